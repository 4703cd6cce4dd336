package lender

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/deepmarket/deepmarket/ledger"
)

// receiptsKey prefixes the node store's usage receipts, "receipts/<run>"
// -> ledger.Receipt: the latest receipt a run's submitter signed for this
// machine, what it lodges against a settlement that paid it less, or
// claims with if the submitter never settles. A receipt stays until the
// ledger has answered its claim for good, so a restarted node claims it
// still.
const receiptsKey = "receipts/"

// answersKey prefixes the latest signed answer kept for each held run
// (ledger.Answer): the payer's word on this machine's rounds, kept while
// the run's receipt is.
const answersKey = "answers/"

// Claim timings.
const (
	// claimDelay waits past an escrow's expiry before claiming, so the
	// ledger's block time has passed it.
	claimDelay = 30 * time.Second
	// claimLook is how often a run's escrow is read until it is settled
	// or expires: a settlement opens a dispute window (10 minutes by
	// default) in which this machine lodges its receipt and disputes a
	// failed mark it did not earn.
	claimLook = 30 * time.Second
	// claimRetry spaces the tries of a step that failed (a claim the
	// ledger found early, a store or ledger that did not answer),
	// doubling up to claimRetryMax: the ledger judges expiry by block
	// time, which lags the clock while the chain is idle.
	claimRetry    = 10 * time.Second
	claimRetryMax = 10 * time.Minute
)

// errClaimsStopped refuses a receipt once the claim service has stopped:
// nothing is written to the store after the executor's Run returns.
var errClaimsStopped = errors.New("the node is stopping: the receipt is not kept")

// claims is the executor's one claim service. It keeps the receipts the
// submitters send (Keep) and, for every run that had a worker here
// (Watch) or whose receipt was kept before a restart, watches the run's
// escrow: once the submitter settles, in the dispute window, it disputes
// a failed mark this machine did not earn and lodges its latest receipt
// if the settlement paid less; once the escrow expires unsettled, it
// claims what the receipt covers. The runs wait in a queue ordered by
// when each is next due, under one timer set to the earliest; a step that
// fails is tried again later, backing off, and logged: no error on the
// money path is dropped.
type claims struct {
	ledger Escrows
	store  Store
	log    *slog.Logger
	now    func() time.Time
	// payee is this machine's address, as escrows and marks name it.
	payee string
	// failedHere says whether a worker of the run failed on this machine
	// (its program exited with an error, or it broke a limit): a failed
	// mark for it has a cause, and is not disputed. Nil: none did.
	failedHere func(run string) bool
	// appeal, once the run is settled, appeals the refusal of this
	// machine's rounds when its recomputation overturns it (referee.go).
	// Nil: none is.
	appeal func(ctx context.Context, run string, esc *ledger.Escrow) error
	// delay, look, retry and retryMax are claimDelay, claimLook,
	// claimRetry and claimRetryMax; tests shorten them.
	delay, look, retry, retryMax time.Duration

	mu      sync.Mutex
	runs    map[string]*claim
	queue   claimQueue // the runs not being stepped, earliest next first
	wake    chan struct{}
	stopped bool
}

// claim is one run's claim.
type claim struct {
	run  string
	next time.Time // when its next step is due
	// receipt is the latest kept (nil: read the store's), and unsaved
	// says the store does not have it yet.
	receipt  *ledger.Receipt
	unsaved  bool
	failures int // steps failed in a row: the next try backs off
	index    int // in the queue; -1 while out of it
}

func newClaims(l Escrows, s Store, payee string, log *slog.Logger) *claims {
	return &claims{ledger: l, store: s, payee: payee, log: log, now: time.Now, delay: claimDelay, look: claimLook,
		retry: claimRetry, retryMax: claimRetryMax, runs: map[string]*claim{}, wake: make(chan struct{}, 1)}
}

// Watch schedules the claim on run's escrow: a worker of run was
// launched here.
func (c *claims) Watch(run string) {
	c.mu.Lock()
	c.watchLocked(run)
	c.mu.Unlock()
	c.poke()
}

// watchLocked is run's claim, queued now if it was not there.
func (c *claims) watchLocked(run string) *claim {
	cl := c.runs[run]
	if cl == nil {
		cl = &claim{run: run, next: c.now(), index: -1}
		c.runs[run] = cl
		heap.Push(&c.queue, cl)
	}
	return cl
}

// Keep records r, the latest receipt of its run's submitter for this
// machine (its signature checked by the caller), and schedules its claim.
// A receipt that covers no more than the one kept changes nothing: a
// later sequence number for less is the payer taking back what it
// signed, which the ledger would not honour either. When the store
// fails, Keep says so and the claim service holds r in memory, claims
// with it and stores it again until the store takes it.
func (c *claims) Keep(r ledger.Receipt) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return errClaimsStopped
	}
	cl := c.watchLocked(r.Job)
	if cl.receipt != nil && !covers(r, *cl.receipt) {
		if r.Seq > cl.receipt.Seq && r.Amount < cl.receipt.Amount {
			c.log.Warn("a receipt with a later sequence covers less than the one kept: kept the earlier", "job", r.Job,
				"kept", cl.receipt.Amount, "offered", r.Amount)
		}
		return nil
	}
	cl.receipt, cl.unsaved = &r, true
	if err := c.saveLocked(cl); err != nil {
		c.soonLocked(cl)
		return err
	}
	return nil
}

// KeepAnswer stores a, a verified answer of the payer's, unless the one
// kept for its run says as much; it reports whether a was kept.
func (c *claims) KeepAnswer(a ledger.Answer) (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var kept ledger.Answer
	found, err := c.store.Get(answersKey+a.Job, &kept)
	if err != nil {
		return false, fmt.Errorf("read the answer kept for job %.12s: %w", a.Job, err)
	}
	if found && !a.Later(kept) {
		return false, nil
	}
	if err := c.store.Put(answersKey+a.Job, a); err != nil {
		return false, fmt.Errorf("keep the answer for job %.12s: %w", a.Job, err)
	}
	return true, nil
}

// Answer is the latest answer kept for run.
func (c *claims) Answer(run string) (ledger.Answer, bool) {
	var a ledger.Answer
	found, err := c.store.Get(answersKey+run, &a)
	return a, found && err == nil
}

// saveLocked stores cl's receipt, unless the store already holds a later
// one for the run, which cl then takes.
func (c *claims) saveLocked(cl *claim) error {
	var stored ledger.Receipt
	found, err := c.store.Get(receiptsKey+cl.run, &stored)
	if err != nil {
		return fmt.Errorf("read the receipt kept for job %.12s: %w", cl.run, err)
	}
	if found && !covers(*cl.receipt, stored) {
		cl.receipt, cl.unsaved = &stored, false
		return nil
	}
	if err := c.store.Put(receiptsKey+cl.run, *cl.receipt); err != nil {
		return fmt.Errorf("keep the receipt for job %.12s: %w", cl.run, err)
	}
	cl.unsaved = false
	return nil
}

// Covered is what the latest receipt kept for run covers (0: none yet).
func (c *claims) Covered(run string) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cl := c.runs[run]; cl != nil && cl.receipt != nil {
		return cl.receipt.Amount
	}
	return 0
}

// Has says whether run has a claim here: a worker of it ran here, or a
// receipt of it is kept.
func (c *claims) Has(run string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.runs[run] != nil
}

// covers says whether receipt r is worth more than kept: it covers more,
// or as much with a later sequence.
func covers(r, kept ledger.Receipt) bool {
	return r.Amount > kept.Amount || (r.Amount == kept.Amount && r.Seq > kept.Seq)
}

// soonLocked brings cl's next step forward to a retry's delay, for a
// receipt the store did not take; the step in progress, if any, sees it.
func (c *claims) soonLocked(cl *claim) {
	if at := c.now().Add(c.retry); cl.index >= 0 && at.Before(cl.next) {
		cl.next = at
		heap.Fix(&c.queue, cl.index)
		c.poke()
	}
}

// poke wakes the service: the queue's head may have changed.
func (c *claims) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// run serves the claims until ctx ends: first those of the receipts kept
// before this start, then each run as it comes due. Once it returns, Keep
// writes nothing more.
func (c *claims) run(ctx context.Context) {
	defer func() {
		c.mu.Lock()
		c.stopped = true
		c.mu.Unlock()
	}()
	if !c.resume(ctx) {
		return
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for ctx.Err() == nil {
		cl, wait := c.due()
		if cl != nil {
			c.step(ctx, cl)
			continue
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
		case <-c.wake:
		case <-timer.C:
		}
	}
}

// resume queues the claim of every receipt kept before this start. A
// store that cannot list them is asked again until ctx ends (false).
func (c *claims) resume(ctx context.Context) bool {
	for delay := c.retry; ; delay = min(2*delay, c.retryMax) {
		var runs []string
		err := c.store.Each(receiptsKey, func(key string, _ []byte) error {
			runs = append(runs, strings.TrimPrefix(key, receiptsKey))
			return nil
		})
		if err == nil {
			c.mu.Lock()
			for _, run := range runs {
				c.watchLocked(run)
			}
			c.mu.Unlock()
			return true
		}
		c.log.Warn("cannot list the receipts kept before this start: their claims wait", "err", err, "retry", delay)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
	}
}

// due takes the claim whose step is due out of the queue, or says how
// long until one is.
func (c *claims) due() (*claim, time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.queue) == 0 {
		return nil, time.Hour // until Watch or Keep pokes
	}
	if wait := c.queue[0].next.Sub(c.now()); wait > 0 {
		return nil, wait
	}
	return heap.Pop(&c.queue).(*claim), 0
}

// claimStep is what a step decided: done (the ledger answered for
// good, or nothing is owed), or when the next step is due.
type claimStep struct {
	done bool
	next time.Time
	why  string // for the log, when done
}

// step takes cl one step: it stores a receipt the store did not take,
// then reads the escrow's expiry or, once the escrow expired, claims,
// with the receipt held in memory should the store still refuse it. A
// step that fails is logged and tried again later, backing off; a claim
// answered for good forgets the run and its receipt.
func (c *claims) step(ctx context.Context, cl *claim) {
	c.mu.Lock()
	var saveErr error
	if cl.unsaved {
		saveErr = c.saveLocked(cl)
	}
	receipt := cl.receipt
	c.mu.Unlock()
	if saveErr != nil {
		c.log.Warn("cannot keep a usage receipt: it is claimed with from memory, and stored again later", "job", cl.run, "err", saveErr)
	}
	st, err := c.advance(ctx, cl.run, receipt)

	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if err != nil || saveErr != nil {
		cl.failures++
	} else {
		cl.failures = 0
	}
	switch {
	case ctx.Err() != nil:
		// The node is stopping: what is kept is claimed after its restart.
		cl.next = now
	case err != nil:
		cl.next = now.Add(c.backoff(cl.failures))
		level := slog.LevelWarn
		if ledger.CodeOf(err) == ledger.CodeNotExpired {
			level = slog.LevelDebug // block time lags the clock: expected
		}
		c.log.Log(ctx, level, "claim: trying again later", "job", cl.run, "err", err, "retry", cl.next.Sub(now))
	case st.done && cl.receipt != receipt:
		// Keep took a later receipt meanwhile: claim with it.
		cl.next = now
	case st.done:
		delete(c.runs, cl.run)
		if err := c.store.Delete(receiptsKey + cl.run); err != nil {
			c.log.Warn("cannot forget a receipt whose claim is answered: the next start claims it again", "job", cl.run, "err", err)
		}
		if err := c.store.Delete(answersKey + cl.run); err != nil {
			c.log.Warn("cannot forget the answer kept for a closed run", "job", cl.run, "err", err)
		}
		c.log.Debug("claim answered", "job", cl.run, "outcome", st.why)
		return
	default:
		cl.next = st.next
	}
	if at := now.Add(c.backoff(max(cl.failures, 1))); cl.unsaved && at.Before(cl.next) {
		cl.next = at // the store has not taken the receipt yet
	}
	heap.Push(&c.queue, cl)
}

// backoff is the wait before the try after n failed ones.
func (c *claims) backoff(n int) time.Duration {
	d := c.retry
	for i := 1; i < n && d < c.retryMax; i++ {
		d *= 2
	}
	return min(d, c.retryMax)
}

// advance is one step of run's claim, with the receipt kept in memory
// (nil: the store's). It reads the escrow: while it is neither settled
// nor expired, it looks again later; once settled, in the dispute window,
// it disputes a failed mark this machine did not earn and lodges the
// receipt if the settlement paid less; once expired unsettled, it claims.
func (c *claims) advance(ctx context.Context, run string, r *ledger.Receipt) (st claimStep, err error) {
	esc, err := c.ledger.Escrow(ctx, run)
	if gone(err) {
		return claimStep{done: true, why: "the escrow is closed"}, nil
	}
	if err != nil {
		return claimStep{}, fmt.Errorf("read the escrow: %w", err)
	}
	now := c.now()
	settled := esc.Settled != 0
	if at := time.Unix(esc.Expiry, 0).Add(c.delay); !settled && now.Before(at) {
		return claimStep{next: earliest(now.Add(c.look), at)}, nil
	}
	if settled {
		if err := c.disputeMark(ctx, run, esc); err != nil {
			return claimStep{}, err
		}
		if c.appeal != nil {
			if aerr := c.appeal(ctx, run, esc); aerr != nil {
				// The receipt is lodged meanwhile; the run stays watched
				// until the appeal is made or its window ends.
				if !errors.Is(aerr, errAppealPending) {
					c.log.Warn("appeal: trying again later", "job", run, "err", aerr)
				}
				defer func() {
					if err == nil && st.done {
						st = claimStep{next: c.now().Add(c.retry)}
					}
				}()
			}
		}
	}
	if r == nil {
		var stored ledger.Receipt
		found, err := c.store.Get(receiptsKey+run, &stored)
		if err != nil {
			return claimStep{}, fmt.Errorf("read the receipt kept: %w", err)
		}
		if !found {
			return claimStep{done: true, why: "no receipt"}, nil
		}
		r = &stored
	}
	var paid uint64
	for _, got := range esc.Claimed {
		if got.Payee == r.Payee {
			paid = got.Amount
		}
	}
	if r.Amount <= paid {
		return claimStep{done: true, why: "paid in full"}, nil
	}
	if _, err := c.ledger.Claim(ctx, *r); err != nil {
		if final(err) {
			c.log.Warn("the ledger refused a claim for good", "job", run, "amount", r.Amount, "err", err)
			return claimStep{done: true, why: "refused"}, nil
		}
		return claimStep{}, err
	}
	if settled {
		c.log.Warn("the submitter settled for less than its own receipt: lodged the receipt and was paid the rest",
			"job", run, "settled", paid, "receipt", r.Amount)
	} else {
		c.log.Info("claimed from an unsettled escrow", "job", run, "amount", r.Amount)
	}
	return claimStep{done: true, why: "claimed"}, nil
}

// disputeMark disputes the failed mark esc's settlement gave this
// machine, unless a worker of run failed here (a mark with a cause). A
// disputed mark does not count in the machine's record.
func (c *claims) disputeMark(ctx context.Context, run string, esc *ledger.Escrow) error {
	i := slices.IndexFunc(esc.Marks, func(m ledger.Mark) bool { return m.Machine == c.payee })
	if i < 0 || esc.Marks[i].Disputed {
		return nil
	}
	if c.failedHere != nil && c.failedHere(run) {
		c.log.Info("the submitter marked this machine failed, and its worker did fail here: the mark stands", "job", run)
		return nil
	}
	if _, err := c.ledger.Dispute(ctx, run); err != nil {
		if final(err) || ledger.CodeOf(err) == ledger.CodeAlreadyVoted {
			c.log.Warn("the ledger refused a dispute for good", "job", run, "err", err)
			return nil
		}
		return fmt.Errorf("dispute the failed mark: %w", err)
	}
	c.log.Warn("the submitter marked this machine failed without a cause here: disputed the mark", "job", run)
	return nil
}

// earliest is the earlier of two times.
func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// gone says whether err is the ledger's answer that a run has no escrow
// (any more): its payer settled it, or took back what was left.
func gone(err error) bool {
	var le *ledger.Error
	return errors.As(err, &le) && le.Code == ledger.CodeUnknownEscrow
}

// final says whether the ledger refused a claim for good: trying it again
// cannot change the answer.
func final(err error) bool {
	var le *ledger.Error
	if !errors.As(err, &le) {
		return false // no answer from the ledger
	}
	switch le.Code {
	case ledger.CodeUnknownEscrow, ledger.CodeNotPayee, ledger.CodeBadReceipt, ledger.CodeInsufficientFunds, ledger.CodeInvalidJob:
		return true
	}
	return false
}

// claimQueue orders claims by when each is next due (container/heap).
type claimQueue []*claim

func (q claimQueue) Len() int { return len(q) }

func (q claimQueue) Less(i, j int) bool {
	if !q[i].next.Equal(q[j].next) {
		return q[i].next.Before(q[j].next)
	}
	return q[i].run < q[j].run
}

func (q claimQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index, q[j].index = i, j
}

func (q *claimQueue) Push(x any) {
	cl := x.(*claim)
	cl.index = len(*q)
	*q = append(*q, cl)
}

func (q *claimQueue) Pop() any {
	old := *q
	cl := old[len(old)-1]
	old[len(old)-1] = nil
	cl.index = -1
	*q = old[:len(old)-1]
	return cl
}
