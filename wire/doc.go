// Package wire is DeepMarket's one deterministic encoding: CBOR with core
// deterministic encoding (RFC 8949 §4.2.1), and a decoder with limits that
// keep hostile input cheap. Signed gossip messages (p2p) and ledger
// transactions (ledger) both use it, so a signature always covers exactly
// one encoding. It is a leaf package.
package wire
