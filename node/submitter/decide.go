package submitter

// The submitter's own decisions: whether a poll found a worker running,
// how long to gather quotes, which to take; and, for its queue, in what
// order waiting jobs bid, which bid now and how long one may wait. They read
// only what they are given (no clock, network, store or lock), so
// decide_test.go tests them by tables. What a poll of a run's workers
// means, how a run ended and what each machine is paid are the job's
// decisions, in node/jobs (decide.go).

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"time"

	"github.com/deepmarket/deepmarket/p2p"
)

// anyRunning reports whether some worker of a poll runs.
func anyRunning(sts []*p2p.JobStatus) bool {
	return slices.ContainsFunc(sts, func(st *p2p.JobStatus) bool { return st != nil && st.State == p2p.WorkerRunning })
}

// quoteWaits bound how long the quotes for a bid are gathered.
type quoteWaits struct {
	usual time.Duration // a placement is taken after this at the latest
	max   time.Duration // the most a bid waits for its first quote
	// quiet is how long after the last refusal, with no placement, no
	// other answer is expected.
	quiet time.Duration
	// least is the shortest wait for quotes once one places the job
	// (see placedAfter).
	least time.Duration
}

// placedAfter is w once the first placement came first after the bid:
// the quotes that compete with it come about as fast (their schedulers
// price the same offers), so the usual wait shrinks to thrice the first's
// delay, w.least at least. A quote later than that is a scheduler's that
// lost the race for the same machines and quotes again on what is left,
// which costs more. A slow network's first quote is slow too, and keeps
// the wait long.
func (w quoteWaits) placedAfter(first time.Duration) quoteWaits {
	w.usual = min(w.usual, max(w.least, 3*first))
	return w
}

// enoughQuotes says when to stop gathering quotes for a bid published
// waited ago, count of them in so far, the last new one quiet ago, all
// telling whether every scheduler heard from lately has answered: then
// at once, since no other quote is coming; else a placement after the
// usual wait; or only refusals, and no scheduler has said anything more
// for w.quiet; or the limit.
func enoughQuotes(w quoteWaits, waited, quiet time.Duration, count int, placed, all bool) bool {
	return (all && count > 0) || (waited >= w.usual && placed) || (waited >= w.usual && count > 0 && quiet >= w.quiet) ||
		waited >= w.max
}

// untilEnough is how long after a look at the quotes (waited and quiet
// as for enoughQuotes, which said no) its answer may change with no new
// quote arriving: when the usual wait ends, refusals have been quiet
// long enough, or the limit is reached.
func untilEnough(w quoteWaits, waited, quiet time.Duration) time.Duration {
	d := w.max - waited
	if waited < w.usual {
		d = min(d, w.usual-waited)
	} else if quiet < w.quiet {
		d = min(d, w.quiet-quiet)
	}
	return max(d, time.Millisecond)
}

// hasPlacement reports whether some quote places the job.
func hasPlacement(qs []ReceivedQuote) bool {
	for _, q := range qs {
		if len(q.Workers) > 0 {
			return true
		}
	}
	return false
}

// choose picks the cheapest quote that places the job (nil when none
// does), and up to five refusals' reasons. A job in an image counts each
// worker's price for the setup of its machine, cold(machine) (nil: none),
// as the schedulers did: where schedulers raced for the machine that
// holds the image, the one that got it quotes a little dearer than those
// that fell back on a cheaper machine that must fetch it first.
func choose(qs []ReceivedQuote, cold func(machine string) time.Duration) (best *ReceivedQuote, reasons []string) {
	var bestCost float64
	for i := range qs {
		q := &qs[i]
		if len(q.Workers) == 0 {
			if len(reasons) < 5 {
				reasons = append(reasons, q.Reason)
			}
			continue
		}
		cost := float64(q.Total)
		if cold != nil {
			for _, w := range q.Workers {
				cost += float64(w.PerHour) * cold(w.Machine).Hours()
			}
		}
		if best == nil || cost < bestCost {
			best, bestCost = q, cost
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

// waiter is a job in the queue, as the queue's decisions see it.
type waiter struct {
	id    string
	since time.Time // waiting since
	score float64   // benefit per cost: bids before lower scores
	need  shape
	// next is when it bids again whatever the offers show (its offers
	// may not show every machine the schedulers see).
	next time.Time
	// seen is the offers' fingerprint its last bid was refused on: room
	// there is no reason to bid again.
	seen    uint64
	bidding bool // granted its turn, its bid not yet answered
	// blind: granted because its next bid was due, with no room showing
	// for it.
	blind bool
}

// shape is what a job asks of the machines.
type shape struct {
	workers    int
	per        p2p.Resources
	tensorflow bool
}

// room is what one machine has free, by its offer.
type room struct {
	free       p2p.Resources
	tensorflow bool
}

// queueOrder sorts waiting jobs into the order they bid: first those that
// have waited starve or longer, the longest waiting first, which bounds
// starvation; then by benefit per cost, highest first; then the longest
// waiting.
func queueOrder(ws []*waiter, now time.Time, starve time.Duration) {
	slices.SortStableFunc(ws, func(a, b *waiter) int {
		sa, sb := now.Sub(a.since) >= starve, now.Sub(b.since) >= starve
		switch {
		case sa && !sb:
			return -1
		case sb && !sa:
			return 1
		case !sa && a.score != b.score:
			return cmp.Compare(b.score, a.score)
		}
		return cmp.Or(a.since.Compare(b.since), strings.Compare(a.id, b.id))
	})
}

// pickBidders chooses, of the waiting jobs in queue order, those that bid
// now, at most slots of them: a job whose workers fit the room the offers
// show (room it was not refused on; the jobs before it, and those bidding
// already, take theirs first); and, one at a time, the first whose next
// bid is due though no room shows for it (a blind bid, for machines the
// schedulers see and this node does not; one at a time, so a long queue
// does not flood the market with bids nothing shows room for). A job
// that has waited starve or longer and is not picked holds back the jobs
// after it, so the room that frees up goes to it. rooms is used up; the
// blind ones picked are marked so.
func pickBidders(order []*waiter, rooms []room, fingerprint uint64, now time.Time, starve time.Duration, slots int) []*waiter {
	blind := false
	for _, w := range order {
		if w.bidding {
			fit(rooms, w.need)
			slots--
			blind = blind || w.blind
		}
	}
	var picked []*waiter
	for _, w := range order {
		if w.bidding {
			continue
		}
		if slots <= 0 {
			break
		}
		roomy := w.seen != fingerprint && fit(rooms, w.need)
		if roomy || (!blind && !now.Before(w.next)) {
			w.blind = !roomy
			blind = blind || w.blind
			picked = append(picked, w)
			slots--
			continue
		}
		if now.Sub(w.since) >= starve {
			break
		}
	}
	return picked
}

// fit places need's workers on rooms, first fit, taking the room they
// use; when they do not all fit it reports false and takes nothing.
func fit(rooms []room, need shape) bool {
	took := make([]int, len(rooms))
	left := need.workers
	for i := range rooms {
		r := &rooms[i]
		if need.tensorflow && !r.tensorflow {
			continue
		}
		for left > 0 && fits(r.free, need.per, took[i]+1) {
			took[i]++
			left--
		}
		if left == 0 {
			break
		}
	}
	if left > 0 {
		return false
	}
	for i, n := range took {
		for range n {
			rooms[i].free = minus(rooms[i].free, need.per)
		}
	}
	return true
}

// fits reports whether n workers of per fit in free.
func fits(free, per p2p.Resources, n int) bool {
	k := uint64(n)
	return uint64(free.Cores) >= k*uint64(per.Cores) && free.MemBytes >= k*per.MemBytes && uint64(free.GPUs) >= k*uint64(per.GPUs)
}

func minus(a, b p2p.Resources) p2p.Resources {
	return p2p.Resources{Cores: a.Cores - min(a.Cores, b.Cores), MemBytes: a.MemBytes - min(a.MemBytes, b.MemBytes), GPUs: a.GPUs - min(a.GPUs, b.GPUs)}
}

// roomsOf is the room the offers show, and their fingerprint: a hash of
// what each offers and has allocated, and at what price, the same
// whatever order the offers come in.
func roomsOf(offers []p2p.Offer) ([]room, uint64) {
	rooms := make([]room, 0, len(offers))
	var fp uint64
	for _, o := range offers {
		rooms = append(rooms, room{free: minus(o.Lent, o.Allocated), tensorflow: o.Software.TensorFlow != ""})
		h := fnv.New64a()
		fmt.Fprintf(h, "%s|%v|%v|%v|%s", o.Machine, o.Lent, o.Allocated, o.Price, o.Software.TensorFlow)
		fp += h.Sum64()
	}
	return rooms, fp
}

// backoff is how long after its bids-th bid from the queue a job bids
// again when the offers show no room for it: 2 s (a collision with
// another bid clears that fast), doubling to 2 min.
func backoff(bids int) time.Duration {
	return min(2*time.Second<<min(bids, 6), 2*time.Minute)
}

// waitLimit is when a job waiting since since must stop waiting, and
// why: its max wait; its deadline, less its duration, after which it
// cannot finish in time; an unconfirmed job's time to be confirmed
// (confirmWait from its creation).
func waitLimit(since, created time.Time, maxWait time.Duration, deadline time.Time, duration time.Duration, confirmed bool,
	confirmWait time.Duration) (time.Time, string) {
	limit := since.Add(maxWait)
	why := fmt.Sprintf("waited %s (its max_wait) for machines", maxWait)
	if !deadline.IsZero() && deadline.Add(-duration).Before(limit) {
		limit = deadline.Add(-duration)
		why = fmt.Sprintf("it can no longer finish by its deadline %s (it may run %s)", deadline.UTC().Format(time.RFC3339), duration)
	}
	if c := created.Add(confirmWait); !confirmed && c.Before(limit) {
		limit, why = c, "not confirmed within "+confirmWait.String()
	}
	return limit, why
}

// score is a job's benefit per cost: its max price over what its
// resources cost for its duration at the reference prices.
func score(maxPrice uint64, need shape, duration time.Duration, ref p2p.Prices) float64 {
	perWorker := float64(need.per.Cores)*float64(ref.CoreHour) + float64(need.per.MemBytes)/(1<<30)*float64(ref.MemGiBHour) +
		float64(need.per.GPUs)*float64(ref.GPUHour)
	cost := perWorker * float64(need.workers) * duration.Hours()
	if cost <= 0 {
		return float64(maxPrice)
	}
	return float64(maxPrice) / cost
}

// priceNow is the least a refusal for price said the job costs now (0
// when none did). A refusal for price says the job costs more than
// maxPrice: a figure that does not is a scheduler's mistake or lie, and
// is not shown.
func priceNow(qs []ReceivedQuote, maxPrice uint64) uint64 {
	var least uint64
	for _, q := range qs {
		if len(q.Workers) == 0 && q.Resource == "price" && q.Total > maxPrice && (least == 0 || q.Total < least) {
			least = q.Total
		}
	}
	return least
}
