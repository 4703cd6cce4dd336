package submitter

// The submitter's own decisions: whether a poll found a worker running,
// how long to gather quotes, which to take, when to bid again. They read
// only what they are given (no clock, network, store or lock), so
// decide_test.go tests them by tables. What a poll of a run's workers
// means, how a run ended and what each machine is paid are the job's
// decisions, in node/jobs (decide.go).

import (
	"slices"
	"strings"
	"time"

	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/p2p"
)

// anyRunning reports whether some worker of a poll runs.
func anyRunning(sts []*p2p.JobStatus) bool {
	return slices.ContainsFunc(sts, func(st *p2p.JobStatus) bool { return st != nil && st.State == p2p.WorkerRunning })
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
