// Package tunnel carries a job's TensorFlow cluster traffic between the
// job's machines over authenticated, encrypted libp2p streams, so that no
// TensorFlow worker port is ever reachable from the network.
//
// TensorFlow's gRPC server has no authentication and runs any graph it is
// sent. Every worker therefore binds to 127.0.0.1 only; its machine
// Exposes it to the job's other machines (by peer ID, which libp2p's secure
// channel authenticates), and each of those machines Forwards a loopback
// port to it. TF_CONFIG on every machine lists only 127.0.0.1 addresses: the
// worker's own port, and one forwarder per other worker.
//
// A tunnelled connection is one stream of protocol
// /deepmarket/<chainID>/tunnel/1: a small header naming the job and the
// worker index, then the raw bytes of the TCP connection in both
// directions, with half-closes carried as stream half-closes and aborts as
// resets.
//
// tunnel owns the stream protocol, the loopback listeners and dials, and the
// copying. It imports only libp2p and wire; it must not import node, ledger,
// scheduler, storage or p2p (which owns the host it is handed).
package tunnel
