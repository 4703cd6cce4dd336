// Package node is the DeepMarket daemon: it reads the home directory
// (key, config.toml, API token), detects the machine's inventory, and wires
// the services into one process: the libp2p host and discovery, gossip of
// offers and bids, the badger node store, the lender that announces this
// machine's offer, the market's books and view (node/market), the quoter
// that answers bids (node/quoter), and the local HTTP API.
//
// node and its role packages import p2p, ledger, scheduler and storage;
// those never import node, and neither do the role packages: each declares
// the small interfaces it needs, and node adapts to them. Services take a context and stop when
// it ends; Run joins them with an errgroup.
package node
