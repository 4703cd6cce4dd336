package node

import (
	"context"
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/units"
)

// ledgerReads is what the node reads of its own ledger replica on hot
// paths (every gossip message, every hold request): in-process map
// lookups as of the last block, no copying.
type ledgerReads interface {
	MachineOwner(machine identity.Address) (owner identity.Address, registered bool)
	IsMember(a identity.Address) bool
	BalanceOf(a identity.Address) uint64
}

// Machine implements p2p.Admission: only machines the ledger backs may
// offer (a fake machine costs a university's signature, not a key).
func (n *Node) Machine(key []byte) (identity.Address, bool) {
	return n.reads.MachineOwner(identity.AddressOf(key))
}

// Bidder implements p2p.Admission: only members whose balance covers a
// bid may bid.
func (n *Node) Bidder(key []byte, maxPrice uint64) error {
	return n.canPay(identity.AddressOf(key), maxPrice)
}

func (n *Node) canPay(a identity.Address, maxPrice uint64) error {
	if !n.reads.IsMember(a) {
		return fmt.Errorf("account %s is not a member of this network", a)
	}
	if bal := n.reads.BalanceOf(a); bal < maxPrice {
		return fmt.Errorf("account %s holds %s credits, less than the bid's %s", a, units.FormatCredits(bal), units.FormatCredits(maxPrice))
	}
	return nil
}

var _ p2p.Admission = (*Node)(nil)

// checkBid is what a machine checks before holding capacity for a
// scheduler: the bid the request carries is signed by its bidder, for this
// job, by a member whose balance (on this machine's own replica) covers
// its maximum price; the hold may ask for at most what the bid's workers
// need.
func (n *Node) checkBid(r *p2p.Reserve, now time.Time) (HoldRequest, error) {
	req := HoldRequest{Reserve: r}
	if r.Op != p2p.OpReserve {
		return req, nil
	}
	bid, signer, err := p2p.OpenBid(r.Bid, n.cfg.Node.ChainID, now)
	if err != nil {
		return req, fmt.Errorf("the hold's bid: %w", err)
	}
	if bid.JobID != r.JobID {
		return req, fmt.Errorf("the hold is for job %s, its bid for %s", r.JobID, bid.JobID)
	}
	if bidder, err := peer.Decode(r.Bidder); err != nil || bidder != signer {
		return req, fmt.Errorf("the hold names bidder %s, its bid is signed by %s", r.Bidder, signer)
	}
	if err := n.canPay(identity.Address(bid.Submitter), bid.MaxPrice); err != nil {
		return req, err
	}
	req.Account = bid.Submitter
	req.Most = p2p.Resources{
		Cores:    bid.Workers * bid.PerWorker.Cores,
		MemBytes: uint64(bid.Workers) * bid.PerWorker.MemBytes,
		GPUs:     bid.Workers * bid.PerWorker.GPUs,
	}
	return req, nil
}

// handleReserve answers a scheduler's hold request on this machine.
func (n *Node) handleReserve(_ context.Context, from peer.ID, env *p2p.Envelope) (string, any, error) {
	if env.Type != p2p.TypeReserve {
		return "", nil, fmt.Errorf("%w %q", p2p.ErrUnknownType, env.Type)
	}
	var r p2p.Reserve
	if err := p2p.Unmarshal(env.Payload, &r); err != nil {
		return "", nil, err
	}
	if err := r.Validate(); err != nil {
		return "", nil, err
	}
	return p2p.TypeReserveReply, n.applyHold(from, &r, time.Now()), nil
}

// applyHold checks a hold request's bid and applies it to this machine's
// holds; a request whose bid does not hold up is refused with the reason.
func (n *Node) applyHold(from peer.ID, r *p2p.Reserve, now time.Time) p2p.ReserveReply {
	req, err := n.checkBid(r, now)
	if err != nil {
		return p2p.ReserveReply{Reason: truncate(err.Error(), 256)}
	}
	return n.holds.Apply(from, req, now)
}
