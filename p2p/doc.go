// Package p2p owns DeepMarket's peer-to-peer layer:
//
//   - the libp2p host (NewHost: TCP and QUIC, Noise and TLS, resource and
//     connection managers) and its NAT traversal (AutoNAT, circuit relay
//     v2, hole punching; nat.go); Host.Close stops it network first, and
//     gives up on a libp2p close stuck past CloseTimeout, logging what holds
//     it, so that a node's shutdown always completes (close.go);
//   - peer discovery (Discovery: mDNS on a lab LAN; bootstrap peers and a
//     Kademlia DHT on a WAN, which also finds content providers), and the
//     connected peers' latencies and gossip scores (PeerWatcher);
//   - the signed envelope every message travels in (Seal, Open: signed
//     under the chain ID, with an expiry and a per-signer sequence);
//   - the gossip topics (Gossip, Topic) of the market's messages: offers
//     and withdrawals, and bids. A Validator checks each message before it
//     reaches the rest of the node (size, encoding, signature, expiry,
//     replay, value ranges, and the ledger's admission, asked through
//     Admission before the signature is verified) and decodes it into a
//     Received whose typed field (Offer, Withdrawal or Bid) is the one its
//     type names: a payload table per topic decides which;
//   - request/response streams (RPC) and their messages: holds
//     (Reserve), quotes (Quote), a job's launch, status, logs and stop
//     (JobProtocol), and pages of a peer's offer book (BookServer,
//     FetchBook, BookClient), each offer checked as a gossiped one is;
//   - link measurements between machines (LinkMeter, ProbeServer), which
//     offers carry for schedulers.
//
// Subpackage tunnel carries a job's worker traffic between its machines.
//
// p2p must not import ledger, scheduler, storage or node: node wires them.
// It may import identity (keys and addresses) and wire (encoding).
package p2p
