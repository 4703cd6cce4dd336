package sim

import (
	"bytes"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/deepmarket/deepmarket/scheduler"
)

func near(t *testing.T, what string, got, want float64) {
	t.Helper()
	if math.Abs(got-want) > 1e-6*max(1, math.Abs(want)) {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}

// cluster is a Shared-model scenario of single-core machines.
func cluster(speeds []float64, memMiB uint64, jobs ...Job) *Scenario {
	s := &Scenario{Name: "t", Model: Shared, Sites: []string{"lab"}, LANMbps: 100, Thrash: 10, MigrateMBps: 0}
	for i, sp := range speeds {
		s.Machines = append(s.Machines, Machine{ID: string(rune('a' + i)), Cores: 1, MemBytes: memMiB * mib, Speed: sp})
	}
	s.Jobs = jobs
	return s
}

func proc(id string, at, work float64, memMiB uint64) Job {
	return Job{ID: id, Arrival: at, Workers: 1, Per: scheduler.Resources{Cores: 1, MemBytes: memMiB * mib}, Work: work}
}

func TestAloneOnFastestIsSlowdownOne(t *testing.T) {
	s := cluster([]float64{1, 2, 1.5}, 256, proc("j", 0, 100, 10))
	for _, p := range []Policy{MarginalCost(), Mosix()} {
		r, err := Run(s, p, 1)
		if err != nil {
			t.Fatal(err)
		}
		near(t, p.Name+" slowdown", r.MeanSlowdown, 1)
		near(t, p.Name+" completion", r.MeanCompletion, 50)
	}
}

func TestCPUSharedEqually(t *testing.T) {
	// Two jobs of 100 s on one machine: each gets half the CPU until
	// both end at 200 s.
	s := cluster([]float64{1}, 256, proc("a", 0, 100, 10), proc("b", 0, 100, 10))
	r, err := Run(s, MarginalCost(), 1)
	if err != nil {
		t.Fatal(err)
	}
	near(t, "slowdown", r.MeanSlowdown, 2)
	near(t, "makespan", r.Makespan, 200)
	near(t, "cpu util", r.CPUUtil, 1)
	if r.MaxLoad[0] != 2 {
		t.Errorf("max core load %v, want 2 processes per core", r.MaxLoad[0])
	}
}

func TestOvercommittedMemoryThrashes(t *testing.T) {
	// 2 x 200 MiB on a 256 MiB machine: each share is 1/2 / 10.
	s := cluster([]float64{1}, 256, proc("a", 0, 100, 200), proc("b", 0, 100, 200))
	r, err := Run(s, MarginalCost(), 1)
	if err != nil {
		t.Fatal(err)
	}
	near(t, "makespan", r.Makespan, 2000)
	near(t, "thrashing", r.Thrashing, 1)
	if r.MaxLoad[1] <= 1 {
		t.Errorf("max memory load %v, want over-committed", r.MaxLoad[1])
	}
	// With a second machine every policy that looks at memory avoids it.
	s = cluster([]float64{1, 1}, 256, proc("a", 0, 100, 200), proc("b", 0, 100, 200))
	for _, p := range append([]Policy{MarginalCost(), Mosix()}, Baselines()[2:]...) {
		r, err := Run(s, p, 1)
		if err != nil {
			t.Fatal(err)
		}
		if r.Thrashing != 0 || r.Makespan != 100 {
			t.Errorf("%s: thrashing %v, makespan %v; want 0 and 100", p.Name, r.Thrashing, r.Makespan)
		}
	}
}

func TestMosixMigratesToAnIdleMachine(t *testing.T) {
	// Two machines. a (long) and b (short) arrive; c arrives while both
	// run and must share. When b ends, Mosix moves a job onto the freed
	// machine; a static policy leaves the two sharing.
	s := cluster([]float64{1, 1}, 256, proc("a", 0, 1000, 10), proc("b", 0, 10, 10), proc("c", 1, 1000, 10))
	mo, err := Run(s, Mosix(), 1)
	if err != nil {
		t.Fatal(err)
	}
	lr, err := Run(s, Baselines()[3], 1) // least-requested
	if err != nil {
		t.Fatal(err)
	}
	if mo.Migrations == 0 {
		t.Fatal("mosix never migrated")
	}
	if mo.Makespan >= lr.Makespan {
		t.Errorf("mosix makespan %v, static %v: migration should finish sooner", mo.Makespan, lr.Makespan)
	}
}

func TestReservedNeverOvercommits(t *testing.T) {
	s := Edge(DefaultEdge, 0.9, 3)
	for _, p := range Policies(Reserved) {
		r, err := Run(s, p, 3)
		if err != nil {
			t.Fatal(err)
		}
		if r.MaxLoad[0] > 1 || r.MaxLoad[1] > 1 {
			t.Errorf("%s: max load %v: over-committed", p.Name, r.MaxLoad)
		}
		if r.MeanSlowdown < 1 {
			t.Errorf("%s: bounded slowdown %v below 1", p.Name, r.MeanSlowdown)
		}
	}
}

func TestSameInputSameResult(t *testing.T) {
	for _, s := range []*Scenario{Workstations(DefaultWorkstations, 0.7, 5), Edge(DefaultEdge, 0.7, 5)} {
		for _, p := range Policies(s.Model) {
			a, err := Run(s, p, 9)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := Run(s, p, 9)
			if !reflect.DeepEqual(a, b) {
				t.Errorf("%s %s: two runs differ", s.Name, p.Name)
			}
		}
	}
	if !reflect.DeepEqual(Edge(DefaultEdge, 0.5, 2), Edge(DefaultEdge, 0.5, 2)) {
		t.Error("the same seed drew two scenarios")
	}
}

func TestEveryJobCompletesOrIsRejected(t *testing.T) {
	s := Edge(DefaultEdge, 0.7, 4)
	// One job no machine can hold.
	s.Jobs = append(s.Jobs, Job{ID: "huge", Arrival: s.Jobs[len(s.Jobs)-1].Arrival + 1, Workers: 1,
		Per: scheduler.Resources{Cores: 1000}, Work: 10})
	for _, p := range []Policy{MarginalCost(), Baselines()[0]} {
		var seen int
		r, err := Run(s, p, 1)
		if err != nil {
			t.Fatal(err)
		}
		seen = r.Rejected
		if seen < 1 {
			t.Errorf("%s: the job that fits nowhere was not rejected", p.Name)
		}
	}
}

func TestWorkersStayOffSlowLinks(t *testing.T) {
	// Two sites of two 4-core machines, joined by 1 Mbit/s. A 2-worker
	// job that talks fits on either site; marginal cost keeps it on one.
	s := &Scenario{Name: "t", Model: Reserved, Sites: []string{"x", "y"}, LANMbps: 1000, LANLatencyMs: 0.2,
		Links: []Link{{A: 0, B: 1, Mbps: 1, LatencyMs: 30}}}
	for i := range 4 {
		s.Machines = append(s.Machines, Machine{ID: string(rune('a' + i)), Site: i / 2, Cores: 4, MemBytes: 16 << 30, Speed: 1})
	}
	talk := func(id string, at float64) Job {
		return Job{ID: id, Arrival: at, Workers: 2, Per: scheduler.Resources{Cores: 4, MemBytes: 4 << 30},
			Work: 100, StepWork: 0.5, CommBytes: 1 << 20}
	}
	s.Jobs = []Job{talk("a", 0), talk("b", 1)}
	r, err := Run(s, MarginalCost(), 1)
	if err != nil {
		t.Fatal(err)
	}
	if r.CrossSite != 0 {
		t.Errorf("marginal cost spread %v of jobs over the slow link", r.CrossSite)
	}
	// One ring all-reduce of 1 MiB between two sites: 2(W-1)/W x 8 Mbit
	// at 1 Mbit/s plus 2(W-1) x 30 ms.
	run := &run{s: s, paths: s.paths()}
	near(t, "cross-site all-reduce", run.commTime(&s.Jobs[0], []int{0, 2}), 8.388608+0.06)
	near(t, "same-machine all-reduce", run.commTime(&s.Jobs[0], []int{1, 1}), 0)
}

func TestSubsetsOverlapAndCoverEveryMachine(t *testing.T) {
	for _, s := range []*Scenario{Workstations(DefaultWorkstations, 0.5, 1), Edge(DefaultEdge, 0.5, 1)} {
		subs := subsets(s, 4, 0.5, 1)
		seen := make([]int, len(s.Machines))
		for _, sub := range subs {
			if len(sub) < len(s.Machines)/2 {
				t.Errorf("%s: a subset of %d of %d machines", s.Name, len(sub), len(s.Machines))
			}
			for _, mi := range sub {
				seen[mi]++
			}
		}
		over := 0
		for mi, n := range seen {
			if n == 0 {
				t.Errorf("%s: machine %d in no subset", s.Name, mi)
			}
			if n > 1 {
				over++
			}
		}
		if over == 0 {
			t.Errorf("%s: subsets do not overlap", s.Name)
		}
	}
}

func TestScenarioFileRoundTrip(t *testing.T) {
	s := Edge(DefaultEdge, 0.5, 7)
	var b bytes.Buffer
	if err := s.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	back, err := ReadScenario(&b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(s, back) {
		t.Error("a scenario read back differs from the one written")
	}
	for _, tc := range []struct{ in, want string }{
		{`{"name":"x","model":"shared","sites":["a"],"machines":[{"id":"m","site":0,"cores":1,"mem_bytes":1,"speed":1}],"jobs":[],"bogus":1}`, "unknown field"},
		{`{"name":"x","model":"cloud","sites":["a"]}`, `model "cloud"`},
		{`{"name":"x","model":"shared","sites":["a"],"machines":[{"id":"m","site":3,"cores":1,"mem_bytes":1,"speed":1}]}`, "site 3"},
		{`{"name":"x","model":"shared","sites":["a"],"machines":[{"id":"m","site":0,"cores":1,"mem_bytes":1,"speed":0}]}`, "speed"},
		{`{"name":"x","model":"shared","sites":["a"],"machines":[{"id":"m","site":0,"cores":1,"mem_bytes":1,"speed":1}],
		  "jobs":[{"id":"a","arrival_s":5,"workers":1,"per_worker":{"cores":1,"mem_bytes":1,"gpus":0},"work_s":1},
		          {"id":"b","arrival_s":1,"workers":1,"per_worker":{"cores":1,"mem_bytes":1,"gpus":0},"work_s":1}]}`, "in order"},
		{`{"name":"x","model":"reserved","sites":["a","b"],"machines":[{"id":"m","site":0,"cores":1,"mem_bytes":1,"speed":1}]}`, "no path"},
	} {
		_, err := ReadScenario(strings.NewReader(tc.in))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ReadScenario(%.60s...) = %v, want an error about %q", tc.in, err, tc.want)
		}
	}
	if _, err := Run(cluster([]float64{1}, 1, proc("a", 0, 1, 1)), Mosix(), 1); err != nil {
		t.Errorf("mosix on the shared model: %v", err)
	}
	if _, err := Run(Edge(DefaultEdge, 0.3, 1), Mosix(), 1); err == nil {
		t.Error("mosix ran on the reserved model")
	}
}

func TestExperimentReport(t *testing.T) {
	e := EdgeExperiment([]float64{0.3, 0.6}, 2)
	e.Policies = []Policy{MarginalCost(), Baselines()[0]}
	calls := 0
	rep, err := e.Run(func(done, total int) {
		calls++
		if total != 8 {
			t.Errorf("total %d runs, want 8", total)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if calls != 8 || len(rep.Rows) != 4 {
		t.Fatalf("%d progress calls and %d rows, want 8 and 4", calls, len(rep.Rows))
	}
	var md, svg bytes.Buffer
	if err := rep.Markdown(&md); err != nil {
		t.Fatal(err)
	}
	if err := rep.SVG(&svg); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"### offered load 0.60", "| marginal-cost |", "| round-robin |", "1.00x"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("markdown lacks %q:\n%s", want, md.String())
		}
	}
	if !strings.HasPrefix(svg.String(), "<svg") || strings.Count(svg.String(), "<polyline") != 2 {
		t.Errorf("plot: want an SVG with a line per policy:\n%.300s", svg.String())
	}
	mc, _ := rep.Row("marginal-cost", 0.6)
	if mc.Runs != 2 || mc.CreditsMean <= 0 {
		t.Errorf("marginal cost at 0.6: %+v: want 2 runs and credits earned", mc)
	}
}

// TestIndexedPlacesAsMarginalCost: through an index, the marginal-cost
// policy does exactly what it does by exhaustive search, on both shipped
// scenarios at light and heavy load.
func TestIndexedPlacesAsMarginalCost(t *testing.T) {
	for _, s := range []*Scenario{Workstations(DefaultWorkstations, 0.5, 2), Workstations(DefaultWorkstations, 0.95, 3),
		Edge(DefaultEdge, 0.3, 2), Edge(DefaultEdge, 0.9, 3)} {
		want, err := Run(s, MarginalCost(), 1)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Run(s, MarginalCostIndexed(), 1)
		if err != nil {
			t.Fatal(err)
		}
		got.Policy = want.Policy
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: indexed slowdown %.4f, exhaustive %.4f (results differ)", s.Name, got.MeanSlowdown, want.MeanSlowdown)
		}
	}
}
