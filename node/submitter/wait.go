package submitter

// A job's wait in the queue, between its bids.

import (
	"context"
	"fmt"
	"time"

	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/units"
)

// MaxTurnWait bounds how long a job that may not wait for machines
// (max_wait 0) waits for its first turn to bid, behind the jobs ahead of
// it in the queue.
const MaxTurnWait = time.Hour

// refusal is what a bid that found no placement learned: why, what the
// job would cost now when it was refused for price, and the offers'
// fingerprint the bid was made on.
type refusal struct {
	why      string
	priceNow uint64
	on       uint64
}

// awaitTurn waits until the job may bid: at once for its first bid when
// no job ahead of it waits for the room; after a refusal, when the offers
// show room it was not refused on, or its backoff runs out. It reports
// false when the job ended instead (cancelled, waited as long as it may,
// its deadline out of reach) or the node stops; the job then is out of
// the queue.
func (m *Manager) awaitTurn(ctx context.Context, j *job, r *refusal) bool {
	now := time.Now()
	spec, created := j.Spec, j.Created
	qd := jobs.Queued{Since: now}
	if j.Queue != nil {
		qd = *j.Queue // waiting already, before a restart or a bid
	}
	need := shape{workers: spec.Workers, per: p2p.Resources{Cores: uint32(spec.Cores), MemBytes: spec.MemBytes, GPUs: uint32(spec.GPUs)},
		tensorflow: spec.Framework == "tensorflow"}
	w := waiter{id: j.ID, since: qd.Since, score: score(spec.MaxPrice, need, spec.MaxDuration, m.p.Reference), need: need, next: now}
	if r != nil {
		if spec.MaxWait == 0 {
			m.move(j, jobs.Failed, r.why)
			return false
		}
		qd.Why, qd.PriceNow = r.why, r.priceNow
		w.next, w.seen = now.Add(backoff(qd.Bids)), r.on
	}
	maxWait := spec.MaxWait
	if maxWait == 0 && r == nil {
		// Not waiting for machines, only for its first turn to bid: a job
		// with max_wait 0 fails when that bid finds none.
		maxWait = MaxTurnWait
	}
	limits := func() (time.Time, string) {
		return waitLimit(qd.Since, created, maxWait, spec.Deadline, spec.MaxDuration, j.Confirmed, m.t.confirmWait)
	}
	limit, limitWhy := limits()
	if !now.Before(limit) {
		m.move(j, jobs.Failed, limitWhy+": "+orStr(qd.Why, "no placement yet"))
		return false
	}
	turn := m.q.enter(w)
	select {
	case <-turn:
		if r == nil {
			return true // its first bid, or the first after a restart
		}
	default:
	}
	if qd.Why == "" {
		qd.Why = "jobs ahead of it in this node's queue bid first"
	}
	qd.NextBid = w.next
	j.Queue, j.Reason = &qd, qd.Why
	m.save(j)
	if j.State != jobs.Waiting {
		m.move(j, jobs.Waiting, qd.Why)
		when := "when the jobs ahead of it have bid"
		if r != nil {
			when = "when the offers show room for it, or by " + w.next.UTC().Format("15:04:05")
		}
		m.logf(j.ID, "waiting in the queue (position %d)%s; it bids again %s", m.q.positions(now)[j.ID], priceNote(qd.PriceNow, spec.MaxPrice), when)
	}
	return m.waitForTurn(ctx, j, turn, limits)
}

// waitForTurn waits in the queue for turn, until the limit limits gives
// (then the job fails, for the reason it gives), a cancel, or the node
// stopping. A confirmation moves the limit.
func (m *Manager) waitForTurn(ctx context.Context, j *job, turn <-chan struct{}, limits func() (time.Time, string)) bool {
	limit, limitWhy := limits()
	timer := time.NewTimer(time.Until(limit))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return false // the node stops: the job waits on after its restart
		case <-j.in.note:
			if m.look(j); j.cancelled {
				m.q.leave(j.ID)
				m.move(j, jobs.Cancelled, "cancelled while waiting in the queue: nothing was paid")
				return false
			}
			limit, limitWhy = limits()
			timer.Reset(time.Until(limit))
		case <-timer.C:
			m.q.leave(j.ID)
			m.move(j, jobs.Failed, limitWhy+": "+j.Queue.Why)
			return false
		case <-turn:
			j.Queue.Bids++
			m.save(j)
			m.logf(j.ID, "its turn in the queue after %s: bidding again", time.Since(j.Queue.Since).Round(time.Second))
			return true
		}
	}
}

// priceNote says what a job refused for price would cost now.
func priceNote(now, max uint64) string {
	if now == 0 {
		return ""
	}
	return fmt.Sprintf("; it would run now for %s credits, above its max price %s", units.FormatCredits(now), units.FormatCredits(max))
}

func orStr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
