package node

// Calls from this node to other machines (or to itself, when the machine
// is this one): the hold protocol, job requests, and where a machine listens.
// Every room reaches other machines through these.

import (
	"context"
	"time"

	"github.com/deepmarket/deepmarket/p2p"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	ma "github.com/multiformats/go-multiaddr"
)

// learnAddrs adds a machine's announced addresses (full multiaddrs ending
// in its /p2p/ID) to the peerstore for a while, so it can be dialled.
func (n *Node) learnAddrs(machine peer.ID, addrs []string) {
	for _, a := range addrs {
		if m, err := ma.NewMultiaddr(a); err == nil {
			if tr, id := peer.SplitAddr(m); tr != nil && id == machine {
				n.host.Peerstore().AddAddr(machine, tr, peerstore.TempAddrTTL)
			}
		}
	}
}

// reserve asks machine (this node itself, or a peer over a stream) to
// apply r.
func (n *Node) reserve(ctx context.Context, machine peer.ID, addrs []string, r p2p.Reserve) (p2p.ReserveReply, error) {
	if machine == n.host.ID() {
		return n.desk.Apply(machine, &r, time.Now()), nil
	}
	n.learnAddrs(machine, addrs)
	var reply p2p.ReserveReply
	err := n.rpc.Call(ctx, machine, p2p.ReserveProtocol(n.cfg.Node.ChainID), p2p.TypeReserve, &r, p2p.TypeReserveReply, &reply)
	return reply, err
}

// machineAddrs is where a machine's offer says it listens.
func (n *Node) machineAddrs(machine string) []string {
	for _, h := range n.book.List(time.Now()) {
		if h.Offer.Machine == machine {
			return h.Offer.Addrs
		}
	}
	return nil
}

// jobCall sends a job request to machine over the job protocol, or, when
// the machine is this one, hands it straight to this node's own executor
// (local: one of its typed handlers, as this node).
func jobCall[Req, Rep any](n *Node, ctx context.Context, machine, typ string, req Req, replyType string,
	local func(self peer.ID, req Req) (Rep, error)) (Rep, error) {
	var reply Rep
	id, err := peer.Decode(machine)
	if err != nil {
		return reply, err
	}
	if id == n.host.ID() {
		return local(id, req)
	}
	err = n.rpc.Call(ctx, id, p2p.JobProtocol(n.cfg.Node.ChainID), typ, &req, replyType, &reply)
	return reply, err
}
