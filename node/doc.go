// Package node is the DeepMarket daemon: it reads the home directory
// (key, config.toml, API token), detects the machine's inventory, and wires
// the services into one process: the libp2p host and discovery, gossip of
// offers and bids, the badger node store, the lender that announces this
// machine's offer, the offer book of the market, and the local HTTP API.
//
// node is the only package that imports p2p (and later ledger, scheduler,
// storage); those never import node. Services take a context and stop when
// it ends; Run joins them with an errgroup.
package node
