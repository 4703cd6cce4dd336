// Package p2p owns DeepMarket's peer-to-peer layer: the libp2p host (TCP and
// QUIC, Noise and TLS, resource and connection managers), peer discovery
// (mDNS on a lab LAN; bootstrap peers and a Kademlia DHT on a WAN), the
// signed envelope every message travels in, the typed messages (Offer,
// Withdrawal, Bid), the gossip topics that carry them, and the validators
// that reject anything malformed, forged, expired, replayed or absurd before
// it reaches the rest of the node.
//
// p2p must not import ledger, scheduler, storage or node: node wires them.
// It may import identity (keys and addresses) and wire (encoding).
package p2p
