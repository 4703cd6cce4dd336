package scheduler

import (
	"math"
	"testing"
	"time"
)

func TestPredict(t *testing.T) {
	lan := func(a, b int) (Link, bool) { return Link{RTT: time.Millisecond, BytesPerSec: 100e6}, true }
	wan := func(a, b int) (Link, bool) { return Link{RTT: 100 * time.Millisecond, BytesPerSec: 1.25e6}, true }
	unknown := func(a, b int) (Link, bool) { return Link{}, false }
	// Perfect scaling (each of k workers takes 1/k of the steps), so that
	// the figures below follow from the links alone.
	sync := Training{Steps: 1000, ModelBytes: 400_000, Sync: true, Efficiency: &perfect}
	local := Training{Steps: 1000, ModelBytes: 400_000, SyncEvery: 50, Wire: 0.25, Efficiency: &perfect}
	const dur = 100 * time.Second // 0.1 s a step on a speed-1 machine
	for _, c := range []struct {
		name                 string
		t                    Training
		speeds               []float64
		link                 func(a, b int) (Link, bool)
		total, comm, speedUp float64 // seconds, seconds, ratio
		best                 int
	}{
		{"one worker is its compute", sync, []float64{1}, wan, 100, 0, 1, 1},
		{"a faster machine", sync, []float64{2}, nil, 50, 0, 1, 1},
		// 500 steps of 0.1 s; a ring hop: 0.5 ms + 200 kB at 100 MB/s, twice a step.
		{"sync on a LAN", sync, []float64{1, 1}, lan, 52.5, 2.5, 100 / 52.5, 2},
		{"unmeasured links are a LAN", sync, []float64{1, 1}, unknown, 52.5, 2.5, 100 / 52.5, 2},
		// a hop: 50 ms + 200 kB at 1.25 MB/s = 0.21 s, 0.42 s a step.
		{"sync across sites is slower than one", sync, []float64{1, 1}, wan, 260, 210, 100.0 / 260, 1},
		// 10 rounds of 2 x (100 kB at 1.25 MB/s + 100 ms).
		{"local steps across sites", local, []float64{1, 1}, wan, 53.6, 3.6, 100 / 53.6, 2},
		// the slow machine sets the pace: 500 steps of 0.2 s.
		{"a slow machine", sync, []float64{1, 0.5}, lan, 102.5, 2.5, 100 / 102.5, 1},
		// three workers: 334 steps; ring hop 0.5 ms + 133 kB at 100 MB/s, four a step.
		{"three on a LAN", sync, []float64{1, 1, 1}, lan, 33.4 + 334*4*(0.0005+400_000.0/3/100e6), 334 * 4 * (0.0005 + 400_000.0/3/100e6), 100 / (33.4 + 334*4*(0.0005+400_000.0/3/100e6)), 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := Predict(c.t, dur, c.speeds, c.link)
			if err != nil {
				t.Fatal(err)
			}
			near := func(what string, got, want float64) {
				if math.Abs(got-want) > 1e-6*math.Max(1, want) {
					t.Errorf("%s = %v, want %v", what, got, want)
				}
			}
			near("total", p.Total.Seconds(), c.total)
			near("comm", p.Comm.Seconds(), c.comm)
			near("compute+comm", (p.Compute + p.Comm).Seconds(), p.Total.Seconds())
			near("speed-up", p.SpeedUp, c.speedUp)
			all, best, err := Fewest(c.t, dur, c.speeds, c.link)
			if err != nil {
				t.Fatal(err)
			}
			if best != c.best || len(all) != len(c.speeds) || all[len(all)-1] != p {
				t.Errorf("Fewest: best %d of %d, want %d; last %+v, want %+v", best, len(all), c.best, all[len(all)-1], p)
			}
		})
	}
}

func TestPredictRefusesBadWorkloads(t *testing.T) {
	for _, tr := range []Training{
		{Steps: 0, Sync: true},
		{Steps: 10, SyncEvery: 0},
		{Steps: 10, Sync: true, Wire: 2},
	} {
		if _, err := Predict(tr, time.Minute, []float64{1}, nil); err == nil {
			t.Errorf("%+v: no error", tr)
		}
	}
	if _, err := Predict(Training{Steps: 1, Sync: true}, time.Minute, nil, nil); err == nil {
		t.Error("no workers: no error")
	}
}

var perfect = Efficiency{
	Sync:  []EfficiencyPoint{{1, 1}, {2, 0.5}, {4, 0.25}},
	Local: []EfficiencyPoint{{1, 1}, {2, 0.5}, {4, 0.25}},
}

// The steps each worker takes come from the measured statistics: a
// second worker that saves 40 % of the steps gives 1/0.6 at best, not 2.
func TestPredictUsesStatisticalEfficiency(t *testing.T) {
	e := Efficiency{Sync: []EfficiencyPoint{{1, 1}, {2, 0.6}, {8, 0.25}}, Local: []EfficiencyPoint{{1, 1}, {2, 0.55}}}
	if err := e.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		sync bool
		k    int
		want float64
	}{
		{true, 1, 1}, {true, 2, 0.6}, {true, 8, 0.25},
		{true, 4, math.Exp((math.Log(0.6) + math.Log(0.25)) / 2)}, // halfway in log k
		{true, 16, 0.25}, // beyond the table nothing more is assumed
		{false, 2, 0.55}, {false, 3, 0.55},
	} {
		if got := e.Ratio(c.sync, c.k); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("Ratio(sync %v, %d) = %v, want %v", c.sync, c.k, got, c.want)
		}
	}
	tr := Training{Steps: 1000, ModelBytes: 1, Sync: true, Efficiency: &e}
	p, err := Predict(tr, 100*time.Second, []float64{1, 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.Steps != 600 || math.Abs(p.Compute.Seconds()-60) > 1e-9 || p.SpeedUp >= 1/0.6 {
		t.Errorf("2 workers at ratio 0.6: %+v, want 600 steps, 60 s of compute, under 1.67x", p)
	}
	for _, bad := range []Efficiency{
		{Sync: []EfficiencyPoint{{2, 0.5}}},                    // no 1-worker point
		{Sync: []EfficiencyPoint{{1, 1}, {2, 0.4}}},            // better than perfect
		{Sync: []EfficiencyPoint{{1, 1}, {2, 1.2}}},            // worse than one worker
		{Local: []EfficiencyPoint{{1, 1}, {4, 0.5}, {2, 0.6}}}, // unsorted
	} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%+v: no error", bad)
		}
		if _, err := Predict(Training{Steps: 10, Sync: true, SyncEvery: 1, Efficiency: &bad}, time.Minute, []float64{1}, nil); err == nil {
			t.Errorf("Predict with %+v: no error", bad)
		}
	}
}

// The shipped table is the harness's measurement: every count it has is
// better than one worker and no better than perfect scaling.
func TestDefaultEfficiency(t *testing.T) {
	for _, sync := range []bool{true, false} {
		for k := 2; k <= 8; k++ {
			r := DefaultEfficiency.Ratio(sync, k)
			if r >= 1 || r < 1/float64(k) {
				t.Errorf("sync %v, %d workers: ratio %v", sync, k, r)
			}
		}
	}
}

func TestSpreadRefusesSyncThatFewerFinishSooner(t *testing.T) {
	wan := func(a, b int) (Link, bool) { return Link{RTT: 100 * time.Millisecond, BytesPerSec: 1.25e6}, true }
	sync := Training{Steps: 1000, ModelBytes: 400_000, Sync: true, Efficiency: &perfect}
	p, fewest, rej, err := Spread(sync, 100*time.Second, []float64{1, 1}, wan)
	if err != nil || rej == nil || rej.Resource != "network" || p.Workers != 2 || fewest != 1 {
		t.Fatalf("sync across sites: %+v %v %v", p, rej, err)
	}
	const want = "synchronous training over these links: 2 workers would take 4m20s (3m30s exchanging gradients), 1 would take 1m40s; use [training] mode = \"diloco\", or fewer workers"
	if rej.Reason != want {
		t.Errorf("reason %q\nwant   %q", rej.Reason, want)
	}
	local := Training{Steps: 1000, ModelBytes: 400_000, SyncEvery: 50, Wire: 0.25, Efficiency: &perfect}
	if _, _, rej, err := Spread(local, 100*time.Second, []float64{1, 1}, wan); err != nil || rej != nil {
		t.Errorf("local steps across sites: %v %v", rej, err)
	}
	lan := func(a, b int) (Link, bool) { return Link{RTT: time.Millisecond, BytesPerSec: 100e6}, true }
	if _, _, rej, err := Spread(sync, 100*time.Second, []float64{1, 1}, lan); err != nil || rej != nil {
		t.Errorf("sync on a LAN: %v %v", rej, err)
	}
}
