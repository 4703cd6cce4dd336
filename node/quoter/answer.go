package quoter

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/node/market"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/scheduler"
)

// holdTTL is how long a quote's holds last before the bidder commits them.
const holdTTL = time.Minute

// quoteAttempts bounds re-quoting when machines refuse holds (another
// scheduler got there first) or cannot be reached.
const quoteAttempts = 8

// lostPerAccount is how many of one account's machines may fail to
// answer a quote's holds before the quote leaves out the rest of that
// account's machines.
const lostPerAccount = 2

// reserveTimeout bounds one hold request: a machine that does not answer
// in time is skipped and remembered as unreachable (Market.MarkUnreachable).
const reserveTimeout = 3 * time.Second

// answerBids limits the bids a node prices at once.
const answerBids = 16

// answerBid prices a bid over this node's view, holds the placement on
// its machines (every hold or none: a machine that refuses, because
// another scheduler took its capacity first, makes this one release what
// it got and re-quote on what the machines said they have), and returns
// the quote, or the reason there is none, with the holds taken for it
// (none without a quote), which the caller releases if the quote does not
// reach its bidder. The first placement is the market's index's, which
// may be up to a second behind the offers (the holds catch what changed
// since); the re-quotes are exhaustive, over a copy of its view that
// believes the refusals.
func (q *Quoter) answerBid(ctx context.Context, w bidWork) (p2p.Quote, []holdRef) {
	b := w.bid
	now := time.Now()
	idx, v, offers := q.p.Market.Indexed(now, b.Framework)
	if len(v.Machines) == 0 && b.Framework == "tensorflow" {
		if _, all, anyOffers := q.p.Market.Indexed(now, ""); len(all.Machines) > 0 {
			checking := 0
			for _, o := range anyOffers {
				if o.Software.Checking {
					checking++
				}
			}
			why := fmt.Sprintf("none of the %d machines in view has TensorFlow (their owners can point [inventory] python at a virtualenv with tensorflow)", len(all.Machines))
			if checking > 0 {
				why = fmt.Sprintf("none of the %d machines in view has TensorFlow yet: %d of them are still checking (their nodes started moments ago); the job bids again when they say", len(all.Machines), checking)
			}
			return p2p.Quote{JobID: b.JobID, Resource: "framework", Reason: why}, nil
		}
	}
	job := market.SchedulerJob(b)
	// A job in an image: machines that hold it start at once, the others
	// fetch it first. The index prices no setups: such a view is placed
	// exhaustively.
	if sv, ok := market.WithImageSetup(v, offers, b); ok {
		v, idx = sv, nil
	}
	refused := ""
	collided := false
	lostBy := map[string]int{} // machines of each account that did not answer, in this quote
	for attempt := range quoteAttempts {
		if collided {
			// Schedulers that collided on the same machines all retry; a
			// random pause lets one of them take what is free first.
			select {
			case <-ctx.Done():
				return p2p.Quote{JobID: b.JobID, Resource: "job", Reason: "the scheduler is stopping"}, nil
			case <-time.After(time.Duration(50+rand.IntN(400*attempt)) * time.Millisecond):
			}
		}
		var pl scheduler.Placement
		var err error
		if idx != nil {
			pl, err = idx.Quote(job, now)
		} else {
			pl, err = scheduler.Quote(v, job, now, scheduler.Params{})
		}
		var rej *scheduler.Rejection
		if errors.As(err, &rej) {
			reason := rej.Reason
			if refused != "" {
				reason += " (after machines refused holds: " + refused + ")"
			}
			return p2p.Quote{JobID: b.JobID, Resource: rej.Resource, Reason: p2p.Clip(reason, 256), Total: rej.Price}, nil
		}
		if err != nil {
			return p2p.Quote{JobID: b.JobID, Resource: "job", Reason: p2p.Clip(err.Error(), 256)}, nil
		}
		if !market.AllReachable(offers, pl.Machines) {
			// Workers behind NATs that admit no hole punch: place the job
			// within machines that all reach each other, from now on.
			var rej *scheduler.Rejection
			pl, v, offers, rej = placeReachable(v, offers, job, now)
			idx = nil
			if rej != nil {
				return p2p.Quote{JobID: b.JobID, Resource: rej.Resource, Reason: p2p.Clip(rej.Reason, 256), Total: rej.Price}, nil
			}
		}
		predicted, rej := predict(b, v, offers, pl)
		if rej != nil {
			return p2p.Quote{JobID: b.JobID, Resource: rej.Resource, Reason: p2p.Clip(rej.Reason, 256), Predicted: predicted}, nil
		}
		h := q.holdPlacement(ctx, w, job, &pl, offers, attempt)
		if len(h.failed) == 0 {
			quote := p2p.Quote{JobID: b.JobID, PerHour: pl.PerHour, Total: pl.Total, DoneAt: pl.Done.Unix(), HeldUntil: h.heldUntil,
				Predicted: predicted}
			for w, i := range pl.Machines {
				quote.Workers = append(quote.Workers, p2p.QuotedWorker{Machine: offers[i].Machine, PerHour: pl.Worker[w], Hold: h.ids[i]})
			}
			return quote, h.held(offers)
		}
		q.releaseBeforeRequote(ctx, b.JobID, h.held(offers))
		if idx != nil {
			// The index's view is shared with the other bids: the
			// refusals go into a copy, which the index does not follow.
			v = scheduler.View{Machines: slices.Clone(v.Machines), RTT: v.RTT}
			idx = nil
		}
		collided = believeRefusals(&v, offers, h, &refused, lostBy)
	}
	return p2p.Quote{JobID: b.JobID, Resource: "cores", Reason: p2p.Clip(fmt.Sprintf(
		"machines refused holds %d times (other schedulers took their capacity): %s", quoteAttempts, refused), 256)}, nil
}

// releaseBeforeRequote gives back what an attempt held before the next
// one: the holds machines granted at once, since the next attempt may ask
// the same machines; the ones asked of machines that did not answer in the
// background, since the next attempt leaves those machines out and waiting
// on each would add reserveTimeout to the quote (a quote that tried two of
// an insider's dead machines came after the bidder stopped listening).
func (q *Quoter) releaseBeforeRequote(ctx context.Context, job string, held []holdRef) {
	var sure, unsure []holdRef
	for _, h := range held {
		if h.unsure {
			unsure = append(unsure, h)
		} else {
			sure = append(sure, h)
		}
	}
	q.release(ctx, job, sure)
	if len(unsure) > 0 {
		q.bg.Go(func() { q.release(ctx, job, unsure) })
	}
}

// placeReachable places job within each group of machines that all reach
// each other directly (market.ReachClasses) and keeps the cheapest, with
// the group's view and offers; or says why no group can take it.
func placeReachable(v scheduler.View, offers []p2p.Offer, job scheduler.Job, now time.Time) (scheduler.Placement, scheduler.View, []p2p.Offer, *scheduler.Rejection) {
	var best scheduler.Placement
	var bestV scheduler.View
	var bestO []p2p.Offer
	var last *scheduler.Rejection
	found := false
	for _, class := range market.ReachClasses(offers) {
		cv, co := market.Restrict(v, offers, class)
		pl, err := scheduler.Quote(cv, job, now, scheduler.Params{})
		if err != nil {
			errors.As(err, &last)
			continue
		}
		if !found || pl.Total < best.Total {
			best, bestV, bestO, found = pl, cv, co, true
		}
	}
	if found {
		return best, bestV, bestO, nil
	}
	relay := 0
	for _, o := range offers {
		if o.Reach == p2p.ReachRelay {
			relay++
		}
	}
	rej := &scheduler.Rejection{Resource: "network", Reason: fmt.Sprintf(
		"no %d machines that can all reach each other directly: %d of the %d in view are behind NATs that admit no hole punch (symmetric), so they take single-worker jobs or work with public machines and their own network's",
		job.Workers, relay, len(offers))}
	if last != nil {
		rej.Reason += " (" + last.Reason + ")"
		rej.Price = last.Price
	}
	return scheduler.Placement{}, v, offers, rej
}

// predict is the job's predicted time on the placement's machines, when
// the bid describes its work; and a rejection for a synchronous job that
// fewer of them would finish sooner (scheduler.Spread).
func predict(b p2p.Bid, v scheduler.View, offers []p2p.Offer, pl scheduler.Placement) (*p2p.Predicted, *scheduler.Rejection) {
	t, compute, ok := market.SchedulerTraining(b)
	if !ok {
		return nil, nil
	}
	speeds := make([]float64, len(pl.Machines))
	for w, i := range pl.Machines {
		speeds[w] = v.Machines[i].Speed
	}
	links := market.Links(offers)
	p, fewest, rej, err := scheduler.Spread(t, compute, speeds, func(a, b int) (scheduler.Link, bool) {
		return links(pl.Machines[a], pl.Machines[b])
	})
	if err != nil {
		return nil, nil
	}
	return &p2p.Predicted{StepMillis: float64(p.Step) / float64(time.Millisecond), TotalSeconds: p.Total.Seconds(),
		CommSeconds: p.Comm.Seconds(), SpeedUp: p.SpeedUp, Fewest: fewest}, rej
}

// heldPlacement is what the machines of a placement answered: the hold ID
// asked of each (by index in the view), their replies, which refused, and
// when the first granted hold lapses.
type heldPlacement struct {
	ids       map[int]string
	replies   map[int]p2p.ReserveReply
	failed    []int // sorted
	heldUntil int64
	// lost are the machines whose reply never came (a timeout, a dropped
	// connection): each may have granted the hold all the same.
	lost map[int]bool
}

// held lists the holds of h that machines granted, or may have granted
// (lost), with where each machine listens.
func (h heldPlacement) held(offers []p2p.Offer) []holdRef {
	var out []holdRef
	for i, r := range h.replies {
		if r.OK || h.lost[i] {
			out = append(out, holdRef{machine: offers[i].Machine, addrs: offers[i].Addrs, id: h.ids[i], unsure: !r.OK})
		}
	}
	return out
}

// holdPlacement asks each machine of pl to hold its workers, one hold per
// machine. It asks one at a time, in peer ID order, and stops at the first
// refusal: schedulers racing for the same machines then meet at the first
// one they share, and the winner takes all rather than each holding a part
// and every quote failing (lock ordering).
func (q *Quoter) holdPlacement(ctx context.Context, w bidWork, job scheduler.Job, pl *scheduler.Placement, offers []p2p.Offer, attempt int) heldPlacement {
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
	h := heldPlacement{ids: map[int]string{}, replies: map[int]p2p.ReserveReply{}, lost: map[int]bool{}}
	for _, i := range order {
		id := holdID(w.bid.JobID, q.p.Self, offers[i].Machine, attempt)
		h.ids[i] = id
		machine, _ := peer.Decode(offers[i].Machine)
		rctx, cancel := context.WithTimeout(ctx, reserveTimeout)
		reply, err := q.p.Holds.Reserve(rctx, machine, offers[i].Addrs, p2p.Reserve{
			Op: p2p.OpReserve, ID: id, JobID: w.bid.JobID, Res: perMachine[i], TTL: int64(holdTTL / time.Second),
			Bidder: w.bidder.String(), Bid: w.raw})
		cancel()
		if err != nil {
			// Skip it now and for a while: a machine that cannot be
			// reached must not fail every quote that would use it.
			q.p.Market.MarkUnreachable(offers[i].Machine, time.Now())
			reply = p2p.ReserveReply{Reason: "unreachable: " + err.Error()}
			h.lost[i] = true
		} else {
			q.p.Market.Reachable(offers[i].Machine)
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

// believeRefusals updates the view with what the machines that refused
// said they have free (nothing, when unreachable or not lending), adds
// their reasons to refused, and reports whether another scheduler took
// capacity (then the next attempt backs off first).
//
// lostBy counts, across the quote's attempts, the machines of each account
// that did not answer (see lostPerAccount).
func believeRefusals(v *scheduler.View, offers []p2p.Offer, h heldPlacement, refused *string, lostBy map[string]int) (collided bool) {
	for _, i := range h.failed {
		f := h.replies[i].Free
		if f != (p2p.Resources{}) {
			collided = true
		}
		if h.replies[i].Reason != "" && len(*refused) < 200 {
			*refused += offers[i].Moniker + ": " + h.replies[i].Reason + "; "
		}
		m := &v.Machines[i]
		free := market.SchedulerResources(f)
		m.Allocated = scheduler.Resources{
			Cores:    m.Lent.Cores - min(free.Cores, m.Lent.Cores),
			MemBytes: m.Lent.MemBytes - min(free.MemBytes, m.Lent.MemBytes),
			GPUs:     m.Lent.GPUs - min(free.GPUs, m.Lent.GPUs),
		}
		if f == (p2p.Resources{}) {
			m.Allocated = m.Lent // unreachable or not lending: nothing there
		}
		if h.lost[i] {
			lostBy[offers[i].Owner]++
		}
		if h.lost[i] && lostBy[offers[i].Owner] >= lostPerAccount {
			// One account's machines that do not answer must not use up
			// the attempts one by one (256 of them, cheapest, failed every
			// honest bid): once lostPerAccount of them did not answer, none
			// of that account's machines is tried for the rest of this
			// quote (one dead machine of a lab leaves its others in). Only
			// the ones that failed are remembered as unreachable for later
			// quotes.
			for j := range offers {
				if offers[j].Owner == offers[i].Owner {
					v.Machines[j].Allocated = v.Machines[j].Lent
				}
			}
		}
	}
	return collided
}

// holdID names a hold: one per job, scheduler, machine and attempt.
func holdID(job string, scheduler peer.ID, machine string, attempt int) string {
	sum := sha256.Sum256([]byte(fmt.Sprintf("%s|%s|%s|%d", job, scheduler, machine, attempt)))
	return hex.EncodeToString(sum[:16])
}
