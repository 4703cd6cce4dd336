package lender

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/ledger"
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
	// escrowed says whether account has an escrow open for job that pays
	// this machine at least cost (SetEscrowed); nil: nobody has.
	escrowed func(job, account string, cost, charge uint64) bool
	// streaks are, by account, its last streak of unlaunched holds here
	// that has ended, kept for streakGap: a hold taken again within it
	// continues the streak (graceFrom).
	streaks map[string]holdStreak
	// announced is what Announced last said.
	announced p2p.Resources
	// charges, once set, has a commit carry the bidder's receipt for the
	// launch window, kept for the claim service when the hold ends
	// unlaunched (SetCharges).
	charges *HoldCharges
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

// Grace periods after which another account's request may take a
// hold's place (Holds.preemptLocked). They bound what an insider's holds
// delay an honest job by (the goal: 10 s): an honest scheduler's hold is
// committed once its bidder has gathered its quotes (2 s as a rule, 10 s
// at most), and the bidder's escrow is open a block or two after the
// commit. A hold that outlives them is taken only by a request that
// cannot fit otherwise: an honest bidder slower than that loses its
// holds only to a market that wants the capacity, and quotes again.
const (
	// TentativeGrace is how long an uncommitted hold keeps its capacity
	// against other accounts.
	TentativeGrace = 6 * time.Second
	// EscrowWithin is how long a committed hold keeps its capacity
	// against other accounts without an escrow that pays this machine.
	EscrowWithin = 8 * time.Second
	// MinHoldAge is how long any hold keeps its capacity, whatever its
	// account's streak: the time an honest bidder takes from its quotes
	// to its commit. A busy honest account, bidding job after job, holds
	// machines in one long streak too; this keeps its next quote's holds
	// until it commits them.
	MinHoldAge = 3 * time.Second
)

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
	from    peer.ID // the scheduler that asked
	bidder  peer.ID // may commit, release and launch too
	account string  // the bidder's ledger account, which pays
	job     string
	res     p2p.Resources
	cost    uint64 // HoldRequest.Cost
	rate    uint64 // HoldRequest.Rate
	// receipt is the bidder's, for the launch window, taken with the
	// commit (HoldCharges).
	receipt     *ledger.Receipt
	created     time.Time
	graceFrom   time.Time // when its account's streak of unlaunched holds here began (holdStreak)
	committedAt time.Time
	expires     time.Time // when it lapses; zero once launched
	committed   bool
	launched    bool
}

// MaxTentativePerJob bounds the uncommitted holds one bid may have on a
// machine: several schedulers may place the same bid at once, each
// holding for its quote, but a bid does not buy a machine's capacity
// many times over.
const MaxTentativePerJob = 4

// NewHolds makes an empty book over the capacity lent reports.
func NewHolds(lent func() p2p.Resources, limits HoldLimits, changed func()) *Holds {
	return &Holds{lent: lent, limits: limits.withDefaults(), holds: map[string]*hold{}, changed: changed,
		streaks: map[string]holdStreak{}}
}

// holdStreak is a time an account held capacity here without launching
// on it: a hold released (or lapsed, or preempted) and taken again within
// streakGap is the same streak, so an account cannot keep its holds young
// by releasing each before its grace runs out.
type holdStreak struct{ start, end time.Time }

// streakGap is how long after an account's last unlaunched hold here
// ended a new one still continues its streak.
const streakGap = 10 * time.Second

// graceFromLocked is when account's streak of unlaunched holds here
// began, for a hold it takes now; h.mu must be held.
func (h *Holds) graceFromLocked(account string, now time.Time) time.Time {
	from := now
	for _, o := range h.holds {
		if o.account == account && !o.launched && o.graceFrom.Before(from) {
			from = o.graceFrom
		}
	}
	if s, ok := h.streaks[account]; ok && now.Sub(s.end) < streakGap && s.start.Before(from) {
		from = s.start
	}
	return from
}

// dropLocked removes hold id, which ended at end; an unlaunched one ends
// a streak of its account's, and a committed one is charged (its receipt
// kept) when charge is set and the run's escrow is open. h.mu must be
// held.
func (h *Holds) dropLocked(id string, end time.Time, charge bool) {
	x, ok := h.holds[id]
	if !ok {
		return
	}
	delete(h.holds, id)
	if x.launched || x.account == "" {
		return
	}
	if charge && x.receipt != nil && h.charges != nil && h.escrowed != nil && h.escrowed(x.job, x.account, 0, 0) {
		// Kept (or retried) by the claim service, which logs what it cannot store.
		_ = h.charges.Keep(*x.receipt)
	}
	s, ok := h.streaks[x.account]
	if !ok || end.Sub(s.end) >= streakGap {
		s = holdStreak{start: x.graceFrom}
	}
	if x.graceFrom.Before(s.start) {
		s.start = x.graceFrom
	}
	if end.After(s.end) {
		s.end = end
	}
	h.streaks[x.account] = s
}

// pruneStreaksLocked forgets the streaks that ended streakGap ago; h.mu
// must be held.
func (h *Holds) pruneStreaksLocked(now time.Time) {
	for a, s := range h.streaks {
		if now.Sub(s.end) >= streakGap {
			delete(h.streaks, a)
		}
	}
}

// HoldCharges is what a machine needs to charge a committed hold that is
// never launched: a commit carries the bidder's receipt for the hold's
// hourly reserve price over the launch window (p2p.HoldCharge), and if
// the hold lapses, or the bidder releases it, unlaunched while the run's
// escrow is open, the receipt goes to the claim service, which lodges it
// against that escrow (after its settlement, or once it expires). A run
// charged here is not committed here again while its claim is pending
// (the one receipt kept per run would cover both): an honest bidder
// re-places a run whose escrow is open as a new run.
type HoldCharges struct {
	ChainID string
	Payee   string // this machine's ledger address
	// Keep hands a receipt to the claim service; Charged says whether it
	// keeps one for run already.
	Keep    func(ledger.Receipt) error
	Charged func(run string) bool
}

// SetCharges has commits carry receipts and unlaunched ends charged.
func (h *Holds) SetCharges(c HoldCharges) {
	h.mu.Lock()
	h.charges = &c
	h.mu.Unlock()
}

// commitReceiptLocked checks the receipt a commit of x carries, from
// from; h.mu must be held.
func (h *Holds) commitReceiptLocked(x *hold, from peer.ID, r *p2p.Receipt) (*ledger.Receipt, error) {
	need := p2p.HoldCharge(x.rate, h.limits.LaunchWithin)
	if h.charges == nil || need == 0 {
		return nil, nil
	}
	if h.charges.Charged(x.job) {
		return nil, fmt.Errorf("a hold of run %.12s was left here unlaunched once already: bid for it as a new run", x.job)
	}
	if r == nil {
		return nil, fmt.Errorf("a commit carries the bidder's receipt for the launch window: %s credits at this machine's reserve price", units.FormatCredits(need))
	}
	lr := ledger.Receipt{Job: x.job, Payee: r.Payee, Amount: r.Amount, Seq: r.Seq, Sig: r.Sig}
	switch {
	case r.Payee != h.charges.Payee:
		return nil, fmt.Errorf("the commit's receipt is for %s, not this machine (%s)", r.Payee, h.charges.Payee)
	case r.Amount < need:
		return nil, fmt.Errorf("the commit's receipt covers %s credits, less than this machine's reserve price for the launch window: %s",
			units.FormatCredits(r.Amount), units.FormatCredits(need))
	case !ledger.VerifyReceipt(payerKey(from), h.charges.ChainID, lr):
		return nil, errors.New("the commit's receipt is not signed by the bidder")
	}
	return &lr, nil
}

// SetEscrowed tells the book how to see a committed hold's money:
// escrowed reports whether account has an escrow open for job that backs
// this machine's hold (EscrowBacks: it pays this machine, unsettled,
// holding at least cost, and charge for each machine it pays); with cost
// and charge 0, whether it has one open at all, settled or not, that a
// receipt may still be lodged against (read from this machine's ledger
// replica, under the book's lock).
func (h *Holds) SetEscrowed(escrowed func(job, account string, cost, charge uint64) bool) {
	h.mu.Lock()
	h.escrowed = escrowed
	h.mu.Unlock()
}

// preemptLocked makes room for account's request for res, when it does
// not fit, by dropping other accounts' holds that have nothing behind
// them any more: uncommitted ones whose account has held here, unlaunched,
// for TentativeGrace (a streak: holdStreak), and committed ones with no
// escrow paying this machine EscrowWithin after their commit. An uncommitted hold costs its account nothing, so without
// this one member whose balance covers a modest bid held every lent core
// it reached, again as each hold lapsed, and honest bids waited minutes.
// The oldest go first, and none go unless enough do for res to fit. It
// reports whether any went; h.mu must be held.
func (h *Holds) preemptLocked(account string, res, lent p2p.Resources, now time.Time) bool {
	var stale []string
	for id, x := range h.holds {
		if x.account != account && h.stale(x, now) {
			stale = append(stale, id)
		}
	}
	slices.SortFunc(stale, func(a, b string) int { return h.holds[a].graceFrom.Compare(h.holds[b].graceFrom) })
	alloc := h.allocatedLocked()
	var n int
	for n < len(stale) && !fits(res, free(lent, alloc)) {
		x := h.holds[stale[n]]
		alloc.Cores -= x.res.Cores
		alloc.MemBytes -= x.res.MemBytes
		alloc.GPUs -= x.res.GPUs
		n++
	}
	if !fits(res, free(lent, alloc)) {
		return false
	}
	for _, id := range stale[:n] {
		h.dropLocked(id, now, false)
	}
	return n > 0
}

// fits says whether res fits in f.
func fits(res, f p2p.Resources) bool {
	return res.Cores <= f.Cores && res.MemBytes <= f.MemBytes && res.GPUs <= f.GPUs
}

// dropExpired removes lapsed holds; h.mu must be held.
func (h *Holds) dropExpired(now time.Time) bool {
	dropped := false
	for id, x := range h.holds {
		if !x.launched && !now.Before(x.expires) {
			h.dropLocked(id, x.expires, true)
			dropped = true
		}
	}
	h.pruneStreaksLocked(now)
	return dropped
}

// armLocked sets the lapse timer to the next time a hold not launched
// lapses or comes to have nothing behind it (staleAt); h.mu must be held.
func (h *Holds) armLocked(now time.Time) {
	var next time.Time
	for _, x := range h.holds {
		if x.launched {
			continue
		}
		for _, at := range []time.Time{x.expires, h.staleAt(x)} {
			if at.After(now) && (next.IsZero() || at.Before(next)) {
				next = at
			}
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

// sweep drops the holds that lapsed and tells the offer, which also
// leaves out the holds that now have nothing behind them (Announced).
func (h *Holds) sweep() {
	h.mu.Lock()
	now := time.Now()
	changed := h.dropExpired(now) || h.announcedLocked(now) != h.announced
	h.armLocked(now)
	h.mu.Unlock()
	if changed && h.changed != nil {
		h.changed()
	}
}

// staleAt is when hold x comes to have nothing behind it, if it has
// nothing then (see stale): the zero time for a launched hold.
func (h *Holds) staleAt(x *hold) time.Time {
	switch {
	case x.launched:
		return time.Time{}
	case !x.committed:
		return later(x.graceFrom.Add(TentativeGrace), x.created.Add(MinHoldAge))
	}
	return x.committedAt.Add(EscrowWithin)
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// stale says whether hold x has nothing behind it at now, so that another
// account's request may take its place (preemptLocked): uncommitted, its
// account has held here unlaunched for TentativeGrace; committed, no
// escrow pays this machine EscrowWithin after the commit. h.mu must be
// held.
func (h *Holds) stale(x *hold, now time.Time) bool {
	at := h.staleAt(x)
	switch {
	case at.IsZero() || now.Before(at):
		return false
	case !x.committed:
		return true
	}
	return h.escrowed == nil || !h.escrowed(x.job, x.account, x.cost, p2p.HoldCharge(x.rate, p2p.HoldChargeWindow))
}

// EscrowBacks says whether escrow e, as this machine's ledger replica
// has it, backs account's committed hold on machine me: e is account's,
// pays me, is unsettled and holds at least cost (the hold's reserve for
// the job's duration), and at least charge (the hold's launch-window
// charge, p2p.HoldCharge) for every machine it pays. So one escrow backs
// holds on as many machines as it could pay for their launch windows,
// and holding a core unlaunched costs its reserve price for the time,
// wherever the holds are. With cost and charge 0: whether e is account's
// and pays me at all, settled or not.
func EscrowBacks(e ledger.Escrow, me, account string, cost, charge uint64) bool {
	switch {
	case e.Payer != account || !slices.Contains(e.Payees, me):
		return false
	case cost == 0 && charge == 0:
		return true
	}
	return e.Settled == 0 && e.Amount >= cost && e.Amount/uint64(len(e.Payees)) >= charge
}

// Announced is what the machine's offer says its holds take now: every
// live hold but those with nothing behind them, whose capacity another
// account's request would get. Allocated is all of them.
func (h *Holds) Announced(now time.Time) p2p.Resources {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.dropExpired(now)
	h.announced = h.announcedLocked(now)
	return h.announced
}

func (h *Holds) announcedLocked(now time.Time) p2p.Resources {
	var a p2p.Resources
	for _, x := range h.holds {
		if !h.stale(x, now) {
			a.Cores += x.res.Cores
			a.MemBytes += x.res.MemBytes
			a.GPUs += x.res.GPUs
		}
	}
	return a
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
	// Rate is this machine's reserve price for the hold, an hour: what a
	// commit's receipt covers for the launch window (p2p.HoldCharge).
	Rate uint64
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
		if !fits(r.Res, f) && h.preemptLocked(r.Account, r.Res, lent, now) {
			f = free(lent, h.allocatedLocked())
		}
		if !fits(r.Res, f) {
			why := fmt.Sprintf("only %d cores, %s memory and %d GPUs free here", f.Cores, units.FormatSize(f.MemBytes), f.GPUs)
			if lent == (p2p.Resources{}) {
				why = "this machine is not lending now"
			}
			return p2p.ReserveReply{Reason: why}
		}
		exp := now.Add(time.Duration(r.TTL) * time.Second)
		bid, _ := peer.Decode(r.Bidder)
		h.holds[r.ID] = &hold{from: from, bidder: bid, account: r.Account, job: r.JobID, res: r.Res, cost: r.Cost, rate: r.Rate, created: now,
			graceFrom: h.graceFromLocked(r.Account, now), expires: exp}
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
			receipt, err := h.commitReceiptLocked(x, from, r.Receipt)
			if err != nil {
				return p2p.ReserveReply{Reason: err.Error()}
			}
			x.committed, x.committedAt, x.expires, x.receipt = true, now, now.Add(h.limits.LaunchWithin), receipt
		}
		return p2p.ReserveReply{OK: true, Expires: x.expires.UnixMilli()}
	case p2p.OpRelease:
		if exists && !x.launched {
			h.dropLocked(r.ID, now, true)
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
	// The account uses what it held: its streak here starts again.
	delete(h.streaks, x.account)
	for _, o := range h.holds {
		if o.account == x.account && !o.launched {
			o.graceFrom = now
		}
	}
	return x.res, true
}

// Release drops hold id (a job's worker ended for good).
func (h *Holds) Release(id string) {
	h.mu.Lock()
	_, ok := h.holds[id]
	h.dropLocked(id, time.Now(), false)
	h.mu.Unlock()
	if ok && h.changed != nil {
		h.changed()
	}
}

// DropUnbacked drops account's uncommitted holds for jobs, bids its
// balance no longer backs beside its other live bids on the market
// (Commitments.Unbacked), and reports how many went. A committed hold
// stays: its bidder signed a receipt for it, and its escrow must follow
// within EscrowWithin.
func (h *Holds) DropUnbacked(account string, jobs []string, now time.Time) int {
	if len(jobs) == 0 {
		return 0
	}
	h.mu.Lock()
	n := 0
	for id, x := range h.holds {
		if x.account == account && !x.committed && !x.launched && slices.Contains(jobs, x.job) {
			h.dropLocked(id, now, false)
			n++
		}
	}
	h.mu.Unlock()
	if n > 0 && h.changed != nil {
		h.changed()
	}
	return n
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
	h.dropLocked(id, time.Now(), false)
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
