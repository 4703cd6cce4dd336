package submitter

import (
	"context"
	"errors"
	"slices"
	"time"

	ctypes "github.com/cometbft/cometbft/rpc/core/types"

	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/units"
)

func ledgerReason(err error) string {
	var lerr *ledger.Error
	if errors.As(err, &lerr) {
		return lerr.Reason
	}
	return err.Error()
}

// escrow locks run k's budget on the ledger, payable to its machines:
// the job's max price less what earlier runs spent. It reports false when
// the ledger refused, the holds released and the job failed.
func (m *Manager) escrow(ctx context.Context, j *job, k int) bool {
	run := &j.Runs[k]
	budget := j.Spec.MaxPrice - min(j.Cost, j.Spec.MaxPrice)
	payees := []string{}
	for _, w := range run.Workers {
		if !slices.Contains(payees, w.Payee) {
			payees = append(payees, w.Payee)
		}
	}
	expiry := time.Now().Add(j.Spec.MaxDuration + m.p.EscrowSlack).Unix()
	tx, err := m.p.Ledger.OpenEscrow(ctx, ledger.OpenEscrow{Job: jobs.RunID(j.ID, k), Amount: budget, Expiry: expiry, Payees: payees})
	if tx, err = m.outcome(ctx, tx, err); err != nil {
		m.releaseHolds(context.WithoutCancel(ctx), run)
		m.move(j, jobs.Failed, "open escrow: "+ledgerReason(err))
		return false
	}
	run.Escrow = budget
	m.save(j)
	m.logf(j.ID, "escrow of %s credits opened (tx %s)", units.FormatCredits(budget), tx.Hash.String())
	m.move(j, jobs.Escrowed, "")
	return true
}

// outcome waits on a transaction whose commit did not come in time (a
// busy ledger), for up to outcomeWaits more commit timeouts, rather than
// signing another: a second settlement of an escrow the first one
// settled is refused, and a second escrow would lock the budget twice.
func (m *Manager) outcome(ctx context.Context, res *ctypes.ResultTx, err error) (*ctypes.ResultTx, error) {
	var unknown *ledger.UnknownOutcomeError
	for i := 0; i < outcomeWaits && errors.As(err, &unknown) && ctx.Err() == nil; i++ {
		wctx, cancel := context.WithTimeout(ctx, ledger.DefaultCommitTimeout)
		res, err = m.p.Ledger.Wait(wctx, unknown.Hash)
		cancel()
	}
	return res, err
}

// outcomeWaits bounds outcome.
const outcomeWaits = 3

// settle pays each machine of run k its hourly price for the time its
// workers ran (a lost machine what its receipts cover); the rest comes
// back when the escrow's dispute window closes, and the ledger then
// records each machine's job as completed or failed.
func (m *Manager) settle(ctx context.Context, j *job, k int, lost map[int]bool) {
	run := &j.Runs[k]
	if run.Settled || run.Escrow == 0 {
		return
	}
	now := time.Now()
	pays, total := jobs.PayPlan(run, lost, now)
	var tx string
	for attempt := 0; attempt < 5; attempt++ {
		res, err := m.p.Ledger.Settle(ctx, ledger.Settle{Job: run.ID, Payments: pays})
		if res, err = m.outcome(ctx, res, err); err == nil {
			tx = res.Hash.String()
			break
		}
		var lerr *ledger.Error
		if errors.As(err, &lerr) && (lerr.Code == ledger.CodeUnknownEscrow || lerr.Code == ledger.CodeSettled) {
			m.logf(j.ID, "settle: the escrow is settled or gone (claimed or expired): %s", lerr.Reason)
			break
		}
		m.logf(j.ID, "settle: %v (retrying)", err)
		time.Sleep(m.t.settleRetry)
	}
	// A worker whose end no poll saw (its machine slow to stop it, or
	// lost) is recorded as ending where its pay did.
	for i := range run.Workers {
		if w := &run.Workers[i]; !w.Started.IsZero() && w.Ended.IsZero() {
			w.Ended = jobs.RanUntil(w, now).UTC()
		}
	}
	var withheld uint64
	for _, p := range pays {
		withheld += p.Withheld // with total, at most the escrow
	}
	run.Settled, run.SettleTx, run.Paid, run.Ended = tx != "", tx, total, now.UTC()
	if tx != "" {
		run.Withheld = withheld
		j.Cost += total + withheld
	}
	m.save(j)
	if tx != "" {
		for _, p := range pays {
			if p.Refused > 0 || p.Withheld > 0 {
				m.logf(j.ID, "settled: machine %s paid %s credits; the holder refused %d of its %d rounds, %s credits withheld",
					p.Machine, units.FormatCredits(p.Amount), p.Refused, p.Rounds, units.FormatCredits(p.Withheld))
			}
		}
		if withheld > 0 {
			m.logf(j.ID, "settled: %s credits withheld for refused rounds and forfeits: burned when the dispute window closes, not refunded, unless referees uphold a refusal",
				units.FormatCredits(withheld))
		}
		m.logf(j.ID, "settled: paid %s credits to %s; %s come back when the escrow's dispute window closes, less any receipt a machine lodges (tx %s)",
			units.FormatCredits(total), units.Count(len(pays), "machine", "machines"), units.FormatCredits(run.Escrow-total-withheld), tx)
	}
}
