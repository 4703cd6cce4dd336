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
// # Validators
//
// The validator set starts as genesis lists it (a validator's key is its
// node key, which is also its account key) and changes only by the votes
// of the validators themselves; no key is above the others. A
// ValidatorVote {PubKey, Power, Name}, signed by a current validator with
// its account's next nonce, votes that the ed25519 key PubKey have Power:
// more than 0 adds it or changes its power (at most MaxValidatorPower), 0
// removes it. Name names a new validator; once a key has a name, votes
// naming it otherwise are refused.
//
// A change carries when the validators voting for it hold more than 2/3 of
// the set's total power (3*votes > 2*total, integers). It is made in the
// block that carries it: the set in the state changes, every pending vote
// on that key ends, and FinalizeBlock returns the change in
// ValidatorUpdates, which CometBFT applies from height H+2.
//
// Each validator has at most one pending vote per key: voting again with
// another power moves the vote, voting again with the same power is
// refused (CodeAlreadyVoted, so the nonce is not spent), and voting for
// the power a key already has withdraws the vote. At most MaxPendingVotes
// are pending per validator. Votes are counted at the voters' current
// power every time: when a change carries, the votes of a validator it
// removed are dropped, and every other pending change is counted again
// against the new set, in key order, until none carries.
//
// A change that would leave the set empty, or grow it past MaxValidators,
// is refused when voted and never carries. The rule does not guard
// liveness: a new validator whose node is not running and synced, and
// whose power with the others' missing ones reaches 1/3, halts the chain
// until it runs. Vote a university in once its node has caught up.
//
// ledger must not import p2p, scheduler, storage or node. It may import
// identity (addresses) and wire (deterministic encoding).
package ledger
