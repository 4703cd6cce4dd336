package lender

import (
	"time"

	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/p2p"
)

// keepReceipt hands the claim service the submitter's latest usage
// receipt for this machine: it is what the machine claims with if the
// submitter never settles. The error says the store did not take it (the
// claim service stores it again until it does).
func (e *Executor) keepReceipt(w *worker, r p2p.Receipt) error {
	if r.Payee != string(e.account) {
		return nil
	}
	return e.claims.Keep(ledger.Receipt{Job: w.l.JobID, Payee: r.Payee, Amount: r.Amount, Seq: r.Seq, Sig: r.Sig})
}

// Earnings is what the workers running here now will be paid in the next
// d, each at its hourly price until its maximum duration.
func (e *Executor) Earnings(now time.Time, d time.Duration) (total uint64, running int) {
	for _, w := range e.snapshot() {
		w.mu.Lock()
		state, started := w.state, w.started
		w.mu.Unlock()
		if state != p2p.WorkerRunning && state != p2p.WorkerFetching {
			continue
		}
		running++
		left := d
		if !started.IsZero() && w.l.MaxSecs > 0 {
			left = min(d, started.Add(time.Duration(w.l.MaxSecs)*time.Second).Sub(now))
		}
		total += perHourFor(w.l.PerHour, left)
	}
	return total, running
}

// perHourFor is an hourly price for d, rounded down to micro-credits.
func perHourFor(perHour uint64, d time.Duration) uint64 {
	if d <= 0 {
		return 0
	}
	return uint64(float64(perHour) * d.Hours())
}
