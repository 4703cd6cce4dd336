package submitter

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/p2p"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func running() *p2p.JobStatus  { return &p2p.JobStatus{State: p2p.WorkerRunning} }
func fetching() *p2p.JobStatus { return &p2p.JobStatus{State: p2p.WorkerFetching} }
func stopped() *p2p.JobStatus  { return &p2p.JobStatus{State: p2p.WorkerStopped} }
func exited(code int, result, reason string) *p2p.JobStatus {
	return &p2p.JobStatus{State: p2p.WorkerExited, ExitCode: code, Result: result, Reason: reason}
}
func failed(reason string) *p2p.JobStatus {
	return &p2p.JobStatus{State: p2p.WorkerFailed, Reason: reason}
}

// TestDecideRunEnd tables what a poll of a run's workers means: survey
// then judge, as supervise calls them.
func TestDecideRunEnd(t *testing.T) {
	recent, long := t0.Add(-5*time.Second), t0.Add(-lostAfter-time.Second)
	tests := []struct {
		name      string
		sts       []*p2p.JobStatus
		lastSeen  []time.Time // default: recent
		lost      map[int]bool
		cancelled bool
		started   time.Time
		maxDur    time.Duration

		ended      bool
		out        outcome
		why        string // a substring of end.why; "" means it is empty
		lostAfter  []int
		result     string
		checkpoint bool
	}{
		{name: "all running", sts: []*p2p.JobStatus{running(), running()}},
		{name: "still fetching", sts: []*p2p.JobStatus{fetching(), running()}},
		{name: "all exited ok, chief left a result", sts: []*p2p.JobStatus{exited(0, "bafyres", ""), exited(0, "", "")},
			ended: true, out: succeeded, result: "bafyres"},
		{name: "the chief finishing ends the run", sts: []*p2p.JobStatus{exited(0, "bafyres", ""), running()},
			ended: true, out: succeeded, result: "bafyres"},
		{name: "a worker's result is not the job's", sts: []*p2p.JobStatus{running(), exited(0, "bafyw1", "")}},
		{name: "all exited ok, no result", sts: []*p2p.JobStatus{exited(0, "", ""), exited(0, "", "")},
			ended: true, out: programFailed, why: "every worker exited but the chief left no result"},
		{name: "a worker exited non-zero", sts: []*p2p.JobStatus{running(), exited(3, "", "exited with code 3")},
			ended: true, out: programFailed, why: "worker 1 on m1 exited with code 3"},
		{name: "a worker failed", sts: []*p2p.JobStatus{running(), failed("out of memory")},
			ended: true, out: programFailed, why: "worker 1 on m1 failed: out of memory"},
		{name: "the last failure is the reason", sts: []*p2p.JobStatus{failed("first"), failed("second")},
			ended: true, out: programFailed, why: "worker 1 on m1 failed: second"},
		{name: "a failure beside a silent worker waits", sts: []*p2p.JobStatus{nil, failed("collective op broke")}},
		{name: "a failure beside a lost worker is a loss", sts: []*p2p.JobStatus{nil, failed("collective op broke")},
			lastSeen: []time.Time{long, recent},
			ended:    true, out: workerLost, why: "lost 1 worker(s)", lostAfter: []int{0}},
		{name: "silent a little", sts: []*p2p.JobStatus{running(), nil}},
		{name: "silent too long: lost, the chief checkpoints", sts: []*p2p.JobStatus{running(), nil},
			lastSeen: []time.Time{recent, long},
			ended:    true, out: workerLost, why: "no answer for 30s", lostAfter: []int{1}, checkpoint: true},
		{name: "stopped by its machine: lost", sts: []*p2p.JobStatus{running(), stopped()},
			ended: true, out: workerLost, lostAfter: []int{1}, why: "lost 1 worker(s)", checkpoint: true},
		{name: "the chief lost: no checkpoint", sts: []*p2p.JobStatus{nil, running()}, lastSeen: []time.Time{long, recent},
			ended: true, out: workerLost, lostAfter: []int{0}, why: "lost 1 worker(s)"},
		{name: "lost once, lost for good", sts: []*p2p.JobStatus{running(), running()}, lost: map[int]bool{1: true},
			ended: true, out: workerLost, lostAfter: []int{1}, why: "lost 1 worker(s)", checkpoint: true},
		{name: "two lost", sts: []*p2p.JobStatus{running(), nil, stopped()}, lastSeen: []time.Time{recent, long, recent},
			ended: true, out: workerLost, lostAfter: []int{1, 2}, why: "lost 2 worker(s)", checkpoint: true},
		{name: "a loss wins over success", sts: []*p2p.JobStatus{exited(0, "bafyres", ""), stopped()},
			ended: true, out: workerLost, lostAfter: []int{1}, result: "bafyres", why: "lost 1 worker(s)", checkpoint: true},
		{name: "a failure wins over success", sts: []*p2p.JobStatus{exited(0, "bafyres", ""), exited(1, "", "exited with code 1")},
			ended: true, out: programFailed, result: "bafyres", why: "worker 1 on m1 exited with code 1"},
		{name: "cancelled", sts: []*p2p.JobStatus{running(), running()}, cancelled: true,
			ended: true, out: wasCancelled, why: "cancelled"},
		{name: "success wins over cancellation", sts: []*p2p.JobStatus{exited(0, "bafyres", ""), running()}, cancelled: true,
			ended: true, out: succeeded, result: "bafyres"},
		{name: "a failure wins over cancellation", sts: []*p2p.JobStatus{running(), failed("x")}, cancelled: true,
			ended: true, out: programFailed, why: "failed: x"},
		{name: "within its max duration", sts: []*p2p.JobStatus{running()},
			started: t0.Add(-10 * time.Minute), maxDur: 10 * time.Minute},
		{name: "past its max duration and a minute", sts: []*p2p.JobStatus{running()},
			started: t0.Add(-11*time.Minute - time.Second), maxDur: 10 * time.Minute,
			ended: true, out: timedOut, why: "max duration 10m0s reached"},
		{name: "not launched: no time limit", sts: []*p2p.JobStatus{running()}, maxDur: time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws := make([]jobs.Worker, len(tt.sts))
			for i := range ws {
				ws[i] = jobs.Worker{Machine: "peer" + string(rune('0'+i)), Moniker: "m" + string(rune('0'+i)), LastSeen: recent}
				if tt.lastSeen != nil {
					ws[i].LastSeen = tt.lastSeen[i]
				}
			}
			before := maps.Clone(tt.lost)
			f := survey(tt.sts, ws, tt.lost, t0)
			end, ended := judge(f, tt.cancelled, tt.started, tt.maxDur, t0)
			if !maps.Equal(tt.lost, before) {
				t.Errorf("survey changed the lost workers it was given: %v, was %v", tt.lost, before)
			}
			if ended != tt.ended {
				t.Fatalf("ended = %v (%+v), want %v", ended, end, tt.ended)
			}
			if got := slices.Sorted(maps.Keys(f.lost)); !slices.Equal(got, tt.lostAfter) && len(got)+len(tt.lostAfter) > 0 {
				t.Errorf("lost = %v, want %v", got, tt.lostAfter)
			}
			if !maps.Equal(end.lost, f.lost) {
				t.Errorf("end.lost = %v, want the survey's %v", end.lost, f.lost)
			}
			if f.result != tt.result {
				t.Errorf("result = %q, want %q", f.result, tt.result)
			}
			if !ended {
				return
			}
			if end.out != tt.out {
				t.Errorf("out = %d, want %d", end.out, tt.out)
			}
			if (tt.why == "" && end.why != "") || !strings.Contains(end.why, tt.why) {
				t.Errorf("why = %q, want it to hold %q", end.why, tt.why)
			}
			if end.checkpoint != tt.checkpoint {
				t.Errorf("checkpoint = %v, want %v", end.checkpoint, tt.checkpoint)
			}
		})
	}
}

func TestDecideAnyRunning(t *testing.T) {
	tests := []struct {
		sts  []*p2p.JobStatus
		want bool
	}{
		{nil, false},
		{[]*p2p.JobStatus{nil, fetching()}, false},
		{[]*p2p.JobStatus{fetching(), running()}, true},
		{[]*p2p.JobStatus{exited(0, "r", "")}, false},
	}
	for i, tt := range tests {
		if got := anyRunning(tt.sts); got != tt.want {
			t.Errorf("%d: anyRunning = %v, want %v", i, got, tt.want)
		}
	}
}

func TestDecideAfterRun(t *testing.T) {
	tests := []struct {
		out  outcome
		k    int
		want jobs.State
	}{
		{succeeded, 0, jobs.Succeeded},
		{succeeded, 1, jobs.Succeeded},
		{wasCancelled, 0, jobs.Cancelled},
		{wasCancelled, 1, jobs.Cancelled},
		{programFailed, 0, jobs.Failed},
		{timedOut, 0, jobs.Failed},
		{workerLost, 0, jobs.Quoting},
		{workerLost, maxRuns - 1, jobs.Failed},
		{launchFailed, 0, jobs.Quoting},
		{launchFailed, maxRuns - 1, jobs.Failed},
	}
	for _, tt := range tests {
		if got := afterRun(tt.out, tt.k); got != tt.want {
			t.Errorf("afterRun(%d, %d) = %s, want %s", tt.out, tt.k, got, tt.want)
		}
		if got := afterRun(tt.out, tt.k); got != jobs.Quoting && !got.Terminal() {
			t.Errorf("afterRun(%d, %d) = %s: neither re-placed nor ended", tt.out, tt.k, got)
		}
	}
}

func TestDecideUsed(t *testing.T) {
	now := t0
	tests := []struct {
		name string
		w    jobs.Worker
		want uint64
	}{
		{"never started", jobs.Worker{PerHour: 3600}, 0},
		{"running, seen now", jobs.Worker{PerHour: 3600, Started: now.Add(-time.Hour), LastSeen: now}, 3600},
		{"running, last seen earlier", jobs.Worker{PerHour: 3600, Started: now.Add(-time.Hour), LastSeen: now.Add(-30 * time.Minute)}, 1800},
		{"never seen: up to now", jobs.Worker{PerHour: 3600, Started: now.Add(-time.Hour)}, 3600},
		{"ended", jobs.Worker{PerHour: 3600, Started: now.Add(-time.Hour), Ended: now.Add(-45 * time.Minute), LastSeen: now}, 900},
		{"ended before it started", jobs.Worker{PerHour: 3600, Started: now.Add(-time.Hour), Ended: now.Add(-2 * time.Hour)}, 0},
	}
	for _, tt := range tests {
		if got := used(&jobs.Run{}, &tt.w, now); got != tt.want {
			t.Errorf("%s: used = %d, want %d", tt.name, got, tt.want)
		}
	}
}

func TestDecidePayPlan(t *testing.T) {
	hour := func(payee string, perHour uint64, ran time.Duration) jobs.Worker {
		return jobs.Worker{Payee: payee, PerHour: perHour, Started: t0.Add(-ran), Ended: t0, State: p2p.WorkerExited}
	}
	tests := []struct {
		name    string
		workers []jobs.Worker
		escrow  uint64
		lost    map[int]bool
		want    []ledger.Payment
		total   uint64
	}{
		{name: "each machine its time", escrow: 1_000_000,
			workers: []jobs.Worker{hour("B", 1000, time.Hour), hour("A", 2000, 30*time.Minute)},
			want:    []ledger.Payment{{Machine: "B", Amount: 1000}, {Machine: "A", Amount: 1000}}, total: 2000},
		{name: "two workers on one machine add up", escrow: 1_000_000,
			workers: []jobs.Worker{hour("A", 1000, time.Hour), hour("B", 1000, time.Hour), hour("A", 500, time.Hour)},
			want:    []ledger.Payment{{Machine: "A", Amount: 1500}, {Machine: "B", Amount: 1000}}, total: 2500},
		{name: "a failed worker is paid its time, marked failed", escrow: 1_000_000,
			workers: []jobs.Worker{hour("A", 1000, time.Hour), func() jobs.Worker {
				w := hour("B", 1000, time.Hour)
				w.State = p2p.WorkerFailed
				return w
			}()},
			want: []ledger.Payment{{Machine: "A", Amount: 1000}, {Machine: "B", Amount: 1000, Failed: true}}, total: 2000},
		{name: "a lost machine gets what its receipts cover", escrow: 1_000_000, lost: map[int]bool{1: true},
			workers: []jobs.Worker{hour("A", 1000, time.Hour), func() jobs.Worker {
				w := hour("B", 1000, time.Hour)
				w.Receipt = 400
				return w
			}()},
			want: []ledger.Payment{{Machine: "A", Amount: 1000}, {Machine: "B", Amount: 400, Failed: true}}, total: 1400},
		{name: "a machine's receipt covers all its workers", escrow: 1_000_000, lost: map[int]bool{0: true, 1: true},
			workers: func() []jobs.Worker {
				a, b := hour("B", 1000, time.Hour), hour("B", 1000, time.Hour)
				a.Receipt, b.Receipt = 1500, 1500 // receipts are per machine
				return []jobs.Worker{a, b}
			}(),
			want: []ledger.Payment{{Machine: "B", Amount: 1500, Failed: true}}, total: 1500},
		{name: "never started: nothing", escrow: 1_000_000,
			workers: []jobs.Worker{{Payee: "A", PerHour: 1000}},
			want:    []ledger.Payment{{Machine: "A", Amount: 0}}, total: 0},
		{name: "scaled down to the escrow", escrow: 1500,
			workers: []jobs.Worker{hour("A", 1000, time.Hour), hour("B", 2000, time.Hour)},
			want:    []ledger.Payment{{Machine: "A", Amount: 500}, {Machine: "B", Amount: 1000}}, total: 1500},
		{name: "scaled down, rounding down", escrow: 1000,
			workers: []jobs.Worker{hour("A", 1000, time.Hour), hour("B", 1000, time.Hour), hour("C", 1000, time.Hour)},
			want:    []ledger.Payment{{Machine: "A", Amount: 333}, {Machine: "B", Amount: 333}, {Machine: "C", Amount: 333}}, total: 999},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			run := &jobs.Run{Workers: tt.workers, Escrow: tt.escrow}
			pays, total := payPlan(run, tt.lost, t0)
			if !slices.Equal(pays, tt.want) || total != tt.total {
				t.Errorf("payPlan = %+v, %d; want %+v, %d", pays, total, tt.want, tt.total)
			}
			if total > tt.escrow {
				t.Errorf("pays %d, more than the escrow's %d", total, tt.escrow)
			}
		})
	}
}

func TestDecideOwedSoFar(t *testing.T) {
	w := func(payee string, perHour uint64) jobs.Worker {
		return jobs.Worker{Payee: payee, PerHour: perHour, Started: t0.Add(-time.Hour), LastSeen: t0}
	}
	run := &jobs.Run{Escrow: 2500, Workers: []jobs.Worker{w("A", 1000), w("B", 3000), w("A", 1000), {Payee: "C", PerHour: 9}}}
	want := map[string]uint64{"A": 2000, "B": 2500, "C": 0}
	if got := owedSoFar(run, t0); !maps.Equal(got, want) {
		t.Errorf("owedSoFar = %v, want %v", got, want)
	}
}

func TestDecideQuotes(t *testing.T) {
	q := func(total uint64, workers int, reason string) api.ReceivedQuote {
		rq := api.ReceivedQuote{}
		rq.Total, rq.Reason = total, reason
		for range workers {
			rq.Workers = append(rq.Workers, p2p.QuotedWorker{})
		}
		return rq
	}
	tests := []struct {
		name    string
		qs      []api.ReceivedQuote
		best    int // index into qs; -1: none
		reasons []string
		why     string
	}{
		{name: "no quotes", best: -1, why: noScheduler},
		{name: "the cheapest placement", qs: []api.ReceivedQuote{q(300, 2, ""), q(0, 0, "busy"), q(200, 2, ""), q(250, 2, "")}, best: 2,
			reasons: []string{"busy"}},
		{name: "the first of equals", qs: []api.ReceivedQuote{q(200, 1, ""), q(200, 1, "")}, best: 0},
		{name: "only refusals", qs: []api.ReceivedQuote{q(0, 0, "no GPU"), q(0, 0, "busy"), q(0, 0, "no GPU")}, best: -1,
			reasons: []string{"no GPU", "busy", "no GPU"}, why: "no machine can take the job now: busy; no GPU"},
		{name: "at most five reasons", qs: []api.ReceivedQuote{q(0, 0, "a"), q(0, 0, "b"), q(0, 0, "c"), q(0, 0, "d"), q(0, 0, "e"), q(0, 0, "f")},
			best: -1, reasons: []string{"a", "b", "c", "d", "e"}, why: "no machine can take the job now: a; b; c; d; e"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			best, reasons := choose(tt.qs)
			switch {
			case tt.best < 0 && best != nil:
				t.Errorf("chose %+v, want none", best)
			case tt.best >= 0 && best != &tt.qs[tt.best]:
				t.Errorf("chose %+v, want quote %d", best, tt.best)
			}
			if !slices.Equal(reasons, tt.reasons) {
				t.Errorf("reasons = %q, want %q", reasons, tt.reasons)
			}
			if hasPlacement(tt.qs) != (tt.best >= 0) {
				t.Errorf("hasPlacement = %v", hasPlacement(tt.qs))
			}
			if best == nil {
				if got := noPlacement(reasons); got != tt.why {
					t.Errorf("noPlacement = %q, want %q", got, tt.why)
				}
			}
		})
	}
}

func TestDecideEnoughQuotes(t *testing.T) {
	tests := []struct {
		waited, quiet time.Duration
		count         int
		placed        bool
		want          bool
	}{
		{time.Second, time.Second, 1, true, false},                  // a placement, but wait the usual time
		{quoteWait, 0, 1, true, true},                               // a placement after the usual wait
		{quoteWait, 500 * time.Millisecond, 2, false, false},        // refusals still coming
		{quoteWait, time.Second, 2, false, true},                    // refusals, then a quiet second
		{quoteWait + time.Second, 5 * time.Second, 0, false, false}, // nothing yet
		{quoteWaitMax, quoteWaitMax, 0, false, true},                // the limit
	}
	for i, tt := range tests {
		if got := enoughQuotes(tt.waited, tt.quiet, tt.count, tt.placed); got != tt.want {
			t.Errorf("%d: enoughQuotes(%s, %s, %d, %v) = %v, want %v", i, tt.waited, tt.quiet, tt.count, tt.placed, got, tt.want)
		}
	}
}

func TestDecideBidAgain(t *testing.T) {
	tests := []struct {
		why  string
		bids int
		want bool
	}{
		{"no machine can take the job now: busy", 0, true},
		{"no machine can take the job now: busy", rebids - 1, true},
		{"no machine can take the job now: busy", rebids, false},
		{noScheduler, 0, false},
		{"publish bid: closed", 0, true},
	}
	for _, tt := range tests {
		if got := bidAgain(tt.why, tt.bids); got != tt.want {
			t.Errorf("bidAgain(%q, %d) = %v, want %v", tt.why, tt.bids, got, tt.want)
		}
	}
}

// TestDecideUntilEnough checks that waking after untilEnough misses no
// change of enoughQuotes' answer: none comes sooner, with no new quote.
func TestDecideUntilEnough(t *testing.T) {
	step := 50 * time.Millisecond
	for waited := time.Duration(0); waited < quoteWaitMax; waited += step {
		for quiet := time.Duration(0); quiet <= waited; quiet += step {
			for _, count := range []int{0, 1} {
				for _, placed := range []bool{false, true} {
					if placed && count == 0 || enoughQuotes(waited, quiet, count, placed) {
						continue
					}
					d := untilEnough(waited, quiet)
					if d <= 0 {
						t.Fatalf("untilEnough(%s, %s) = %s, want > 0", waited, quiet, d)
					}
					for later := time.Duration(0); later < d; later += step / 5 {
						if enoughQuotes(waited+later, quiet+later, count, placed) {
							t.Fatalf("enoughQuotes turns true %s after (%s, %s, %d, %v), before untilEnough's %s",
								later, waited, quiet, count, placed, d)
						}
					}
				}
			}
		}
	}
}
