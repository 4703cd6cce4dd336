// Package ledger owns DeepMarket's credits: a CometBFT ABCI application
// (the state machine every node replicates), its transactions and their
// signatures, the genesis of a network, a client that signs and broadcasts
// transactions, and the audit that replays a chain from genesis.
//
// State holds integers only (1 credit = 1,000,000 micro-credits): accounts
// {balance, nonce}, issuers {quota left}, machine links, escrows, machine
// records. The app hash after each block is the SHA-256 of the canonical
// encoding of the whole state: no map order, no floats, no wall clock.
//
// ledger must not import p2p, scheduler, storage or node. It may import
// identity (addresses) and wire (deterministic encoding).
package ledger
