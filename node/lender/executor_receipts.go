package lender

import (
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/units"
)

// keepReceipt hands the claim service the submitter's latest usage
// receipt for this machine, once its signature checks against the
// submitter's key (the escrow's payer, checked at launch): it is what the
// machine lodges against a settlement that pays less, or claims with if
// the submitter never settles. A receipt for another payee, or one the
// submitter did not sign, is dropped with a warning: kept, a junk receipt
// with a high sequence number would shadow the good ones. The error says
// the store did not take a good one (the claim service stores it again
// until it does).
func (e *Executor) keepReceipt(w *worker, from peer.ID, r p2p.Receipt) error {
	lr := ledger.Receipt{Job: w.l.JobID, Payee: r.Payee, Amount: r.Amount, Seq: r.Seq, Sig: r.Sig}
	if r.Payee != string(e.account) || !ledger.VerifyReceipt(payerKey(from), e.chainID, lr) {
		e.log.Warn("dropped a usage receipt that is not the submitter's for this machine", "module", "executor",
			"job", w.l.JobID[:12], "payee", r.Payee, "seq", r.Seq, "amount", r.Amount)
		return nil
	}
	if r.Answer != nil {
		e.keepAnswer(w, from, r.Payee, *r.Answer)
	}
	return e.claims.Keep(lr)
}

// KeepHoldCharge hands the claim service the bidder's receipt for a
// committed hold that ended unlaunched while the run's escrow was open
// (Holds checked its signature at the commit): the machine lodges it
// against that escrow.
func (e *Executor) KeepHoldCharge(r ledger.Receipt) error {
	e.log.Info("a committed hold ended unlaunched: its receipt for the launch window is charged to the run's escrow",
		"module", "executor", "job", r.Job[:12], "amount", r.Amount)
	err := e.claims.Keep(r)
	e.claims.Watch(r.Job) // wakes the claim service: the run is new to it
	return err
}

// HasClaim says whether run has a claim on this machine: a worker of it
// ran here or a receipt of it is kept.
func (e *Executor) HasClaim(run string) bool { return e.claims.Has(run) }

// keepAnswer keeps the payer's signed answer on this machine's rounds of
// a held run (ledger.Answer), the latest one whose signature checks, and
// logs what it says when it says more; one the payer did not sign, or
// for another payee, is dropped with a warning.
func (e *Executor) keepAnswer(w *worker, from peer.ID, payee string, pa p2p.Answer) {
	a := ledger.Answer{Job: w.l.JobID, Payee: payee, Round: pa.Round, Accepted: pa.Accepted, Refused: pa.Refused,
		AcceptedMillis: pa.AcceptedMillis, Reason: pa.Reason, Forfeited: pa.Forfeited, Refusal: (*ledger.Refusal)(pa.Refusal),
		Terms: jobs.AnswerTerms(w.l.Training), Sig: pa.Sig}
	if payee != string(e.account) || !ledger.VerifyAnswer(payerKey(from), e.chainID, a) {
		e.log.Warn("dropped a round answer that is not the submitter's for this machine", "module", "executor",
			"job", w.l.JobID[:12], "payee", payee, "round", pa.Round)
		return
	}
	kept, err := e.claims.KeepAnswer(a)
	if err != nil {
		e.log.Warn("cannot keep a round answer", "module", "executor", "job", w.l.JobID[:12], "err", err)
		return
	}
	if kept {
		e.log.Info("the submitter's signed answer", "module", "executor", "job", w.l.JobID[:12], "round", a.Round,
			"accepted", a.Accepted, "refused", a.Refused, "accepted_s", a.AcceptedMillis/1000, "last_refusal", a.Reason, "forfeited", a.Forfeited)
	}
}

// payerKey is the ed25519 key of peer from (nil if it has none): the key
// its ledger account, and so the escrow's payer, is.
func payerKey(from peer.ID) []byte {
	raw, err := identity.PublicKeyOf(from)
	if err != nil {
		return nil
	}
	return raw
}

// failedHere says whether a worker of run failed on this machine: its
// program exited with an error, or it could not start or broke a limit.
// A failed mark on such a run has its cause here, and is not disputed.
func (e *Executor) failedHere(run string) bool {
	for _, w := range e.snapshot() {
		if w.l.JobID != run || w.holder {
			continue
		}
		w.mu.Lock()
		failed := w.state == p2p.WorkerFailed || (w.state == p2p.WorkerExited && w.exit != 0)
		w.mu.Unlock()
		if failed {
			return true
		}
	}
	return false
}

// receiptEvery is how often a submitter signs its machines a receipt.
const receiptEvery = 30 * time.Second

// UnpaidLag is the stop-loss's lag: a run whose latest receipt here
// covers less than the floor of the time its workers had run UnpaidLag
// ago is stopped. Two receipts late, and slack for the poll and the
// clocks: what a lender risks on a payer that stops paying.
const UnpaidLag = 2*receiptEvery + 15*time.Second

// unpaidRuns are the runs whose workers here this machine stops, unpaid,
// with why: the latest receipt their submitter signed covers less than
// the floor (the launch's share of the price) for the time the run's
// workers here had run UnpaidLag ago. Golem's debit notes work so: a
// lender's exposure to a payer that stops paying is an interval or two.
func (e *Executor) unpaidRuns(now time.Time) map[string]string {
	floors := map[string]uint64{}
	for _, w := range e.snapshot() {
		w.mu.Lock()
		live := w.state == p2p.WorkerRunning && !w.started.IsZero() && !w.holder
		worked := now.Sub(w.started) - w.frozenFor - UnpaidLag
		if !w.frozenAt.IsZero() {
			worked -= now.Sub(w.frozenAt)
		}
		w.mu.Unlock()
		if live && w.l.Floor > 0 && worked > 0 {
			floors[w.l.JobID] += uint64(float64(units.PriceFor(w.l.PerHour, worked)) * w.l.Floor)
		}
	}
	out := map[string]string{}
	for run, floor := range floors {
		if paid := e.claims.Covered(run); paid < floor {
			out[run] = fmt.Sprintf("stopped: unpaid: the submitter's receipts cover %s credits, the floor for the time worked here is %s",
				units.FormatCredits(paid), units.FormatCredits(floor))
		}
	}
	return out
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
		total += units.PriceFor(w.l.PerHour, left)
	}
	return total, running
}
