package scheduler

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

func machine(id, site string, cores uint32, memGiB uint64, gpus uint32) Machine {
	return Machine{ID: id, Site: site, Lent: Resources{Cores: cores, MemBytes: memGiB * gib, GPUs: gpus}, Dedicated: true}
}

func job(workers int, cores uint32, memGiB uint64, gpus uint32) Job {
	return Job{ID: "j", Workers: workers, Per: Resources{Cores: cores, MemBytes: memGiB * gib, GPUs: gpus},
		Duration: time.Hour, Benefit: Benefit{Kind: FixedPrice, Max: 1_000_000_000}}
}

func TestResourceCost(t *testing.T) {
	md := newModel(Params{N: 4}, 4)
	for _, tc := range []struct {
		name                          string
		lent, alloc, d, base, reserve float64
		want                          float64
	}{
		{"nothing added", 8, 3, 0, 100, 0, 0},
		// base * lent * (n^(d/lent) - 1) / ln n with n=4, lent 1, d 1: 100*(4-1)/ln4.
		{"whole of an idle unit", 1, 0, 1, 100, 0, 100 * 3 / math.Log(4)},
		// The same unit when half loaded costs n^0.5 = 2 times more.
		{"second half", 2, 1, 1, 100, 0, 100 * 2 * (4 - 2) / math.Log(4)},
		{"reserve floor", 8, 0, 1, 1, 500, 500},
		{"over capacity", 8, 7, 2, 100, 0, math.Inf(1)},
		{"nothing lent", 0, 0, 1, 100, 0, math.Inf(1)},
	} {
		got := md.resourceCost(tc.lent, tc.alloc, tc.d, tc.base, tc.reserve)
		if math.Abs(got-tc.want) > 1e-6*math.Max(1, tc.want) && !(math.IsInf(got, 1) && math.IsInf(tc.want, 1)) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	// At idle a unit costs its base price; each 1/ln(n) of load scales it by e.
	if p := md.unitPrice(0, 100, 0); p != 100 {
		t.Errorf("idle unit price %v", p)
	}
	if p := md.unitPrice(0.5, 100, 0); math.Abs(p-200) > 1e-9 {
		t.Errorf("half-load unit price %v, want 200 (n^0.5 with n=4)", p)
	}
}

func TestRisk(t *testing.T) {
	md := newModel(Params{}, 4)
	ded := Machine{Dedicated: true, Failed: 100}
	fresh := Machine{}
	good := Machine{Completed: 990, Failed: 0}
	bad := Machine{Completed: 5, Failed: 45}
	if md.risk(&ded) != 1 {
		t.Error("a dedicated machine carries risk")
	}
	if r := md.risk(&fresh); math.Abs(r-1/0.9) > 1e-9 {
		t.Errorf("no record: risk %v, want the prior's 1/0.9", r)
	}
	if !(md.risk(&good) < md.risk(&fresh) && md.risk(&fresh) < md.risk(&bad)) {
		t.Errorf("risk does not follow the record: good %v fresh %v bad %v", md.risk(&good), md.risk(&fresh), md.risk(&bad))
	}
	if md.risk(&Machine{Failed: 1 << 40}) > 10 {
		t.Error("risk is not capped")
	}
}

func TestPlacePrefersIdleAndClose(t *testing.T) {
	v := View{Machines: []Machine{
		machine("busy", "a", 8, 32, 0),
		machine("idle-a", "a", 8, 32, 0),
		machine("idle-b", "b", 8, 32, 0),
	}}
	v.Machines[0].Allocated = Resources{Cores: 6, MemBytes: 24 * gib}
	pl, err := Place(v, job(1, 2, 4, 0), t0, Params{})
	if err != nil {
		t.Fatal(err)
	}
	if pl.Machines[0] == 0 {
		t.Fatalf("placed on the busy machine: %v", pl.Machines)
	}
	// Four workers of 4 cores: two per idle machine would be cheapest in
	// resources, but site a's idle machine and the busy one share a site;
	// whatever the split, no machine goes over its capacity and the
	// network term keeps the job on one site when it fits there.
	pl, err = Place(v, job(2, 4, 8, 0), t0, Params{})
	if err != nil {
		t.Fatal(err)
	}
	sites := map[string]bool{}
	for _, i := range pl.Machines {
		sites[v.Machines[i].Site] = true
	}
	if len(sites) != 1 {
		t.Errorf("two workers spread over sites %v though one site had room", sites)
	}
	if pl.Total == 0 || pl.PerHour == 0 || !pl.Done.Equal(t0.Add(time.Hour)) {
		t.Errorf("placement %+v", pl)
	}
}

// TestSetupPrefersTheWarmMachine: of two machines alike, the one that
// must fetch the job's image first (a setup) loses to the one that holds
// it, whatever their order; a cheaper cold machine still wins when its
// price makes up for the setup; and the placement is done after the
// setup of its slowest machine to get ready.
func TestSetupPrefersTheWarmMachine(t *testing.T) {
	j := job(1, 2, 4, 0)
	for cold := range 2 {
		v := View{Machines: []Machine{machine("m0", "a", 8, 32, 0), machine("m1", "a", 8, 32, 0)}}
		v.Machines[cold].Setup = time.Minute
		pl, err := Place(v, j, t0, Params{})
		if err != nil {
			t.Fatal(err)
		}
		if pl.Machines[0] == cold || !pl.Done.Equal(t0.Add(time.Hour)) {
			t.Errorf("machine %d cold: placed on %v, done %s", cold, pl.Machines, pl.Done)
		}
	}
	// Both cold: placed as before, done a setup later.
	v := View{Machines: []Machine{machine("m0", "a", 8, 32, 0), machine("m1", "a", 8, 32, 0)}}
	v.Machines[0].Setup, v.Machines[1].Setup = time.Minute, time.Minute
	pl, err := Place(v, j, t0, Params{})
	if err != nil || pl.Machines[0] != 0 || !pl.Done.Equal(t0.Add(time.Hour+time.Minute)) {
		t.Errorf("both cold: %+v %v", pl, err)
	}
	// A setup of a minute on an hour's job is worth 1/60 of the price: a
	// cold machine a tenth cheaper wins; one 1% cheaper does not.
	for _, tc := range []struct {
		cheaper  float64
		coldWins bool
	}{{0.10, true}, {0.01, false}} {
		v := View{Machines: []Machine{machine("warm", "a", 8, 32, 0), machine("cold", "a", 8, 32, 0)}}
		v.Machines[0].Reserve = Prices{CoreHour: 1_000_000, MemGiBHour: 100_000}
		v.Machines[1].Reserve = Prices{CoreHour: uint64(1_000_000 * (1 - tc.cheaper)), MemGiBHour: uint64(100_000 * (1 - tc.cheaper))}
		v.Machines[1].Setup = time.Minute
		pl, err := Place(v, j, t0, Params{})
		if err != nil || (pl.Machines[0] == 1) != tc.coldWins {
			t.Errorf("cold machine %.0f%% cheaper: placed on %v (%v), want the cold one %v", 100*tc.cheaper, pl.Machines, err, tc.coldWins)
		}
	}
}

func TestPlaceUsesRTTWhenKnown(t *testing.T) {
	v := View{Machines: []Machine{machine("m0", "", 4, 8, 0), machine("m1", "", 4, 8, 0), machine("m2", "", 4, 8, 0)}}
	// m0-m2 are close; m1 is far from both.
	rtt := map[[2]int]time.Duration{{0, 1}: 80 * time.Millisecond, {0, 2}: time.Millisecond, {1, 2}: 80 * time.Millisecond}
	v.RTT = func(i, j int) (time.Duration, bool) {
		if i > j {
			i, j = j, i
		}
		d, ok := rtt[[2]int{i, j}]
		return d, ok
	}
	pl, err := Place(v, job(2, 4, 8, 0), t0, Params{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[int]bool{pl.Machines[0]: true, pl.Machines[1]: true}
	if !got[0] || !got[2] {
		t.Errorf("workers on %v, want the close pair 0 and 2", pl.Machines)
	}
}

func TestRejectionsSayWhy(t *testing.T) {
	v := View{Machines: []Machine{machine("m0", "a", 8, 16, 1), machine("m1", "a", 8, 16, 0)}}
	for _, tc := range []struct {
		name     string
		v        View
		j        Job
		resource string
		contains string
	}{
		{"no such GPU count", v, job(1, 1, 1, 2), "gpus", "2 GPUs"},
		{"GPUs for only one worker", v, job(2, 1, 1, 1), "gpus", "holds 1 of the 2 workers"},
		{"too much memory", v, job(1, 1, 32, 0), "memory", "32.0 GiB"},
		{"cores run out", v, job(5, 4, 1, 0), "cores", "holds 4 of the 5 workers"},
		{"empty view", View{}, job(1, 1, 1, 0), "job", "no machines"},
		{"bad job", v, job(0, 1, 1, 0), "job", "workers 0"},
	} {
		_, err := Quote(tc.v, tc.j, t0, Params{})
		var rej *Rejection
		if !errors.As(err, &rej) || rej.Resource != tc.resource || !strings.Contains(rej.Reason, tc.contains) {
			t.Errorf("%s: %v, want a %s rejection mentioning %q", tc.name, err, tc.resource, tc.contains)
		}
	}

	// Window: lent 19:00-07:00 UTC, now is noon.
	night := v
	night.Machines = []Machine{machine("m0", "a", 8, 16, 0)}
	night.Machines[0].Window = Window{StartMin: 19 * 60, EndMin: 7 * 60}
	if _, err := Quote(night, job(1, 1, 1, 0), t0, Params{}); err == nil || err.(*Rejection).Resource != "window" {
		t.Errorf("machine outside its window: %v", err)
	}
	if _, err := Quote(night, job(1, 1, 1, 0), t0.Add(8*time.Hour), Params{}); err != nil {
		t.Errorf("at 20:00, inside the window: %v", err)
	}
	if _, err := Quote(night, Job{ID: "j", Workers: 1, Per: Resources{Cores: 1}, Duration: 12 * time.Hour,
		Benefit: Benefit{Max: 1 << 40}}, t0.Add(8*time.Hour), Params{}); err == nil {
		t.Error("a 12 h job fitted an 11 h window")
	}
}

func TestAdmissionIsMiserly(t *testing.T) {
	v := View{Machines: []Machine{machine("m0", "a", 8, 16, 0)}}
	j := job(1, 2, 2, 0)
	pl, err := Place(v, j, t0, Params{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		b    Benefit
		ok   bool
	}{
		{"exactly the price", Benefit{Kind: FixedPrice, Max: pl.Total}, true},
		{"one micro-credit short", Benefit{Kind: FixedPrice, Max: pl.Total - 1}, false},
		{"deadline met", Benefit{Kind: ByDeadline, Max: pl.Total, Deadline: t0.Add(time.Hour)}, true},
		{"deadline missed", Benefit{Kind: ByDeadline, Max: 1 << 40, Deadline: t0.Add(59 * time.Minute)}, false},
		// Worth 4x the price at once, 0 after 4 h: at 1 h, 3x.
		{"decay still worth it", Benefit{Kind: LinearDecay, Max: 4 * pl.Total, ZeroAt: t0.Add(4 * time.Hour)}, true},
		{"decayed below", Benefit{Kind: LinearDecay, Max: pl.Total, ZeroAt: t0.Add(90 * time.Minute)}, false},
	} {
		j.Benefit = tc.b
		q, err := Quote(v, j, t0, Params{})
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if err != nil {
			var rej *Rejection
			if !errors.As(err, &rej) || rej.Resource != "price" || (tc.b.Kind != ByDeadline && rej.Price != pl.Total) {
				t.Errorf("%s: rejection %+v", tc.name, err)
			}
		} else if !reflect.DeepEqual(q, pl) {
			t.Errorf("%s: quote %+v differs from placement %+v", tc.name, q, pl)
		}
	}
}

// randomView is a heterogeneous view: some machines loaded, some with
// GPUs, reserve prices, records, sites.
func randomView(r *rand.Rand, n int) View {
	v := View{Machines: make([]Machine, n)}
	for i := range v.Machines {
		m := Machine{
			ID: string(rune('a'+i%26)) + string(rune('0'+i/26%10)), Site: []string{"psu", "osu", "uw"}[r.IntN(3)],
			Lent:  Resources{Cores: uint32(1 + r.IntN(32)), MemBytes: uint64(1+r.IntN(64)) * gib, GPUs: uint32(r.IntN(3))},
			Speed: 0.5 + r.Float64(), Dedicated: r.IntN(2) == 0, Completed: uint64(r.IntN(50)), Failed: uint64(r.IntN(5)),
		}
		m.Allocated = Resources{Cores: uint32(r.IntN(int(m.Lent.Cores) + 1)), MemBytes: uint64(r.Int64N(int64(m.Lent.MemBytes) + 1)), GPUs: uint32(r.IntN(int(m.Lent.GPUs) + 1))}
		if r.IntN(4) == 0 {
			m.Reserve = Prices{CoreHour: uint64(r.IntN(300_000)), MemGiBHour: uint64(r.IntN(50_000)), GPUHour: uint64(r.IntN(3_000_000))}
		}
		v.Machines[i] = m
	}
	return v
}

func randomJob(r *rand.Rand) Job {
	return Job{ID: "j", Workers: 1 + r.IntN(8), Per: Resources{Cores: uint32(1 + r.IntN(8)), MemBytes: uint64(r.IntN(16)+1) * gib, GPUs: uint32(r.IntN(2))},
		Duration: time.Duration(1+r.IntN(600)) * time.Minute, Benefit: Benefit{Kind: FixedPrice, Max: uint64(r.Int64N(50_000_000))}}
}

// TestPropertyNeverOverCommits: for every policy, placements fit the
// machines' free capacity; all or nothing.
func TestPropertyNeverOverCommits(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	policies := []Policy{MarginalCost{}, &RoundRobin{}, Random{Rand: rand.New(rand.NewPCG(3, 4))}, FirstFit{},
		LeastRequested{}, BalancedResource{}, KubeDefault{}}
	for trial := 0; trial < 300; trial++ {
		v := randomView(r, 1+r.IntN(40))
		j := randomJob(r)
		for _, p := range policies {
			got, err := p.Place(v, j, t0)
			if err != nil {
				var rej *Rejection
				if !errors.As(err, &rej) || rej.Reason == "" {
					t.Fatalf("%s: error without a reason: %v", p.Name(), err)
				}
				continue
			}
			if len(got) != j.Workers {
				t.Fatalf("%s placed %d of %d workers", p.Name(), len(got), j.Workers)
			}
			used := map[int]Resources{}
			for _, i := range got {
				u := used[i]
				u.Cores += j.Per.Cores
				u.MemBytes += j.Per.MemBytes
				u.GPUs += j.Per.GPUs
				used[i] = u
			}
			for i, u := range used {
				f := v.Machines[i].Free()
				if u.Cores > f.Cores || u.MemBytes > f.MemBytes || u.GPUs > f.GPUs {
					t.Fatalf("%s over-committed machine %d: %+v on free %+v", p.Name(), i, u, f)
				}
			}
		}
	}
}

// TestPropertyPriceMonotoneInLoad: more load never lowers a price, for the
// next unit and for a whole job.
func TestPropertyPriceMonotoneInLoad(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for trial := 0; trial < 300; trial++ {
		v := randomView(r, 1+r.IntN(20))
		i := r.IntN(len(v.Machines))
		before := MarketPrices(v, t0, Params{}).Machines[i].Unit
		pl0, err0 := Place(v, Job{ID: "j", Workers: 1, Per: Resources{Cores: 1}, Duration: time.Hour}, t0, Params{})
		m := &v.Machines[i]
		if m.Allocated.Cores < m.Lent.Cores {
			m.Allocated.Cores++
		}
		if m.Allocated.MemBytes+gib <= m.Lent.MemBytes {
			m.Allocated.MemBytes += gib
		}
		after := MarketPrices(v, t0, Params{}).Machines[i].Unit
		if after.Core < before.Core || after.MemGiB < before.MemGiB || after.GPU < before.GPU {
			t.Fatalf("prices fell with load: %+v -> %+v", before, after)
		}
		pl1, err1 := Place(v, Job{ID: "j", Workers: 1, Per: Resources{Cores: 1}, Duration: time.Hour}, t0, Params{})
		if err0 == nil && err1 == nil && pl1.Total < pl0.Total {
			t.Fatalf("a job got cheaper as a machine filled: %d -> %d", pl0.Total, pl1.Total)
		}
	}
}

// TestPropertyDeterministicAndConsistent: the same input gives the same
// output, and Quote admits exactly when the benefit covers Place's price.
func TestPropertyDeterministicAndConsistent(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for trial := 0; trial < 300; trial++ {
		v := randomView(r, 1+r.IntN(30))
		j := randomJob(r)
		p1, e1 := Place(v, j, t0, Params{})
		p2, e2 := Place(v, j, t0, Params{})
		if !reflect.DeepEqual(p1, p2) || (e1 == nil) != (e2 == nil) {
			t.Fatal("same input, different placement")
		}
		q, eq := Quote(v, j, t0, Params{})
		switch {
		case e1 != nil:
			if eq == nil {
				t.Fatal("quoted a job that does not fit")
			}
		case j.Benefit.Max >= p1.Total:
			if eq != nil || !reflect.DeepEqual(q, p1) {
				t.Fatalf("benefit %d covers price %d but: %v", j.Benefit.Max, p1.Total, eq)
			}
		default:
			var rej *Rejection
			if !errors.As(eq, &rej) || rej.Resource != "price" || rej.Price != p1.Total {
				t.Fatalf("benefit %d under price %d but: %v", j.Benefit.Max, p1.Total, eq)
			}
		}
		if !reflect.DeepEqual(MarketPrices(v, t0, Params{}), MarketPrices(v, t0, Params{})) {
			t.Fatal("same input, different prices")
		}
	}
}

func TestBaselines(t *testing.T) {
	v := View{Machines: []Machine{
		machine("small", "a", 2, 4, 0),
		machine("big", "a", 16, 8, 0),
		machine("mem", "a", 4, 64, 0),
	}}
	j := job(1, 2, 2, 0)
	for _, tc := range []struct {
		p    Policy
		want []int
	}{
		{FirstFit{}, []int{0}},
		// After the worker: big keeps 14/16 cores and 6/8 GiB free
		// (0.8125 on average); mem keeps 2/4 and 62/64 (0.73); small 0.
		{LeastRequested{}, []int{1}},
		// Used fractions after: small (1, 0.5), big (0.125, 0.25), mem
		// (0.5, 0.03): big is the most even.
		{BalancedResource{}, []int{1}},
		{KubeDefault{}, []int{1}},
	} {
		got, err := tc.p.Place(v, j, t0)
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: %v %v, want %v", tc.p.Name(), got, err, tc.want)
		}
	}
	rr := &RoundRobin{}
	var seq []int
	for range 4 {
		got, err := rr.Place(v, j, t0)
		if err != nil {
			t.Fatal(err)
		}
		seq = append(seq, got...)
	}
	if !reflect.DeepEqual(seq, []int{0, 1, 2, 0}) {
		t.Errorf("round robin went %v", seq)
	}
	// Random is reproducible from its seed and spreads over machines.
	seen := map[int]bool{}
	a, b := Random{Rand: rand.New(rand.NewPCG(9, 9))}, Random{Rand: rand.New(rand.NewPCG(9, 9))}
	for range 50 {
		x, _ := a.Place(v, j, t0)
		y, _ := b.Place(v, j, t0)
		if !reflect.DeepEqual(x, y) {
			t.Fatal("random is not reproducible from its seed")
		}
		seen[x[0]] = true
	}
	if len(seen) != 3 {
		t.Errorf("random used machines %v", seen)
	}
}

func TestPricesMarket(t *testing.T) {
	v := View{Machines: []Machine{machine("a", "s", 8, 16, 1), machine("b", "s", 8, 16, 0), machine("c", "s", 8, 16, 0)}}
	v.Machines[1].Allocated.Cores = 4
	v.Machines[2].Reserve.CoreHour = 1_000_000
	mk := MarketPrices(v, t0, Params{})
	if len(mk.Machines) != 3 || mk.Machines[0].Unit.Core != DefaultBase.CoreHour {
		t.Fatalf("idle machine's core price %+v", mk.Machines[0])
	}
	if mk.Machines[1].Unit.Core <= mk.Machines[0].Unit.Core || mk.Machines[1].Load[0] != 0.5 {
		t.Errorf("half-loaded machine %+v", mk.Machines[1])
	}
	if mk.Machines[2].Unit.Core != 1_000_000 {
		t.Errorf("reserve floor not applied: %+v", mk.Machines[2])
	}
	if mk.Lowest.Core != DefaultBase.CoreHour || mk.Median.Core != mk.Machines[1].Unit.Core || mk.Lowest.GPU != DefaultBase.GPUHour {
		t.Errorf("market %+v %+v", mk.Lowest, mk.Median)
	}
}

func TestWindowCovers(t *testing.T) {
	w := Window{StartMin: 19 * 60, EndMin: 7 * 60} // over midnight
	at := func(h, m int) time.Time { return time.Date(2026, 1, 1, h, m, 0, 0, time.UTC) }
	for _, tc := range []struct {
		from time.Time
		d    time.Duration
		want bool
	}{
		{at(20, 0), time.Hour, true},
		{at(20, 0), 11 * time.Hour, true},
		{at(20, 0), 11*time.Hour + time.Minute, false},
		{at(6, 30), 30 * time.Minute, true},
		{at(6, 30), 31 * time.Minute, false},
		{at(12, 0), time.Minute, false},
		{at(19, 0), 0, true},
	} {
		if got := w.Covers(tc.from, tc.from.Add(tc.d)); got != tc.want {
			t.Errorf("%s for %s: %v", tc.from.Format("15:04"), tc.d, got)
		}
	}
	// The machine's offset: 19:00-07:00 at UTC-5 is 00:00-12:00 UTC.
	east := Window{StartMin: 19 * 60, EndMin: 7 * 60, OffsetMin: -300}
	if !east.Covers(at(1, 0), at(2, 0)) || east.Covers(at(13, 0), at(14, 0)) {
		t.Error("offset ignored")
	}
	if !(Window{}).Covers(at(12, 0), at(12, 0).Add(72*time.Hour)) {
		t.Error("all-day window refused a long job")
	}
	// An offer that ends at 14:00 takes a 2 h job at noon, not a 2 h 1 min one.
	m := Machine{Until: at(14, 0)}
	if !m.available(at(12, 0), at(14, 0)) || m.available(at(12, 0), at(14, 1)) {
		t.Error("Until ignored")
	}
}

// bruteForce is Place without its shortcuts: every machine's exact cost
// for every worker.
func bruteForce(v View, j Job, now time.Time, p Params) []int {
	md := newModel(p, len(v.Machines))
	ms := append([]Machine(nil), v.Machines...)
	var out []int
	for w := 0; w < j.Workers; w++ {
		best, bestCost := -1, math.Inf(1)
		for i := range ms {
			m := &ms[i]
			h := j.Duration.Hours() / m.speed()
			if !m.fits(j.Per) || !m.available(now, now.Add(time.Duration(h*float64(time.Hour)))) {
				continue
			}
			c, _ := md.workerCost(m, j.Per)
			for _, k := range out {
				c += md.pairCost(&v, i, k)
			}
			if c*h < bestCost {
				best, bestCost = i, c*h
			}
		}
		if best < 0 {
			return nil
		}
		out = append(out, best)
		ms[best].add(j.Per)
	}
	return out
}

// TestPlaceMatchesBruteForce: the lower-bound pruning and the per-site
// network counts change nothing.
func TestPlaceMatchesBruteForce(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for trial := 0; trial < 500; trial++ {
		v := randomView(r, 1+r.IntN(60))
		if trial%3 == 0 { // many sites (past the scheduler's short list), some machines without one
			for i := range v.Machines {
				v.Machines[i].Site = []string{"", fmt.Sprint("site-", r.IntN(50))}[r.IntN(2)]
			}
		}
		j := randomJob(r)
		want := bruteForce(v, j, t0, Params{})
		pl, err := Place(v, j, t0, Params{})
		if (err == nil) != (want != nil) || (err == nil && !reflect.DeepEqual(pl.Machines, want)) {
			t.Fatalf("trial %d: Place %v (%v), brute force %v", trial, pl.Machines, err, want)
		}
	}
}
