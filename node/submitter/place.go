package submitter

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"golang.org/x/sync/errgroup"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/units"
)

// hold gets run k of j its machines: it bids, chooses a quote, waits for
// the job's confirmation and commits the quote's holds. While nothing
// fits, or only above its benefit, the job waits in the queue and bids
// again at its turn; it re-quotes when holds lapse or a commitment is
// refused. It reports false when the job ended instead (cancelled,
// unconfirmed, waited too long, or failed), or the node stops.
func (m *Manager) hold(ctx context.Context, j *job, k int) bool {
	runID := jobs.RunID(j.ID, k)
	defer m.q.leave(j.ID)
	var refused *refusal
	for attempt := 0; ; attempt++ {
		if m.look(j); j.cancelled {
			m.move(j, jobs.Cancelled, "cancelled before launch")
			return false
		}
		if attempt >= commitAttempts {
			m.move(j, jobs.Failed, fmt.Sprintf("machines kept refusing to commit their holds (%d tries)", attempt))
			return false
		}
		if !m.awaitTurn(ctx, j, refused) {
			return false
		}
		if j.State != jobs.Quoting && !m.move(j, jobs.Quoting, "") {
			return false
		}
		run, r := m.quote(ctx, j, runID)
		if ctx.Err() != nil {
			return false // the node stops: the job bids again after its restart
		}
		if run == nil {
			refused = r
			attempt--
			continue
		}
		refused = nil
		m.q.leave(j.ID)
		m.quoted(j, k, run)
		switch m.awaitConfirm(ctx, j, run) {
		case confirmStop:
			return false
		case confirmRequote:
			attempt--
			continue
		}
		m.move(j, jobs.Reserving, "")
		if err := m.commit(ctx, run); err != nil {
			m.logf(j.ID, "commit: %v; re-quoting", err)
			m.releaseHolds(ctx, run)
			continue
		}
		return true
	}
}

// quoted records run as run k of j, the quote the job is to confirm.
func (m *Manager) quoted(j *job, k int, run *jobs.Run) {
	j.Queue = nil
	if len(j.Runs) > k {
		j.Runs[k] = *run
	} else {
		j.Runs = append(j.Runs, *run)
	}
	m.save(j)
	m.logf(j.ID, "quote: %d workers on %s, %s credits an hour, at most %s credits", len(run.Workers),
		machinesOf(run), units.FormatCredits(run.PerHour), units.FormatCredits(run.Quoted))
	if j.ImageCID != "" {
		warm := 0
		for _, w := range run.Workers {
			if w.Warm {
				warm++
			}
		}
		m.logf(j.ID, "quote: %d of %d machines already hold the image, %d fetch it first", warm, len(run.Workers), len(run.Workers)-warm)
	}
}

// What awaitConfirm found.
const (
	confirmGo      = iota // confirmed: commit the holds
	confirmRequote        // the holds lapsed meanwhile (released): quote again
	confirmStop           // the job ended (its holds released), or the node stops
)

// awaitConfirm waits, unless the job is confirmed already, for its
// confirmation of run's quote, at most confirmWait. A cancel taken
// meanwhile ends the job before anything is paid.
func (m *Manager) awaitConfirm(ctx context.Context, j *job, run *jobs.Run) int {
	m.look(j)
	waited := !j.Confirmed
	if waited {
		timer := time.NewTimer(m.t.confirmWait)
		defer timer.Stop()
		for !j.Confirmed {
			select {
			case <-ctx.Done():
				return confirmStop
			case <-j.in.note:
				m.look(j)
			case <-timer.C:
				m.releaseHolds(ctx, run)
				m.move(j, jobs.Cancelled, "not confirmed within "+m.t.confirmWait.String())
				return confirmStop
			}
		}
	}
	if j.cancelled {
		m.releaseHolds(ctx, run)
		m.move(j, jobs.Cancelled, "cancelled before launch")
		return confirmStop
	}
	if waited && time.Now().After(run.HeldUntil) {
		m.releaseHolds(ctx, run)
		m.logf(j.ID, "the holds lapsed while waiting for confirmation: re-quoting")
		return confirmRequote
	}
	return confirmGo
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
// other quotes' holds are released. With no placement it says why, and
// the least price at which one was refused only for costing too much.
func (m *Manager) quote(ctx context.Context, j *job, runID string) (*jobs.Run, *refusal) {
	s := &j.Spec
	bid := p2p.Bid{JobID: runID, Workers: uint32(s.Workers),
		PerWorker: p2p.Resources{Cores: uint32(s.Cores), MemBytes: s.MemBytes, GPUs: uint32(s.GPUs)},
		MaxPrice:  s.MaxPrice - min(j.Cost, s.MaxPrice), Duration: int64(s.MaxDuration / time.Second),
		BundleCID: j.BundleCID, DatasetCID: j.DatasetCID, Framework: s.Framework, Site: s.Site, Training: s.Training, Floor: s.Floor,
		Image: j.ImageCID, ImageBytes: uint64(max(j.ImageBytes, 0))}
	if !s.Deadline.IsZero() {
		bid.Deadline = s.Deadline.Unix()
	}
	fp := m.q.fingerprint()
	m.p.Quotes.forget(runID) // a bid again: only new quotes count
	known := m.p.Quotes.known(time.Now())
	if _, err := m.p.Bids.Publish(ctx, bid, bidTTL); err != nil {
		return nil, &refusal{why: "publish bid: " + err.Error(), on: fp}
	}
	qs, ok := m.gatherQuotes(ctx, j, runID, known)
	m.p.Quotes.close(runID) // later quotes are refused: their holds go
	if !ok {
		return nil, &refusal{why: "stopped", on: fp}
	}
	offers := m.p.Offers.Offers(time.Now())
	best, reasons := choose(qs, coldStarts(offers, bid))
	for i := range qs {
		if q := &qs[i]; q != best && len(q.Workers) > 0 {
			m.releaseHolds(ctx, runOf(q, nil, ""))
		}
	}
	if best == nil {
		return nil, &refusal{why: noPlacement(reasons), priceNow: priceNow(qs, bid.MaxPrice), on: fp}
	}
	return runOf(best, offers, bid.Image), nil
}

// coldStarts is, for a bid in an image, how long each machine takes to
// get ready for it: nothing where this node's offers say it holds the
// image (not a quote's word for it), p2p.ColdStart elsewhere; nil for a
// bid without one.
func coldStarts(offers []p2p.Offer, bid p2p.Bid) func(machine string) time.Duration {
	if bid.Image == "" {
		return nil
	}
	warm := map[string]bool{}
	for i := range offers {
		if offers[i].HoldsImage(bid.Image) {
			warm[offers[i].Machine] = true
		}
	}
	setup := p2p.ColdStart(bid.ImageBytes)
	return func(machine string) time.Duration {
		if warm[machine] {
			return 0
		}
		return setup
	}
}

// bidTTL is how long a bid lives on the market: its quotes come within
// seconds, and a bid again is a new one.
const bidTTL = 2 * time.Minute

// gatherQuotes collects the quotes for j's bid for run runID, just
// published, looking again as each arrives, until enoughQuotes (at once
// when every scheduler of known, those heard from lately, has answered;
// soon after the first placement, quoteWaits.placedAfter);
// false when ctx ends first. What is asked of j meanwhile is taken: a
// cancel stops the gathering.
func (m *Manager) gatherQuotes(ctx context.Context, j *job, runID string, known []string) ([]ReceivedQuote, bool) {
	start := time.Now()
	lastNew, count := start, 0
	w := m.t.quotes
	placed := false
	for {
		now := time.Now()
		qs, arrived := m.p.Quotes.watch(runID)
		all := answeredBy(qs, known)
		if len(qs) > count {
			count, lastNew = len(qs), now
		}
		waited, quiet := now.Sub(start), now.Sub(lastNew)
		if !placed && hasPlacement(qs) {
			placed, w = true, w.placedAfter(waited)
		}
		if enoughQuotes(w, waited, quiet, count, placed, all) {
			return qs, true
		}
		select {
		case <-ctx.Done():
			return nil, false
		case <-arrived:
		case <-j.in.note:
			if m.look(j); j.cancelled {
				return qs, true // what came is chosen from, its holds released after
			}
		case <-time.After(untilEnough(w, waited, quiet)):
		}
	}
}

// runOf turns a quote into a run's plan, naming its machines as their
// offers among held do, which also say which of them hold image (warm).
func runOf(q *ReceivedQuote, held []p2p.Offer, image string) *jobs.Run {
	r := &jobs.Run{ID: q.JobID, PerHour: q.PerHour, Quoted: q.Total, Scheduler: q.Scheduler,
		HeldUntil: time.UnixMilli(q.HeldUntil), Predicted: q.Predicted}
	offers := map[string]p2p.Offer{}
	for _, o := range held {
		offers[o.Machine] = o
	}
	for _, w := range q.Workers {
		o := offers[w.Machine]
		r.Workers = append(r.Workers, jobs.Worker{Machine: w.Machine, Moniker: o.Moniker, Site: o.Site,
			Payee: PayeeOf(w.Machine), Hold: w.Hold, PerHour: w.PerHour, Warm: o.HoldsImage(image), State: jobs.WorkerPlaced})
	}
	return r
}

// PayeeOf is the ledger address a machine is paid at: its key's.
func PayeeOf(machine string) string {
	id, err := peer.Decode(machine)
	if err != nil {
		return ""
	}
	a, err := identity.AddressOfPeer(id)
	if err != nil {
		return ""
	}
	return string(a)
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

func (m *Manager) releaseHolds(ctx context.Context, r *jobs.Run) {
	for _, h := range holdsOf(r) {
		m.p.Machines.Reserve(ctx, h[0], p2p.Reserve{Op: p2p.OpRelease, ID: h[1], JobID: r.ID})
	}
}

// commit turns every hold of the run into a commitment; one refusal
// fails the whole (the caller releases and re-quotes). Each commit
// carries this node's receipt for the hold's quoted price over the launch
// window (p2p.HoldCharge): what the machine is paid from the run's escrow
// if its hold is then left unlaunched.
func (m *Manager) commit(ctx context.Context, r *jobs.Run) error {
	g, gctx := errgroup.WithContext(ctx)
	for _, h := range holdsOf(r) {
		var perHour uint64
		for _, w := range r.Workers {
			if w.Machine == h[0] && w.Hold == h[1] {
				perHour += w.PerHour
			}
		}
		payee := PayeeOf(h[0])
		signed := m.p.Ledger.SignReceipt(ledger.Receipt{Job: r.ID, Payee: payee,
			Amount: p2p.HoldCharge(perHour+perHour/50+1, p2p.HoldChargeWindow)}) // 2% above: the quote's rounding
		receipt := &p2p.Receipt{Payee: payee, Amount: signed.Amount, Seq: signed.Seq, Sig: signed.Sig}
		g.Go(func() error {
			reply, err := m.p.Machines.Reserve(gctx, h[0], p2p.Reserve{Op: p2p.OpCommit, ID: h[1], JobID: r.ID, Receipt: receipt})
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
