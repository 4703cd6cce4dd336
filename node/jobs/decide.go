package jobs

// The decisions of a job's life on its submitter: what one poll of a run's
// workers means, whether and how the run ended, what the job does next,
// and what each machine is paid. They read only what they are given (no
// clock, network, store or lock), so decide_test.go tests them by tables.

import (
	"fmt"
	"maps"
	"math"
	"math/big"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/units"
)

const (
	// LostAfter is how long a worker may go unheard before it is lost.
	LostAfter = 30 * time.Second
	// MaxRuns bounds a job's runs: it is re-placed at most once.
	MaxRuns = 2
	// OutOfTimeSlack is how much sooner than the max duration, counted
	// from the launch, a machine may stop a worker as out of time (it
	// counts from the worker's start, after the launch).
	OutOfTimeSlack = 30 * time.Second
	// FailureSettle is how long a worker's failure waits while others of
	// its run still run: one whose machine is stopping fails its peers'
	// collective ops before its own machine says it stopped it (within
	// p2p.StopGrace).
	FailureSettle = p2p.StopGrace + 5*time.Second
)

// Outcome is how a run ended.
type Outcome int

const (
	RunSucceeded Outcome = iota
	ProgramFailed
	WorkerLost
	RunCancelled
	TimedOut
	LaunchFailed
	RunStalled
)

// Fleet is what one poll found of a run's workers.
type Fleet struct {
	Over   bool         // every worker answered, and none is still fetching or running
	Result string       // the chief exited 0 leaving this output
	Failed string       // why a worker failed (the last one, when several did)
	Lost   map[int]bool // lost workers, found by this poll or an earlier one
	// Vacated are the lost workers whose machines stopped them for their
	// owners (owner first), with the first one's reason: they say when
	// they ended and are paid for what they ran.
	Vacated    map[int]bool
	VacatedWhy string
	// OutOfTime are the workers whose machines stopped them at the job's
	// max duration, as they say (Judge checks it).
	OutOfTime map[int]bool
	// Stalled are the workers whose progress stopped (Stalled).
	Stalled map[int]bool
	Silent  bool // some worker did not answer
	Chief   bool // the chief's machine answered
	// FailedFor is how long polls have found a failure (the supervisor
	// sets it from the first that did).
	FailedFor time.Duration
}

// Survey reads one poll of a run's workers: sts[i] is worker i's status,
// nil when it did not answer. A worker is lost when its machine stopped it
// or it has not been heard from for LostAfter; lost holds the ones found
// lost before, and is not changed.
func Survey(sts []*p2p.JobStatus, ws []Worker, lost map[int]bool, now time.Time) Fleet {
	f := Fleet{Over: true, Lost: maps.Clone(lost), Chief: len(sts) > 0 && sts[0] != nil}
	if f.Lost == nil {
		f.Lost = map[int]bool{}
	}
	for i, st := range sts {
		w := &ws[i]
		switch {
		case st == nil:
			if now.Sub(w.LastSeen) > LostAfter {
				f.Lost[i] = true
			}
			f.Over, f.Silent = false, true
		case st.State == p2p.WorkerStopped && (w.Benched != "" || st.Unpaid && w.Refused > 0):
			// Its submitter stopped it (Benched), or its machine did
			// because the holder refused its rounds (the lender's
			// stop-loss, borne out by the refusals): neither lost nor
			// failed. The machine hears a refusal from its worker before
			// the holder's accounts reach this node: an earlier poll that
			// found the stop before the refusals counted it lost, wrongly.
			delete(f.Lost, i)
		case st.State == p2p.WorkerStopped && st.OutOfTime && !f.Lost[i]:
			if f.OutOfTime == nil {
				f.OutOfTime = map[int]bool{}
			}
			f.OutOfTime[i] = true
		case st.State == p2p.WorkerStopped:
			f.Lost[i] = true // its machine stopped it: withdrawn, shutting down, or its owner's
			if st.Vacated {
				if f.Vacated == nil {
					f.Vacated = map[int]bool{}
					f.VacatedWhy = fmt.Sprintf("worker %d stopped by its machine %s: %s", i, w.Moniker, st.Reason)
				}
				f.Vacated[i] = true
			}
		case st.State == p2p.WorkerFailed:
			f.Failed = fmt.Sprintf("worker %d on %s failed: %s", i, w.Moniker, st.Reason)
		case st.State == p2p.WorkerExited && st.ExitCode != 0:
			f.Failed = fmt.Sprintf("worker %d on %s %s", i, w.Moniker, st.Reason)
		case st.State == p2p.WorkerExited && i == 0 && st.Result != "":
			f.Result = st.Result
		case st.State != p2p.WorkerExited:
			f.Over = false
		}
	}
	return f
}

// RunEnd is how a run ended: its outcome and why, the workers lost, and
// whether the chief is to keep a checkpoint for the next run.
type RunEnd struct {
	Out  Outcome
	Why  string
	Lost map[int]bool
	// Vacated are the lost workers their machines vacated for their
	// owners: paid for the time they ran, unlike the others, which are
	// paid what their receipts cover.
	Vacated    map[int]bool
	Checkpoint bool
}

// Unvacated are the lost workers not vacated for their machines' owners:
// paid only what their receipts cover.
func (e RunEnd) Unvacated() map[int]bool {
	out := map[int]bool{}
	for i := range e.Lost {
		if !e.Vacated[i] {
			out[i] = true
		}
	}
	return out
}

// Judge says whether a run whose workers are f has ended, and how. The
// run was launched at started (zero: not yet) with at most maxDuration
// to run; cancelled is the submitter's cancellation.
func Judge(f Fleet, cancelled bool, started time.Time, maxDuration time.Duration, now time.Time) (RunEnd, bool) {
	if len(f.OutOfTime) > 0 && (started.IsZero() || now.Sub(started) < maxDuration-OutOfTimeSlack) {
		// A machine that says the time is up before it is stopped its
		// worker for nothing: it is lost, paid what its receipts cover.
		for i := range f.OutOfTime {
			f.Lost[i] = true
		}
		f.OutOfTime = nil
	}
	end := RunEnd{Lost: f.Lost, Vacated: f.Vacated}
	switch {
	case f.Failed != "" && len(f.Lost) == 0 && (f.Silent || !f.Over && f.FailedFor < FailureSettle):
		// A worker failing while another is unreachable, or stopping, is
		// most likely the consequence (its collective ops broke): wait to
		// see whether the unreachable one is lost, or for the others'
		// machines to say they stopped them.
		return end, false
	case len(f.OutOfTime) > 0:
		// Its machine stopped a worker at the max duration: the run is
		// out of time, paid for what its workers ran, and not re-placed.
		end.Out, end.Why = TimedOut, "out of time: max duration "+maxDuration.String()+" reached"
	case len(f.Lost) > 0:
		end.Out, end.Why = WorkerLost, fmt.Sprintf("lost %d worker(s): no answer for %s, or stopped by their machine", len(f.Lost), LostAfter)
		if len(f.Vacated) == len(f.Lost) {
			end.Why = f.VacatedWhy
		}
		end.Checkpoint = f.Chief // on a lost worker the chief keeps a checkpoint
	case f.Failed != "":
		end.Out, end.Why = ProgramFailed, f.Failed
	case f.Result != "":
		end.Out = RunSucceeded
	case len(f.Stalled) > 0:
		var who []string
		for _, i := range slices.Sorted(maps.Keys(f.Stalled)) {
			who = append(who, strconv.Itoa(i))
		}
		end.Out, end.Why = RunStalled, fmt.Sprintf("no progress from worker(s) %s for the job's stall_after: stopped, "+
			"each worker paid up to its last progress", strings.Join(who, ", "))
	case cancelled:
		end.Out, end.Why = RunCancelled, "cancelled"
	case !started.IsZero() && now.Sub(started) > maxDuration+time.Minute:
		end.Out, end.Why = TimedOut, "out of time: max duration "+maxDuration.String()+" reached"
	case f.Over:
		end.Out, end.Why = ProgramFailed, "every worker exited but the chief left no result"
	default:
		return end, false
	}
	return end, true
}

// AfterRun is the state a job goes to once run k (0-based) ended with
// out: Quoting when it is re-placed on other machines (a lost worker or a
// failed launch, once), else its terminal state.
func AfterRun(out Outcome, k int) State {
	switch {
	case out == RunSucceeded:
		return Succeeded
	case out == RunCancelled:
		return Cancelled
	case (out == WorkerLost || out == LaunchFailed) && k+1 < MaxRuns:
		return Quoting
	}
	return Failed
}

// Used is what worker w of run k has earned by now: the run's floor of
// its price for the time it ran (FloorOf), or more when its work says so.
// In a held run that is its price for the seconds of its accepted rounds
// (less the share held back until it passes a spot check); otherwise its
// hourly price for the time it ran, less the time its machine's owner had
// it suspended, and, once the run reports progress, only up to its last
// progress (a worker that never reported earns only the floor). At most
// the largest uint64: a price no escrow covers is scaled down by PayPlan,
// not wrapped.
func Used(run *Run, w *Worker, now time.Time) uint64 {
	return max(earned(run, w, now), FloorOf(run, w, now))
}

// FloorOf is what worker w is owed whatever its rounds or progress: the
// run's floor share of its price for the wall time it ran, less
// suspension. A worker that failed a spot check forfeits it.
func FloorOf(run *Run, w *Worker, now time.Time) uint64 {
	if run.Floor <= 0 || w.Started.IsZero() || w.Forfeited {
		return 0
	}
	ran := units.PriceFor(w.PerHour, RanUntil(w, now).Sub(w.Started)-w.Suspended)
	return uint64(float64(ran) * min(run.Floor, 1))
}

// earned is what worker w's work earned by now (Used, without the floor).
func earned(run *Run, w *Worker, now time.Time) uint64 {
	if run.Held() {
		return units.PriceFor(w.PerHour, time.Duration(w.AcceptedSeconds*float64(time.Second)))
	}
	if w.Started.IsZero() {
		return 0
	}
	until := RanUntil(w, now)
	if run.Progress && w.ProgressAt.Before(until) {
		until = w.ProgressAt
	}
	if run.Progress && run.Lockstep {
		if m := medianProgress(run); !m.IsZero() && m.Before(until) {
			until = m
		}
	}
	return units.PriceFor(w.PerHour, until.Sub(w.Started)-w.Suspended)
}

// medianProgress is, in a lockstep run, the lower median of when its
// reporting workers last progressed (zero when none has): a worker that
// says it progressed while the others could not (they wait on it in
// every step) is not paid for it, and one that freezes its count cannot
// hold the others' pay back unless it is the lower half.
func medianProgress(run *Run) time.Time {
	var at []time.Time
	for i := range run.Workers {
		if p := run.Workers[i].ProgressAt; !p.IsZero() {
			at = append(at, p)
		}
	}
	if len(at) == 0 {
		return time.Time{}
	}
	slices.SortFunc(at, time.Time.Compare)
	return at[(len(at)-1)/2]
}

// HolderAccount is what the model's holder of a held job says of one
// worker (holder.json, written by the deepmarket package's Holder).
type HolderAccount struct {
	Accepted    int     `json:"accepted"`
	Refused     int     `json:"refused"`
	Seconds     float64 `json:"seconds"`
	LastRefusal string  `json:"last_refusal"`
	Dropped     bool    `json:"dropped"`
	// Spot checks (see Worker).
	ChecksPassed int     `json:"checks_passed"`
	HeldSeconds  float64 `json:"held_seconds"`
	Forfeited    bool    `json:"forfeited"`
	CheckFailure string  `json:"check_failure"`
	// Refusal names the last update refused, by digest (ledger.Refusal).
	Refusal *ledger.Refusal `json:"refusal"`
}

// AbsentRounds is how many rounds the model's holder may close without a
// worker's update before its submitter stops the worker: a machine that
// runs nothing (or whose worker cannot reach the holder) is paid the
// floor until then, not for the whole job.
const AbsentRounds = 3

// Benched lists the workers of held run the submitter stops while the run
// goes on, each with why: one the holder dropped (it failed a spot check,
// or its updates were refused round after round) that still runs, and
// one absent: no update handed in while the holder closed AbsentRounds
// rounds. A worker already benched, ended or lost is not listed.
func Benched(run *Run) map[int]string {
	out := map[int]string{}
	if !run.Held() {
		return out
	}
	for i := range run.Workers {
		w := &run.Workers[i]
		if w.Benched != "" || !w.Ended.IsZero() || w.Started.IsZero() {
			continue
		}
		switch {
		case w.Forfeited:
			out[i] = "it failed a spot check: " + w.CheckFailure
		case w.Dropped:
			out[i] = "the model's holder dropped it (its updates were refused)"
		case w.Accepted == 0 && w.Refused == 0 && run.HolderRounds >= AbsentRounds:
			out[i] = fmt.Sprintf("it handed no update in while the model's holder closed %d rounds", run.HolderRounds)
		}
	}
	return out
}

// ApplyAccounts records in run's workers what the holder's accounts say,
// keyed by rank; figures only grow (a holder restarted from its
// checkpoint starts its counts again), but a worker that forfeited (failed
// a spot check) is paid nothing from then on; ranks outside the run are
// ignored.
func ApplyAccounts(run *Run, acc map[string]HolderAccount) {
	for rank, a := range acc {
		i, err := strconv.Atoi(rank)
		if err != nil || i < 0 || i >= len(run.Workers) {
			continue
		}
		w := &run.Workers[i]
		if !(a.Seconds >= 0 && a.Seconds < 1e9) { // NaN too
			a.Seconds = 0
		}
		w.Accepted, w.Refused = max(w.Accepted, a.Accepted), max(w.Refused, a.Refused)
		w.AcceptedSeconds = max(w.AcceptedSeconds, a.Seconds)
		w.Dropped = w.Dropped || a.Dropped
		if a.LastRefusal != "" {
			w.LastRefusal = p2p.Clip(a.LastRefusal, 200)
		}
		w.ChecksPassed = max(w.ChecksPassed, a.ChecksPassed)
		if a.HeldSeconds >= 0 && a.HeldSeconds < 1e9 {
			w.HeldSeconds = a.HeldSeconds
		}
		if r := a.Refusal; r != nil && r.Valid() && (w.Refusal == nil || r.Round >= w.Refusal.Round) {
			w.Refusal = r
		}
		if a.Forfeited && !w.Forfeited {
			w.Forfeited, w.CheckFailure = true, p2p.Clip(a.CheckFailure, 200)
		}
		if w.Forfeited {
			if w.AcceptedSeconds > 0 || w.HeldSeconds > 0 {
				w.ForfeitedSeconds = max(w.ForfeitedSeconds, w.AcceptedSeconds+w.HeldSeconds)
			}
			w.AcceptedSeconds, w.HeldSeconds, w.Dropped = 0, 0, true
		}
	}
}

// JudgeHeld is Judge for a held run, whose end is its holder's: it ends
// when the holder exits (succeeded with its output, or failed), on
// cancellation, or out of time. Workers lost, failed or dropped do not end
// it: the holder goes on with the others (they are paid for their
// accepted rounds). holder is the holder's status, nil when it did not
// answer.
func JudgeHeld(f Fleet, holder *p2p.JobStatus, cancelled bool, started time.Time, maxDuration time.Duration, now time.Time) (RunEnd, bool) {
	end := RunEnd{Lost: f.Lost, Vacated: f.Vacated}
	switch {
	case holder != nil && holder.State == p2p.WorkerExited && holder.ExitCode == 0 && holder.Result != "":
		end.Out = RunSucceeded
	case holder != nil && (holder.State == p2p.WorkerFailed || holder.State == p2p.WorkerStopped ||
		holder.State == p2p.WorkerExited && holder.ExitCode != 0):
		end.Out, end.Why = ProgramFailed, "the model's holder (on this machine) "+holderWhy(holder)
	case holder != nil && holder.State == p2p.WorkerExited:
		end.Out, end.Why = ProgramFailed, "the model's holder exited but left no result"
	case cancelled:
		end.Out, end.Why = RunCancelled, "cancelled"
	case len(f.OutOfTime) > 0 || !started.IsZero() && now.Sub(started) > maxDuration+time.Minute:
		end.Out, end.Why = TimedOut, "out of time: max duration "+maxDuration.String()+" reached"
	default:
		return end, false
	}
	return end, true
}

func holderWhy(st *p2p.JobStatus) string {
	switch st.State {
	case p2p.WorkerFailed:
		return "failed: " + st.Reason
	case p2p.WorkerStopped:
		return "was stopped: " + st.Reason
	}
	return st.Reason
}

// RanUntil is the end of worker w's run as counted at now: when it ended,
// or, while it has not reported an end, when it was last seen running.
func RanUntil(w *Worker, now time.Time) time.Time {
	switch {
	case !w.Ended.IsZero():
		return w.Ended
	case !w.LastSeen.IsZero() && w.LastSeen.Before(now):
		return w.LastSeen
	}
	return now
}

// PayPlan is what run's settlement pays, one payment per machine in the
// order the workers list them: each machine what its workers earned
// (Used; in a held run the share held back for spot checks is paid too,
// unless the worker failed one: a share never checked is released here),
// a lost machine what its receipts cover, all scaled down to the escrow
// if rounding went over it. total is their sum. A machine is marked
// failed only with a cause: it was lost, its worker failed, or it failed
// a spot check; refused rounds alone do not mark it (the ledger counts an
// undisputed mark only). The arithmetic cannot overflow: what machines
// are owed is summed in 128 bits and each share scaled with a 128-bit
// product, so every payment is exact (rounded down) for any amounts the
// ledger holds, the sum is at most the escrow, and no payment shrinks
// when the escrow grows.
func PayPlan(run *Run, lost map[int]bool, now time.Time) (pays []ledger.Payment, total uint64) {
	owed, withheld, receipt := map[string]uint64{}, map[string]uint64{}, map[string]uint64{}
	failed := map[string]bool{}
	rounds, refused := map[string]uint32{}, map[string]uint32{}
	var order []string
	for i := range run.Workers {
		w := &run.Workers[i]
		if !slices.Contains(order, w.Payee) {
			order = append(order, w.Payee)
		}
		if run.Held() {
			// Its own statistic on the ledger, not a mark.
			rounds[w.Payee] = min(rounds[w.Payee]+uint32(min(w.Accepted+w.Refused, ledger.MaxRounds)), ledger.MaxRounds)
			refused[w.Payee] = min(refused[w.Payee]+uint32(min(w.Refused, ledger.MaxRounds)), rounds[w.Payee])
		}
		if lost[i] {
			failed[w.Payee] = true
			owed[w.Payee] = max(owed[w.Payee], w.Receipt)
			continue
		}
		// A worker its holder dropped fails (its next push is refused):
		// the payer's word, not a cause, unless it failed a spot check.
		if w.State == p2p.WorkerFailed && !(run.Held() && w.Dropped) || (run.Held() && w.Forfeited) {
			failed[w.Payee] = true
		}
		receipt[w.Payee] = max(receipt[w.Payee], w.Receipt)
		pay := Used(run, w, now)
		switch {
		case run.Held() && !w.Forfeited:
			pay = max(pay, units.PriceFor(w.PerHour, time.Duration((w.AcceptedSeconds+w.HeldSeconds)*float64(time.Second))))
			withheld[w.Payee] = satAdd(withheld[w.Payee], refusedShare(w, now, pay))
		case run.Held():
			withheld[w.Payee] = satAdd(withheld[w.Payee], forfeitedShare(run, w, now, pay))
		}
		owed[w.Payee] = satAdd(owed[w.Payee], pay)
	}
	// Never less than a machine's latest receipt (its workers' together):
	// it would lodge it. What that adds comes out of what is withheld, so
	// a forfeit after a receipt takes back only what is unreceipted.
	for p, r := range receipt {
		if r > owed[p] {
			withheld[p] -= min(withheld[p], r-owed[p])
			owed[p] = r
		}
	}
	var sum uint128
	for _, p := range order {
		sum = sum.add(owed[p])
	}
	// Never more than the escrow holds: scale down if rounding went over.
	if sum.hi != 0 || sum.lo > run.Escrow {
		for _, p := range order {
			owed[p] = mulDiv(owed[p], run.Escrow, sum)
		}
	}
	pays = make([]ledger.Payment, 0, len(order))
	for _, p := range order {
		total += owed[p] // at most the escrow, summed
		pays = append(pays, ledger.Payment{Machine: p, Amount: owed[p], Failed: failed[p], Rounds: rounds[p], Refused: refused[p]})
	}
	left := run.Escrow - min(total, run.Escrow)
	for i := range pays {
		if p := &pays[i]; p.Refused > 0 || p.Failed {
			p.Withheld = min(withheld[p.Machine], left)
			left -= p.Withheld
		}
	}
	return pays, total
}

// refusedShare is what worker w's refused rounds would have paid it in a
// held run beyond pay, what it is paid: each of its rounds, accepted or
// refused, counted as an equal share of the time it ran, at its price;
// at most what the rest of that time would pay. A settlement withholds
// it (ledger.Payment.Withheld): the ledger burns it rather than refund
// it, unless referees uphold the refusal, so refusing a round never pays
// the payer.
func refusedShare(w *Worker, now time.Time, pay uint64) uint64 {
	taken := w.Accepted + w.Refused
	if w.Refused <= 0 || taken <= 0 || w.Started.IsZero() {
		return 0
	}
	ran := RanUntil(w, now).Sub(w.Started) - w.Suspended
	full := units.PriceFor(w.PerHour, ran)
	share := units.PriceFor(w.PerHour, time.Duration(float64(ran)*float64(w.Refused)/float64(taken)))
	return min(share, full-min(full, pay))
}

// forfeitedShare is what worker w, forfeited by its holder's spot check,
// would have been paid beyond pay without the forfeit: the floor and its
// accepted and held rounds (ForfeitedSeconds). A settlement withholds it:
// the ledger burns it, so a forfeit the payer's holder declares saves the
// payer nothing (referees cannot replay a spot check: nobody can uphold
// one), and the worker is paid what its receipts covered.
func forfeitedShare(run *Run, w *Worker, now time.Time, pay uint64) uint64 {
	cleared := *w
	cleared.Forfeited = false
	full := max(FloorOf(run, &cleared, now), units.PriceFor(w.PerHour, time.Duration(w.ForfeitedSeconds*float64(time.Second))))
	return full - min(full, pay)
}

// AnswerTo is what held run's holder has answered payee's workers so far
// (summed over them), unsigned: the rounds accepted and refused, the
// accepted seconds, the last refusal's reason and what it refused, a
// forfeit, and the terms of t (the bid's training terms) it judged by.
func AnswerTo(run *Run, payee string, t *p2p.Training) ledger.Answer {
	a := ledger.Answer{Job: run.ID, Payee: payee, Round: uint64(max(run.HolderRounds, 0)), Terms: AnswerTerms(t)}
	var ms float64
	for i := range run.Workers {
		w := &run.Workers[i]
		if w.Payee != payee {
			continue
		}
		a.Accepted = min(a.Accepted+uint32(min(max(w.Accepted, 0), ledger.MaxRounds)), ledger.MaxRounds)
		a.Refused = min(a.Refused+uint32(min(max(w.Refused, 0), ledger.MaxRounds)), ledger.MaxRounds)
		ms += w.AcceptedSeconds * 1000
		if w.LastRefusal != "" {
			a.Reason = w.LastRefusal
		}
		if r := w.Refusal; r != nil && (a.Refusal == nil || r.Round > a.Refusal.Round) {
			a.Refusal = r
		}
		a.Forfeited = a.Forfeited || w.Forfeited
	}
	if ms > 0 && ms < 1<<62 {
		a.AcceptedMillis = uint64(ms)
	}
	return a
}

// AnswerTerms are the terms of a held job's bid (t) a signed answer
// binds: both sides fill them from the bid they hold.
func AnswerTerms(t *p2p.Training) ledger.Terms {
	if t == nil {
		return ledger.Terms{}
	}
	c := t.Checks
	if c == nil {
		c = p2p.DefaultChecks()
	}
	return ledger.Terms{Validation: t.Validation, Tolerance: c.Tolerance, Echo: c.Echo, Residual: c.Residual}
}

// OwedSoFar is what each machine of run has earned by now, capped at the
// escrow: what its next receipt covers.
func OwedSoFar(run *Run, now time.Time) map[string]uint64 {
	owed := map[string]uint64{}
	for i := range run.Workers {
		p := run.Workers[i].Payee
		owed[p] = satAdd(owed[p], Used(run, &run.Workers[i], now))
	}
	for p, amount := range owed {
		owed[p] = min(amount, run.Escrow)
	}
	return owed
}

// satAdd is a+b, or the largest uint64 when that overflows.
func satAdd(a, b uint64) uint64 {
	s, carry := bits.Add64(a, b, 0)
	if carry != 0 {
		return math.MaxUint64
	}
	return s
}

// uint128 is a sum of uint64 amounts that cannot overflow.
type uint128 struct{ hi, lo uint64 }

func (u uint128) add(v uint64) uint128 {
	var carry uint64
	u.lo, carry = bits.Add64(u.lo, v, 0)
	u.hi += carry
	return u
}

// mulDiv is a*b/sum rounded down, for a share a of sum (a <= sum, so the
// result is at most b): the product is 128 bits, and a sum past 64 bits
// is divided in big integers.
func mulDiv(a, b uint64, sum uint128) uint64 {
	hi, lo := bits.Mul64(a, b)
	if sum.hi == 0 {
		q, _ := bits.Div64(hi, lo, sum.lo) // hi < sum.lo, as a <= sum
		return q
	}
	prod := new(big.Int).Lsh(new(big.Int).SetUint64(hi), 64)
	prod.Or(prod, new(big.Int).SetUint64(lo))
	div := new(big.Int).Lsh(new(big.Int).SetUint64(sum.hi), 64)
	div.Or(div, new(big.Int).SetUint64(sum.lo))
	return prod.Quo(prod, div).Uint64()
}

// Stalled are run's live workers whose progress has not grown for
// stallAfter, once the run reports progress (Run.Progress): counted from
// its last progress, or from its start when it never reported. A worker
// that ended is not stalled.
func Stalled(run *Run, stallAfter time.Duration, now time.Time) map[int]bool {
	if !run.Progress || stallAfter <= 0 {
		return nil
	}
	var out map[int]bool
	for i := range run.Workers {
		w := &run.Workers[i]
		if w.State != p2p.WorkerRunning || w.SuspendedNow {
			continue
		}
		since := w.ProgressAt
		if since.IsZero() {
			since = w.Started
		}
		if since.IsZero() || now.Sub(since)-w.Suspended <= stallAfter {
			continue
		}
		if out == nil {
			out = map[int]bool{}
		}
		out[i] = true
	}
	return out
}
