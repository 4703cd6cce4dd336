package node

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"golang.org/x/sync/errgroup"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/units"
)

// place bids run k of j, chooses a quote, waits for confirmation,
// commits the holds, opens the escrow and launches; then supervises.
func (m *JobManager) place(ctx context.Context, j *jobs.Job, k int) {
	runID := jobs.RunID(j.ID, k)
	var resume string
	m.mu.Lock()
	resume = j.Checkpoint
	m.mu.Unlock()
	bids := 0
	for attempt := 0; ; attempt++ {
		if m.cancelled(j.ID) {
			m.move(j, jobs.Cancelled, "cancelled before launch")
			return
		}
		if attempt >= commitAttempts {
			m.move(j, jobs.Failed, fmt.Sprintf("machines kept refusing to commit their holds (%d tries)", attempt))
			return
		}
		if j.State != jobs.Quoting && !m.move(j, jobs.Quoting, "") {
			return
		}
		run, why := m.quote(ctx, j, runID)
		if run == nil && bidAgain(why, bids) {
			// Capacity frees as other jobs end (or, re-placing, as the
			// previous run's workers stop): bid again a few times.
			bids++
			m.logf(j, "no placement yet (%s): bidding again in %s", why, rebidEvery)
			select {
			case <-ctx.Done():
				return
			case <-time.After(rebidEvery + time.Duration(rand.IntN(1000))*time.Millisecond):
			}
			attempt--
			continue
		}
		if run == nil {
			m.move(j, jobs.Failed, why)
			return
		}
		m.save(j, func() {
			if len(j.Runs) > k {
				j.Runs[k] = *run
			} else {
				j.Runs = append(j.Runs, *run)
			}
		})
		m.logf(j, "quote: %d workers on %s, %s credits an hour, at most %s credits", len(run.Workers),
			machinesOf(run), units.FormatCredits(run.PerHour), units.FormatCredits(run.Quoted))
		// Confirmation, unless given.
		m.mu.Lock()
		ch := m.confirm[j.ID]
		confirmed := j.Confirmed
		m.mu.Unlock()
		if !confirmed {
			select {
			case <-ctx.Done():
				return
			case <-ch:
			case <-time.After(confirmWait):
				m.releaseHolds(ctx, run)
				m.move(j, jobs.Cancelled, "not confirmed within "+confirmWait.String())
				return
			}
			if m.cancelled(j.ID) {
				m.releaseHolds(ctx, run)
				m.move(j, jobs.Cancelled, "cancelled before launch")
				return
			}
			if time.Now().After(run.HeldUntil) {
				m.releaseHolds(ctx, run)
				m.logf(j, "the holds lapsed while waiting for confirmation: re-quoting")
				attempt--
				continue
			}
		}
		m.move(j, jobs.Reserving, "")
		if err := m.commit(ctx, run); err != nil {
			m.logf(j, "commit: %v; re-quoting", err)
			m.releaseHolds(ctx, run)
			continue
		}
		break
	}
	// Escrow: the job's max price (what earlier runs spent is gone).
	run := &j.Runs[k]
	budget := j.Spec.MaxPrice - min(j.Cost, j.Spec.MaxPrice)
	payees := []string{}
	for _, w := range run.Workers {
		if !slices.Contains(payees, w.Payee) {
			payees = append(payees, w.Payee)
		}
	}
	expiry := time.Now().Add(j.Spec.MaxDuration + m.n.cfg.Jobs.EscrowSlack.Duration).Unix()
	tx, err := m.n.ledger.OpenEscrow(ctx, ledger.OpenEscrow{Job: runID, Amount: budget, Expiry: expiry, Payees: payees})
	if err != nil {
		m.releaseHolds(context.WithoutCancel(ctx), run)
		m.move(j, jobs.Failed, "open escrow: "+ledgerReason(err))
		return
	}
	m.save(j, func() { run.Escrow = budget })
	m.logf(j, "escrow of %s credits opened (tx %s)", units.FormatCredits(budget), tx.Hash.String())
	m.move(j, jobs.Escrowed, "")
	m.move(j, jobs.Launching, "")
	if err := m.launch(ctx, j, k, resume); err != nil {
		m.logf(j, "launch: %v", err)
		bg := context.WithoutCancel(ctx)
		m.stopAll(bg, j, k, "launch failed", false)
		m.settle(bg, j, k, nil)
		m.finalStop(bg, j, k)
		m.releaseHolds(bg, run)
		if k+1 < maxRuns {
			m.place(ctx, j, k+1)
			return
		}
		m.move(j, jobs.Failed, "launch failed: "+err.Error())
		return
	}
	m.supervise(ctx, j, k)
}

func machinesOf(r *jobs.Run) string {
	var names []string
	for _, w := range r.Workers {
		name := w.Moniker
		if name == "" {
			name = w.Machine[len(w.Machine)-8:]
		}
		if w.Site != "" {
			name += " (" + w.Site + ")"
		}
		names = append(names, name)
	}
	return strings.Join(names, ", ")
}

// quote publishes run's bid and picks the cheapest placement offered; the
// other quotes' holds are released.
func (m *JobManager) quote(ctx context.Context, j *jobs.Job, runID string) (*jobs.Run, string) {
	s := &j.Spec
	bid := p2p.Bid{JobID: runID, Workers: uint32(s.Workers),
		PerWorker: p2p.Resources{Cores: uint32(s.Cores), MemBytes: s.MemBytes, GPUs: uint32(s.GPUs)},
		MaxPrice:  s.MaxPrice - min(j.Cost, s.MaxPrice), Duration: int64(s.MaxDuration / time.Second),
		BundleCID: j.BundleCID, DatasetCID: j.DatasetCID, Framework: s.Framework, Site: s.Site}
	if !s.Deadline.IsZero() {
		bid.Deadline = s.Deadline.Unix()
	}
	m.n.quotes.forget(runID) // a bid again: only new quotes count
	if _, err := m.n.PublishBid(ctx, api.PublishBidRequest{Bid: bid, TTL: "2m"}); err != nil {
		return nil, "publish bid: " + err.Error()
	}
	start := time.Now()
	var qs []api.ReceivedQuote
	lastNew, count := start, 0
	for {
		select {
		case <-ctx.Done():
			return nil, "stopped"
		case <-time.After(200 * time.Millisecond):
		}
		qs = m.n.quotes.list(runID)
		now := time.Now()
		if len(qs) > count {
			count, lastNew = len(qs), now
		}
		if enoughQuotes(now.Sub(start), now.Sub(lastNew), count, hasPlacement(qs)) {
			break
		}
	}
	best, reasons := choose(qs)
	for i := range qs {
		if q := &qs[i]; q != best && len(q.Workers) > 0 {
			r := runOf(q, m.n)
			m.releaseHolds(ctx, r)
		}
	}
	if best == nil {
		return nil, noPlacement(reasons)
	}
	return runOf(best, m.n), ""
}

// runOf turns a quote into a run's plan.
func runOf(q *api.ReceivedQuote, n *Node) *jobs.Run {
	r := &jobs.Run{ID: q.JobID, PerHour: q.PerHour, Quoted: q.Total, Scheduler: q.Scheduler,
		HeldUntil: time.UnixMilli(q.HeldUntil)}
	offers := map[string]p2p.Offer{}
	for _, h := range n.book.List(time.Now()) {
		offers[h.Offer.Machine] = h.Offer
	}
	for _, w := range q.Workers {
		o := offers[w.Machine]
		r.Workers = append(r.Workers, jobs.Worker{Machine: w.Machine, Moniker: o.Moniker, Site: o.Site,
			Payee: payeeOf(w.Machine), Hold: w.Hold, PerHour: w.PerHour, State: "placed"})
	}
	return r
}

// payeeOf is the ledger address a machine is paid at: its key's.
func payeeOf(machine string) string {
	id, err := peer.Decode(machine)
	if err != nil {
		return ""
	}
	pub, err := id.ExtractPublicKey()
	if err != nil {
		return ""
	}
	raw, err := pub.Raw()
	if err != nil {
		return ""
	}
	return string(identity.AddressOf(raw))
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

// holdsOf lists a run's distinct (machine, hold) pairs.
func holdsOf(r *jobs.Run) [][2]string {
	var out [][2]string
	for _, w := range r.Workers {
		p := [2]string{w.Machine, w.Hold}
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

func (m *JobManager) releaseHolds(ctx context.Context, r *jobs.Run) {
	for _, h := range holdsOf(r) {
		id, err := peer.Decode(h[0])
		if err != nil {
			continue
		}
		m.n.reserve(ctx, id, m.n.machineAddrs(h[0]), p2p.Reserve{Op: p2p.OpRelease, ID: h[1], JobID: r.ID})
	}
}

// commit turns every hold of the run into a commitment; one refusal
// fails the whole (the caller releases and re-quotes).
func (m *JobManager) commit(ctx context.Context, r *jobs.Run) error {
	g, gctx := errgroup.WithContext(ctx)
	for _, h := range holdsOf(r) {
		g.Go(func() error {
			id, err := peer.Decode(h[0])
			if err != nil {
				return err
			}
			reply, err := m.n.reserve(gctx, id, m.n.machineAddrs(h[0]), p2p.Reserve{Op: p2p.OpCommit, ID: h[1], JobID: r.ID})
			if err != nil {
				return err
			}
			if !reply.OK {
				return fmt.Errorf("%s: %s", h[0], reply.Reason)
			}
			return nil
		})
	}
	return g.Wait()
}
