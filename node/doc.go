// Package node is the DeepMarket daemon: it reads the home directory
// (key, config.toml, API token), detects the machine's inventory, and wires
// the services into one process: the libp2p host and discovery, gossip of
// offers and bids, the badger node store, the ledger replica, the local
// HTTP API, and the rooms of the roles a node plays:
//
//   - node/submitter: this node's own jobs (wire_submitter.go);
//   - node/lender: what this machine lends, its holds and the workers it
//     runs (wire_lender.go);
//   - node/quoter: answering other nodes' bids (wire_market.go);
//   - node/market: the offer and bid books and the scheduler's view.
//
// node and its rooms import p2p, ledger, scheduler and storage; those never
// import node, and neither do the rooms: each declares the small interfaces
// it needs, and node adapts to them. Services take a context and stop when
// it ends; Run joins them with an errgroup.
package node
