package submitter

// The submitter's decisions: what a poll of a run's workers means, how a
// run ended and what the job does next, what each machine is paid, which
// quote to take. They read only what they are given (no clock, network,
// store or lock), so decide_test.go tests them by tables.

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/p2p"
)

// outcome is how a run ended.
type outcome int

const (
	succeeded outcome = iota
	programFailed
	workerLost
	wasCancelled
	timedOut
	launchFailed
)

// fleet is what one poll found of a run's workers.
type fleet struct {
	over   bool         // every worker answered, and none is still fetching or running
	result string       // the chief exited 0 leaving this output
	failed string       // why a worker failed (the last one, when several did)
	lost   map[int]bool // lost workers, found by this poll or an earlier one
	silent bool         // some worker did not answer
	chief  bool         // the chief's machine answered
}

// survey reads one poll of a run's workers: sts[i] is worker i's status,
// nil when it did not answer. A worker is lost when its machine stopped it
// or it has not been heard from for lostAfter; lost holds the ones found
// lost before, and is not changed.
func survey(sts []*p2p.JobStatus, ws []jobs.Worker, lost map[int]bool, now time.Time) fleet {
	f := fleet{over: true, lost: maps.Clone(lost), chief: len(sts) > 0 && sts[0] != nil}
	if f.lost == nil {
		f.lost = map[int]bool{}
	}
	for i, st := range sts {
		w := &ws[i]
		switch {
		case st == nil:
			if now.Sub(w.LastSeen) > lostAfter {
				f.lost[i] = true
			}
			f.over, f.silent = false, true
		case st.State == p2p.WorkerStopped:
			f.lost[i] = true // its machine stopped it: withdrawn or shutting down
		case st.State == p2p.WorkerFailed:
			f.failed = fmt.Sprintf("worker %d on %s failed: %s", i, w.Moniker, st.Reason)
		case st.State == p2p.WorkerExited && st.ExitCode != 0:
			f.failed = fmt.Sprintf("worker %d on %s %s", i, w.Moniker, st.Reason)
		case st.State == p2p.WorkerExited && i == 0 && st.Result != "":
			f.result = st.Result
		case st.State != p2p.WorkerExited:
			f.over = false
		}
	}
	return f
}

// runEnd is how a run ended: its outcome and why, the workers lost, and
// whether the chief is to keep a checkpoint for the next run.
type runEnd struct {
	out        outcome
	why        string
	lost       map[int]bool
	checkpoint bool
}

// judge says whether a run whose workers are f has ended, and how. The
// run was launched at started (zero: not yet) with at most maxDuration
// to run; cancelled is the submitter's cancellation.
func judge(f fleet, cancelled bool, started time.Time, maxDuration time.Duration, now time.Time) (runEnd, bool) {
	end := runEnd{lost: f.lost}
	switch {
	case f.failed != "" && f.silent && len(f.lost) == 0:
		// A worker failing while another is unreachable is most likely
		// the consequence (its collective ops broke): wait to see whether
		// the unreachable one is lost.
		return end, false
	case len(f.lost) > 0:
		end.out, end.why = workerLost, fmt.Sprintf("lost %d worker(s): no answer for %s, or stopped by their machine", len(f.lost), lostAfter)
		end.checkpoint = f.chief // on a lost worker the chief keeps a checkpoint
	case f.failed != "":
		end.out, end.why = programFailed, f.failed
	case f.result != "":
		end.out = succeeded
	case cancelled:
		end.out, end.why = wasCancelled, "cancelled"
	case !started.IsZero() && now.Sub(started) > maxDuration+time.Minute:
		end.out, end.why = timedOut, "max duration "+maxDuration.String()+" reached"
	case f.over:
		end.out, end.why = programFailed, "every worker exited but the chief left no result"
	default:
		return end, false
	}
	return end, true
}

// anyRunning reports whether some worker of a poll runs.
func anyRunning(sts []*p2p.JobStatus) bool {
	return slices.ContainsFunc(sts, func(st *p2p.JobStatus) bool { return st != nil && st.State == p2p.WorkerRunning })
}

// afterRun is the state a job goes to once run k (0-based) ended with
// out: Quoting when it is re-placed on other machines (a lost worker or a
// failed launch, once), else its terminal state.
func afterRun(out outcome, k int) jobs.State {
	switch {
	case out == succeeded:
		return jobs.Succeeded
	case out == wasCancelled:
		return jobs.Cancelled
	case (out == workerLost || out == launchFailed) && k+1 < maxRuns:
		return jobs.Quoting
	}
	return jobs.Failed
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

// payPlan is what run's settlement pays, one payment per machine in the
// order the workers list them: each machine its hourly price for the time
// its workers ran (a lost machine what its receipts cover, marked failed,
// as is one whose worker failed), all scaled down to the escrow if
// rounding went over it. total is their sum.
func payPlan(run *jobs.Run, lost map[int]bool, now time.Time) (pays []ledger.Payment, total uint64) {
	owed := map[string]uint64{}
	failed := map[string]bool{}
	var order []string
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
	pays = make([]ledger.Payment, 0, len(order))
	for _, p := range order {
		pays = append(pays, ledger.Payment{Machine: p, Amount: owed[p], Failed: failed[p]})
	}
	return pays, total
}

// owedSoFar is what each machine of run has earned by now, capped at the
// escrow: what its next receipt covers.
func owedSoFar(run *jobs.Run, now time.Time) map[string]uint64 {
	owed := map[string]uint64{}
	for i := range run.Workers {
		owed[run.Workers[i].Payee] += used(run, &run.Workers[i], now)
	}
	for p, amount := range owed {
		owed[p] = min(amount, run.Escrow)
	}
	return owed
}

// enoughQuotes says when to stop gathering quotes for a bid published
// waited ago, count of them in so far, the last new one quiet ago: a
// placement after the usual wait; or only refusals, and no scheduler has
// said anything more for a second; or the limit.
func enoughQuotes(waited, quiet time.Duration, count int, placed bool) bool {
	return (waited >= quoteWait && placed) || (waited >= quoteWait && count > 0 && quiet >= time.Second) ||
		waited >= quoteWaitMax
}

// untilEnough is how long after a look at the quotes (waited and quiet
// as for enoughQuotes, which said no) its answer may change with no new
// quote arriving: when the usual wait ends, refusals have been quiet for
// a second, or the limit is reached.
func untilEnough(waited, quiet time.Duration) time.Duration {
	d := quoteWaitMax - waited
	if waited < quoteWait {
		d = min(d, quoteWait-waited)
	} else if quiet < time.Second {
		d = min(d, time.Second-quiet)
	}
	return max(d, time.Millisecond)
}

// hasPlacement reports whether some quote places the job.
func hasPlacement(qs []api.ReceivedQuote) bool {
	for _, q := range qs {
		if len(q.Workers) > 0 {
			return true
		}
	}
	return false
}

// choose picks the cheapest quote that places the job (nil when none
// does), and up to five refusals' reasons.
func choose(qs []api.ReceivedQuote) (best *api.ReceivedQuote, reasons []string) {
	for i := range qs {
		q := &qs[i]
		if len(q.Workers) == 0 {
			if len(reasons) < 5 {
				reasons = append(reasons, q.Reason)
			}
			continue
		}
		if best == nil || q.Total < best.Total {
			best = q
		}
	}
	return best, reasons
}

// noPlacement says why a bid found no placement, given its refusals'
// reasons (sorted in place).
func noPlacement(reasons []string) string {
	if len(reasons) == 0 {
		return noScheduler
	}
	// Schedulers that see the same machines give the same reason.
	slices.Sort(reasons)
	return "no machine can take the job now: " + strings.Join(slices.Compact(reasons), "; ")
}

// noScheduler is why a bid no scheduler answered found no placement.
const noScheduler = "no scheduler answered the bid: are any machines lending on this network?"

// bidAgain says whether a bid that found no placement for why is worth
// repeating, after bids repeats: capacity frees as other jobs end (or,
// re-placing, as the previous run's workers stop), but not when no
// scheduler answered at all.
func bidAgain(why string, bids int) bool {
	return bids < rebids && !strings.HasPrefix(why, "no scheduler answered")
}
