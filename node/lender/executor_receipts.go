package lender

import (
	"context"
	"strings"
	"time"

	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/p2p"
)

// keepReceipt records the submitter's latest usage receipt for this
// machine, on disk: it is what the machine claims with if the submitter
// never settles.
func (e *Executor) keepReceipt(w *worker, r p2p.Receipt) {
	if r.Payee != string(e.account) {
		return
	}
	key := "receipts/" + w.l.JobID
	var old ledger.Receipt
	if found, _ := e.store.Get(key, &old); found && old.Seq >= r.Seq {
		return
	}
	e.store.Put(key, ledger.Receipt{Job: w.l.JobID, Payee: r.Payee, Amount: r.Amount, Seq: r.Seq, Sig: r.Sig})
}

// claimLater claims this machine's due from a run's escrow after it
// expires, if its payer never settled: the receipts are what it is owed.
func (e *Executor) claimLater(run string) {
	ctx := e.ctx
	esc, err := e.ledger.Escrow(ctx, run)
	if err != nil {
		return
	}
	wait := time.Until(time.Unix(esc.Expiry, 0)) + claimDelay
	select {
	case <-ctx.Done():
		return
	case <-time.After(wait):
	}
	e.claim(ctx, run)
}

func (e *Executor) claim(ctx context.Context, run string) {
	var r ledger.Receipt
	if found, _ := e.store.Get("receipts/"+run, &r); !found || r.Amount == 0 {
		return
	}
	if _, err := e.ledger.Escrow(ctx, run); err != nil {
		return // settled
	}
	// The ledger judges expiry by block time, which lags the clock while
	// the chain is idle (an empty block comes every empty_block_interval):
	// try again until a block is past the expiry.
	for attempt := 1; ; attempt++ {
		_, err := e.ledger.Claim(ctx, r)
		if err == nil {
			break
		}
		if ledger.CodeOf(err) != ledger.CodeNotExpired || attempt == claimAttempts {
			e.log.Warn("claim", "job", run, "err", err)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(claimRetry):
		}
	}
	e.log.Info("claimed from an unsettled escrow", "job", run, "amount", r.Amount)
}

// claimKept schedules the claims of the receipts kept before a restart:
// they still get claimed if their escrows expire unsettled.
func (e *Executor) claimKept() {
	var runs []string
	e.store.Each("receipts/", func(key string, _ []byte) error {
		runs = append(runs, strings.TrimPrefix(key, "receipts/"))
		return nil
	})
	for _, run := range runs {
		go e.claimLater(run)
	}
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
