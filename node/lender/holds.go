package lender

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/units"
)

// Holds is a lending machine's own book of what schedulers have reserved
// on it. The machine is the only authority over its capacity: schedulers
// with overlapping views ask it, and it grants a hold only if the hold
// fits beside the others, so it can never be over-committed whoever asks.
//
// A hold is granted only for a bid the machine has checked itself (see
// Admission.CheckBid): signed by a ledger member whose balance covers its
// maximum price, and asking for no more than the bid's workers need. An
// uncommitted hold lapses after its TTL; a committed one lapses unless a
// launch backed by an escrow arrives within HoldLimits.LaunchWithin; a
// launched one stays until its worker ends. One bidder account and one
// scheduler may hold only so much at a time, so nobody freezes a machine
// with requests it never means to pay for. Holds live in memory: a
// restarted machine has none. The owner sees them (`lend --json`) and may
// release any that is not running a worker.
type Holds struct {
	mu     sync.Mutex
	lent   func() p2p.Resources // what the machine lends now (zero when not offering)
	limits HoldLimits
	holds  map[string]*hold
	// changed is told when the allocation changes, so the offer that
	// carries it is re-announced.
	changed func()
	// lapse fires at the next hold's expiry, so a lapse is announced when
	// it happens: in a big market the offer is otherwise re-announced
	// only every few minutes (lender.PaceFor), and a lapsed hold would
	// keep the machine looking busy until then.
	lapse *time.Timer
}

// HoldLimits bound holds on one machine.
type HoldLimits struct {
	// PerBidder is how many committed holds (the bidder accepted their
	// quote) one bidder account may have here at once (default 8).
	// Tentative holds do not count: a scheduler that overheard a bid could
	// otherwise use up its bidder's slots.
	PerBidder int
	// PerScheduler is how many holds one scheduler may have asked for and
	// not yet seen launched (default 32).
	PerScheduler int
	// LaunchWithin is how long a committed hold waits for its launch
	// (default 2 minutes): the bidder commits, opens its escrow (a block or
	// two) and launches.
	LaunchWithin time.Duration
}

func (l HoldLimits) withDefaults() HoldLimits {
	if l.PerBidder <= 0 {
		l.PerBidder = 8
	}
	if l.PerScheduler <= 0 {
		l.PerScheduler = 32
	}
	if l.LaunchWithin <= 0 {
		l.LaunchWithin = 2 * time.Minute
	}
	return l
}

type hold struct {
	from      peer.ID // the scheduler that asked
	bidder    peer.ID // may commit, release and launch too
	account   string  // the bidder's ledger account, which pays
	job       string
	res       p2p.Resources
	cost      uint64 // HoldRequest.Cost
	created   time.Time
	expires   time.Time // when it lapses; zero once launched
	committed bool
	launched  bool
}

// MaxTentativePerJob bounds the uncommitted holds one bid may have on a
// machine: several schedulers may place the same bid at once, each
// holding for its quote, but a bid does not buy a machine's capacity
// many times over.
const MaxTentativePerJob = 4

// NewHolds makes an empty book over the capacity lent reports.
func NewHolds(lent func() p2p.Resources, limits HoldLimits, changed func()) *Holds {
	return &Holds{lent: lent, limits: limits.withDefaults(), holds: map[string]*hold{}, changed: changed}
}

// dropExpired removes lapsed holds; h.mu must be held.
func (h *Holds) dropExpired(now time.Time) bool {
	dropped := false
	for id, x := range h.holds {
		if !x.launched && !now.Before(x.expires) {
			delete(h.holds, id)
			dropped = true
		}
	}
	return dropped
}

// armLocked sets the lapse timer to the earliest expiry of a hold not
// launched; h.mu must be held.
func (h *Holds) armLocked(now time.Time) {
	var next time.Time
	for _, x := range h.holds {
		if !x.launched && (next.IsZero() || x.expires.Before(next)) {
			next = x.expires
		}
	}
	switch {
	case next.IsZero():
		if h.lapse != nil {
			h.lapse.Stop()
		}
	case h.lapse == nil:
		h.lapse = time.AfterFunc(next.Sub(now)+10*time.Millisecond, h.sweep)
	default:
		h.lapse.Reset(next.Sub(now) + 10*time.Millisecond)
	}
}

// sweep drops the holds that lapsed and tells the offer.
func (h *Holds) sweep() {
	h.mu.Lock()
	now := time.Now()
	changed := h.dropExpired(now)
	h.armLocked(now)
	h.mu.Unlock()
	if changed && h.changed != nil {
		h.changed()
	}
}

func (h *Holds) allocatedLocked() p2p.Resources {
	var a p2p.Resources
	for _, x := range h.holds {
		a.Cores += x.res.Cores
		a.MemBytes += x.res.MemBytes
		a.GPUs += x.res.GPUs
	}
	return a
}

// Allocated is what live holds take now.
func (h *Holds) Allocated(now time.Time) p2p.Resources {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.dropExpired(now)
	return h.allocatedLocked()
}

func free(lent, alloc p2p.Resources) p2p.Resources {
	sub := func(a, b uint64) uint64 {
		if b > a {
			return 0
		}
		return a - b
	}
	return p2p.Resources{
		Cores:    uint32(sub(uint64(lent.Cores), uint64(alloc.Cores))),
		MemBytes: sub(lent.MemBytes, alloc.MemBytes),
		GPUs:     uint32(sub(uint64(lent.GPUs), uint64(alloc.GPUs))),
	}
}

// HoldRequest is a scheduler's request with what the machine learnt of its
// bid (OpReserve only): the bid's account and the most it may hold.
type HoldRequest struct {
	*p2p.Reserve
	Account string        // the bidder's account
	Most    p2p.Resources // the bid's workers times its per-worker resources
	// Cost is this machine's reserve price for the hold over the job's
	// duration, and Balance the account's balance on this machine's
	// replica (both 0 when the machine is not lending): the account's
	// live holds here, one cost per job, may lock no more than Balance.
	Cost, Balance uint64
}

// Apply performs a scheduler's request and says what came of it.
func (h *Holds) Apply(from peer.ID, r HoldRequest, now time.Time) p2p.ReserveReply {
	// The lender's lock is taken (by lent) before ours, never inside it:
	// the lender reads Allocated while holding its own.
	lent := h.lent()
	h.mu.Lock()
	changed := h.dropExpired(now)
	reply := h.applyLocked(from, r, lent, now)
	changed = changed || reply.OK
	reply.Free = free(lent, h.allocatedLocked())
	if changed {
		h.armLocked(now)
	}
	h.mu.Unlock()
	if changed && h.changed != nil {
		h.changed()
	}
	return reply
}

func (h *Holds) applyLocked(from peer.ID, r HoldRequest, lent p2p.Resources, now time.Time) p2p.ReserveReply {
	x, exists := h.holds[r.ID]
	if exists && x.from != from && !(r.Op != p2p.OpReserve && x.bidder != "" && x.bidder == from) {
		return p2p.ReserveReply{Reason: "reservation " + r.ID + " belongs to another scheduler"}
	}
	switch r.Op {
	case p2p.OpReserve:
		if exists {
			return p2p.ReserveReply{OK: true, Expires: x.expires.UnixMilli()} // a retry
		}
		if r.Res.Cores > r.Most.Cores || r.Res.MemBytes > r.Most.MemBytes || r.Res.GPUs > r.Most.GPUs {
			return p2p.ReserveReply{Reason: "the hold asks for more than the bid's workers need"}
		}
		bidder, scheduler, job := 0, 0, 0
		for _, o := range h.holds {
			if o.account == r.Account && o.committed {
				bidder++
			}
			if o.from == from && !o.launched {
				scheduler++
			}
			if o.job == r.JobID && !o.committed {
				job++
			}
		}
		if bidder >= h.limits.PerBidder {
			return p2p.ReserveReply{Reason: fmt.Sprintf("account %s already holds %d reservations here, the most one bidder may", r.Account, bidder)}
		}
		if job >= MaxTentativePerJob {
			return p2p.ReserveReply{Reason: fmt.Sprintf("job %s already has %d tentative holds here, the most one bid may", r.JobID, job)}
		}
		if scheduler >= h.limits.PerScheduler {
			return p2p.ReserveReply{Reason: fmt.Sprintf("this scheduler already has %d holds here waiting for launch, the most one may", scheduler)}
		}
		if r.Cost > 0 {
			// One cost per job (several schedulers may place one bid), and
			// none for launched holds, whose escrow locked the price.
			perJob := map[string]uint64{r.JobID: r.Cost}
			for _, o := range h.holds {
				if o.account == r.Account && !o.launched {
					perJob[o.job] = max(perJob[o.job], o.cost)
				}
			}
			var sum uint64
			for _, c := range perJob {
				sum += c
			}
			if sum > r.Balance {
				return p2p.ReserveReply{Reason: fmt.Sprintf("account %s's holds here would lock %s credits at this machine's reserve prices, more than its balance of %s",
					r.Account, units.FormatCredits(sum), units.FormatCredits(r.Balance))}
			}
		}
		f := free(lent, h.allocatedLocked())
		if r.Res.Cores > f.Cores || r.Res.MemBytes > f.MemBytes || r.Res.GPUs > f.GPUs {
			why := fmt.Sprintf("only %d cores, %s memory and %d GPUs free here", f.Cores, units.FormatSize(f.MemBytes), f.GPUs)
			if lent == (p2p.Resources{}) {
				why = "this machine is not lending now"
			}
			return p2p.ReserveReply{Reason: why}
		}
		exp := now.Add(time.Duration(r.TTL) * time.Second)
		bid, _ := peer.Decode(r.Bidder)
		h.holds[r.ID] = &hold{from: from, bidder: bid, account: r.Account, job: r.JobID, res: r.Res, cost: r.Cost, created: now, expires: exp}
		return p2p.ReserveReply{OK: true, Expires: exp.UnixMilli()}
	case p2p.OpCommit:
		if !exists {
			return p2p.ReserveReply{Reason: "no such hold (it lapsed or was released): re-quote"}
		}
		// Only the party that pays keeps a machine past the quote window:
		// the bidder, accepting the quote. A scheduler that overheard the
		// bid holds for the hold's short TTL at most.
		if from != x.bidder {
			return p2p.ReserveReply{Reason: "only the job's bidder commits a hold"}
		}
		if !x.committed {
			x.committed, x.expires = true, now.Add(h.limits.LaunchWithin)
		}
		return p2p.ReserveReply{OK: true, Expires: x.expires.UnixMilli()}
	case p2p.OpRelease:
		if exists && !x.launched {
			delete(h.holds, r.ID)
		}
		return p2p.ReserveReply{OK: true}
	}
	return p2p.ReserveReply{Reason: "unknown operation " + r.Op}
}

// Check reports hold id's resources, as Launch does, without taking it:
// a launch is checked against the hold before its escrow is.
func (h *Holds) Check(id, job string, launcher peer.ID, now time.Time) (p2p.Resources, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	x := h.launchableLocked(id, job, launcher, now)
	if x == nil {
		return p2p.Resources{}, false
	}
	return x.res, true
}

// launchableLocked is hold id if it is committed for job and launcher may
// use it (its scheduler or its bidder), else nil.
func (h *Holds) launchableLocked(id, job string, launcher peer.ID, now time.Time) *hold {
	h.dropExpired(now)
	x, ok := h.holds[id]
	if !ok || !x.committed || x.job != job || (x.from != launcher && x.bidder != launcher) {
		return nil
	}
	return x
}

// Launch takes hold id for a worker of job and reports its resources, if
// the hold is committed for job and launcher may use it (its scheduler or
// its bidder). A launched hold no longer lapses; Release ends it.
func (h *Holds) Launch(id, job string, launcher peer.ID, now time.Time) (p2p.Resources, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	x := h.launchableLocked(id, job, launcher, now)
	if x == nil {
		return p2p.Resources{}, false
	}
	x.launched, x.expires = true, time.Time{}
	return x.res, true
}

// Release drops hold id (a job's worker ended for good).
func (h *Holds) Release(id string) {
	h.mu.Lock()
	_, ok := h.holds[id]
	delete(h.holds, id)
	h.mu.Unlock()
	if ok && h.changed != nil {
		h.changed()
	}
}

// ErrHoldRunning is returned when the owner releases a hold a worker runs
// on: stopping lending (`lend --stop`) is how the owner takes that back.
var ErrHoldRunning = errors.New("a worker runs on this hold")

// ErrNoHold is returned for a hold this machine does not have.
var ErrNoHold = errors.New("no such hold")

// ReleaseByOwner drops hold id at the owner's request, unless a worker
// runs on it.
func (h *Holds) ReleaseByOwner(id string) error {
	h.mu.Lock()
	x, ok := h.holds[id]
	switch {
	case !ok:
		h.mu.Unlock()
		return fmt.Errorf("%w %q (it may have lapsed)", ErrNoHold, id)
	case x.launched:
		h.mu.Unlock()
		return fmt.Errorf("hold %s: %w (job %s); `lend --stop` takes the machine back", id, ErrHoldRunning, x.job)
	}
	delete(h.holds, id)
	h.mu.Unlock()
	if h.changed != nil {
		h.changed()
	}
	return nil
}

// List is the book as the owner sees it, oldest first.
func (h *Holds) List(now time.Time) []Hold {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.dropExpired(now)
	out := make([]Hold, 0, len(h.holds))
	for id, x := range h.holds {
		state := "held"
		switch {
		case x.launched:
			state = "running"
		case x.committed:
			state = "committed"
		}
		hd := Hold{ID: id, Job: x.job, State: state, Account: x.account, Scheduler: x.from.String(),
			Bidder: x.bidder.String(), Cores: x.res.Cores, MemBytes: x.res.MemBytes, GPUs: x.res.GPUs,
			Since: x.created.UTC()}
		if !x.expires.IsZero() {
			exp := x.expires.UTC()
			hd.Expires = &exp
		}
		out = append(out, hd)
	}
	slices.SortFunc(out, func(a, b Hold) int {
		if c := a.Since.Compare(b.Since); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out
}
