package node

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/scheduler"
)

// holdTTL is how long a quote's holds last before the bidder commits them.
const holdTTL = time.Minute

// quoteAttempts bounds re-quoting when machines refuse holds (another
// scheduler got there first) or cannot be reached.
const quoteAttempts = 8

// reserveTimeout bounds one hold request: a machine that does not answer
// in time is skipped and remembered as unreachable (see failures).
const reserveTimeout = 3 * time.Second

// answerBids limits the bids a node prices at once.
const answerBids = 16

// answerBid prices a bid over this node's view, holds the placement on
// its machines (every hold or none: a machine that refuses, because
// another scheduler took its capacity first, makes this one release what
// it got and re-quote on what the machines said they have), and returns
// the quote, or the reason there is none.
func (n *Node) answerBid(ctx context.Context, w bidWork) p2p.Quote {
	b := w.bid
	now := time.Now()
	v, offers := n.schedulerViewFor(now, b.Framework)
	if len(v.Machines) == 0 && b.Framework == "tensorflow" {
		if all, _ := n.schedulerView(now); len(all.Machines) > 0 {
			return p2p.Quote{JobID: b.JobID, Resource: "framework", Reason: fmt.Sprintf(
				"none of the %d machines in view has TensorFlow (their owners can point [inventory] python at a virtualenv with tensorflow)", len(all.Machines))}
		}
	}
	job := schedulerJob(b)
	refused := ""
	collided := false
	for attempt := range quoteAttempts {
		if collided {
			// Schedulers that collided on the same machines all retry; a
			// random pause lets one of them take what is free first.
			select {
			case <-ctx.Done():
				return p2p.Quote{JobID: b.JobID, Resource: "job", Reason: "the scheduler is stopping"}
			case <-time.After(time.Duration(50+rand.IntN(400*attempt)) * time.Millisecond):
			}
		}
		pl, err := scheduler.Quote(v, job, now, scheduler.Params{})
		var rej *scheduler.Rejection
		if errors.As(err, &rej) {
			reason := rej.Reason
			if refused != "" {
				reason += " (after machines refused holds: " + refused + ")"
			}
			return p2p.Quote{JobID: b.JobID, Resource: rej.Resource, Reason: truncate(reason, 256)}
		}
		if err != nil {
			return p2p.Quote{JobID: b.JobID, Resource: "job", Reason: truncate(err.Error(), 256)}
		}
		h := n.holdPlacement(ctx, w, job, &pl, offers, attempt)
		if len(h.failed) == 0 {
			q := p2p.Quote{JobID: b.JobID, PerHour: pl.PerHour, Total: pl.Total, DoneAt: pl.Done.Unix(), HeldUntil: h.heldUntil}
			for w, i := range pl.Machines {
				q.Workers = append(q.Workers, p2p.QuotedWorker{Machine: offers[i].Machine, PerHour: pl.Worker[w], Hold: h.ids[i]})
			}
			return q
		}
		n.releaseHeld(ctx, b.JobID, h, offers)
		collided = believeRefusals(&v, offers, h, &refused)
	}
	return p2p.Quote{JobID: b.JobID, Resource: "cores", Reason: truncate(fmt.Sprintf(
		"machines refused holds %d times (other schedulers took their capacity): %s", quoteAttempts, refused), 256)}
}

// heldPlacement is what the machines of a placement answered: the hold ID
// asked of each (by index in the view), their replies, which refused, and
// when the first granted hold lapses.
type heldPlacement struct {
	ids       map[int]string
	replies   map[int]p2p.ReserveReply
	failed    []int // sorted
	heldUntil int64
}

// holdPlacement asks each machine of pl to hold its workers, one hold per
// machine. It asks one at a time, in peer ID order, and stops at the first
// refusal: schedulers racing for the same machines then meet at the first
// one they share, and the winner takes all rather than each holding a part
// and every quote failing (lock ordering).
func (n *Node) holdPlacement(ctx context.Context, w bidWork, job scheduler.Job, pl *scheduler.Placement, offers []p2p.Offer, attempt int) heldPlacement {
	perMachine := map[int]p2p.Resources{}
	for _, i := range pl.Machines {
		r := perMachine[i]
		r.Cores += job.Per.Cores
		r.MemBytes += job.Per.MemBytes
		r.GPUs += job.Per.GPUs
		perMachine[i] = r
	}
	order := make([]int, 0, len(perMachine))
	for i := range perMachine {
		order = append(order, i)
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(offers[a].Machine, offers[b].Machine) })
	h := heldPlacement{ids: map[int]string{}, replies: map[int]p2p.ReserveReply{}}
	for _, i := range order {
		id := holdID(w.bid.JobID, n.host.ID(), offers[i].Machine, attempt)
		h.ids[i] = id
		machine, _ := peer.Decode(offers[i].Machine)
		rctx, cancel := context.WithTimeout(ctx, reserveTimeout)
		reply, err := n.reserve(rctx, machine, offers[i].Addrs, p2p.Reserve{
			Op: p2p.OpReserve, ID: id, JobID: w.bid.JobID, Res: perMachine[i], TTL: int64(holdTTL / time.Second),
			Bidder: w.bidder.String(), Bid: w.raw})
		cancel()
		if err != nil {
			// Skip it now and for a while: a machine that cannot be
			// reached must not fail every quote that would use it.
			n.failures.mark(offers[i].Machine, time.Now())
			reply = p2p.ReserveReply{Reason: "unreachable: " + err.Error()}
		} else {
			n.failures.forget(offers[i].Machine)
		}
		h.replies[i] = reply
		if !reply.OK {
			break
		}
	}
	for i, r := range h.replies {
		if !r.OK {
			h.failed = append(h.failed, i)
		} else if h.heldUntil == 0 || r.Expires < h.heldUntil {
			h.heldUntil = r.Expires
		}
	}
	slices.Sort(h.failed)
	return h
}

// releaseHeld gives back the holds of h that were granted.
func (n *Node) releaseHeld(ctx context.Context, job string, h heldPlacement, offers []p2p.Offer) {
	for i, r := range h.replies {
		if r.OK {
			machine, _ := peer.Decode(offers[i].Machine)
			n.reserve(ctx, machine, offers[i].Addrs, p2p.Reserve{Op: p2p.OpRelease, ID: h.ids[i], JobID: job})
		}
	}
}

// believeRefusals updates the view with what the machines that refused
// said they have free (nothing, when unreachable or not lending), adds
// their reasons to refused, and reports whether another scheduler took
// capacity (then the next attempt backs off first).
func believeRefusals(v *scheduler.View, offers []p2p.Offer, h heldPlacement, refused *string) (collided bool) {
	for _, i := range h.failed {
		f := h.replies[i].Free
		if f != (p2p.Resources{}) {
			collided = true
		}
		if h.replies[i].Reason != "" && len(*refused) < 200 {
			*refused += offers[i].Moniker + ": " + h.replies[i].Reason + "; "
		}
		m := &v.Machines[i]
		free := schedulerResources(f)
		m.Allocated = scheduler.Resources{
			Cores:    m.Lent.Cores - min(free.Cores, m.Lent.Cores),
			MemBytes: m.Lent.MemBytes - min(free.MemBytes, m.Lent.MemBytes),
			GPUs:     m.Lent.GPUs - min(free.GPUs, m.Lent.GPUs),
		}
		if f == (p2p.Resources{}) {
			m.Allocated = m.Lent // unreachable or not lending: nothing there
		}
	}
	return collided
}

// holdID names a hold: one per job, scheduler, machine and attempt.
func holdID(job string, scheduler peer.ID, machine string, attempt int) string {
	sum := sha256.Sum256([]byte(fmt.Sprintf("%s|%s|%s|%d", job, scheduler, machine, attempt)))
	return hex.EncodeToString(sum[:16])
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}

// bidQueue bounds the bids waiting to be priced; past it a node under a
// flood of bids drops the newest (their bidders get no quote from it).
const bidQueue = 1024

type bidWork struct {
	bid    p2p.Bid
	bidder peer.ID
	raw    []byte // the bid's signed envelope, for the machines asked to hold it
}

// onBid is the bids topic's handler: it queues the bid for the pricing
// workers, off the gossip loop.
func (n *Node) onBid(rec *p2p.Received) {
	b, ok := rec.Payload.(*p2p.Bid)
	if !ok || !n.cfg.Scheduler.Quote {
		return
	}
	select {
	case n.bidQ <- bidWork{*b, rec.Signer, rec.Raw}:
	default:
		n.log.Warn("too many bids waiting to be priced; dropped one", "job", b.JobID)
	}
}

// priceBids answers queued bids until ctx ends; the node runs answerBids
// of these.
func (n *Node) priceBids(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case w := <-n.bidQ:
			q := n.answerBid(ctx, w)
			if err := n.sendQuote(ctx, w.bidder, q); err != nil {
				n.log.Debug("quote not delivered", "job", w.bid.JobID, "bidder", w.bidder, "err", err)
				for _, qw := range q.Workers { // nobody will commit them
					machine, _ := peer.Decode(qw.Machine)
					n.reserve(ctx, machine, nil, p2p.Reserve{Op: p2p.OpRelease, ID: qw.Hold, JobID: q.JobID})
				}
			}
		}
	}
}

func (n *Node) sendQuote(ctx context.Context, bidder peer.ID, q p2p.Quote) error {
	if bidder == n.host.ID() {
		n.quotes.Add(n.host.ID(), q, time.Now())
		return nil
	}
	var ack p2p.QuoteAck
	if err := n.rpc.Call(ctx, bidder, p2p.QuoteProtocol(n.cfg.Node.ChainID), p2p.TypeQuote, &q, p2p.TypeQuoteAck, &ack); err != nil {
		return err
	}
	if !ack.OK {
		return errors.New("the bidder refused the quote")
	}
	return nil
}

// failures remembers machines this node could not reach, so its
// scheduler leaves them out for a while rather than failing quote after
// quote on them (a machine that went away without withdrawing its offer,
// or that never could be reached).
type failures struct {
	mu    sync.Mutex
	until map[string]failure
}

type failure struct {
	until time.Time
	wait  time.Duration
}

// Unreachable machines are skipped for unreachableFor, doubling (up to
// unreachableMax) each time one fails again.
const (
	unreachableFor = 30 * time.Second
	unreachableMax = 10 * time.Minute
)

func (f *failures) mark(machine string, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.until == nil {
		f.until = map[string]failure{}
	}
	if len(f.until) > 10_000 {
		for m, x := range f.until {
			if now.After(x.until.Add(unreachableMax)) {
				delete(f.until, m)
			}
		}
	}
	x := f.until[machine]
	x.wait = min(max(2*x.wait, unreachableFor), unreachableMax)
	x.until = now.Add(x.wait)
	f.until[machine] = x
}

// skip reports whether machine failed recently.
func (f *failures) skip(machine string, now time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	x, ok := f.until[machine]
	return ok && now.Before(x.until)
}

// forget clears a machine that answered again.
func (f *failures) forget(machine string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.until, machine)
}
