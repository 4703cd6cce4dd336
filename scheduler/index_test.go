package scheduler

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
)

// varied makes a random view harder for an index: many or no sites,
// lending windows and offers that end, runs of identical machines (ties),
// and sometimes measured RTTs.
func varied(r *rand.Rand, n int) View {
	v := randomView(r, n)
	switch r.IntN(4) {
	case 0: // many small sites, some machines without one
		for i := range v.Machines {
			v.Machines[i].Site = []string{"", fmt.Sprint("site-", r.IntN(1+n/3))}[r.IntN(2)]
		}
	case 1: // runs of identical machines
		for i := 1; i < len(v.Machines); i++ {
			if r.IntN(3) > 0 {
				v.Machines[i] = v.Machines[i-1]
			}
		}
	}
	for i := range v.Machines {
		m := &v.Machines[i]
		switch r.IntN(8) {
		case 0:
			m.Window = Window{StartMin: r.IntN(24 * 60), EndMin: r.IntN(24 * 60)}
		case 1:
			m.Until = t0.Add(time.Duration(r.IntN(600)) * time.Minute)
		}
	}
	if r.IntN(6) == 0 {
		v.RTT = func(i, j int) (time.Duration, bool) {
			if i > j {
				i, j = j, i
			}
			h := uint64(i)*2654435761 ^ uint64(j)*40503
			return time.Duration(h%50_000) * time.Microsecond, h%7 != 0
		}
	}
	return v
}

// TestIndexMatchesPlace: on random views, the index places every job
// exactly where Place does, at the same prices, and refuses the same jobs
// for the same reasons; Quote's admission is the same too.
func TestIndexMatchesPlace(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	for trial := 0; trial < 500; trial++ {
		v := varied(r, 1+r.IntN(300))
		x := NewIndex(v, Params{})
		for range 3 {
			j := randomJob(r)
			switch r.IntN(8) {
			case 0, 1:
				j.Workers = 1 + r.IntN(40)
			case 2: // a sliver of a machine: rounding is most of its price
				j.Per = Resources{MemBytes: 1 + uint64(r.IntN(4096))}
			}
			want, werr := Place(v, j, t0, Params{})
			got, err := x.Place(j, t0)
			if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(err, werr) {
				t.Fatalf("trial %d, %d machines, job %+v:\nindex %v %v\nPlace %v %v", trial, len(v.Machines), j, got.Machines, err, want.Machines, werr)
			}
			wq, wqerr := Quote(v, j, t0, Params{})
			q, qerr := x.Quote(j, t0)
			if !reflect.DeepEqual(q, wq) || !reflect.DeepEqual(qerr, wqerr) {
				t.Fatalf("trial %d: quote %+v %v, Quote %+v %v", trial, q, qerr, wq, wqerr)
			}
			if werr == nil {
				if bf := bruteForce(v, j, t0, Params{}); !reflect.DeepEqual(got.Machines, bf) {
					t.Fatalf("trial %d: index %v, brute force %v", trial, got.Machines, bf)
				}
			}
		}
	}
}

// TestIndexMatchesPlaceAtScale: the same over views large enough for a
// deep tree, with jobs of every shape the node sees.
func TestIndexMatchesPlaceAtScale(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 24))
	for _, n := range []int{2000, 20000} {
		v := randomView(r, n)
		for i := range v.Machines {
			v.Machines[i].Lent.Cores += 16
			v.Machines[i].Lent.MemBytes += 64 * gib
		}
		x := NewIndex(v, Params{})
		for range 20 {
			j := randomJob(r)
			j.Workers = 1 + r.IntN(32)
			want, werr := Place(v, j, t0, Params{})
			got, err := x.Place(j, t0)
			if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(err, werr) {
				t.Fatalf("%d machines, job %+v: index %v %v, Place %v %v", n, j, got.Machines, err, want.Machines, werr)
			}
		}
	}
}

// TestIndexMatchesPlaceWithWindowsAndSites: views where most machines
// lend only in a window or their offers end within the day, over many
// small sites, placed at times through the day.
func TestIndexMatchesPlaceWithWindowsAndSites(t *testing.T) {
	r := rand.New(rand.NewPCG(33, 34))
	for trial := range 6 {
		v := randomView(r, 3000)
		for i := range v.Machines {
			m := &v.Machines[i]
			m.Lent.Cores += 8
			m.Lent.MemBytes += 32 * gib
			m.Site = fmt.Sprint("site-", r.IntN(10+trial*100))
			switch r.IntN(10) {
			case 0, 1, 2:
				if trial%2 == 1 { // offers that end, rather than windows
					m.Until = t0.Add(time.Duration(r.IntN(24*60)) * time.Minute)
					m.Allocated = Resources{}
					break
				}
				m.Window = Window{StartMin: 19*60 + r.IntN(60), EndMin: 7 * 60, OffsetMin: []int{0, -300, 60, 330}[r.IntN(4)]}
				m.Allocated = Resources{}
			case 3, 4, 5:
				if trial%2 == 1 {
					m.Until = t0.Add(time.Duration(r.IntN(24*60)) * time.Minute)
					m.Allocated = Resources{}
					break
				}
				m.Window = Window{StartMin: r.IntN(24 * 60), EndMin: r.IntN(24 * 60), OffsetMin: r.IntN(28*60) - 14*60}
				m.Allocated = Resources{}
			case 6, 7:
				m.Until = t0.Add(time.Duration(r.IntN(24*60)) * time.Minute)
				m.Allocated = Resources{}
			}
		}
		x := NewIndex(v, Params{})
		for k := range 8 {
			at := t0.Add(time.Duration(k*180+r.IntN(180)) * time.Minute)
			for range 3 {
				j := randomJob(r)
				j.Workers = 1 + r.IntN(16)
				want, werr := Place(v, j, at, Params{})
				got, err := x.Place(j, at)
				if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(err, werr) {
					t.Fatalf("trial %d at %s, job %+v: index %v %v, Place %v %v", trial, at.Format("15:04"), j, got.Machines, err, want.Machines, werr)
				}
			}
		}
	}
}

// TestWindowSlotsCoverTheWindow: every minute a window lets a run start
// falls in a quarter hour its slots mark.
func TestWindowSlotsCoverTheWindow(t *testing.T) {
	r := rand.New(rand.NewPCG(35, 36))
	day := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for range 300 {
		w := Window{StartMin: r.IntN(24 * 60), EndMin: r.IntN(24 * 60), OffsetMin: r.IntN(28*60) - 14*60}
		slots := windowSlots(w)
		for m := 0; m < 24*60; m++ {
			at := day.Add(time.Duration(m)*time.Minute + time.Duration(r.IntN(60))*time.Second)
			if w.Covers(at, at) && slots[m/15>>6]&(1<<(m/15&63)) == 0 {
				t.Fatalf("window %+v covers %s, slot %d not marked", w, at.Format("15:04:05"), m/15)
			}
		}
	}
}

// TestIndexUpdate: after machines change (allocations, reserve prices,
// sites, windows), the index places as Place does on the changed view and
// as a new index does.
func TestIndexUpdate(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 26))
	for trial := 0; trial < 100; trial++ {
		v := varied(r, 1+r.IntN(200))
		x := NewIndex(v, Params{})
		for range 1 + r.IntN(40) {
			i := r.IntN(len(v.Machines))
			m := x.Machine(i)
			switch r.IntN(5) {
			case 0: // a hold or a job took some
				m.Allocated.Cores = min(m.Lent.Cores, m.Allocated.Cores+uint32(r.IntN(4)))
				m.Allocated.MemBytes = min(m.Lent.MemBytes, m.Allocated.MemBytes+uint64(r.IntN(8))*gib)
			case 1: // a job ended
				m.Allocated = Resources{}
			case 2:
				m.Reserve.CoreHour = uint64(r.IntN(500_000))
			case 3:
				m.Site = []string{"", "psu", "new-site", m.Site}[r.IntN(4)]
			case 4:
				m = randomView(r, 1).Machines[0]
			}
			v.Machines[i] = m
			x.Update(i, m)
		}
		fresh := NewIndex(v, Params{})
		for range 3 {
			j := randomJob(r)
			want, werr := Place(v, j, t0, Params{})
			got, err := x.Place(j, t0)
			again, aerr := fresh.Place(j, t0)
			if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(err, werr) || !reflect.DeepEqual(again, want) || !reflect.DeepEqual(aerr, werr) {
				t.Fatalf("trial %d: updated index %v %v, new index %v %v, Place %v %v", trial, got.Machines, err, again.Machines, aerr, want.Machines, werr)
			}
		}
	}
}

// TestIndexPlacementLeavesNoTrace: a placement loads only private copies:
// the index, and the view it was built from, are as they were, and the
// next placement is what it would have been.
func TestIndexPlacementLeavesNoTrace(t *testing.T) {
	r := rand.New(rand.NewPCG(27, 28))
	v := randomView(r, 500)
	before := append([]Machine(nil), v.Machines...)
	x := NewIndex(v, Params{})
	j := job(16, 2, 4, 0)
	first, err := x.Quote(j, t0)
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if _, err := x.Quote(randomJob(r), t0); err != nil {
			var rej *Rejection
			if !errors.As(err, &rej) {
				t.Fatal(err)
			}
		}
	}
	if again, _ := x.Quote(j, t0); !reflect.DeepEqual(again, first) {
		t.Errorf("the same job quoted %v, then %v", first.Machines, again.Machines)
	}
	for i := range before {
		if !reflect.DeepEqual(x.Machine(i), before[i]) || !reflect.DeepEqual(v.Machines[i], before[i]) {
			t.Fatalf("machine %d changed", i)
		}
	}
	// Changing the caller's view afterwards does not reach the index.
	v.Machines[first.Machines[0]].Allocated = v.Machines[first.Machines[0]].Lent
	if again, _ := x.Quote(j, t0); !reflect.DeepEqual(again, first) {
		t.Error("the index saw a change to the caller's view")
	}
}

// TestIndexPropertyNeverOverCommits: the index's placements fit the
// machines' free capacity and windows, all workers or none.
func TestIndexPropertyNeverOverCommits(t *testing.T) {
	r := rand.New(rand.NewPCG(29, 30))
	for trial := 0; trial < 300; trial++ {
		v := varied(r, 1+r.IntN(200))
		x := NewIndex(v, Params{})
		j := randomJob(r)
		j.Workers = 1 + r.IntN(64)
		pl, err := x.Place(j, t0)
		if err != nil {
			var rej *Rejection
			if !errors.As(err, &rej) || rej.Reason == "" || rej.Resource == "" {
				t.Fatalf("error without a named resource and reason: %v", err)
			}
			continue
		}
		if len(pl.Machines) != j.Workers || len(pl.Worker) != j.Workers {
			t.Fatalf("placed %d of %d workers", len(pl.Machines), j.Workers)
		}
		used := map[int]Resources{}
		for _, i := range pl.Machines {
			u := used[i]
			u.Cores += j.Per.Cores
			u.MemBytes += j.Per.MemBytes
			u.GPUs += j.Per.GPUs
			used[i] = u
		}
		for i, u := range used {
			m := v.Machines[i]
			f := m.Free()
			if u.Cores > f.Cores || u.MemBytes > f.MemBytes || u.GPUs > f.GPUs {
				t.Fatalf("over-committed machine %d: %+v on free %+v", i, u, f)
			}
			if !m.available(t0, t0.Add(time.Duration(float64(j.Duration)/m.speed()))) {
				t.Fatalf("machine %d is not available for the run", i)
			}
		}
	}
}

// TestIndexDeterministicAndConsistent: two indexes of one view agree, and
// the index's Quote admits exactly when the benefit covers its Place's
// price, naming the price otherwise.
func TestIndexDeterministicAndConsistent(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	for trial := 0; trial < 300; trial++ {
		v := varied(r, 1+r.IntN(150))
		j := randomJob(r)
		a, b := NewIndex(v, Params{}), NewIndex(v, Params{})
		p1, e1 := a.Place(j, t0)
		p2, e2 := b.Place(j, t0)
		if !reflect.DeepEqual(p1, p2) || !reflect.DeepEqual(e1, e2) {
			t.Fatal("same input, different placement")
		}
		q, eq := a.Quote(j, t0)
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
	}
}

// TestIndexTiesGoToTheLowestIndex: a view of identical machines, where
// every bound is tight, still gets Place's answer.
func TestIndexTiesGoToTheLowestIndex(t *testing.T) {
	v := View{Machines: make([]Machine, 5000)}
	for i := range v.Machines {
		v.Machines[i] = machine(fmt.Sprint("m", i), "lab", 8, 32, 0)
		v.Machines[i].Reserve = Prices{CoreHour: 10_000_000, MemGiBHour: 10_000_000} // the floor decides
	}
	v.Machines[4321].Allocated.Cores = 0
	j := job(12, 4, 8, 0)
	want, err := Place(v, j, t0, Params{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := NewIndex(v, Params{}).Place(j, t0)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("index %v %v, Place %v", got.Machines, err, want.Machines)
	}
	if want.Machines[0] != 0 {
		t.Errorf("Place began at machine %d, not 0", want.Machines[0])
	}
}

func TestIndexEmptyView(t *testing.T) {
	_, err := NewIndex(View{}, Params{}).Quote(job(1, 1, 1, 0), t0)
	var rej *Rejection
	if !errors.As(err, &rej) || rej.Resource != "job" {
		t.Errorf("empty view: %v", err)
	}
	_, err = NewIndex(View{Machines: []Machine{machine("m", "a", 4, 4, 0)}}, Params{}).Quote(job(0, 1, 1, 0), t0)
	if !errors.As(err, &rej) || rej.Resource != "job" {
		t.Errorf("bad job: %v", err)
	}
}

// TestGrowthBoundsTheIntegral: growth never exceeds (e^y - 1) / y, and
// stays within 2 % of it.
func TestGrowthBoundsTheIntegral(t *testing.T) {
	for y := 1e-6; y < 800; y *= 1.01 {
		exact := math.Expm1(y) / y
		g := growth(y)
		if g > exact*(1+1e-12) || (!math.IsInf(exact, 1) && g < exact*0.98) {
			t.Fatalf("growth(%v) = %v, (e^y-1)/y = %v", y, g, exact)
		}
	}
}

// TestIndexWithoutGPUsOrWithOnlyThem: views where no machine lends a
// resource, or every one does, build and place as Place does.
func TestIndexWithoutGPUsOrWithOnlyThem(t *testing.T) {
	r := rand.New(rand.NewPCG(37, 38))
	for _, gpus := range []uint32{0, 2} {
		v := randomView(r, 2000)
		for i := range v.Machines {
			v.Machines[i].Lent.GPUs, v.Machines[i].Allocated.GPUs = gpus, 0
		}
		x := NewIndex(v, Params{})
		for range 20 {
			j := randomJob(r)
			want, werr := Place(v, j, t0, Params{})
			got, err := x.Place(j, t0)
			if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(err, werr) {
				t.Fatalf("%d GPUs each: index %v %v, Place %v %v", gpus, got.Machines, err, want.Machines, werr)
			}
		}
	}
}
