package lender

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ctypes "github.com/cometbft/cometbft/rpc/core/types"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/p2p"
)

// The claim service is tested against a ledger of escrows that judges
// expiry by a clock the test moves: escrows last hours, and the real
// ledger judges expiry by the block time of a chain this test cannot
// move forward.

// testClock is the wall clock, moved forward as the test says.
type testClock struct{ ahead atomic.Int64 }

func (c *testClock) Now() time.Time { return time.Now().Add(time.Duration(c.ahead.Load())) }

// Set moves the clock to t, from where it runs on.
func (c *testClock) Set(t time.Time) { c.ahead.Store(int64(time.Until(t))) }

func clockAt(t time.Time) *testClock {
	c := &testClock{}
	c.Set(t)
	return c
}

// testEscrows is the ledger's escrows and claims as the ledger judges
// them: no escrow, a claim before expiry, a receipt already claimed.
type testEscrows struct {
	now func() time.Time

	mu       sync.Mutex
	escrows  map[string]*ledger.Escrow
	down     int // the next reads and claims get no answer
	early    int // claims refused as before the escrow's expiry
	claimed  chan ledger.Receipt
	disputed chan string // jobs whose mark was disputed
}

func newTestEscrows(now func() time.Time) *testEscrows {
	return &testEscrows{now: now, escrows: map[string]*ledger.Escrow{}, claimed: make(chan ledger.Receipt, 16), disputed: make(chan string, 16)}
}

// settle is the payer settling job for paid to payee "m", marking it
// failed or not: the escrow stays open in its dispute window.
func (l *testEscrows) settle(job string, paid uint64, failed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.escrows[job]
	e.Settled, e.Closes = l.now().Unix(), l.now().Unix()+600
	e.Claimed = append(e.Claimed, ledger.Claimed{Payee: "m", Amount: paid})
	e.Amount -= paid
	if failed {
		e.Marks = []ledger.Mark{{Machine: "m"}}
	}
}

func (l *testEscrows) Dispute(_ context.Context, job string) (*ctypes.ResultTx, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.escrows[job]
	if !ok || e.Settled == 0 || len(e.Marks) == 0 || e.Marks[0].Disputed {
		return nil, &ledger.Error{Code: ledger.CodeNotPayee, Reason: "no mark to dispute"}
	}
	e.Marks[0].Disputed = true
	l.disputed <- job
	return &ctypes.ResultTx{}, nil
}

var _ Escrows = (*testEscrows)(nil)

func (l *testEscrows) open(job string, expiry time.Time) {
	l.mu.Lock()
	l.escrows[job] = &ledger.Escrow{Payer: "payer", Amount: 1000, Total: 1000, Expiry: expiry.Unix(), Payees: []string{"m"}}
	l.mu.Unlock()
}

func (l *testEscrows) Escrow(_ context.Context, job string) (*ledger.Escrow, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.down > 0 {
		l.down--
		return nil, errors.New("connection refused")
	}
	e, ok := l.escrows[job]
	if !ok {
		return nil, &ledger.Error{Code: ledger.CodeUnknownEscrow, Reason: "not found"}
	}
	c := *e
	c.Claimed = append([]ledger.Claimed(nil), e.Claimed...)
	return &c, nil
}

func (l *testEscrows) Claim(_ context.Context, r ledger.Receipt) (*ctypes.ResultTx, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.down > 0 {
		l.down--
		return nil, errors.New("connection refused")
	}
	e, ok := l.escrows[r.Job]
	switch {
	case !ok:
		return nil, &ledger.Error{Code: ledger.CodeUnknownEscrow, Reason: "no open escrow"}
	case e.Settled == 0 && l.now().Unix() < e.Expiry:
		l.early++
		return nil, &ledger.Error{Code: ledger.CodeNotExpired, Reason: "not expired"}
	}
	var paid uint64
	for _, c := range e.Claimed {
		if c.Payee == r.Payee {
			paid = c.Amount
		}
	}
	if paid >= r.Amount {
		return nil, &ledger.Error{Code: ledger.CodeBadReceipt, Reason: "already claimed"}
	}
	e.Claimed = append(e.Claimed, ledger.Claimed{Payee: r.Payee, Amount: r.Amount, Seq: r.Seq})
	e.Amount -= r.Amount - paid
	l.claimed <- r
	return &ctypes.ResultTx{}, nil
}

// startClaims runs c until the test ends or the returned stop is called,
// which waits for it.
func startClaims(t *testing.T, c *claims) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.run(ctx)
	}()
	stop = func() {
		cancel()
		<-done
	}
	t.Cleanup(stop)
	return stop
}

// nextClaim is the next claim the ledger takes.
func nextClaim(t *testing.T, l *testEscrows) ledger.Receipt {
	t.Helper()
	select {
	case r := <-l.claimed:
		return r
	case <-time.After(20 * time.Second):
		t.Fatal("no claim came")
		return ledger.Receipt{}
	}
}

func testClaims(l Escrows, s Store, clock *testClock) *claims {
	c := newClaims(l, s, "m", slog.New(slog.DiscardHandler))
	c.now = clock.Now
	return c
}

func receipt(job string, amount, seq uint64) ledger.Receipt {
	return ledger.Receipt{Job: job, Payee: "m", Amount: amount, Seq: seq, Sig: []byte("sig")}
}

// TestClaimsInExpiryOrder: escrows kept in any order are claimed in the
// order they expire, each only once the ledger takes it (no claim comes
// before its escrow's expiry plus the delay), for what the latest receipt
// kept says; a settled escrow is not claimed; a claim answered forgets
// its receipt.
func TestClaimsInExpiryOrder(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	clock := clockAt(start)
	l, st := newTestEscrows(clock.Now), newMemStore()
	c := testClaims(l, st, clock)
	expiries := map[string]time.Duration{"j4": 4 * time.Hour, "j1": time.Hour, "j3": 3 * time.Hour, "j2": 2 * time.Hour}
	for _, job := range []string{"j4", "j1", "j3", "j2"} {
		l.open(job, start.Add(expiries[job]))
		c.Watch(job)
		for seq := uint64(1); seq <= 3; seq++ {
			if err := c.Keep(receipt(job, 10*seq, seq)); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Keep(receipt(job, 5, 2)); err != nil { // an older receipt changes nothing
			t.Fatal(err)
		}
	}
	c.Keep(receipt("settled", 10, 1)) // its escrow is gone: nothing to claim
	startClaims(t, c)

	for _, job := range []string{"j1", "j2", "j3", "j4"} {
		clock.Set(start.Add(expiries[job] + claimDelay))
		c.poke()
		if r := nextClaim(t, l); r.Job != job || r.Amount != 30 || r.Seq != 3 {
			t.Fatalf("claimed %s for %d (seq %d), want %s for 30 (seq 3)", r.Job, r.Amount, r.Seq, job)
		}
	}
	eventually(t, "every answered claim forgets its receipt", func() bool {
		n := 0
		st.Each(receiptsKey, func(string, []byte) error { n++; return nil })
		return n == 0
	})
	l.mu.Lock()
	early := l.early
	l.mu.Unlock()
	if early > 0 {
		t.Errorf("%d claims came before their escrow expired", early)
	}
}

// TestClaimsResumeAfterRestart: receipts kept before the node stopped are
// claimed after it starts again, once their escrows expire, though no
// worker of their runs is here any more; a stopped service keeps nothing
// more.
func TestClaimsResumeAfterRestart(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	clock := clockAt(start)
	l, st := newTestEscrows(clock.Now), newMemStore()
	l.open("a", start.Add(time.Hour))
	l.open("b", start.Add(2*time.Hour))
	before := testClaims(l, st, clock)
	stop := startClaims(t, before)
	for _, r := range []ledger.Receipt{receipt("b", 20, 2), receipt("a", 10, 1)} {
		before.Watch(r.Job)
		if err := before.Keep(r); err != nil {
			t.Fatal(err)
		}
	}
	stop()
	if err := before.Keep(receipt("a", 99, 9)); !errors.Is(err, errClaimsStopped) {
		t.Fatalf("a stopped service kept a receipt (%v)", err)
	}
	var kept ledger.Receipt
	if found, err := st.Get(receiptsKey+"a", &kept); !found || err != nil || kept.Amount != 10 {
		t.Fatalf("receipt of a after the stop: %+v (found %v, %v), want the one kept before", kept, found, err)
	}

	clock.Set(start.Add(3 * time.Hour))
	l.mu.Lock()
	l.down = 2 // the ledger is still starting: the first reads fail
	l.mu.Unlock()
	after := testClaims(l, st, clock)
	after.retry = time.Millisecond
	startClaims(t, after)
	for _, want := range []ledger.Receipt{receipt("a", 10, 1), receipt("b", 20, 2)} {
		if r := nextClaim(t, l); r.Job != want.Job || r.Amount != want.Amount {
			t.Fatalf("claimed %s for %d after the restart, want %s for %d", r.Job, r.Amount, want.Job, want.Amount)
		}
	}
}

// failingStore is a Store whose reads and writes fail while broken.
type failingStore struct {
	Store
	broken atomic.Bool
}

var errDiskFull = errors.New("no space left on device")

func (s *failingStore) Get(key string, v any) (bool, error) {
	if s.broken.Load() {
		return false, errDiskFull
	}
	return s.Store.Get(key, v)
}

func (s *failingStore) Put(key string, v any) error {
	if s.broken.Load() {
		return errDiskFull
	}
	return s.Store.Put(key, v)
}

// TestReceiptStoreErrorIsSurfaced: a receipt the store does not take is
// an error for the one who kept it, is stored once the store takes
// writes again, and is claimed with meanwhile.
func TestReceiptStoreErrorIsSurfaced(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	clock := clockAt(start)
	l, st := newTestEscrows(clock.Now), &failingStore{Store: newMemStore()}
	l.open("j", start.Add(time.Hour))
	c := testClaims(l, st, clock)
	startClaims(t, c)

	st.broken.Store(true)
	if err := c.Keep(receipt("j", 40, 4)); !errors.Is(err, errDiskFull) {
		t.Fatalf("keeping a receipt on a full disk: %v, want its error", err)
	}
	st.broken.Store(false)
	clock.Set(start.Add(claimRetry))
	c.poke()
	eventually(t, "the receipt is stored once the store takes it", func() bool {
		var r ledger.Receipt
		found, err := st.Get(receiptsKey+"j", &r)
		return found && err == nil && r.Amount == 40
	})

	// Kept in memory, a receipt is claimed with though the store fails.
	st.broken.Store(true)
	if err := c.Keep(receipt("j", 50, 5)); err == nil {
		t.Fatal("no error for a receipt the store refused")
	}
	clock.Set(start.Add(time.Hour + claimDelay))
	c.poke()
	if r := nextClaim(t, l); r.Amount != 50 {
		t.Fatalf("claimed %d, want the latest receipt's 50", r.Amount)
	}
}

// TestStatusSaysWhenAReceiptIsNotKept: a status request whose receipt the
// store refuses is answered, and the machine's log says the receipt was
// not kept.
func TestStatusSaysWhenAReceiptIsNotKept(t *testing.T) {
	var logs bytes.Buffer
	st := &failingStore{Store: newMemStore()}
	e := workAreaExecutor(t, t.TempDir(), st)
	e.log = slog.New(slog.NewTextHandler(&logs, nil))
	e.account, e.chainID = "m", "test-chain"
	e.claims = newClaims(newTestEscrows(time.Now), st, "m", e.log)
	payer, err := identity.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	job, bidder := randomJobID(t), payer.PeerID()
	w := &worker{l: p2p.Launch{JobID: job, World: []string{"this"}}, bidder: bidder, key: workerKey(job, 0),
		state: p2p.WorkerRunning, beat: time.Now(), done: make(chan struct{})}
	e.workers = map[string]*worker{w.key: w}

	st.broken.Store(true)
	r := ledger.SignReceipt(payer, e.chainID, ledger.Receipt{Job: job, Payee: "m", Amount: 7, Seq: 1})
	status, err := e.Status(bidder, p2p.StatusReq{JobID: job, Receipt: &p2p.Receipt{Payee: r.Payee, Amount: r.Amount, Seq: r.Seq, Sig: r.Sig}})
	if err != nil || status.State != p2p.WorkerRunning {
		t.Fatalf("status: %+v, %v", status, err)
	}
	if !strings.Contains(logs.String(), "cannot keep a usage receipt") || !strings.Contains(logs.String(), errDiskFull.Error()) {
		t.Fatalf("the log does not say the receipt was not kept:\n%s", logs.String())
	}
}

// eventually waits up to 20 s for cond.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after 20 s: not %s", what)
		}
	}
}

// TestReceiptsLodgedInTheWindow: a submitter that settles for less than
// its own latest receipt, long before the escrow expires, is made to pay
// the rest: the claim service sees the settlement within claimLook and
// lodges the receipt in the dispute window; a settlement that paid the
// receipt in full is left alone; a failed mark is disputed unless the
// worker failed here.
func TestReceiptsLodgedInTheWindow(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	clock := clockAt(start)
	l, st := newTestEscrows(clock.Now), newMemStore()
	for _, job := range []string{"short", "full", "marked", "caused"} {
		l.open(job, start.Add(24*time.Hour))
	}
	c := testClaims(l, st, clock)
	c.failedHere = func(run string) bool { return run == "caused" }
	for job, amount := range map[string]uint64{"short": 800, "full": 300, "marked": 500, "caused": 400} {
		c.Watch(job)
		if err := c.Keep(receipt(job, amount, 4)); err != nil {
			t.Fatal(err)
		}
	}
	startClaims(t, c)
	l.settle("short", 10, false)
	l.settle("full", 300, false)
	l.settle("marked", 500, true)
	l.settle("caused", 400, true)
	clock.Set(start.Add(claimLook))
	c.poke()
	if r := nextClaim(t, l); r.Job != "short" || r.Amount != 800 {
		t.Fatalf("lodged %s for %d, want short's receipt for 800", r.Job, r.Amount)
	}
	select {
	case job := <-l.disputed:
		if job != "marked" {
			t.Fatalf("disputed the mark on %s, want marked's only", job)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the mark without a cause here was not disputed")
	}
	eventually(t, "every settled run is done", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.runs) == 0
	})
	select {
	case r := <-l.claimed:
		t.Fatalf("claimed %s for %d: it was paid in full", r.Job, r.Amount)
	case job := <-l.disputed:
		t.Fatalf("disputed the mark on %s, whose worker failed here", job)
	default:
	}
}

// receiptExecutor is an executor paid as "m" running one worker of job,
// launched by payer; stranger is another key.
func receiptExecutor(t *testing.T) (e *Executor, st *memStore, payer, stranger *identity.Key, job string) {
	t.Helper()
	st = newMemStore()
	e = workAreaExecutor(t, t.TempDir(), st)
	e.account, e.chainID = "m", "test-chain"
	e.claims = newClaims(newTestEscrows(time.Now), st, "m", e.log)
	var err error
	if payer, err = identity.GenerateKey(); err != nil {
		t.Fatal(err)
	}
	if stranger, err = identity.GenerateKey(); err != nil {
		t.Fatal(err)
	}
	job = randomJobID(t)
	w := &worker{l: p2p.Launch{JobID: job, World: []string{"this"}}, bidder: payer.PeerID(), key: workerKey(job, 0),
		state: p2p.WorkerRunning, beat: time.Now(), done: make(chan struct{})}
	e.workers = map[string]*worker{w.key: w}
	return e, st, payer, stranger, job
}

// TestJunkReceiptIsDropped: a receipt with the highest sequence number
// and a signature that is not the submitter's, or one for another payee,
// is dropped on arrival; the good one stays and is what is claimed with.
// A later receipt for less than the one kept changes nothing.
func TestJunkReceiptIsDropped(t *testing.T) {
	e, st, payer, stranger, job := receiptExecutor(t)
	send := func(k *identity.Key, payee string, amount, seq uint64) {
		t.Helper()
		r := ledger.SignReceipt(k, e.chainID, ledger.Receipt{Job: job, Payee: payee, Amount: amount, Seq: seq})
		if _, err := e.Status(payer.PeerID(), p2p.StatusReq{JobID: job, Receipt: &p2p.Receipt{Payee: r.Payee, Amount: r.Amount, Seq: r.Seq, Sig: r.Sig}}); err != nil {
			t.Fatal(err)
		}
	}
	send(payer, "m", 500, 3)
	send(stranger, "m", 9_000_000, 1<<62)  // a junk signature, highest sequence
	send(payer, "other", 9_000_000, 1<<62) // the submitter's, for someone else
	send(payer, "m", 100, 7)               // later, for less
	var kept ledger.Receipt
	if found, err := st.Get(receiptsKey+job, &kept); !found || err != nil || kept.Amount != 500 || kept.Seq != 3 {
		t.Fatalf("kept %+v (found %v, %v), want the submitter's receipt for 500 (seq 3)", kept, found, err)
	}
	send(payer, "m", 600, 8)
	if found, err := st.Get(receiptsKey+job, &kept); !found || err != nil || kept.Amount != 600 {
		t.Fatalf("kept %+v (found %v, %v), want the later good receipt for 600", kept, found, err)
	}
}

// TestSignedAnswersAreKept: the payer's signed answer on this machine's
// rounds, carried with a receipt, is kept when its signature checks and
// it says more than the one kept; a forged one, one for another payee,
// an earlier one and one whose reason is out of bounds are dropped, and
// the receipt beside each is judged on its own.
func TestSignedAnswersAreKept(t *testing.T) {
	e, st, payer, stranger, job := receiptExecutor(t)
	seq := uint64(0)
	send := func(k *identity.Key, payee string, a ledger.Answer) {
		t.Helper()
		seq++
		a.Job, a.Payee = job, payee
		a = ledger.SignAnswer(k, e.chainID, a)
		r := ledger.SignReceipt(payer, e.chainID, ledger.Receipt{Job: job, Payee: "m", Amount: 100 * seq, Seq: seq})
		req := p2p.StatusReq{JobID: job, Receipt: &p2p.Receipt{Payee: r.Payee, Amount: r.Amount, Seq: r.Seq, Sig: r.Sig,
			Answer: &p2p.Answer{Round: a.Round, Accepted: a.Accepted, Refused: a.Refused, AcceptedMillis: a.AcceptedMillis,
				Reason: a.Reason, Forfeited: a.Forfeited, Sig: a.Sig}}}
		if _, err := e.Status(payer.PeerID(), req); err != nil {
			t.Fatal(err)
		}
	}
	kept := func() ledger.Answer {
		t.Helper()
		a, ok := e.claims.Answer(job)
		if !ok {
			t.Fatal("no answer kept")
		}
		return a
	}
	send(payer, "m", ledger.Answer{Round: 4, Accepted: 2, Refused: 2, AcceptedMillis: 61_500, Reason: "round 3: it raised the validation loss"})
	if a := kept(); a.Round != 4 || a.Refused != 2 || a.Reason != "round 3: it raised the validation loss" || !ledger.VerifyAnswer(payer.Public(), e.chainID, a) {
		t.Fatalf("kept %+v", a)
	}
	send(stranger, "m", ledger.Answer{Round: 9, Accepted: 9})                                                  // forged
	send(payer, "other", ledger.Answer{Round: 9, Accepted: 9})                                                 // another payee's
	send(payer, "m", ledger.Answer{Round: 3, Accepted: 3})                                                     // earlier
	send(payer, "m", ledger.Answer{Round: 9, Accepted: 9, Reason: strings.Repeat("x", ledger.MaxReasonLen+1)}) // too long
	if a := kept(); a.Round != 4 || a.Accepted != 2 {
		t.Fatalf("a bad answer replaced the good one: %+v", a)
	}
	var r ledger.Receipt
	if found, err := st.Get(receiptsKey+job, &r); !found || err != nil || r.Seq != seq {
		t.Errorf("the receipts beside the bad answers: kept %+v (%v %v), want seq %d", r, found, err, seq)
	}
	send(payer, "m", ledger.Answer{Round: 5, Accepted: 2, Refused: 3, Forfeited: true})
	if a := kept(); a.Round != 5 || !a.Forfeited {
		t.Fatalf("the later answer was not kept: %+v", a)
	}
}
