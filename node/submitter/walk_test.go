package submitter

// The walk of a job (doc.go), driven through the Harness: each test
// scripts the market and the machines, then checks where the job ended,
// what the machines were paid and the payer refunded, and which machines
// were stopped.

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/fault"
	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/p2p"
)

// pay is a worker's pay at price an hour for d, rounded down.
func pay(price uint64, d time.Duration) uint64 { return uint64(float64(price) * d.Hours()) }

// CheckSettled checks the settlement of run k of j by the job's own
// record of its workers: each machine paid its hourly price for the time
// its workers ran, or its latest receipt when that is more (a lost
// worker's machine what its last receipt covered, marked failed), that and only that on the ledger, the rest of
// the escrow refunded. It returns what the run paid.
func (h *Harness) CheckSettled(j *jobs.Job, k int, lost ...int) uint64 {
	h.t.Helper()
	run := &j.Runs[k]
	if !run.Settled || run.SettleTx == "" {
		h.t.Fatalf("run %d is not settled: %+v", k, run)
	}
	want, failed, receipt := map[string]uint64{}, map[string]bool{}, map[string]uint64{}
	for i, w := range run.Workers {
		want[w.Payee] += 0 // a machine whose worker never ran is paid nothing, but paid
		switch {
		case slices.Contains(lost, i):
			want[w.Payee] += w.Receipt
			failed[w.Payee] = true
		case !w.Started.IsZero():
			if w.Ended.IsZero() {
				h.t.Errorf("run %d worker %d: settled with no end", k, i)
			}
			want[w.Payee] += pay(w.PerHour, w.Ended.Sub(w.Started))
			receipt[w.Payee] = max(receipt[w.Payee], w.Receipt)
		}
	}
	// A receipt binds: one signed between a worker's end and the poll
	// that saw it covers that poll's time too.
	for p, r := range receipt {
		want[p] = max(want[p], r)
	}
	var s *ledger.Settle
	for _, st := range h.Ledger.Settled() {
		if st.Job == run.ID {
			if s != nil {
				h.t.Fatalf("run %d settled twice", k)
			}
			s = &st
		}
	}
	if s == nil {
		h.t.Fatalf("the ledger has no settlement of run %d", k)
	}
	var total uint64
	for _, p := range s.Payments {
		if p.Amount != want[p.Machine] || p.Failed != failed[p.Machine] {
			h.t.Errorf("run %d paid %s %d (failed %v), want %d (failed %v)", k, p.Machine, p.Amount, p.Failed, want[p.Machine], failed[p.Machine])
		}
		total += p.Amount
	}
	if len(s.Payments) != len(want) {
		h.t.Errorf("run %d: %d payments, want one for each of %d machines", k, len(s.Payments), len(want))
	}
	if total != run.Paid || total > run.Escrow {
		h.t.Errorf("run %d: paid %d in all, the job says %d, of an escrow of %d", k, total, run.Paid, run.Escrow)
	}
	return total
}

// forgotten waits until the job's goroutine has ended and checks that
// the manager keeps nothing of it but its snapshot.
func (h *Harness) forgotten(id string) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), awaitLimit)
	defer cancel()
	h.M.await(ctx, id, func(*jobs.Job) bool { return false }) // returns once nothing more will change
	h.M.mu.Lock()
	defer h.M.mu.Unlock()
	if _, live := h.M.live[id]; live {
		h.t.Error("the job ended, but the manager still keeps it live")
	}
	if h.M.snaps[id] == nil {
		h.t.Error("the job ended, and the manager forgot it: the API cannot show it")
	}
}

// TestWalkSubmitToSettled walks a job from its submission to its
// settlement: quoted, confirmed, paid into escrow, launched on the
// quote's machines, run to its end, each machine paid for what its worker
// ran and the rest refunded.
func TestWalkSubmitToSettled(t *testing.T) {
	h := newHarness(t, "a", "b")
	h.Market.Answer(h.PlaceOn("a", "b"))
	h.Start()
	ctx := t.Context()

	j := h.Submit(h.Spec(2), false)
	if j.State != jobs.Quoting || len(j.Runs) != 1 || len(j.Runs[0].Workers) != 2 || j.Confirmed {
		t.Fatalf("submitted: %s, %d runs, confirmed %v; want an unconfirmed quote of 2 workers", j.State, len(j.Runs), j.Confirmed)
	}
	if j.BundleCID != bundleCID {
		t.Errorf("bundle %q, want the bundle directory added to storage as %s", j.BundleCID, bundleCID)
	}
	if len(h.Ledger.Opened()) != 0 || h.Machines.Holds("a")[committed] != 0 {
		t.Fatal("an unconfirmed job committed holds or paid into escrow")
	}
	c, err := h.M.Confirm(ctx, j.ID[:10]) // a prefix of its ID will do
	if err != nil || !c.Confirmed || c.ID != j.ID {
		t.Fatalf("Confirm = %+v, %v", c, err)
	}

	j = h.Await(j.ID, jobs.Running)
	opened := h.Ledger.Opened()
	if len(opened) != 1 || opened[0].Job != j.ID || opened[0].Amount != maxPrice ||
		!slices.Equal(opened[0].Payees, []string{h.Machines.Payee("a"), h.Machines.Payee("b")}) {
		t.Errorf("escrows opened %+v, want one of the max price %d for the run, payable to a and b", opened, uint64(maxPrice))
	}
	world := []string{h.Machines.ID("a"), h.Machines.ID("b")}
	for i, name := range []string{"a", "b"} {
		if n := h.Machines.Holds(name)[committed]; n != 1 {
			t.Errorf("machine %s: %d holds committed, want 1", name, n)
		}
		ls := h.Machines.Launches(name)
		if len(ls) != 1 || ls[0].Index != i || !slices.Equal(ls[0].World, world) || ls[0].Bundle != bundleCID || ls[0].Resume != "" {
			t.Errorf("machine %s: launches %+v, want worker %d of the world [a b], of the bundle, from scratch", name, ls, i)
		}
	}

	h.Machines.Exit("b", 0, "")
	h.Machines.Exit("a", 0, "bafyresult")
	j = h.Await(j.ID, jobs.Succeeded)
	total := h.CheckSettled(j, 0)
	if total == 0 {
		t.Error("the workers ran, and were paid nothing")
	}
	if j.Cost != total || j.ResultCID != "bafyresult" {
		t.Errorf("cost %d, result %q; want %d and the chief's output", j.Cost, j.ResultCID, total)
	}
	if free, locked := h.Ledger.Balance(); free != payerFunds-total || locked != 0 {
		t.Errorf("the payer has %d, %d locked; want all but the %d paid back, nothing locked", free, locked, total)
	}
	for _, name := range []string{"a", "b"} {
		if h.Ledger.Paid(h.Machines.Payee(name)) == 0 {
			t.Errorf("machine %s was paid nothing", name)
		}
		stops := h.Machines.Stops(name)
		if len(stops) == 0 || !stops[len(stops)-1].Final || h.Machines.Holds(name)[released] != 1 {
			t.Errorf("machine %s: stops %+v, holds %v; want the run forgotten at last, its hold free", name, stops, h.Machines.Holds(name))
		}
	}

	// What the store holds is what the API shows, less what is worked
	// out when a job is read.
	stored := h.Stored(j.ID)
	if stored.State != jobs.Succeeded || stored.Cost != total || stored.Summary != nil || len(stored.Workers) != 2 {
		t.Errorf("stored: %s, cost %d, summary %v, %d workers", stored.State, stored.Cost, stored.Summary, len(stored.Workers))
	}
	shown, err := h.M.Job(ctx, j.ID)
	if err != nil || shown.Summary == nil || shown.State != jobs.Succeeded {
		t.Errorf("Job = %+v, %v; want it succeeded, with its summary", shown, err)
	}
	logs, err := h.M.Logs(ctx, j.ID, 0)
	if err != nil || !strings.Contains(logs.Data, "[w0] worker 0 of 2 starts") || !strings.Contains(logs.Data, "[w1] worker 1 of 2 starts") ||
		!strings.Contains(logs.Data, "state succeeded") {
		t.Errorf("Logs = %q, %v; want each worker's output, tagged, and the end", logs.Data, err)
	}
	if rest, err := h.M.Logs(ctx, j.ID, logs.Next); err != nil || rest.Data != "" || !rest.Done {
		t.Errorf("Logs after the end = %+v, %v; want nothing more, done", rest, err)
	}
	h.forgotten(j.ID)
}

// TestWalkCancelWhileWaitingInQueue: a job no machine takes waits in the
// queue; cancelled there, it ends with nothing committed or paid.
func TestWalkCancelWhileWaitingInQueue(t *testing.T) {
	h := newHarness(t, "a")
	h.Market.Answer(refuse("no free cores"))
	h.Start()
	f := h.Spec(1)
	f.MaxWait = "1h"

	j := h.Submit(f, true)
	if j.State != jobs.Waiting || j.Queue == nil || j.Queue.Position != 1 || !strings.Contains(j.Reason, "no free cores") {
		t.Fatalf("submitted: %s (%s), queue %+v; want it waiting first in the queue, saying why", j.State, j.Reason, j.Queue)
	}
	c, err := h.M.Cancel(t.Context(), j.ID)
	if err != nil || c.State != jobs.Cancelled || !strings.Contains(c.Reason, "nothing was paid") {
		t.Fatalf("Cancel = %s (%s), %v", c.State, c.Reason, err)
	}
	if len(h.Ledger.Opened()) != 0 || len(h.Machines.Reserves("a")) != 0 {
		t.Error("a job cancelled in the queue committed or paid")
	}
	if pos := h.M.q.positions(time.Now()); len(pos) != 0 {
		t.Errorf("the queue still holds %v", pos)
	}
	h.forgotten(j.ID)
}

// TestWalkCancelWhileGatheringQuotes: a cancel stops a job waiting for
// the quotes to its bid at once, not when the wait for quotes ends.
func TestWalkCancelWhileGatheringQuotes(t *testing.T) {
	h := newHarness(t, "a")
	h.Timing.quotes = quoteWaits{usual: time.Hour, max: time.Hour, quiet: time.Hour} // no scheduler answers: a long wait
	h.Market.published = make(chan p2p.Bid, 1)
	h.Start()

	type result struct {
		j   *jobs.Job
		err error
	}
	submitted := make(chan result, 1)
	go func() {
		j, err := h.M.Submit(t.Context(), SubmitRequest{Spec: h.Spec(1), Yes: true})
		submitted <- result{j, err}
	}()
	bid := <-h.Market.published
	c, err := h.M.Cancel(t.Context(), bid.JobID)
	if err != nil || c.State != jobs.Cancelled || c.Reason != "cancelled before launch" {
		t.Fatalf("Cancel = %s (%s), %v; want it cancelled before launch", c.State, c.Reason, err)
	}
	if r := <-submitted; r.err != nil || r.j.State != jobs.Cancelled {
		t.Errorf("Submit = %+v, %v; want the job cancelled", r.j, r.err)
	}
	if len(h.Ledger.Opened()) != 0 {
		t.Error("a job cancelled while bidding paid into escrow")
	}
}

// TestWalkCancelQuotedJob: a quoted job cancelled before it is confirmed
// releases its holds and pays nothing; it cannot be confirmed after.
func TestWalkCancelQuotedJob(t *testing.T) {
	h := newHarness(t, "a", "b")
	h.Market.Answer(h.PlaceOn("a", "b"))
	h.Start()

	j := h.Submit(h.Spec(2), false)
	c, err := h.M.Cancel(t.Context(), j.ID)
	if err != nil || c.State != jobs.Cancelled || c.Reason != "cancelled before launch" {
		t.Fatalf("Cancel = %s (%s), %v", c.State, c.Reason, err)
	}
	for _, name := range []string{"a", "b"} {
		if holds := h.Machines.Holds(name); holds[released] != 1 || holds[held]+holds[committed] != 0 {
			t.Errorf("machine %s: holds %v, want the quote's released", name, holds)
		}
	}
	for _, w := range c.Runs[0].Workers {
		if w.State != jobs.WorkerReleased {
			t.Errorf("a worker of the cancelled quote is %s, want %s", w.State, jobs.WorkerReleased)
		}
	}
	if len(h.Ledger.Opened()) != 0 {
		t.Error("a job cancelled before its confirmation paid into escrow")
	}
	if _, err := h.M.Confirm(t.Context(), j.ID); !isFault(err, fault.Conflict) {
		t.Errorf("Confirm of the cancelled job: %v, want a conflict", err)
	}
	if _, err := h.M.Cancel(t.Context(), j.ID); !isFault(err, fault.Conflict) {
		t.Errorf("Cancel of the cancelled job: %v, want a conflict", err)
	}
}

// TestWalkCancelWhileRunning: a running job cancelled stops its workers,
// pays each machine for what its worker ran and refunds the rest.
func TestWalkCancelWhileRunning(t *testing.T) {
	h := newHarness(t, "a", "b")
	h.Market.Answer(h.PlaceOn("a", "b"))
	h.Start()

	j := h.Submit(h.Spec(2), true)
	h.Await(j.ID, jobs.Running)
	c, err := h.M.Cancel(t.Context(), j.ID)
	if err != nil || c.State != jobs.Cancelled || c.Reason != "cancelled by the submitter" {
		t.Fatalf("Cancel = %s (%s), %v", c.State, c.Reason, err)
	}
	for _, name := range []string{"a", "b"} {
		stops := h.Machines.Stops(name)
		if len(stops) < 2 || stops[0].Reason != "cancelled" || !stops[len(stops)-1].Final || h.Machines.Workers(name) != 0 {
			t.Errorf("machine %s: stops %+v, %d workers left; want its worker stopped as cancelled, then forgotten", name, stops, h.Machines.Workers(name))
		}
	}
	total := h.CheckSettled(c, 0)
	if total == 0 || total >= maxPrice {
		t.Errorf("paid %d: want what the workers ran, above nothing and below the max price", total)
	}
	if free, locked := h.Ledger.Balance(); free != payerFunds-total || locked != 0 {
		t.Errorf("the payer has %d, %d locked; want the rest of the escrow refunded", free, locked)
	}
	h.forgotten(j.ID)
}

// TestWalkMachineRefusesHold: a machine that refuses to commit its hold
// sends the job back to bid, its other holds released; a job whose
// machines keep refusing fails, having paid nothing.
func TestWalkMachineRefusesHold(t *testing.T) {
	t.Run("re-placed", func(t *testing.T) {
		h := newHarness(t, "a", "b", "c", "d")
		h.Market.Answer(h.PlaceOn("a", "b"), h.PlaceOn("c", "d"))
		h.Machines.RefuseCommits("a", "its hold lapsed")
		h.Start()

		j := h.Submit(h.Spec(2), true)
		j = h.Await(j.ID, jobs.Running)
		if got := machinesOf(&j.Runs[0]); got != "c, d" {
			t.Errorf("the job runs on %s, want c, d", got)
		}
		for _, name := range []string{"a", "b"} {
			if holds := h.Machines.Holds(name); holds[released] != 1 || holds[committed] != 0 || len(h.Machines.Launches(name)) != 0 {
				t.Errorf("machine %s: holds %v, %d launches; want its hold released, nothing launched", name, holds, len(h.Machines.Launches(name)))
			}
		}
		if opened := h.Ledger.Opened(); len(opened) != 1 || !slices.Equal(opened[0].Payees, []string{h.Machines.Payee("c"), h.Machines.Payee("d")}) {
			t.Errorf("escrows %+v, want one, payable to c and d", opened)
		}
		h.Machines.Exit("c", 0, "bafyresult")
		h.Machines.Exit("d", 0, "")
		h.CheckSettled(h.Await(j.ID, jobs.Succeeded), 0)
	})
	t.Run("always", func(t *testing.T) {
		h := newHarness(t, "a", "b")
		h.Market.Answer(h.PlaceOn("a", "b"))
		h.Machines.RefuseCommits("a", "its hold lapsed")
		h.Start()

		j := h.Submit(h.Spec(2), true)
		j = h.Await(j.ID, jobs.Failed)
		if !strings.Contains(j.Reason, "kept refusing to commit their holds (3 tries)") {
			t.Errorf("failed: %s", j.Reason)
		}
		if n := len(h.Market.Bids()); n != commitAttempts {
			t.Errorf("%d bids, want one for each of %d tries", n, commitAttempts)
		}
		for _, name := range []string{"a", "b"} {
			if holds := h.Machines.Holds(name); holds[released] != commitAttempts || len(holds) != 1 {
				t.Errorf("machine %s: holds %v, want every one released", name, holds)
			}
		}
		if len(h.Ledger.Opened()) != 0 {
			t.Error("a job that never held its machines paid into escrow")
		}
	})
}

// TestWalkLaunchFails: a run whose launch fails on a machine is stopped
// and settled (its launched worker paid for what it ran), its holds
// released, and the job is placed again, on other machines.
func TestWalkLaunchFails(t *testing.T) {
	h := newHarness(t, "a", "b", "c", "d")
	h.Market.Answer(h.PlaceOn("a", "b"), h.PlaceOn("c", "d"))
	h.Machines.FailLaunches("b", errors.New("connection refused"))
	h.Start()

	j := h.Submit(h.Spec(2), true)
	j = h.Await(j.ID, jobs.Running)
	if len(j.Runs) != 2 || machinesOf(&j.Runs[1]) != "c, d" {
		t.Fatalf("runs: %d, the last on %s; want a second, on c and d", len(j.Runs), machinesOf(j.Current()))
	}
	h.Machines.Exit("c", 0, "bafyresult")
	h.Machines.Exit("d", 0, "")
	j = h.Await(j.ID, jobs.Succeeded)

	first := h.CheckSettled(j, 0)
	second := h.CheckSettled(j, 1)
	if j.Cost != first+second {
		t.Errorf("cost %d, want both runs' %d + %d", j.Cost, first, second)
	}
	opened := h.Ledger.Opened()
	if len(opened) != 2 || opened[0].Amount != maxPrice || opened[1].Amount != maxPrice-first {
		t.Errorf("escrows %+v, want the max price, then what the first run left of it", opened)
	}
	if h.Ledger.Paid(h.Machines.Payee("b")) != 0 {
		t.Error("the machine that never launched its worker was paid")
	}
	for _, name := range []string{"a", "b"} {
		if holds := h.Machines.Holds(name); holds[released] != 1 || h.Machines.Workers(name) != 0 {
			t.Errorf("machine %s: holds %v, %d workers; want its hold released, no worker left", name, holds, h.Machines.Workers(name))
		}
	}
	if !strings.Contains(h.Log(j.ID), "launch: worker 1 on "+h.Machines.ID("b")+": connection refused") {
		t.Errorf("the log does not say why the launch failed:\n%s", h.Log(j.ID))
	}
}

// TestWalkLostWorker: a worker its machine stops is lost; the run ends,
// the chief keeping a checkpoint, the lost machine is paid what its
// receipts covered, and the job goes on once on other machines, from the
// checkpoint.
func TestWalkLostWorker(t *testing.T) {
	h := newHarness(t, "a", "b", "c", "d")
	h.Market.Answer(h.PlaceOn("a", "b"), h.PlaceOn("c", "d"))
	h.Start()

	j := h.Submit(h.Spec(2), true)
	h.AwaitFunc(j.ID, "running, a receipt sent", func(j *jobs.Job) bool {
		return j.State == jobs.Running && j.Runs[0].Workers[1].Receipt > 0
	})
	h.Machines.Drop("b")
	j = h.AwaitFunc(j.ID, "running again", func(j *jobs.Job) bool { return len(j.Runs) == 2 && j.State == jobs.Running })
	if machinesOf(&j.Runs[1]) != "c, d" || j.Checkpoint != checkpointCID {
		t.Fatalf("re-placed on %s from checkpoint %q; want c, d from the chief's", machinesOf(&j.Runs[1]), j.Checkpoint)
	}
	stops := h.Machines.Stops("a")
	if len(stops) == 0 || !stops[0].Checkpoint || stops[0].Index != 0 {
		t.Errorf("the chief's stops: %+v, want it asked to keep a checkpoint", stops)
	}
	if l := h.Machines.Launches("c"); len(l) != 1 || l[0].Resume != checkpointCID {
		t.Errorf("the new chief's launch: %+v, want it resuming from the checkpoint", l)
	}
	if l := h.Machines.Launches("d"); len(l) != 1 || l[0].Resume != "" {
		t.Errorf("the new worker's launch: %+v, want no checkpoint", l)
	}
	h.Machines.Exit("c", 0, "bafyresult")
	h.Machines.Exit("d", 0, "")
	j = h.Await(j.ID, jobs.Succeeded)

	first := h.CheckSettled(j, 0, 1)
	second := h.CheckSettled(j, 1)
	if receipt := j.Runs[0].Workers[1].Receipt; h.Ledger.Paid(h.Machines.Payee("b")) != receipt || receipt == 0 {
		t.Errorf("the lost machine was paid %d, want what its last receipt covered, %d", h.Ledger.Paid(h.Machines.Payee("b")), receipt)
	}
	if len(h.Machines.Receipts("b")) == 0 {
		t.Error("the lost machine never received a receipt")
	}
	if opened := h.Ledger.Opened(); len(opened) != 2 || opened[1].Amount != maxPrice-first {
		t.Errorf("escrows %+v, want the second of what the first run left", opened)
	}
	if j.Cost != first+second {
		t.Errorf("cost %d, want %d + %d", j.Cost, first, second)
	}
	if !strings.Contains(h.Log(j.ID), "re-placing the job once on other machines from the chief's checkpoint") {
		t.Errorf("the log does not say the job was re-placed:\n%s", h.Log(j.ID))
	}
}

// TestWalkRestartResumesRunningJob: a node restarted while its job runs
// answers for it at once, supervises it again without launching or
// paying anew, and settles it once.
func TestWalkRestartResumesRunningJob(t *testing.T) {
	h := newHarness(t, "a", "b")
	h.Market.Answer(h.PlaceOn("a", "b"))
	h.Start()
	j := h.Submit(h.Spec(2), true)
	h.Await(j.ID, jobs.Running)

	h.Stop()
	m := New(h.Params())
	if err := m.Load(); err != nil {
		t.Fatal(err)
	}
	if got, err := m.Job(t.Context(), j.ID); err != nil || got.State != jobs.Running {
		t.Fatalf("after the restart, before Run: %+v, %v; want the job running", got, err)
	}
	h.Start()
	h.Machines.Exit("a", 0, "bafyresult")
	h.Machines.Exit("b", 0, "")
	j = h.Await(j.ID, jobs.Succeeded)
	h.CheckSettled(j, 0)
	if len(h.Ledger.Opened()) != 1 || len(h.Ledger.Settled()) != 1 {
		t.Errorf("%d escrows, %d settlements; want one each", len(h.Ledger.Opened()), len(h.Ledger.Settled()))
	}
	for _, name := range []string{"a", "b"} {
		if n := len(h.Machines.Launches(name)); n != 1 {
			t.Errorf("machine %s: %d launches, want its worker launched once", name, n)
		}
	}
}

// TestWalkRestartBeforeConfirmation: a quoted job the node restarted with
// is placed anew (its old holds released), and still waits for its
// confirmation.
func TestWalkRestartBeforeConfirmation(t *testing.T) {
	h := newHarness(t, "a")
	h.Market.Answer(h.PlaceOn("a"))
	h.Start()
	j := h.Submit(h.Spec(1), false)

	h.Restart()
	j = h.AwaitFunc(j.ID, "quoted again", func(j *jobs.Job) bool { return len(h.Market.Bids()) == 2 && j.Current() != nil })
	if j.State != jobs.Quoting || len(j.Runs) != 1 {
		t.Fatalf("after the restart: %s, %d runs", j.State, len(j.Runs))
	}
	if holds := h.Machines.Holds("a"); holds[released] != 1 || holds[held] != 1 {
		t.Errorf("holds %v: want the first quote's released, the second's held", holds)
	}
	if _, err := h.M.Confirm(t.Context(), j.ID); err != nil {
		t.Fatal(err)
	}
	h.Await(j.ID, jobs.Running)
}

// TestWalkConfirmExpires: a quote not confirmed in time is dropped, its
// holds released, nothing paid.
func TestWalkConfirmExpires(t *testing.T) {
	h := newHarness(t, "a")
	h.Timing.confirmWait = 50 * time.Millisecond
	h.Market.Answer(h.PlaceOn("a"))
	h.Start()

	j := h.Submit(h.Spec(1), false)
	j = h.Await(j.ID, jobs.Cancelled)
	if j.Reason != "not confirmed within 50ms" {
		t.Errorf("cancelled: %s", j.Reason)
	}
	if holds := h.Machines.Holds("a"); holds[released] != 1 || len(holds) != 1 || len(h.Ledger.Opened()) != 0 {
		t.Errorf("holds %v, %d escrows; want the hold released, nothing paid", holds, len(h.Ledger.Opened()))
	}
	if _, err := h.M.Confirm(t.Context(), j.ID); !isFault(err, fault.Conflict) {
		t.Errorf("Confirm too late: %v, want a conflict", err)
	}
}

// TestWalkConfirmWhileWaiting: a job waiting in the queue shows its
// confirmation at once, and goes on without another when placed.
func TestWalkConfirmWhileWaiting(t *testing.T) {
	h := newHarness(t, "a", "c")
	h.Market.SetOffers(h.Market.Offers(time.Now())[:1]) // only a shows
	h.Market.Answer(refuse("no free cores"), h.PlaceOn("c"))
	h.Start()
	f := h.Spec(1)
	f.MaxWait = "1h"

	j := h.Submit(f, false)
	if j.State != jobs.Waiting {
		t.Fatalf("submitted: %s (%s), want waiting", j.State, j.Reason)
	}
	if _, err := h.M.Confirm(t.Context(), j.ID); err != nil {
		t.Fatal(err)
	}
	h.AwaitFunc(j.ID, "confirmed", func(j *jobs.Job) bool { return j.Confirmed })
	// c joins the market: the offers show room, and the job bids at once.
	h.Market.SetOffers(append(h.Market.Offers(time.Now()), p2p.Offer{Machine: h.Machines.ID("c"), Moniker: "c",
		Lent: p2p.Resources{Cores: 4, MemBytes: 8 << 30}}))
	j = h.Await(j.ID, jobs.Running)
	if machinesOf(&j.Runs[0]) != "c" || len(h.Market.Bids()) != 2 {
		t.Errorf("runs on %s after %d bids; want c, after 2", machinesOf(&j.Runs[0]), len(h.Market.Bids()))
	}
}

// TestWalkEscrowRefused: a job whose escrow the ledger refuses fails,
// its holds released.
func TestWalkEscrowRefused(t *testing.T) {
	h := newHarness(t, "a")
	h.Market.Answer(h.PlaceOn("a"))
	h.Ledger.refuse = "insufficient funds: 3 credits"
	h.Start()

	j := h.Submit(h.Spec(1), true)
	j = h.Await(j.ID, jobs.Failed)
	if j.Reason != "open escrow: insufficient funds: 3 credits" {
		t.Errorf("failed: %s", j.Reason)
	}
	if holds := h.Machines.Holds("a"); holds[released] != 1 || len(h.Machines.Launches("a")) != 0 {
		t.Errorf("holds %v, %d launches; want the hold released, nothing launched", holds, len(h.Machines.Launches("a")))
	}
}

// TestWalkProgramFails: a chief exiting non-zero fails the job; its
// machines are paid for what their workers ran.
func TestWalkProgramFails(t *testing.T) {
	h := newHarness(t, "a", "b")
	h.Market.Answer(h.PlaceOn("a", "b"))
	h.Start()

	j := h.Submit(h.Spec(2), true)
	h.Await(j.ID, jobs.Running)
	h.Machines.Exit("b", 0, "")
	h.Machines.Exit("a", 1, "")
	j = h.Await(j.ID, jobs.Failed)
	if !strings.Contains(j.Reason, "worker 0 on a exited with code 1") {
		t.Errorf("failed: %s", j.Reason)
	}
	for _, name := range []string{"a", "b"} {
		if stops := h.Machines.Stops(name); len(stops) != 2 || stops[0].Final || !stops[1].Final {
			t.Errorf("machine %s: stops %+v; want its worker stopped, then forgotten", name, stops)
		}
	}
	if h.CheckSettled(j, 0) == 0 {
		t.Error("the workers ran, and were paid nothing")
	}
}

func isFault(err error, kind fault.Kind) bool {
	k, ok := fault.KindOf(err)
	return ok && k == kind
}
