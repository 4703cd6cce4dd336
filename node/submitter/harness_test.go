package submitter

// The Harness runs a Manager over fakes of everything deps.go names, in
// the spirit of Nomad's scheduler harness (scheduler/tests/testing.go):
// the fakes answer as a test scripts them and record what the submitter
// asked of them, its plans (bids, hold operations, launches, stops,
// escrows, settlements). They also keep what those plans did (the
// ledger its balances, each machine its holds and workers), so the tests
// check outcomes: states, amounts paid and refunded, machines stopped.

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	cmtbytes "github.com/cometbft/cometbft/libs/bytes"
	ctypes "github.com/cometbft/cometbft/rpc/core/types"
	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/storage"
)

// quickTiming is the submitter's timing shrunk for tests: a job goes
// from its submission to its settlement in a fraction of a second.
var quickTiming = timing{
	quotes:         quoteWaits{usual: 20 * time.Millisecond, max: 150 * time.Millisecond, quiet: 10 * time.Millisecond},
	confirmWait:    time.Minute,
	cancelWait:     10 * time.Second,
	poll:           10 * time.Millisecond,
	pollStarting:   5 * time.Millisecond,
	receiptEvery:   15 * time.Millisecond,
	stopWait:       200 * time.Millisecond,
	checkpointWait: time.Second,
	launchRetry:    5 * time.Millisecond,
	launchPatience: 100 * time.Millisecond,
	settleRetry:    5 * time.Millisecond,
	queueLook:      10 * time.Millisecond,
}

// awaitLimit bounds a test's wait for a job to reach a state: far above
// what it takes, so that a slow machine does not fail the test.
const awaitLimit = 20 * time.Second

// Prices and budgets of the harness's jobs, in micro-credits.
const (
	pricePerHour = 3_600_000_000     // a worker's hourly price: 1000 micro-credits a millisecond
	maxPrice     = 100_000_000_000   // a job's max price ("100000" credits)
	payerFunds   = 1_000_000_000_000 // what the payer's account holds
)

// Harness runs Managers over one set of fakes; Restart makes a new one
// over the same store, as a restarted node.
type Harness struct {
	t        *testing.T
	Machines *fakeMachines
	Market   *fakeMarket
	Ledger   *fakeLedger
	Store    *fakeStore
	Blocks   *fakeBlocks
	Holders  *fakeHolders
	Quotes   *QuoteBook
	Bundle   string // a bundle directory with train.py
	LogDir   string
	Timing   timing // what Start gives the Managers

	M    *Manager // the running one
	stop func()   // ends M's Run and waits for it
}

// newHarness makes fakes for machines of the given names, each offering
// 4 cores and 8 GiB; the market answers nothing until a test says how.
func newHarness(t *testing.T, machines ...string) *Harness {
	t.Helper()
	h := &Harness{t: t, Machines: newFakeMachines(t, machines...), Ledger: newFakeLedger(), Store: newFakeStore(),
		Blocks: &fakeBlocks{}, Holders: &fakeHolders{machine: newPeerID(t)}, Quotes: NewQuoteBook(),
		Bundle: t.TempDir(), LogDir: t.TempDir(), Timing: quickTiming}
	h.Market = &fakeMarket{quotes: h.Quotes, script: []answer{silent}}
	for _, name := range machines {
		h.Market.offers = append(h.Market.offers, p2p.Offer{Machine: h.Machines.ID(name), Moniker: name,
			Lent: p2p.Resources{Cores: 4, MemBytes: 8 << 30}})
	}
	if err := os.WriteFile(filepath.Join(h.Bundle, "train.py"), []byte("print('hi')\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return h
}

// Params are what the harness gives New: its fakes.
func (h *Harness) Params() Params {
	return Params{Account: "payer", LogDir: h.LogDir, EscrowSlack: time.Hour, Machines: h.Machines, Holders: h.Holders,
		Offers: h.Market, Bids: h.Market, Quotes: h.Quotes, Ledger: h.Ledger, Store: h.Store, Blocks: h.Blocks,
		Logger: slog.New(slog.NewTextHandler(testWriter{h.t}, nil)), Reference: p2p.Prices{CoreHour: 1_000_000}}
}

// Start makes a Manager over the fakes, loads the stored jobs and runs
// it until the test ends or Restart; it returns once the Manager takes
// submissions.
func (h *Harness) Start() *Manager {
	h.t.Helper()
	m := New(h.Params())
	m.t = h.Timing
	if err := m.Load(); err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	var once sync.Once
	h.M, h.stop = m, func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				h.t.Errorf("Run: %v", err)
			}
			m.mu.Lock()
			defer m.mu.Unlock()
			if len(m.live) != 0 {
				h.t.Errorf("Run returned with %d jobs still live", len(m.live))
			}
		})
	}
	h.t.Cleanup(h.stop)
	for deadline := time.Now().Add(awaitLimit); ; time.Sleep(time.Millisecond) {
		m.mu.Lock()
		running := m.ctx != nil
		m.mu.Unlock()
		if running {
			return m
		}
		if time.Now().After(deadline) {
			h.t.Fatal("the Manager did not start running")
		}
	}
}

// Stop stops the running Manager, as a node that shuts down, and waits
// until its jobs' goroutines have ended.
func (h *Harness) Stop() { h.stop() }

// Restart stops the running Manager, as a node that shuts down, and
// starts a new one over the same store and fakes.
func (h *Harness) Restart() *Manager {
	h.t.Helper()
	h.stop()
	return h.Start()
}

// Spec is a job of n workers of 1 core and 1 GiB each, at most maxPrice
// for an hour, its bundle the harness's.
func (h *Harness) Spec(n int) jobs.File {
	return jobs.File{Name: "mnist", Framework: "generic", Command: []string{"python3", "train.py"}, Bundle: h.Bundle,
		Workers: n, Cores: 1, Memory: "1GiB", MaxPrice: "100000", MaxDuration: "1h"}
}

// Submit submits f (confirmed already with yes) and returns the job as
// Submit does: quoted, waiting, or ended.
func (h *Harness) Submit(f jobs.File, yes bool) *jobs.Job {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), awaitLimit)
	defer cancel()
	j, err := h.M.Submit(ctx, SubmitRequest{Spec: f, Yes: yes})
	if err != nil {
		h.t.Fatalf("Submit: %v", err)
	}
	return j
}

// Await waits until the job id is in state want, or has ended, and
// returns it; it fails the test, showing the job's log, when the job is
// in another state.
func (h *Harness) Await(id string, want jobs.State) *jobs.Job {
	h.t.Helper()
	return h.AwaitFunc(id, string(want), func(j *jobs.Job) bool { return j.State == want })
}

// AwaitFunc waits until ok reports true of the job id (what says what
// that is), or the job has ended; it fails the test, showing the job's
// log, when ok does not hold of it then.
func (h *Harness) AwaitFunc(id, what string, ok func(j *jobs.Job) bool) *jobs.Job {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), awaitLimit)
	defer cancel()
	j := h.M.await(ctx, id, func(j *jobs.Job) bool { return ok(j) || j.State.Terminal() })
	if !ok(&j) {
		h.t.Fatalf("job is %s (%s), want %s; its log:\n%s", j.State, j.Reason, what, h.Log(id))
	}
	return &j
}

// Log is the job's whole log.
func (h *Harness) Log(id string) string {
	b, _ := os.ReadFile(filepath.Join(h.LogDir, id+".log"))
	return string(b)
}

// Stored is the job as the store holds it.
func (h *Harness) Stored(id string) jobs.Job {
	h.t.Helper()
	var j jobs.Job
	if err := json.Unmarshal(h.Store.Get("jobs/"+id), &j); err != nil {
		h.t.Fatalf("stored job %s: %v", id, err)
	}
	return j
}

// PlaceOn answers a bid with a quote that places its workers on the
// named machines in turn, at pricePerHour each, holding each on its
// machine as a scheduler would.
func (h *Harness) PlaceOn(names ...string) answer {
	return func(bid p2p.Bid) []p2p.Quote {
		q := p2p.Quote{JobID: bid.JobID, HeldUntil: time.Now().Add(time.Minute).UnixMilli()}
		for i := range int(bid.Workers) {
			name := names[i%len(names)]
			q.Workers = append(q.Workers, p2p.QuotedWorker{Machine: h.Machines.ID(name), PerHour: pricePerHour,
				Hold: h.Machines.reserve(name, bid.JobID)})
		}
		q.PerHour = pricePerHour * uint64(bid.Workers)
		q.Total = q.PerHour * uint64(bid.Duration) / 3600
		return []p2p.Quote{q}
	}
}

// answer is how the market's schedulers answer one bid.
type answer func(bid p2p.Bid) []p2p.Quote

// silent schedulers send no quote.
func silent(p2p.Bid) []p2p.Quote { return nil }

// refuse answers a bid with a refusal for reason.
func refuse(reason string) answer {
	return func(bid p2p.Bid) []p2p.Quote {
		return []p2p.Quote{{JobID: bid.JobID, Resource: "cores", Reason: reason}}
	}
}

// schedulerID is the one scheduler the fake market's quotes come from.
const schedulerID = peer.ID("scheduler")

// fakeMarket is the market as the submitter sees it: the offers this
// node holds (Offers), and the schedulers that answer its bids (Bids),
// the n-th bid as the n-th answer of its script says (the last one
// answering every bid after).
type fakeMarket struct {
	quotes *QuoteBook

	mu     sync.Mutex
	offers []p2p.Offer
	// script answers the bids from its from-th on, its last answer every
	// bid after.
	script     []answer
	from       int
	bids       []p2p.Bid // published, in order
	publishErr error
	// published, when not nil, is sent each bid once published (and
	// answered), while it has room.
	published chan p2p.Bid
}

var (
	_ Bids   = (*fakeMarket)(nil)
	_ Offers = (*fakeMarket)(nil)
)

// Answer scripts the answers to the bids from the next on.
func (f *fakeMarket) Answer(as ...answer) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.script, f.from = slices.Clone(as), len(f.bids)
}

// SetOffers replaces the offers this node holds.
func (f *fakeMarket) SetOffers(offers []p2p.Offer) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.offers = offers
}

// Bids are the bids published.
func (f *fakeMarket) Bids() []p2p.Bid {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.bids)
}

func (f *fakeMarket) Offers(time.Time) []p2p.Offer {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.offers)
}

func (f *fakeMarket) Publish(ctx context.Context, bid p2p.Bid, ttl time.Duration) (SeenBid, error) {
	f.mu.Lock()
	f.bids = append(f.bids, bid)
	a, err, published := f.script[min(len(f.bids)-1-f.from, len(f.script)-1)], f.publishErr, f.published
	f.mu.Unlock()
	if err != nil {
		return SeenBid{}, err
	}
	if published != nil {
		defer func() {
			select {
			case published <- bid:
			default:
			}
		}()
	}
	now := time.Now()
	f.quotes.Expect(bid.JobID, now.Add(ttl))
	for _, q := range a(bid) {
		f.quotes.Add(schedulerID, q, time.Now())
	}
	return SeenBid{Bid: bid, From: "self", ReceivedAt: now.UTC(), ExpiresAt: now.Add(ttl).UTC()}, nil
}

// Hold states on a fake machine.
const (
	held      = "held"
	committed = "committed"
	released  = "released"
)

// fakeMachines are the machines jobs run on, by name: each keeps the
// holds schedulers reserved on it and the workers launched on it, and
// records what the submitter asked of it.
type fakeMachines struct {
	t  *testing.T
	mu sync.Mutex
	// byID are the machines by peer ID, names their peer IDs by name.
	byID  map[string]*fakeMachine
	names map[string]string
	holds int // hold IDs handed out
	// The plans: every hold operation, launch and stop the submitter
	// asked for, in order.
	reserves []machineCall[p2p.Reserve]
	launches []machineCall[p2p.Launch]
	stops    []machineCall[p2p.Stop]
}

// machineCall is one request of the submitter's to a machine.
type machineCall[T any] struct {
	Machine string // by name
	Req     T
}

type fakeMachine struct {
	name     string
	holds    map[string]string      // hold ID -> held, committed or released
	workers  map[string]*fakeWorker // by run and index
	receipts []p2p.Receipt          // carried by status requests
	// Scripted refusals: of every commit, for this reason; of every
	// launch, with this error.
	refuseCommit string
	launchErr    error
}

type fakeWorker struct {
	launch p2p.Launch
	st     p2p.JobStatus
	log    []byte
}

var _ Machines = (*fakeMachines)(nil)

func newFakeMachines(t *testing.T, names ...string) *fakeMachines {
	f := &fakeMachines{t: t, byID: map[string]*fakeMachine{}, names: map[string]string{}}
	for _, name := range names {
		id := newPeerID(t)
		f.names[name] = id
		f.byID[id] = &fakeMachine{name: name, holds: map[string]string{}, workers: map[string]*fakeWorker{}}
	}
	return f
}

// ID is the named machine's peer ID.
func (f *fakeMachines) ID(name string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	id, ok := f.names[name]
	if !ok {
		f.t.Fatalf("no machine %q", name)
	}
	return id
}

// Payee is the named machine's ledger address.
func (f *fakeMachines) Payee(name string) string { return PayeeOf(f.ID(name)) }

func (f *fakeMachines) machine(name string) *fakeMachine { return f.byID[f.names[name]] }

// reserve holds room on the named machine for run, as a scheduler
// quoting it does, and returns the hold's ID.
func (f *fakeMachines) reserve(name, run string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.holds++
	id := fmt.Sprintf("%016x", f.holds)
	f.machine(name).holds[id] = held
	return id
}

// Holds are the named machine's holds by state: how many are held,
// committed and released.
func (f *fakeMachines) Holds(name string) map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]int{}
	for _, st := range f.machine(name).holds {
		out[st]++
	}
	return out
}

// RefuseCommits makes the named machine refuse to commit any hold.
func (f *fakeMachines) RefuseCommits(name, reason string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.machine(name).refuseCommit = reason
}

// FailLaunches makes launches on the named machine fail with err.
func (f *fakeMachines) FailLaunches(name string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.machine(name).launchErr = err
}

// Exit ends the workers running on the named machine as their program
// exiting with code; the chief leaves result.
func (f *fakeMachines) Exit(name string, code int, result string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, w := range f.machine(name).workers {
		if w.st.State.Ended() {
			continue
		}
		w.st.State, w.st.ExitCode, w.st.Ended = p2p.WorkerExited, code, time.Now().UnixMilli()
		if code != 0 {
			w.st.Reason = fmt.Sprintf("exited with code %d", code)
		}
		if w.st.Index == 0 {
			w.st.Result = result
		}
	}
}

// Drop has the named machine stop its workers by itself (withdrawn,
// shutting down): they are lost to their runs.
func (f *fakeMachines) Drop(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, w := range f.machine(name).workers {
		if !w.st.State.Ended() {
			w.st.State, w.st.Reason, w.st.Ended = p2p.WorkerStopped, "the machine withdrew", time.Now().UnixMilli()
		}
	}
}

// Workers counts the workers the named machine runs now (launched, not
// ended).
func (f *fakeMachines) Workers(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, w := range f.machine(name).workers {
		if !w.st.State.Ended() {
			n++
		}
	}
	return n
}

// Launches are the launches the submitter sent the named machine.
func (f *fakeMachines) Launches(name string) []p2p.Launch { return callsTo(f, f.launches, name) }

// Stops are the stops the submitter sent the named machine.
func (f *fakeMachines) Stops(name string) []p2p.Stop { return callsTo(f, f.stops, name) }

// Reserves are the hold operations the submitter sent the named machine.
func (f *fakeMachines) Reserves(name string) []p2p.Reserve { return callsTo(f, f.reserves, name) }

// Receipts are the receipts the named machine received.
func (f *fakeMachines) Receipts(name string) []p2p.Receipt {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.machine(name).receipts)
}

func callsTo[T any](f *fakeMachines, calls []machineCall[T], name string) []T {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []T
	for _, c := range calls {
		if c.Machine == name {
			out = append(out, c.Req)
		}
	}
	return out
}

func workerKey(run string, index int) string { return fmt.Sprintf("%s/%d", run, index) }

// checkpointCID is the checkpoint a stopped chief keeps.
const checkpointCID = "bafycheckpoint"

func (f *fakeMachines) Reserve(_ context.Context, machine string, r p2p.Reserve) (p2p.ReserveReply, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := f.byID[machine]
	if m == nil {
		return p2p.ReserveReply{}, errors.New("no such machine")
	}
	f.reserves = append(f.reserves, machineCall[p2p.Reserve]{m.name, r})
	switch r.Op {
	case p2p.OpCommit:
		if m.refuseCommit != "" {
			return p2p.ReserveReply{Reason: m.refuseCommit}, nil
		}
		if m.holds[r.ID] != held {
			return p2p.ReserveReply{Reason: "no such hold"}, nil
		}
		m.holds[r.ID] = committed
	case p2p.OpRelease:
		if _, ok := m.holds[r.ID]; ok {
			m.holds[r.ID] = released
		}
	}
	return p2p.ReserveReply{OK: true}, nil
}

func (f *fakeMachines) Launch(_ context.Context, machine string, l p2p.Launch) (p2p.LaunchReply, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := f.byID[machine]
	if m == nil {
		return p2p.LaunchReply{}, errors.New("no such machine")
	}
	f.launches = append(f.launches, machineCall[p2p.Launch]{m.name, l})
	if m.launchErr != nil {
		return p2p.LaunchReply{}, m.launchErr
	}
	if m.holds[l.Hold] != committed {
		return p2p.LaunchReply{Reason: "no committed hold " + l.Hold}, nil
	}
	log := fmt.Sprintf("worker %d of %d starts\n", l.Index, len(l.World))
	m.workers[workerKey(l.JobID, l.Index)] = &fakeWorker{launch: l, log: []byte(log), st: p2p.JobStatus{JobID: l.JobID, Index: l.Index,
		State: p2p.WorkerRunning, Started: time.Now().UnixMilli(), LogBytes: int64(len(log))}}
	return p2p.LaunchReply{OK: true}, nil
}

func (f *fakeMachines) worker(machine, run string, index int) (*fakeMachine, *fakeWorker, error) {
	m := f.byID[machine]
	if m == nil {
		return nil, nil, errors.New("no such machine")
	}
	w := m.workers[workerKey(run, index)]
	if w == nil {
		return m, nil, errors.New("no such worker")
	}
	return m, w, nil
}

func (f *fakeMachines) Status(_ context.Context, machine string, r p2p.StatusReq) (p2p.JobStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, w, err := f.worker(machine, r.JobID, r.Index)
	if err != nil {
		return p2p.JobStatus{}, err
	}
	if r.Receipt != nil {
		m.receipts = append(m.receipts, *r.Receipt)
	}
	return w.st, nil
}

func (f *fakeMachines) Logs(_ context.Context, machine string, r p2p.LogsReq) (p2p.Logs, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, w, err := f.worker(machine, r.JobID, r.Index)
	if err != nil {
		return p2p.Logs{}, err
	}
	off := min(max(r.Offset, 0), int64(len(w.log)))
	return p2p.Logs{Data: slices.Clone(w.log[off:]), Next: int64(len(w.log))}, nil
}

func (f *fakeMachines) Stop(_ context.Context, machine string, s p2p.Stop) (p2p.JobStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if m := f.byID[machine]; m != nil {
		f.stops = append(f.stops, machineCall[p2p.Stop]{m.name, s})
	}
	m, w, err := f.worker(machine, s.JobID, s.Index)
	if err != nil {
		return p2p.JobStatus{}, err
	}
	if s.Final {
		// The run is forgotten, and the room its hold kept is free.
		delete(m.workers, workerKey(s.JobID, s.Index))
		m.holds[w.launch.Hold] = released
		return w.st, nil
	}
	if !w.st.State.Ended() {
		w.st.State, w.st.Reason, w.st.Ended = p2p.WorkerStopped, s.Reason, time.Now().UnixMilli()
		if s.Checkpoint {
			w.st.Checkpoint = checkpointCID
		}
	}
	return w.st, nil
}

func (f *fakeMachines) Addrs(string) []string { return []string{"/ip4/127.0.0.1/tcp/4001"} }

// fakeLedger is the ledger as a job's payer sees it: escrows locked from
// the payer's balance, settlements that pay machines and refund the rest
// to the payer.
type fakeLedger struct {
	mu       sync.Mutex
	balance  uint64            // the payer's
	escrows  map[string]uint64 // open escrows by run
	paid     map[string]uint64 // what each payee received
	opened   []ledger.OpenEscrow
	settles  []ledger.Settle // accepted
	receipts []ledger.Receipt
	answers  []ledger.Answer
	refuse   string // escrows are refused for this reason
	txs      int
}

var _ Ledger = (*fakeLedger)(nil)

func newFakeLedger() *fakeLedger {
	return &fakeLedger{balance: payerFunds, escrows: map[string]uint64{}, paid: map[string]uint64{}}
}

func (l *fakeLedger) tx() *ctypes.ResultTx {
	l.txs++
	return &ctypes.ResultTx{Hash: cmtbytes.HexBytes(fmt.Appendf(nil, "tx%d", l.txs)), Height: int64(l.txs)}
}

func (l *fakeLedger) OpenEscrow(_ context.Context, m ledger.OpenEscrow) (*ctypes.ResultTx, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.refuse != "":
		return nil, &ledger.Error{Code: ledger.CodeInsufficientFunds, Reason: l.refuse}
	case l.escrows[m.Job] != 0:
		return nil, &ledger.Error{Code: ledger.CodeEscrowExists, Reason: "escrow exists"}
	case m.Amount > l.balance:
		return nil, &ledger.Error{Code: ledger.CodeInsufficientFunds, Reason: "insufficient funds"}
	}
	l.balance -= m.Amount
	l.escrows[m.Job] = m.Amount
	l.opened = append(l.opened, m)
	return l.tx(), nil
}

func (l *fakeLedger) Settle(_ context.Context, s ledger.Settle) (*ctypes.ResultTx, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	amount, ok := l.escrows[s.Job]
	if !ok {
		return nil, &ledger.Error{Code: ledger.CodeUnknownEscrow, Reason: "no open escrow for job " + s.Job}
	}
	var sum uint64
	for _, p := range s.Payments {
		sum += p.Amount
	}
	if sum > amount {
		return nil, &ledger.Error{Code: ledger.CodeInvalidAmount, Reason: "payments exceed the escrow"}
	}
	for _, p := range s.Payments {
		l.paid[p.Machine] += p.Amount
	}
	l.balance += amount - sum
	delete(l.escrows, s.Job)
	l.settles = append(l.settles, s)
	return l.tx(), nil
}

func (l *fakeLedger) SignAnswer(a ledger.Answer) ledger.Answer {
	l.mu.Lock()
	defer l.mu.Unlock()
	a.Sig = []byte("signed by the payer")
	l.answers = append(l.answers, a)
	return a
}

func (l *fakeLedger) SignReceipt(r ledger.Receipt) ledger.Receipt {
	l.mu.Lock()
	defer l.mu.Unlock()
	r.Sig = []byte("signed by the payer")
	l.receipts = append(l.receipts, r)
	return r
}

func (l *fakeLedger) Wait(context.Context, string) (*ctypes.ResultTx, error) {
	return nil, errors.New("no transaction is pending")
}

// Opened are the escrows opened.
func (l *fakeLedger) Opened() []ledger.OpenEscrow {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.opened)
}

// Settled are the settlements accepted.
func (l *fakeLedger) Settled() []ledger.Settle {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.settles)
}

// Paid is what payee has received.
func (l *fakeLedger) Paid(payee string) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.paid[payee]
}

// Balance is the payer's balance, and what its open escrows lock.
func (l *fakeLedger) Balance() (free, locked uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, a := range l.escrows {
		locked += a
	}
	return l.balance, locked
}

// fakeStore is the node store: JSON documents by key.
type fakeStore struct {
	mu   sync.Mutex
	docs map[string][]byte
}

var _ Store = (*fakeStore)(nil)

func newFakeStore() *fakeStore { return &fakeStore{docs: map[string][]byte{}} }

func (s *fakeStore) Put(key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.docs[key] = b
	return nil
}

func (s *fakeStore) Each(prefix string, fn func(key string, doc []byte) error) error {
	s.mu.Lock()
	var keys []string
	for k := range s.docs {
		if strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	docs := make([][]byte, len(keys))
	for i, k := range keys {
		docs[i] = s.docs[k]
	}
	s.mu.Unlock()
	for i, k := range keys {
		if err := fn(k, docs[i]); err != nil {
			return err
		}
	}
	return nil
}

// Get is the document at key (nil when none).
func (s *fakeStore) Get(key string) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.docs[key]
}

// fakeBlocks is storage: every directory added gets bundleCID.
type fakeBlocks struct {
	mu    sync.Mutex
	added []string
}

var _ Blocks = (*fakeBlocks)(nil)

// bundleCID is what fakeBlocks adds every directory as.
const bundleCID = "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"

func (b *fakeBlocks) Add(_ context.Context, path string, _ func(storage.Progress)) (storage.Pin, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.added = append(b.added, path)
	c, err := cid.Decode(bundleCID)
	return storage.Pin{CID: c, Name: filepath.Base(path), Kind: "directory"}, err
}

// fakeImageBytes is the size fakeBlocks says what it added has.
const fakeImageBytes = 5 << 20

func (b *fakeBlocks) Pinned(_ context.Context, c cid.Cid) (storage.Pin, bool, error) {
	return storage.Pin{CID: c, Kind: "directory", Size: fakeImageBytes}, c.String() == bundleCID, nil
}

// Fetch finds no peer with anything but what Add gives.
func (b *fakeBlocks) Fetch(_ context.Context, c cid.Cid, _ func(storage.Progress)) (storage.Pin, error) {
	if c.String() == bundleCID {
		return storage.Pin{CID: c, Kind: "directory", Size: fakeImageBytes}, nil
	}
	return storage.Pin{}, fmt.Errorf("fetch %s: %w (kept 0 blocks)", c, storage.ErrStalled)
}

// fakeHolders is this machine as it would run a held job's holder: it
// runs none.
type fakeHolders struct {
	machine string
	can     bool // CanHold says yes (Hold still fails)
}

var _ Holders = (*fakeHolders)(nil)

func (f *fakeHolders) CanHold([]string) error {
	if f.can {
		return nil
	}
	return errors.New("no sandbox in tests")
}

func (f *fakeHolders) Hold(p2p.Launch) error { return errors.New("no sandbox in tests") }

func (f *fakeHolders) HolderAccounts(string, int) ([]byte, error) { return nil, nil }

func (f *fakeHolders) Machine() string { return f.machine }

// newPeerID is a new machine's peer ID.
func newPeerID(t *testing.T) string {
	_, pub, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return id.String()
}

// testWriter logs through t.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}
