// Package node is the DeepMarket daemon: it reads the home directory
// (key, config.toml, API token), detects the machine's inventory, and wires
// the services into one process: the libp2p host and discovery, gossip of
// offers and bids, the badger node store, the ledger replica, the local
// HTTP API, and the rooms of the roles a node plays:
//
//   - node/submitter: this node's own jobs (wire_submitter.go);
//   - node/lender: what this machine lends, its holds and the workers it
//     runs (wire_lender.go);
//   - node/quoter: answering other nodes' bids, and node/market: the offer
//     and bid books and the scheduler's view (wire_market.go);
//   - node/service: the answers of the local API (wire_api.go).
//
// Run starts the parts in the order it is written, each made by a function
// that takes what it needs (newHost, startLedger, startLending,
// newExecutor, newSubmitter, ...), then runs their services in one
// errgroup; services take a context and stop when it ends. calls.go holds
// the calls every room makes to other machines.
//
// node and its rooms import p2p, ledger, scheduler and storage; those never
// import node, and neither do the rooms: each declares the small interfaces
// it needs, and node adapts to them. No room imports node/api or net/http:
// a refused request is a *fault.Error, which node/api maps to a status.
package node
