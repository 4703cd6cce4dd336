package node

// Calls from this node to other machines (or to itself, when the machine
// is this one): the hold protocol, job requests, and where a machine listens.
// Every room reaches other machines through these.

import (
	"context"
	"errors"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/deepmarket/deepmarket/node/lender"
	"github.com/deepmarket/deepmarket/node/market"
	"github.com/deepmarket/deepmarket/node/submitter"
	"github.com/deepmarket/deepmarket/p2p"
)

// machineCalls reach other machines over this node's RPC, and this machine
// directly: its desk for holds (its executor for jobs is jobCall's local).
type machineCalls struct {
	host    host.Host
	rpc     *p2p.RPC
	chainID string
	book    *market.OfferBook // where machines say they listen
	desk    *lender.Desk
	quotes  *submitter.QuoteBook // this node's, for the quotes it sends itself
}

// learnAddrs adds a machine's announced addresses (full multiaddrs ending
// in its /p2p/ID) to the peerstore for a while, so it can be dialled.
func (c *machineCalls) learnAddrs(machine peer.ID, addrs []string) {
	for _, a := range addrs {
		if m, err := ma.NewMultiaddr(a); err == nil {
			if tr, id := peer.SplitAddr(m); tr != nil && id == machine {
				c.host.Peerstore().AddAddr(machine, tr, peerstore.TempAddrTTL)
			}
		}
	}
}

// reserve asks machine (this node itself, or a peer over a stream) to
// apply r.
func (c *machineCalls) reserve(ctx context.Context, machine peer.ID, addrs []string, r p2p.Reserve) (p2p.ReserveReply, error) {
	if machine == c.host.ID() {
		return c.desk.Apply(ctx, machine, &r, time.Now()), nil
	}
	c.learnAddrs(machine, addrs)
	var reply p2p.ReserveReply
	err := c.rpc.Call(ctx, machine, p2p.ReserveProtocol(c.chainID), p2p.TypeReserve, &r, p2p.TypeReserveReply, &reply)
	return reply, err
}

// machineAddrs is where a machine's offer says it listens.
func (c *machineCalls) machineAddrs(machine string) []string {
	for _, h := range c.book.List(time.Now()) {
		if h.Offer.Machine == machine {
			return h.Offer.Addrs
		}
	}
	return nil
}

// LearnMachine lets the executor reach a run's other machines: at the
// addresses the launch named and those their offers announce.
func (c *machineCalls) LearnMachine(machine peer.ID, known []string) {
	c.learnAddrs(machine, append(known, c.machineAddrs(machine.String())...))
}

var _ lender.Dialer = (*machineCalls)(nil)

// jobCall sends a job request to machine over the job protocol, or, when
// the machine is this one, hands it straight to this node's own executor
// (local: one of its typed handlers, as this node).
func jobCall[Req, Rep any](c *machineCalls, ctx context.Context, machine, typ string, req Req, replyType string,
	local func(self peer.ID, req Req) (Rep, error)) (Rep, error) {
	var reply Rep
	id, err := peer.Decode(machine)
	if err != nil {
		return reply, err
	}
	if id == c.host.ID() {
		return local(id, req)
	}
	err = c.rpc.Call(ctx, id, p2p.JobProtocol(c.chainID), typ, &req, replyType, &reply)
	return reply, err
}

// sendQuote delivers a quote to its bidder: over a stream, or into this
// node's own quote book when it bid itself.
func (c *machineCalls) sendQuote(ctx context.Context, bidder peer.ID, q p2p.Quote) error {
	if bidder == c.host.ID() {
		if !c.quotes.Add(c.host.ID(), q, time.Now()) {
			return errors.New("the bid is closed: its bidder has chosen")
		}
		return nil
	}
	var ack p2p.QuoteAck
	if err := c.rpc.Call(ctx, bidder, p2p.QuoteProtocol(c.chainID), p2p.TypeQuote, &q, p2p.TypeQuoteAck, &ack); err != nil {
		return err
	}
	if !ack.OK {
		return errors.New("the bidder refused the quote")
	}
	return nil
}
