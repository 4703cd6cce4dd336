package node

// Calls from this node to other machines (or to itself, when the machine
// is this one): the hold protocol, job requests, and where a machine listens.
// Every room reaches other machines through these.

import (
	"context"
	"fmt"
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
		return n.applyHold(machine, &r, time.Now()), nil
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

// jobCall sends a job request to machine, or hands it to this node's own
// executor when the machine is this one.
func (n *Node) jobCall(ctx context.Context, machine string, typ string, req any, replyType string, reply any) error {
	id, err := peer.Decode(machine)
	if err != nil {
		return err
	}
	if id == n.host.ID() {
		b, err := p2p.Marshal(req)
		if err != nil {
			return err
		}
		rt, r, err := n.exec.handle(ctx, id, &p2p.Envelope{Type: typ, Payload: b})
		if err != nil {
			return err
		}
		if rt != replyType {
			return fmt.Errorf("%w %q", p2p.ErrUnknownType, rt)
		}
		rb, err := p2p.Marshal(r)
		if err != nil {
			return err
		}
		return p2p.Unmarshal(rb, reply)
	}
	return n.rpc.Call(ctx, id, p2p.JobProtocol(n.cfg.Node.ChainID), typ, req, replyType, reply)
}

// truncate shortens a reason to n bytes, to fit a reply on the wire.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}
