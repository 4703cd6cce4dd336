// Package tunnel carries a job's TensorFlow cluster traffic between the
// job's machines over authenticated, encrypted connections between their
// nodes, so that no TensorFlow worker port is ever reachable from the
// network.
//
// TensorFlow's gRPC server has no authentication and runs any graph it is
// sent. Every worker therefore binds to 127.0.0.1 only; its machine
// Exposes it to the job's other machines (by peer ID, which the secure
// channel authenticates), and each of those machines Forwards a loopback
// port to it. TF_CONFIG on every machine lists only 127.0.0.1 addresses: the
// worker's own port, and one forwarder per other worker.
//
// A tunnelled connection takes one of two paths, with the same header
// (the job and the worker index), the same allow lists and the same
// semantics: the raw bytes of the TCP connection in both directions,
// half-closes passed on as half-closes and aborts as resets.
//
//   - Direct (the default, direct.go and frame.go): a TCP connection of its
//     own between the two nodes, authenticated by libp2p's TLS 1.3
//     handshake with both nodes' libp2p keys, the header in one TLS record,
//     then the bytes in AES-128-GCM frames under keys exported from the
//     handshake. No muxer and no copy in user space: about half the CPU
//     per byte of a stream. A forwarder learns the port of the other
//     node's direct listener through DirectProtocol; while the nodes'
//     libp2p connection is down, it dials the address of its last direct
//     connection, which the handshake authenticates all the same.
//   - Streams: one libp2p stream of protocol /deepmarket/<chainID>/tunnel/1
//     per connection, over the nodes' libp2p connection. A forwarder falls
//     back to it whenever the direct path cannot be had (no listener, a
//     firewall, a relayed peer), and WithDirect(false) makes it the only
//     path.
//
// tunnel owns the stream protocol, the direct listener and its frames, the
// loopback listeners and dials, and the copying. It imports only libp2p
// (and multiaddr), wire and x/sys; it must not import node, ledger,
// scheduler, storage or p2p (which owns the host it is handed).
package tunnel
