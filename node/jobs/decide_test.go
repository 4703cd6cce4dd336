package jobs

import (
	"maps"
	"math"
	"math/big"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/p2p"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func running() *p2p.JobStatus  { return &p2p.JobStatus{State: p2p.WorkerRunning} }
func fetching() *p2p.JobStatus { return &p2p.JobStatus{State: p2p.WorkerFetching} }
func stopped() *p2p.JobStatus  { return &p2p.JobStatus{State: p2p.WorkerStopped} }
func vacated() *p2p.JobStatus {
	return &p2p.JobStatus{State: p2p.WorkerStopped, Vacated: true, Reason: "owner busy"}
}
func outOfTime() *p2p.JobStatus {
	return &p2p.JobStatus{State: p2p.WorkerStopped, OutOfTime: true, Reason: "out of time"}
}
func exited(code int, result, reason string) *p2p.JobStatus {
	return &p2p.JobStatus{State: p2p.WorkerExited, ExitCode: code, Result: result, Reason: reason}
}
func failed(reason string) *p2p.JobStatus {
	return &p2p.JobStatus{State: p2p.WorkerFailed, Reason: reason}
}

// TestDecideRunEnd tables what a poll of a run's workers means: survey
// then judge, as supervise calls them.
func TestDecideRunEnd(t *testing.T) {
	recent, long := t0.Add(-5*time.Second), t0.Add(-LostAfter-time.Second)
	tests := []struct {
		name      string
		sts       []*p2p.JobStatus
		lastSeen  []time.Time // default: recent
		Lost      map[int]bool
		cancelled bool
		started   time.Time
		maxDur    time.Duration
		failedFor time.Duration // how long polls have found a failure

		ended      bool
		Out        Outcome
		Why        string // a substring of end.Why; "" means it is empty
		LostAfter  []int  // the lost workers after the poll
		result     string
		Checkpoint bool
		vacated    []int // the lost workers their machines vacated for their owners
	}{
		{name: "all running", sts: []*p2p.JobStatus{running(), running()}},
		{name: "still fetching", sts: []*p2p.JobStatus{fetching(), running()}},
		{name: "all exited ok, chief left a result", sts: []*p2p.JobStatus{exited(0, "bafyres", ""), exited(0, "", "")},
			ended: true, Out: RunSucceeded, result: "bafyres"},
		{name: "the chief finishing ends the run", sts: []*p2p.JobStatus{exited(0, "bafyres", ""), running()},
			ended: true, Out: RunSucceeded, result: "bafyres"},
		{name: "a worker's result is not the job's", sts: []*p2p.JobStatus{running(), exited(0, "bafyw1", "")}},
		{name: "all exited ok, no result", sts: []*p2p.JobStatus{exited(0, "", ""), exited(0, "", "")},
			ended: true, Out: ProgramFailed, Why: "every worker exited but the chief left no result"},
		{name: "a worker exited non-zero", failedFor: FailureSettle, sts: []*p2p.JobStatus{running(), exited(3, "", "exited with code 3")},
			ended: true, Out: ProgramFailed, Why: "worker 1 on m1 exited with code 3"},
		{name: "a worker failed", failedFor: FailureSettle, sts: []*p2p.JobStatus{running(), failed("out of memory")},
			ended: true, Out: ProgramFailed, Why: "worker 1 on m1 failed: out of memory"},
		{name: "the last failure is the reason", sts: []*p2p.JobStatus{failed("first"), failed("second")},
			ended: true, Out: ProgramFailed, Why: "worker 1 on m1 failed: second"},
		{name: "a failure beside a running worker waits a moment", sts: []*p2p.JobStatus{running(), exited(1, "", "exited with code 1")},
			failedFor: FailureSettle - time.Second},
		{name: "a failure beside a worker its machine stopped is a loss", sts: []*p2p.JobStatus{exited(1, "", "exited with code 1"), stopped()},
			ended: true, Out: WorkerLost, Why: "lost 1 worker(s)", LostAfter: []int{1}, Checkpoint: true},
		{name: "a failure once all others ended is the run's end", sts: []*p2p.JobStatus{exited(1, "", "exited with code 1"), exited(1, "", "exited with code 1")},
			ended: true, Out: ProgramFailed, Why: "worker 1 on m1 exited with code 1"},
		{name: "a failure beside a silent worker waits", failedFor: time.Hour, sts: []*p2p.JobStatus{nil, failed("collective op broke")}},
		{name: "a failure beside a lost worker is a loss", sts: []*p2p.JobStatus{nil, failed("collective op broke")},
			lastSeen: []time.Time{long, recent},
			ended:    true, Out: WorkerLost, Why: "lost 1 worker(s)", LostAfter: []int{0}},
		{name: "silent a little", sts: []*p2p.JobStatus{running(), nil}},
		{name: "silent too long: lost, the chief checkpoints", sts: []*p2p.JobStatus{running(), nil},
			lastSeen: []time.Time{recent, long},
			ended:    true, Out: WorkerLost, Why: "no answer for 30s", LostAfter: []int{1}, Checkpoint: true},
		{name: "stopped by its machine: lost", sts: []*p2p.JobStatus{running(), stopped()},
			ended: true, Out: WorkerLost, LostAfter: []int{1}, Why: "lost 1 worker(s)", Checkpoint: true},
		{name: "vacated for its owner: lost, saying why", sts: []*p2p.JobStatus{running(), vacated()},
			ended: true, Out: WorkerLost, LostAfter: []int{1}, Why: "worker 1 stopped by its machine m1: owner busy", Checkpoint: true, vacated: []int{1}},
		{name: "the chief lost: no checkpoint", sts: []*p2p.JobStatus{nil, running()}, lastSeen: []time.Time{long, recent},
			ended: true, Out: WorkerLost, LostAfter: []int{0}, Why: "lost 1 worker(s)"},
		{name: "lost once, lost for good", sts: []*p2p.JobStatus{running(), running()}, Lost: map[int]bool{1: true},
			ended: true, Out: WorkerLost, LostAfter: []int{1}, Why: "lost 1 worker(s)", Checkpoint: true},
		{name: "two lost", sts: []*p2p.JobStatus{running(), nil, stopped()}, lastSeen: []time.Time{recent, long, recent},
			ended: true, Out: WorkerLost, LostAfter: []int{1, 2}, Why: "lost 2 worker(s)", Checkpoint: true},
		{name: "one vacated, one unreachable", sts: []*p2p.JobStatus{running(), nil, vacated()}, lastSeen: []time.Time{recent, long, recent},
			ended: true, Out: WorkerLost, LostAfter: []int{1, 2}, Why: "lost 2 worker(s)", Checkpoint: true, vacated: []int{2}},
		{name: "a loss wins over success", sts: []*p2p.JobStatus{exited(0, "bafyres", ""), stopped()},
			ended: true, Out: WorkerLost, LostAfter: []int{1}, result: "bafyres", Why: "lost 1 worker(s)", Checkpoint: true},
		{name: "a failure wins over success", sts: []*p2p.JobStatus{exited(0, "bafyres", ""), exited(1, "", "exited with code 1")},
			ended: true, Out: ProgramFailed, result: "bafyres", Why: "worker 1 on m1 exited with code 1"},
		{name: "cancelled", sts: []*p2p.JobStatus{running(), running()}, cancelled: true,
			ended: true, Out: RunCancelled, Why: "cancelled"},
		{name: "success wins over cancellation", sts: []*p2p.JobStatus{exited(0, "bafyres", ""), running()}, cancelled: true,
			ended: true, Out: RunSucceeded, result: "bafyres"},
		{name: "a failure wins over cancellation", failedFor: FailureSettle, sts: []*p2p.JobStatus{running(), failed("x")}, cancelled: true,
			ended: true, Out: ProgramFailed, Why: "failed: x"},
		{name: "within its max duration", sts: []*p2p.JobStatus{running()},
			started: t0.Add(-10 * time.Minute), maxDur: 10 * time.Minute},
		{name: "past its max duration and a minute", sts: []*p2p.JobStatus{running()},
			started: t0.Add(-11*time.Minute - time.Second), maxDur: 10 * time.Minute,
			ended: true, Out: TimedOut, Why: "max duration 10m0s reached"},
		{name: "not launched: no time limit", sts: []*p2p.JobStatus{running()}, maxDur: time.Minute},
		// A machine stops its worker at the max duration: the run is out
		// of time, not short of a worker (re-placed, paid twice).
		{name: "stopped at its max duration: out of time, nobody lost", sts: []*p2p.JobStatus{running(), outOfTime()},
			started: t0.Add(-10*time.Minute - time.Second), maxDur: 10 * time.Minute,
			ended: true, Out: TimedOut, Why: "out of time: max duration 10m0s reached"},
		{name: "out of time within the slack", sts: []*p2p.JobStatus{outOfTime(), outOfTime()},
			started: t0.Add(-10*time.Minute + OutOfTimeSlack), maxDur: 10 * time.Minute,
			ended: true, Out: TimedOut, Why: "out of time"},
		{name: "out of time before the time is up: lost", sts: []*p2p.JobStatus{running(), outOfTime()},
			started: t0.Add(-5 * time.Minute), maxDur: 10 * time.Minute,
			ended: true, Out: WorkerLost, LostAfter: []int{1}, Why: "lost 1 worker(s)", Checkpoint: true},
		{name: "out of time before it was launched: lost", sts: []*p2p.JobStatus{running(), outOfTime()}, maxDur: time.Minute,
			ended: true, Out: WorkerLost, LostAfter: []int{1}, Why: "lost 1 worker(s)", Checkpoint: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws := make([]Worker, len(tt.sts))
			for i := range ws {
				ws[i] = Worker{Machine: "peer" + string(rune('0'+i)), Moniker: "m" + string(rune('0'+i)), LastSeen: recent}
				if tt.lastSeen != nil {
					ws[i].LastSeen = tt.lastSeen[i]
				}
			}
			before := maps.Clone(tt.Lost)
			f := Survey(tt.sts, ws, tt.Lost, t0)
			f.FailedFor = tt.failedFor
			end, ended := Judge(f, tt.cancelled, tt.started, tt.maxDur, t0)
			if !maps.Equal(tt.Lost, before) {
				t.Errorf("survey changed the lost workers it was given: %v, was %v", tt.Lost, before)
			}
			if ended != tt.ended {
				t.Fatalf("ended = %v (%+v), want %v", ended, end, tt.ended)
			}
			if got := slices.Sorted(maps.Keys(f.Lost)); !slices.Equal(got, tt.LostAfter) && len(got)+len(tt.LostAfter) > 0 {
				t.Errorf("lost = %v, want %v", got, tt.LostAfter)
			}
			if !maps.Equal(end.Lost, f.Lost) {
				t.Errorf("end.Lost = %v, want the survey's %v", end.Lost, f.Lost)
			}
			if f.Result != tt.result {
				t.Errorf("result = %q, want %q", f.Result, tt.result)
			}
			if !ended {
				return
			}
			if end.Out != tt.Out {
				t.Errorf("out = %d, want %d", end.Out, tt.Out)
			}
			if (tt.Why == "" && end.Why != "") || !strings.Contains(end.Why, tt.Why) {
				t.Errorf("why = %q, want it to hold %q", end.Why, tt.Why)
			}
			if got := slices.Sorted(maps.Keys(end.Vacated)); !slices.Equal(got, tt.vacated) {
				t.Errorf("vacated = %v, want %v", got, tt.vacated)
			}
			if got, want := len(end.Unvacated()), len(end.Lost)-len(end.Vacated); got != want {
				t.Errorf("%d unvacated of %d lost, %d vacated", got, len(end.Lost), len(end.Vacated))
			}
			if end.Checkpoint != tt.Checkpoint {
				t.Errorf("checkpoint = %v, want %v", end.Checkpoint, tt.Checkpoint)
			}
		})
	}
}

func TestDecideAfterRun(t *testing.T) {
	tests := []struct {
		out  Outcome
		k    int
		want State
	}{
		{RunSucceeded, 0, Succeeded},
		{RunSucceeded, 1, Succeeded},
		{RunCancelled, 0, Cancelled},
		{RunCancelled, 1, Cancelled},
		{ProgramFailed, 0, Failed},
		{TimedOut, 0, Failed},
		{WorkerLost, 0, Quoting},
		{WorkerLost, MaxRuns - 1, Failed},
		{LaunchFailed, 0, Quoting},
		{LaunchFailed, MaxRuns - 1, Failed},
	}
	for _, tt := range tests {
		if got := AfterRun(tt.out, tt.k); got != tt.want {
			t.Errorf("AfterRun(%d, %d) = %s, want %s", tt.out, tt.k, got, tt.want)
		}
		if got := AfterRun(tt.out, tt.k); got != Quoting && !got.Terminal() {
			t.Errorf("AfterRun(%d, %d) = %s: neither re-placed nor ended", tt.out, tt.k, got)
		}
	}
}

func TestDecideUsed(t *testing.T) {
	now := t0
	tests := []struct {
		name string
		w    Worker
		want uint64
	}{
		{"never started", Worker{PerHour: 3600}, 0},
		{"running, seen now", Worker{PerHour: 3600, Started: now.Add(-time.Hour), LastSeen: now}, 3600},
		{"running, last seen earlier", Worker{PerHour: 3600, Started: now.Add(-time.Hour), LastSeen: now.Add(-30 * time.Minute)}, 1800},
		{"never seen: up to now", Worker{PerHour: 3600, Started: now.Add(-time.Hour)}, 3600},
		{"ended", Worker{PerHour: 3600, Started: now.Add(-time.Hour), Ended: now.Add(-45 * time.Minute), LastSeen: now}, 900},
		{"ended before it started", Worker{PerHour: 3600, Started: now.Add(-time.Hour), Ended: now.Add(-2 * time.Hour)}, 0},
		{"suspended a quarter of its hour", Worker{PerHour: 3600, Started: now.Add(-time.Hour), LastSeen: now, Suspended: 15 * time.Minute}, 2700},
		{"suspended longer than it ran", Worker{PerHour: 3600, Started: now.Add(-time.Hour), LastSeen: now, Suspended: 2 * time.Hour}, 0},
	}
	for _, tt := range tests {
		if got := Used(&Run{}, &tt.w, now); got != tt.want {
			t.Errorf("%s: used = %d, want %d", tt.name, got, tt.want)
		}
		// A worker recorded as ending where it was counted to is paid the same.
		if ended := tt.w; !ended.Started.IsZero() {
			ended.Ended = RanUntil(&tt.w, now)
			if got := Used(&Run{}, &ended, now.Add(time.Hour)); got != tt.want {
				t.Errorf("%s, ended at RanUntil: used = %d, want %d", tt.name, got, tt.want)
			}
		}
	}
}

func TestDecidePayPlan(t *testing.T) {
	hour := func(payee string, perHour uint64, ran time.Duration) Worker {
		return Worker{Payee: payee, PerHour: perHour, Started: t0.Add(-ran), Ended: t0, State: p2p.WorkerExited}
	}
	tests := []struct {
		name    string
		workers []Worker
		escrow  uint64
		lost    map[int]bool
		want    []ledger.Payment
		total   uint64
	}{
		{name: "each machine its time", escrow: 1_000_000,
			workers: []Worker{hour("B", 1000, time.Hour), hour("A", 2000, 30*time.Minute)},
			want:    []ledger.Payment{{Machine: "B", Amount: 1000}, {Machine: "A", Amount: 1000}}, total: 2000},
		{name: "two workers on one machine add up", escrow: 1_000_000,
			workers: []Worker{hour("A", 1000, time.Hour), hour("B", 1000, time.Hour), hour("A", 500, time.Hour)},
			want:    []ledger.Payment{{Machine: "A", Amount: 1500}, {Machine: "B", Amount: 1000}}, total: 2500},
		{name: "a failed worker is paid its time, marked failed", escrow: 1_000_000,
			workers: []Worker{hour("A", 1000, time.Hour), func() Worker {
				w := hour("B", 1000, time.Hour)
				w.State = p2p.WorkerFailed
				return w
			}()},
			want: []ledger.Payment{{Machine: "A", Amount: 1000}, {Machine: "B", Amount: 1000, Failed: true}}, total: 2000},
		{name: "a lost machine gets what its receipts cover", escrow: 1_000_000, lost: map[int]bool{1: true},
			workers: []Worker{hour("A", 1000, time.Hour), func() Worker {
				w := hour("B", 1000, time.Hour)
				w.Receipt = 400
				return w
			}()},
			want: []ledger.Payment{{Machine: "A", Amount: 1000}, {Machine: "B", Amount: 400, Failed: true}}, total: 1400},
		{name: "a machine's receipt covers all its workers", escrow: 1_000_000, lost: map[int]bool{0: true, 1: true},
			workers: func() []Worker {
				a, b := hour("B", 1000, time.Hour), hour("B", 1000, time.Hour)
				a.Receipt, b.Receipt = 1500, 1500 // receipts are per machine
				return []Worker{a, b}
			}(),
			want: []ledger.Payment{{Machine: "B", Amount: 1500, Failed: true}}, total: 1500},
		{name: "never started: nothing", escrow: 1_000_000,
			workers: []Worker{{Payee: "A", PerHour: 1000}},
			want:    []ledger.Payment{{Machine: "A", Amount: 0}}, total: 0},
		{name: "scaled down to the escrow", escrow: 1500,
			workers: []Worker{hour("A", 1000, time.Hour), hour("B", 2000, time.Hour)},
			want:    []ledger.Payment{{Machine: "A", Amount: 500}, {Machine: "B", Amount: 1000}}, total: 1500},
		{name: "scaled down, rounding down", escrow: 1000,
			workers: []Worker{hour("A", 1000, time.Hour), hour("B", 1000, time.Hour), hour("C", 1000, time.Hour)},
			want:    []ledger.Payment{{Machine: "A", Amount: 333}, {Machine: "B", Amount: 333}, {Machine: "C", Amount: 333}}, total: 999},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			run := &Run{Workers: tt.workers, Escrow: tt.escrow}
			pays, total := PayPlan(run, tt.lost, t0)
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
	w := func(payee string, perHour uint64) Worker {
		return Worker{Payee: payee, PerHour: perHour, Started: t0.Add(-time.Hour), LastSeen: t0}
	}
	run := &Run{Escrow: 2500, Workers: []Worker{w("A", 1000), w("B", 3000), w("A", 1000), {Payee: "C", PerHour: 9}}}
	want := map[string]uint64{"A": 2000, "B": 2500, "C": 0}
	if got := OwedSoFar(run, t0); !maps.Equal(got, want) {
		t.Errorf("owedSoFar = %v, want %v", got, want)
	}
}

// TestPayPlanLargeEscrow: an escrow of 10,000 credits run 1% over pays
// the escrow, not what a wrapped 64-bit product gives (868 credits).
func TestPayPlanLargeEscrow(t *testing.T) {
	const credit = 1_000_000
	escrow := uint64(10_000 * credit)
	w := Worker{Payee: "A", PerHour: escrow + escrow/100, Started: t0.Add(-time.Hour), Ended: t0, State: p2p.WorkerExited}
	pays, total := PayPlan(&Run{Escrow: escrow, Workers: []Worker{w}}, nil, t0)
	if total != escrow || len(pays) != 1 || pays[0].Amount != escrow {
		t.Fatalf("pays %+v (total %d), want the escrow's %d", pays, total, escrow)
	}
	// Two machines, each owed more than half of 2^64: their sum needs 65
	// bits, and each is paid its exact share of the escrow.
	big := uint64(3 << 62)
	ws := []Worker{{Payee: "A", PerHour: big, Started: t0.Add(-time.Hour), Ended: t0}, {Payee: "B", PerHour: big / 3, Started: t0.Add(-time.Hour), Ended: t0}}
	pays, total = PayPlan(&Run{Escrow: escrow, Workers: ws}, nil, t0)
	if pays[0].Amount != escrow/4*3 || pays[1].Amount != escrow/4 || total != escrow {
		t.Fatalf("pays %+v (total %d), want 3/4 and 1/4 of %d", pays, total, escrow)
	}
}

// TestPayPlanProperties: random runs with prices, receipts and escrows up
// to the ledger's limit (its supply is a uint64, so any amount up to
// 2^64-1): the payments never add up to more than the escrow, their sum is
// the total, each is its machine's exact share rounded down when they are
// scaled, and none shrinks when the escrow grows.
func TestPayPlanProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, 25))
	amount := func() uint64 {
		switch rng.IntN(4) {
		case 0:
			return rng.Uint64() // anything up to 2^64-1
		case 1:
			return rng.Uint64() >> rng.IntN(64)
		case 2:
			return math.MaxUint64 - uint64(rng.IntN(3))
		}
		return uint64(rng.IntN(1_000_000_000))
	}
	payees := []string{"A", "B", "C", "D"}
	for n := 0; n < 20_000; n++ {
		run := &Run{}
		lost := map[int]bool{}
		for i := range 1 + rng.IntN(6) {
			w := Worker{Payee: payees[rng.IntN(len(payees))], PerHour: amount(), Receipt: amount(),
				Started: t0.Add(-time.Duration(rng.IntN(100*3600)) * time.Second), Ended: t0}
			if rng.IntN(5) == 0 {
				lost[i] = true
			}
			if rng.IntN(5) == 0 {
				w.State = p2p.WorkerFailed
			}
			run.Workers = append(run.Workers, w)
		}
		check := func(escrow uint64) []ledger.Payment {
			run.Escrow = escrow
			pays, total := PayPlan(run, lost, t0)
			sum := new(big.Int)
			for _, p := range pays {
				sum.Add(sum, new(big.Int).SetUint64(p.Amount))
			}
			if !sum.IsUint64() || sum.Uint64() != total || total > escrow {
				t.Fatalf("run %d, escrow %d: pays %+v sum to %s, total %d", n, escrow, pays, sum, total)
			}
			return pays
		}
		e1, e2 := amount(), amount()
		if e1 > e2 {
			e1, e2 = e2, e1
		}
		small, large := check(e1), check(e2)
		for i := range small {
			if large[i].Amount < small[i].Amount {
				t.Fatalf("run %d: %s is paid %d from an escrow of %d but %d from one of %d", n, small[i].Machine, small[i].Amount, e1, large[i].Amount, e2)
			}
		}
		// Each payment is its machine's exact share, in big integers:
		// what it is owed (a lost machine its largest receipt, else the
		// time its workers ran, at most 2^64-1, or its latest receipt if
		// more), scaled to the escrow
		// when they add up to more, rounded down.
		owed := map[string]*big.Int{}
		for i := range run.Workers {
			w := &run.Workers[i]
			o := owed[w.Payee]
			if o == nil {
				o = new(big.Int)
				owed[w.Payee] = o
			}
			if lost[i] {
				if r := new(big.Int).SetUint64(w.Receipt); r.Cmp(o) > 0 {
					o.Set(r)
				}
				continue
			}
			if o.Add(o, new(big.Int).SetUint64(Used(run, w, t0))); !o.IsUint64() {
				o.SetUint64(math.MaxUint64)
			}
		}
		for i := range run.Workers {
			w := &run.Workers[i]
			if r := new(big.Int).SetUint64(w.Receipt); r.Cmp(owed[w.Payee]) > 0 {
				owed[w.Payee].Set(r)
			}
		}
		sum := new(big.Int)
		for _, o := range owed {
			sum.Add(sum, o)
		}
		escrow := new(big.Int).SetUint64(e1)
		for _, p := range small {
			want := new(big.Int).Set(owed[p.Machine])
			if sum.Cmp(escrow) > 0 {
				want.Mul(want, escrow).Quo(want, sum)
			}
			if !want.IsUint64() || want.Uint64() != p.Amount {
				t.Fatalf("run %d: %s owed %s of %s is paid %d from an escrow of %d, want %s", n, p.Machine, owed[p.Machine], sum, p.Amount, e1, want)
			}
		}
	}
}

// TestDecideProgress: once a run reports progress, each worker is paid up
// to the last time its count grew (one that never reported earns
// nothing), and a live worker whose count has not grown for stall_after
// (from its start, if it never reported) stops the run as stalled, which
// is not re-placed. A run that never reports is paid for its time and
// never stalls.
func TestDecideProgress(t *testing.T) {
	start := t0.Add(-time.Hour)
	honest := Worker{PerHour: 3600, Started: start, LastSeen: t0, State: p2p.WorkerRunning, ProgressAt: t0.Add(-time.Second), Units: 900}
	stalledW := Worker{PerHour: 3600, Started: start, LastSeen: t0, State: p2p.WorkerRunning, ProgressAt: start.Add(20 * time.Minute), Units: 50}
	lazy := Worker{PerHour: 3600, Started: start, LastSeen: t0, State: p2p.WorkerRunning}
	run := &Run{Workers: []Worker{honest, stalledW, lazy}, Progress: true, Escrow: 1_000_000}

	for i, want := range []uint64{3599, 1200, 0} {
		if got := Used(run, &run.Workers[i], t0); got != want {
			t.Errorf("worker %d: used %d, want %d", i, got, want)
		}
	}
	if got := Stalled(run, 10*time.Minute, t0); !maps.Equal(got, map[int]bool{1: true, 2: true}) {
		t.Errorf("stalled = %v, want workers 1 and 2", got)
	}
	if got := Stalled(run, 2*time.Hour, t0); len(got) != 0 {
		t.Errorf("stalled within the bound: %v", got)
	}
	ended := *run
	ended.Workers = slices.Clone(run.Workers)
	ended.Workers[1].State, ended.Workers[2].SuspendedNow = p2p.WorkerExited, true
	if got := Stalled(&ended, 10*time.Minute, t0); len(got) != 0 {
		t.Errorf("an ended or suspended worker counted as stalled: %v", got)
	}

	quiet := &Run{Workers: []Worker{lazy}}
	if got := Used(quiet, &quiet.Workers[0], t0); got != 3600 {
		t.Errorf("a run that never reports progress: used %d, want its time, 3600", got)
	}
	if got := Stalled(quiet, time.Minute, t0); len(got) != 0 {
		t.Errorf("a run that never reports progress stalled: %v", got)
	}

	sts := []*p2p.JobStatus{running(), running(), running()}
	f := Survey(sts, run.Workers, nil, t0)
	f.Stalled = Stalled(run, 10*time.Minute, t0)
	end, ended2 := Judge(f, false, start, 2*time.Hour, t0)
	if !ended2 || end.Out != RunStalled || !strings.Contains(end.Why, "worker(s) 1, 2") {
		t.Fatalf("a stalled run: %+v %v", end, ended2)
	}
	if AfterRun(end.Out, 0) != Failed {
		t.Errorf("a stalled run is re-placed")
	}
	pays, total := PayPlan(run, end.Lost, t0)
	if total != 3599+1200 || pays[0].Amount != 3599+1200 {
		// One payee for all three (the zero Payee): the honest and the
		// stalled worker's progress, nothing for the lazy one.
		t.Errorf("paid %v, total %d", pays, total)
	}
}

// TestFloorRefusingDoesNotPay: a run's floor pays every worker its share
// of its price for the time it ran, whatever the holder accepted: a
// holder that refuses every round pays the floor all the same, and only a
// failed spot check forfeits it (and marks the machine failed). What was
// held back for spot checks and never checked is paid at settlement.
// Refused rounds are counted, not marked, and what they would have paid
// beyond the floor is withheld: the ledger burns it rather than refund it
// (unless referees uphold the refusal), so the refusal saves the payer
// nothing; so is a forfeited worker's floor.
func TestFloorRefusingDoesNotPay(t *testing.T) {
	run := &Run{Holder: &Worker{}, Escrow: 1 << 40, Floor: 0.5, Workers: []Worker{
		{Payee: "refused", PerHour: 3600, Started: t0.Add(-time.Hour), LastSeen: t0, Refused: 12, Dropped: true},
		{Payee: "accepted", PerHour: 3600, Started: t0.Add(-time.Hour), LastSeen: t0, Accepted: 12, AcceptedSeconds: 2880, HeldSeconds: 720},
		{Payee: "forfeited", PerHour: 3600, Started: t0.Add(-time.Hour), LastSeen: t0, Accepted: 12, Forfeited: true},
	}}
	if owed := OwedSoFar(run, t0); owed["refused"] != 1800 || owed["accepted"] != 2880 || owed["forfeited"] != 0 {
		t.Errorf("receipts %v: want the floor (1800) for the refused worker, its accepted rounds less the held share for the other, nothing for the forfeited", owed)
	}
	pays, _ := PayPlan(run, nil, t0)
	// The refused rounds go to the ledger as a statistic of their own.
	want := []ledger.Payment{{Machine: "refused", Amount: 1800, Rounds: 12, Refused: 12, Withheld: 1800}, {Machine: "accepted", Amount: 3600, Rounds: 12},
		{Machine: "forfeited", Failed: true, Rounds: 12, Withheld: 1800}}
	if !slices.Equal(pays, want) {
		t.Errorf("pay plan %+v, want %+v", pays, want)
	}
	// Forfeited after a receipt for 1000 (two workers on one machine):
	// paid that receipt once, and the rest of its 3000 s withheld.
	run.Workers = []Worker{
		{Payee: "late", PerHour: 3600, Started: t0.Add(-time.Hour), LastSeen: t0, Accepted: 5, Forfeited: true, ForfeitedSeconds: 3000, Receipt: 1000},
		{Payee: "late", PerHour: 3600, Started: t0.Add(-time.Hour), LastSeen: t0, Accepted: 5, Forfeited: true, Receipt: 1000},
	}
	pays, _ = PayPlan(run, nil, t0)
	want = []ledger.Payment{{Machine: "late", Amount: 1000, Failed: true, Rounds: 10, Withheld: 2000 + 1800}}
	if !slices.Equal(pays, want) {
		t.Errorf("pay plan after a receipt %+v, want %+v", pays, want)
	}
}

// TestDroppedIsNotACause: a worker its holder dropped for refused
// rounds ends failed on its machine (its next push is refused), whichever
// of the drop and its machine's stop-loss came first. The drop is the
// payer's word: the machine is not marked failed, and what its refused
// rounds would have paid is withheld, not refunded. A failed spot check
// is a cause.
func TestDroppedIsNotACause(t *testing.T) {
	run := &Run{Holder: &Worker{}, Escrow: 1 << 40, Floor: 0.5, Workers: []Worker{
		{Payee: "dropped", PerHour: 3600, Started: t0.Add(-time.Hour), Ended: t0, State: p2p.WorkerFailed, Refused: 3, Dropped: true},
		{Payee: "crashed", PerHour: 3600, Started: t0.Add(-time.Hour), Ended: t0, State: p2p.WorkerFailed, Accepted: 3, Refused: 1,
			AcceptedSeconds: 2700},
		{Payee: "forfeited", PerHour: 3600, Started: t0.Add(-time.Hour), Ended: t0, State: p2p.WorkerFailed, Refused: 3,
			Dropped: true, Forfeited: true},
	}}
	pays, _ := PayPlan(run, nil, t0)
	want := []ledger.Payment{{Machine: "dropped", Amount: 1800, Rounds: 3, Refused: 3, Withheld: 1800},
		{Machine: "crashed", Amount: 2700, Failed: true, Rounds: 4, Refused: 1, Withheld: 900},
		{Machine: "forfeited", Failed: true, Rounds: 3, Refused: 3, Withheld: 1800}}
	if !slices.Equal(pays, want) {
		t.Errorf("pay plan %+v, want %+v", pays, want)
	}
}

// TestDecideHeld: a held run pays each worker its price for the seconds of
// its accepted rounds, whatever it ran; its end is its holder's.
func TestDecideHeld(t *testing.T) {
	run := &Run{Holder: &Worker{}, Escrow: 1 << 40, Workers: []Worker{
		{Payee: "A", PerHour: 3600, Started: t0.Add(-time.Hour), LastSeen: t0},
		{Payee: "B", PerHour: 3600, Started: t0.Add(-time.Hour), LastSeen: t0},
		{Payee: "C", PerHour: 3600, Started: t0.Add(-time.Hour), LastSeen: t0},
	}}
	ApplyAccounts(run, map[string]HolderAccount{
		"0": {Accepted: 10, Seconds: 600}, "1": {Refused: 4, Dropped: true}, "7": {Accepted: 99, Seconds: 1e6},
		"x": {Accepted: 1}, "2": {Accepted: 1, Seconds: math.NaN()},
	})
	// Counts only grow: a restarted holder's smaller figures change nothing.
	ApplyAccounts(run, map[string]HolderAccount{"0": {Accepted: 2, Seconds: 60}})
	w := run.Workers
	if w[0].Accepted != 10 || w[0].AcceptedSeconds != 600 || w[1].Refused != 4 || !w[1].Dropped || w[2].AcceptedSeconds != 0 {
		t.Fatalf("accounts: %+v", w)
	}
	pays, total := PayPlan(run, nil, t0)
	if total != 600 || len(pays) != 3 || pays[0].Amount != 600 || pays[1].Amount != 0 || pays[2].Amount != 0 ||
		pays[0].Failed || pays[1].Failed || pays[2].Failed {
		t.Errorf("pay plan %+v (total %d): want 600 for A's 600 s of accepted rounds, nothing for the others, none marked: refused rounds are no cause", pays, total)
	}
	if owed := OwedSoFar(run, t0); owed["A"] != 600 || owed["B"] != 0 {
		t.Errorf("owed so far %v", owed)
	}
	// A worker caught by a spot check forfeits what it had earned, and
	// a later account does not give it back.
	ApplyAccounts(run, map[string]HolderAccount{"0": {Accepted: 11, Seconds: 660, Forfeited: true, Dropped: true,
		CheckFailure: "round 3 does not replay"}})
	ApplyAccounts(run, map[string]HolderAccount{"0": {Accepted: 11, Seconds: 700}})
	if w := run.Workers[0]; !w.Forfeited || w.AcceptedSeconds != 0 || w.ForfeitedSeconds != 700 || !w.Dropped ||
		w.CheckFailure != "round 3 does not replay" {
		t.Errorf("after a failed spot check: %+v", w)
	}
	// What it forfeited is withheld, not refunded: the payer's holder
	// gains nothing by declaring a forfeit.
	if pays, total := PayPlan(run, nil, t0); total != 0 || !pays[0].Failed || pays[0].Withheld != 700 {
		t.Errorf("pay plan after a failed spot check %+v (total %d): want nothing paid, A failed, its 700 s withheld", pays, total)
	}
	run.Workers[0] = Worker{Payee: "A", PerHour: 3600, Started: t0.Add(-time.Hour), LastSeen: t0}
	ApplyAccounts(run, map[string]HolderAccount{"0": {Accepted: 10, Seconds: 480, HeldSeconds: 120}})
	if w := run.Workers[0]; w.AcceptedSeconds != 480 || w.HeldSeconds != 120 {
		t.Errorf("held back: %+v", w)
	}

	running := &p2p.JobStatus{State: p2p.WorkerRunning}
	tests := []struct {
		name   string
		holder *p2p.JobStatus
		f      Fleet
		cancel bool
		ended  bool
		out    Outcome
		why    string
	}{
		{name: "running", holder: running},
		{name: "a worker lost or failed: the holder goes on", holder: running,
			f: Fleet{Lost: map[int]bool{1: true}, Failed: "worker 2 on m2 exited with code 1"}},
		{name: "the holder finished", holder: exited(0, "bafyres", ""), ended: true, out: RunSucceeded},
		{name: "the holder failed", holder: failed("out of memory"), ended: true, out: ProgramFailed, why: "holder (on this machine) failed: out of memory"},
		{name: "the holder exited non-zero", holder: exited(1, "", "exited with code 1"), ended: true, out: ProgramFailed, why: "exited with code 1"},
		{name: "the holder left no result", holder: exited(0, "", ""), ended: true, out: ProgramFailed, why: "no result"},
		{name: "no answer: waits", holder: nil},
		{name: "cancelled", holder: running, cancel: true, ended: true, out: RunCancelled},
	}
	for _, tt := range tests {
		end, ended := JudgeHeld(tt.f, tt.holder, tt.cancel, t0.Add(-time.Minute), time.Hour, t0)
		if ended != tt.ended || ended && (end.Out != tt.out || !strings.Contains(end.Why, tt.why)) {
			t.Errorf("%s: ended %v %+v, want %v %d %q", tt.name, ended, end, tt.ended, tt.out, tt.why)
		}
	}
	if end, ended := JudgeHeld(Fleet{}, running, false, t0.Add(-2*time.Hour), time.Hour, t0); !ended || end.Out != TimedOut {
		t.Errorf("past the max duration: %v %+v", ended, end)
	}
}

// TestDecideLockstep: in a lockstep run no worker is paid past the lower
// median of its workers' last progress, so a lazy lender that says its
// worker progresses while the others wait on it earns nothing for it.
func TestDecideLockstep(t *testing.T) {
	start := t0.Add(-time.Hour)
	at := func(m int) Worker {
		return Worker{PerHour: 3600, Started: start, LastSeen: t0, State: p2p.WorkerRunning, ProgressAt: start.Add(time.Duration(m) * time.Minute), Units: 1}
	}
	tests := []struct {
		name string
		ws   []Worker
		want []uint64
	}{
		{"all in step", []Worker{at(60), at(60), at(60)}, []uint64{3600, 3600, 3600}},
		{"one lies past the others' stall", []Worker{at(20), at(20), at(60)}, []uint64{1200, 1200, 1200}},
		{"one freezes: the others are paid on", []Worker{at(10), at(60), at(60)}, []uint64{600, 3600, 3600}},
		{"two workers: the lower one", []Worker{at(20), at(60)}, []uint64{1200, 1200}},
		{"one never reported: not counted", []Worker{at(30), at(30), {PerHour: 3600, Started: start, LastSeen: t0}}, []uint64{1800, 1800, 0}},
	}
	for _, tt := range tests {
		run := &Run{Workers: tt.ws, Progress: true, Lockstep: true, Escrow: 1 << 40}
		for i, want := range tt.want {
			if got := Used(run, &run.Workers[i], t0); got != want {
				t.Errorf("%s: worker %d used %d, want %d", tt.name, i, got, want)
			}
		}
		// Not in lockstep, each is paid up to its own progress.
		run.Lockstep = false
		if got := Used(run, &run.Workers[len(tt.ws)-1], t0); tt.name == "one lies past the others' stall" && got != 3600 {
			t.Errorf("%s, not lockstep: the last worker used %d, want 3600", tt.name, got)
		}
	}
}

// TestBenched: in a held run the submitter stops a worker the holder
// dropped, one that failed a spot check, and one that handed nothing in
// while the holder closed AbsentRounds rounds; not a worker that hands
// its rounds in, one not started, or one stopped already.
func TestBenched(t *testing.T) {
	started := t0.Add(-time.Minute)
	run := &Run{Holder: &Worker{}, HolderRounds: AbsentRounds - 1, Workers: []Worker{
		{Started: started, Accepted: 3},
		{Started: started},
		{Started: started, Refused: 3, Dropped: true},
		{Started: started, Accepted: 2, Forfeited: true, Dropped: true, CheckFailure: "replay off by 0.9"},
		{},
		{Started: started, Dropped: true, Benched: "earlier"},
	}}
	got := Benched(run)
	if len(got) != 2 || !strings.Contains(got[2], "dropped") || !strings.Contains(got[3], "replay off by 0.9") {
		t.Fatalf("benched %v: want workers 2 (dropped) and 3 (failed its spot check)", got)
	}
	run.HolderRounds = AbsentRounds
	if got := Benched(run); len(got) != 3 || !strings.Contains(got[1], "no update") {
		t.Fatalf("benched %v: want worker 1 (absent for %d rounds) too", got, AbsentRounds)
	}
	// Stopped by its submitter, a benched worker is not lost.
	f := Survey([]*p2p.JobStatus{{State: p2p.WorkerStopped}, {State: p2p.WorkerStopped}}, []Worker{{Benched: "absent"}, {}}, nil, t0)
	if f.Lost[0] || !f.Lost[1] {
		t.Fatalf("lost %v: want the worker its machine stopped, not the one its submitter benched", f.Lost)
	}
	// Its machine's stop-loss stopped it ("stopped: unpaid"): a stop with
	// a cause where the holder refused its rounds, a lost machine where
	// nothing bears the claim out.
	f = Survey([]*p2p.JobStatus{{State: p2p.WorkerStopped, Unpaid: true}, {State: p2p.WorkerStopped, Unpaid: true}},
		[]Worker{{Refused: 3}, {Accepted: 4}}, nil, t0)
	if f.Lost[0] || !f.Lost[1] {
		t.Fatalf("lost %v: want only the worker whose unpaid stop no refusal bears out", f.Lost)
	}
	// The machine heard the refusals from its worker before the holder's
	// accounts reached the submitter: the poll that found the stop first
	// counted it lost; once the accounts bear the stop out it is not.
	unpaid := []*p2p.JobStatus{{State: p2p.WorkerStopped, Unpaid: true}}
	f = Survey(unpaid, []Worker{{}}, nil, t0)
	if !f.Lost[0] {
		t.Fatalf("lost %v: an unpaid stop no refusal bears out yet is a lost machine", f.Lost)
	}
	if f = Survey(unpaid, []Worker{{Refused: 3}}, f.Lost, t0.Add(time.Second)); f.Lost[0] {
		t.Fatalf("lost %v: the refusals now bear the stop out, want it no longer lost", f.Lost)
	}
	if got := Benched(&Run{Workers: run.Workers}); len(got) != 0 {
		t.Fatalf("a run no one holds benched %v", got)
	}
}

// TestAnswerTo: a held run's answer to a machine sums its workers'
// rounds and accepted seconds, names the last refusal and a forfeit, and
// is for the round the holder has reached.
func TestAnswerTo(t *testing.T) {
	run := &Run{ID: "run", Holder: &Worker{}, HolderRounds: 7, Workers: []Worker{
		{Payee: "a", Accepted: 5, Refused: 2, AcceptedSeconds: 50.25, LastRefusal: "round 6: not finite",
			Refusal: &ledger.Refusal{Round: 6, Theta: "aa", Update: "bb"}},
		{Payee: "b", Accepted: 7},
		{Payee: "a", Accepted: 1, Refused: 6, Forfeited: true, Refusal: &ledger.Refusal{Round: 4, Theta: "cc", Update: "dd"}},
	}}
	tr := &p2p.Training{Mode: "diloco", Holder: "submitter", Validation: "bafyvalidation"}
	want := ledger.Answer{Job: "run", Payee: "a", Round: 7, Accepted: 6, Refused: 8, AcceptedMillis: 50_250,
		Reason: "round 6: not finite", Forfeited: true, Refusal: &ledger.Refusal{Round: 6, Theta: "aa", Update: "bb"},
		Terms: ledger.Terms{Validation: "bafyvalidation", Tolerance: 0.1, Echo: 0.98, Residual: 0.9}}
	if got := AnswerTo(run, "a", tr); !reflect.DeepEqual(got, want) {
		t.Errorf("answer to a: %+v, want %+v", got, want)
	}
	if got := AnswerTo(run, "b", tr); got.Accepted != 7 || got.Refused != 0 || got.Reason != "" || got.Forfeited || got.Refusal != nil {
		t.Errorf("answer to b: %+v", got)
	}
}
