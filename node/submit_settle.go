package node

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/units"
)

func ledgerReason(err error) string {
	var lerr *ledger.Error
	if errors.As(err, &lerr) {
		return lerr.Reason
	}
	return err.Error()
}

// used is what worker w of run k has earned by now: its hourly price for
// the time it ran.
func used(run *jobs.Run, w *jobs.Worker, now time.Time) uint64 {
	if w.Started.IsZero() {
		return 0
	}
	end := now
	if !w.Ended.IsZero() {
		end = w.Ended
	} else if !w.LastSeen.IsZero() && w.LastSeen.Before(now) {
		end = w.LastSeen
	}
	if end.Before(w.Started) {
		return 0
	}
	return uint64(float64(w.PerHour) * end.Sub(w.Started).Hours())
}

// settle pays each machine of run k its hourly price for the time its
// workers ran (a lost machine what its receipts cover) and refunds the
// rest; the ledger records each machine's job as completed or failed.
func (m *JobManager) settle(ctx context.Context, j *jobs.Job, k int, lost map[int]bool) {
	run := &j.Runs[k]
	if run.Settled || run.Escrow == 0 {
		return
	}
	now := time.Now()
	owed := map[string]uint64{}
	failed := map[string]bool{}
	var order []string
	m.mu.Lock()
	for i := range run.Workers {
		w := &run.Workers[i]
		if !slices.Contains(order, w.Payee) {
			order = append(order, w.Payee)
		}
		if lost[i] {
			failed[w.Payee] = true
			owed[w.Payee] = max(owed[w.Payee], w.Receipt)
			continue
		}
		if w.State == p2p.WorkerFailed {
			failed[w.Payee] = true
		}
		owed[w.Payee] += used(run, w, now)
	}
	m.mu.Unlock()
	var total uint64
	for _, p := range order {
		total += owed[p]
	}
	// Never more than the escrow holds: scale down if rounding went over.
	if total > run.Escrow {
		for _, p := range order {
			owed[p] = owed[p] * run.Escrow / total
		}
		total = 0
		for _, p := range order {
			total += owed[p]
		}
	}
	pays := make([]ledger.Payment, 0, len(order))
	for _, p := range order {
		pays = append(pays, ledger.Payment{Machine: p, Amount: owed[p], Failed: failed[p]})
	}
	var tx string
	for attempt := 0; attempt < 5; attempt++ {
		res, err := m.n.ledger.Settle(ctx, ledger.Settle{Job: run.ID, Payments: pays})
		if err == nil {
			tx = res.Hash.String()
			break
		}
		var lerr *ledger.Error
		if errors.As(err, &lerr) && lerr.Code == ledger.CodeUnknownEscrow {
			m.logf(j, "settle: the escrow is gone (claimed or expired): %s", lerr.Reason)
			break
		}
		m.logf(j, "settle: %v (retrying)", err)
		time.Sleep(2 * time.Second)
	}
	m.save(j, func() {
		run.Settled, run.SettleTx, run.Paid, run.Ended = tx != "", tx, total, now.UTC()
		if tx != "" {
			j.Cost += total
		}
	})
	if tx != "" {
		m.logf(j, "settled: paid %s credits to %d machine(s), refunded %s (tx %s)", units.FormatCredits(total), len(order), units.FormatCredits(run.Escrow-total), tx)
	}
}
