// Command scheduler is `make bench-scheduler`: how fast the marginal-cost
// scheduler places an 8-worker job over 100, 1,000, 10,000 and 100,000
// machines on one core, by exhaustive search (scheduler.Place) and through
// a scheduler.Index built once per view, side by side with their ratio, next
// to the Kubernetes-style baseline on the same views. Goals: >= 10,000
// placements/s and p99 <= 1 ms at 1,000 machines for the exhaustive search;
// through the index, >= 10,000/s at 10,000 machines and >= 2,000/s at
// 100,000. It also times building and updating an index, places a mix of
// job shapes both ways and the job over views shaped against the index's
// bounds (machines outside their windows, many sites, measured RTTs),
// replays the simulator's scenarios under every policy, prints tables and
// writes JSON (-out).
//
// Each placement is on a fresh random view state (machines of 4-64 cores,
// 8-256 GiB, some GPUs, loads from idle to nearly full, three sites), so
// no answer is cached; views and indexes are built before timing. The
// machine is shared: each case is timed in -rounds rounds, the policies of
// a size taking turns, and the tables give each figure's median over the
// rounds and its spread (least-most).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"math"
	"math/rand/v2"
	"os"
	"reflect"
	"runtime"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/deepmarket/deepmarket/scheduler"
	"github.com/deepmarket/deepmarket/scheduler/sim"
)

// row is one policy over one view size: figures are medians over rounds,
// with their least and most.
type row struct {
	Machines      int     `json:"machines"`
	Policy        string  `json:"policy"`
	PerSecond     float64 `json:"placements_per_s"`
	P50Micros     float64 `json:"p50_us"`
	P99Micros     float64 `json:"p99_us"`
	NanosPerMachn float64 `json:"ns_per_machine"`
	Rounds        int     `json:"rounds"`
	Samples       int     `json:"samples"`
	PerSecondMin  float64 `json:"placements_per_s_min"`
	PerSecondMax  float64 `json:"placements_per_s_max"`
	// PerCPUSecond is placements per second of the process's CPU time:
	// what one core does when the machine's other work takes turns on it.
	PerCPUSecond    float64 `json:"placements_per_cpu_s,omitempty"`
	PerCPUSecondMin float64 `json:"placements_per_cpu_s_min,omitempty"`
	PerCPUSecondMax float64 `json:"placements_per_cpu_s_max,omitempty"`
	P99MinMicros    float64 `json:"p99_us_min"`
	P99MaxMicros    float64 `json:"p99_us_max"`
}

// side is exhaustive search against the index at one size.
type side struct {
	Machines int `json:"machines"`
	// Speedup is indexed placements/s over exhaustive (medians), with
	// the spread of the per-round ratios; P99Ratio is exhaustive p99 over
	// indexed.
	Speedup    float64 `json:"speedup"`
	SpeedupMin float64 `json:"speedup_min"`
	SpeedupMax float64 `json:"speedup_max"`
	P99Ratio   float64 `json:"p99_ratio"`
	// BuildMillis is NewIndex's time (median of rounds, spread), and
	// UpdateMicros one Update's; BreakEven is how many placements an
	// index must serve to repay its build.
	BuildMillis    float64 `json:"index_build_ms"`
	BuildMillisMin float64 `json:"index_build_ms_min"`
	BuildMillisMax float64 `json:"index_build_ms_max"`
	UpdateMicros   float64 `json:"index_update_us"`
	BreakEven      float64 `json:"break_even_placements"`
	// Goal is the indexed placements/s wanted at this size (0: none).
	Goal float64 `json:"goal_placements_per_s,omitempty"`
}

// variantRow is the 8-worker job over a view shaped to be hard for the
// index, both ways.
type variantRow struct {
	Machines   int     `json:"machines"`
	View       string  `json:"view"`
	Exhaustive row     `json:"exhaustive"`
	Indexed    row     `json:"indexed"`
	Speedup    float64 `json:"speedup"`
}

// mixRow is a mix of job shapes placed both ways.
type mixRow struct {
	Machines   int      `json:"machines"`
	Jobs       []string `json:"jobs"`
	Exhaustive row      `json:"exhaustive"`
	Indexed    row      `json:"indexed"`
	Speedup    float64  `json:"speedup"`
}

var now = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

// placer places one job on view k.
type placer struct {
	name  string
	place func(k int, j scheduler.Job) error
}

func main() {
	out := flag.String("out", "", "write JSON results here")
	dur := flag.Duration("duration", 3*time.Second, "time per case, split over the rounds")
	rounds := flag.Int("rounds", 5, "rounds per case, policies taking turns")
	seeds := flag.Int("seeds", 10, "random scenarios per load in the quality comparison")
	flag.Parse()
	log.SetFlags(0)
	runtime.GOMAXPROCS(1)
	per := *dur / time.Duration(*rounds)
	job := scheduler.Job{ID: "bench", Workers: 8, Per: scheduler.Resources{Cores: 2, MemBytes: 4 << 30},
		Duration: time.Hour, Benefit: scheduler.Benefit{Max: 1 << 50}}
	mix := jobMix()
	var rows []row
	var sides []side
	var mixes []mixRow
	var variants []variantRow
	for _, n := range []int{100, 1000, 10000, 100000} {
		// Fewer views of the largest size, to keep the benchmark's memory
		// (and its collector's work, which lands on the timed core) small.
		nv := 16
		if n >= 100000 {
			nv = 4
		}
		views := make([]scheduler.View, nv)
		r := rand.New(rand.NewPCG(uint64(n), 1))
		for i := range views {
			views[i] = randomView(r, n)
		}
		idx := make([]*scheduler.Index, nv)
		var builds []float64
		for range *rounds {
			for i := range views {
				t := time.Now()
				idx[i] = scheduler.NewIndex(views[i], scheduler.Params{})
				builds = append(builds, float64(time.Since(t).Microseconds())/1000)
			}
		}
		for i := range views { // the index must agree with the search it replaces
			for _, j := range append([]scheduler.Job{job}, mix...) {
				want, werr := scheduler.Place(views[i], j, now, scheduler.Params{})
				got, err := idx[i].Place(j, now)
				if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(err, werr) {
					log.Fatalf("%d machines, view %d, job %s: the index placed %v (%v), Place %v (%v)", n, i, j.ID, got.Machines, err, want.Machines, werr)
				}
			}
		}
		kube := scheduler.KubeDefault{}
		policies := []placer{
			{"marginal-cost", func(k int, j scheduler.Job) error {
				_, err := scheduler.Place(views[k%nv], j, now, scheduler.Params{})
				return err
			}},
			{"marginal-cost-indexed", func(k int, j scheduler.Job) error {
				_, err := idx[k%nv].Place(j, now)
				return err
			}},
			{"kube-default", func(k int, j scheduler.Job) error {
				_, err := kube.Place(views[k%nv], j, now)
				return err
			}},
		}
		res := measure(n, policies, []scheduler.Job{job}, *rounds, per)
		rows = append(rows, res...)
		sd := compare(n, res[0], res[1])
		sd.BuildMillis, sd.BuildMillisMin, sd.BuildMillisMax = median(builds), slices.Min(builds), slices.Max(builds)
		if gain := 1e6/res[0].PerSecond - 1e6/res[1].PerSecond; gain > 0 {
			sd.BreakEven = sd.BuildMillis * 1000 / gain
		}
		switch n {
		case 10000:
			sd.Goal = 10000
		case 100000:
			sd.Goal = 2000
		}
		if n >= 1000 {
			m := measure(n, policies[:2], mix, *rounds, per)
			mr := mixRow{Machines: n, Exhaustive: m[0], Indexed: m[1], Speedup: m[1].PerSecond / m[0].PerSecond}
			for _, j := range mix {
				mr.Jobs = append(mr.Jobs, j.ID)
			}
			mixes = append(mixes, mr)
		}
		sd.UpdateMicros = updateCost(idx[0], r) // last: it changes the index
		sides = append(sides, sd)
		views, idx = nil, nil
		runtime.GC()
	}
	variants = hardViews(job, 100000, *rounds, per)
	report(rows, sides, mixes, variants, *rounds)
	runtime.GOMAXPROCS(runtime.NumCPU())
	q := quality(*seeds)
	if *out != "" {
		b, _ := json.MarshalIndent(struct {
			Throughput []row          `json:"throughput"`
			Indexed    []side         `json:"indexed_vs_exhaustive"`
			JobMix     []mixRow       `json:"job_mix"`
			HardViews  []variantRow   `json:"hard_views"`
			Quality    []*sim.Report  `json:"quality"`
			Setup      map[string]any `json:"setup"`
		}{rows, sides, mixes, variants, q, map[string]any{
			"gomaxprocs": 1, "rounds": *rounds, "duration_per_case_s": dur.Seconds(), "go": runtime.Version(),
			"cpus": runtime.NumCPU(), "job": "8 workers x (2 cores, 4 GiB), 1 h",
		}}, "", "  ")
		if err := os.WriteFile(*out, append(b, '\n'), 0o644); err != nil {
			log.Fatal(err)
		}
	}
}

// jobMix is the shapes a node's bids take: one worker or many, small or
// large, with and without GPUs.
func jobMix() []scheduler.Job {
	j := func(id string, workers int, cores uint32, memGiB uint64, gpus uint32) scheduler.Job {
		return scheduler.Job{ID: id, Workers: workers, Per: scheduler.Resources{Cores: cores, MemBytes: memGiB << 30, GPUs: gpus},
			Duration: 2 * time.Hour, Benefit: scheduler.Benefit{Max: 1 << 50}}
	}
	return []scheduler.Job{j("1x(1c,2G)", 1, 1, 2, 0), j("4x(4c,16G,1gpu)", 4, 4, 16, 1), j("2x(32c,128G)", 2, 32, 128, 0),
		j("32x(1c,1G)", 32, 1, 1, 0), j("8x(8c,32G)", 8, 8, 32, 0), j("16x(2c,8G)", 16, 2, 8, 0)}
}

// minSamples is the fewest placements a round times, however slow.
const minSamples = 20

// measure times each policy over the jobs in turn, rounds times, the
// policies taking turns within a round.
func measure(n int, ps []placer, jobs []scheduler.Job, rounds int, per time.Duration) []row {
	rates := make([][]float64, len(ps))
	cpuRates := make([][]float64, len(ps))
	p99s := make([][]float64, len(ps))
	lats := make([][]time.Duration, len(ps))
	for range rounds {
		for pi, p := range ps {
			var lat []time.Duration
			start, cpu := time.Now(), cpuTime()
			for i := 0; time.Since(start) < per || len(lat) < minSamples; i++ {
				j := jobs[i%len(jobs)]
				t := time.Now()
				if err := p.place(i/len(jobs), j); err != nil {
					log.Fatalf("%s over %d machines, job %s: %v", p.name, n, j.ID, err)
				}
				lat = append(lat, time.Since(t))
			}
			total := time.Since(start)
			rates[pi] = append(rates[pi], float64(len(lat))/total.Seconds())
			if c := cpuTime() - cpu; c > 0 {
				cpuRates[pi] = append(cpuRates[pi], float64(len(lat))/c.Seconds())
			}
			slices.Sort(lat)
			p99s[pi] = append(p99s[pi], quantile(lat, 0.99))
			lats[pi] = append(lats[pi], lat...)
		}
	}
	out := make([]row, len(ps))
	for pi, p := range ps {
		slices.Sort(lats[pi])
		p50 := quantile(lats[pi], 0.5)
		out[pi] = row{Machines: n, Policy: p.name, PerSecond: median(rates[pi]), P50Micros: p50, P99Micros: median(p99s[pi]),
			NanosPerMachn: p50 * 1000 / float64(n), Rounds: rounds, Samples: len(lats[pi]),
			PerSecondMin: slices.Min(rates[pi]), PerSecondMax: slices.Max(rates[pi]),
			P99MinMicros: slices.Min(p99s[pi]), P99MaxMicros: slices.Max(p99s[pi])}
		if len(cpuRates[pi]) == rounds {
			out[pi].PerCPUSecond, out[pi].PerCPUSecondMin, out[pi].PerCPUSecondMax = median(cpuRates[pi]), slices.Min(cpuRates[pi]), slices.Max(cpuRates[pi])
		}
	}
	return out
}

// compare is the index against exhaustive search; the spread of the
// speedup is that of the rounds' rates, least indexed over most
// exhaustive and back.
func compare(n int, ex, ix row) side {
	return side{Machines: n, Speedup: ix.PerSecond / ex.PerSecond, SpeedupMin: ix.PerSecondMin / ex.PerSecondMax,
		SpeedupMax: ix.PerSecondMax / ex.PerSecondMin, P99Ratio: ex.P99Micros / ix.P99Micros}
}

// updateCost is the median time of Update on random machines, each given
// a new allocation.
func updateCost(x *scheduler.Index, r *rand.Rand) float64 {
	var ts []float64
	for range 2000 {
		i := r.IntN(x.Len())
		m := x.Machine(i)
		m.Allocated.Cores = uint32(r.IntN(int(m.Lent.Cores) + 1))
		t := time.Now()
		x.Update(i, m)
		ts = append(ts, float64(time.Since(t).Nanoseconds())/1000)
	}
	return median(ts)
}

func quantile(lat []time.Duration, f float64) float64 {
	return float64(lat[int(f*float64(len(lat)-1))].Nanoseconds()) / 1000
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

func report(rows []row, sides []side, mixes []mixRow, variants []variantRow, rounds int) {
	get := func(n int, policy string) row {
		for _, r := range rows {
			if r.Machines == n && r.Policy == policy {
				return r
			}
		}
		return row{}
	}
	fmt.Printf("placements of an 8-worker job on one core: median of %d rounds (least-most)\n\n", rounds)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "machines\texhaustive /s\tindexed /s\tindexed / exhaustive\tp99 exhaustive\tp99 indexed\tkube-default /s\tindex build\tupdate\tgoal (indexed)")
	for _, sd := range sides {
		ex, ix, kd := get(sd.Machines, "marginal-cost"), get(sd.Machines, "marginal-cost-indexed"), get(sd.Machines, "kube-default")
		goal := ""
		if sd.Goal > 0 {
			goal = fmt.Sprintf(">= %.0f/s: %.2fx", sd.Goal, ix.PerSecond/sd.Goal)
		}
		fmt.Fprintf(tw, "%d\t%.0f (%.0f-%.0f)\t%.0f (%.0f-%.0f)\t%.1fx (%.1f-%.1f)\t%.0f µs (%.0f-%.0f)\t%.0f µs (%.0f-%.0f)\t%.0f\t%.1f ms (%.1f-%.1f)\t%.1f µs\t%s\n",
			sd.Machines, ex.PerSecond, ex.PerSecondMin, ex.PerSecondMax, ix.PerSecond, ix.PerSecondMin, ix.PerSecondMax,
			sd.Speedup, sd.SpeedupMin, sd.SpeedupMax, ex.P99Micros, ex.P99MinMicros, ex.P99MaxMicros, ix.P99Micros, ix.P99MinMicros, ix.P99MaxMicros,
			kd.PerSecond, sd.BuildMillis, sd.BuildMillisMin, sd.BuildMillisMax, sd.UpdateMicros, goal)
	}
	tw.Flush()
	if get(100, "marginal-cost").PerCPUSecond > 0 {
		fmt.Printf("\nthe same, per second of the process's CPU time (the machine is shared: this is one core's worth)\n")
		tw = tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "machines\texhaustive /CPU s\tindexed /CPU s\tindexed / exhaustive\tgoal (indexed)")
		for _, sd := range sides {
			ex, ix := get(sd.Machines, "marginal-cost"), get(sd.Machines, "marginal-cost-indexed")
			goal := ""
			if sd.Goal > 0 {
				goal = fmt.Sprintf(">= %.0f/s: %.2fx", sd.Goal, ix.PerCPUSecond/sd.Goal)
			}
			fmt.Fprintf(tw, "%d\t%.0f (%.0f-%.0f)\t%.0f (%.0f-%.0f)\t%.1fx\t%s\n", sd.Machines, ex.PerCPUSecond, ex.PerCPUSecondMin, ex.PerCPUSecondMax,
				ix.PerCPUSecond, ix.PerCPUSecondMin, ix.PerCPUSecondMax, ix.PerCPUSecond/ex.PerCPUSecond, goal)
		}
		tw.Flush()
	}
	ex := get(1000, "marginal-cost")
	fmt.Printf("\nexhaustive at 1,000 machines: >= 10,000/s: %.2fx; p99 <= 1 ms: %v\n", ex.PerSecond/10000, ex.P99Micros <= 1000)
	growth := func(p string) float64 { return get(100000, p).P50Micros / get(100, p).P50Micros }
	fmt.Printf("growth, 100 -> 100,000 machines (1000x): exhaustive %.0fx the time per placement, indexed %.1fx\n",
		growth("marginal-cost"), growth("marginal-cost-indexed"))
	for _, sd := range sides {
		if sd.BreakEven > 0 {
			fmt.Printf("  an index of %d machines repays its build after %.0f placements\n", sd.Machines, sd.BreakEven)
		}
	}
	if len(mixes) > 0 {
		fmt.Printf("\njob mix (%v), placements/s, median (least-most)\n", mixes[0].Jobs)
		tw = tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "machines\texhaustive /s\tindexed /s\tindexed / exhaustive\tp99 exhaustive\tp99 indexed")
		for _, m := range mixes {
			fmt.Fprintf(tw, "%d\t%.0f (%.0f-%.0f)\t%.0f (%.0f-%.0f)\t%.1fx\t%.0f µs\t%.0f µs\n", m.Machines,
				m.Exhaustive.PerSecond, m.Exhaustive.PerSecondMin, m.Exhaustive.PerSecondMax,
				m.Indexed.PerSecond, m.Indexed.PerSecondMin, m.Indexed.PerSecondMax, m.Speedup, m.Exhaustive.P99Micros, m.Indexed.P99Micros)
		}
		tw.Flush()
	}
	if len(variants) > 0 {
		fmt.Printf("\nviews hard for the index, %d machines, the 8-worker job, placements/s, median (least-most)\n", variants[0].Machines)
		tw = tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "view\texhaustive /s\tindexed /s\tindexed / exhaustive\tp99 exhaustive\tp99 indexed")
		for _, v := range variants {
			fmt.Fprintf(tw, "%s\t%.0f (%.0f-%.0f)\t%.0f (%.0f-%.0f)\t%.1fx\t%.0f µs\t%.0f µs\n", v.View,
				v.Exhaustive.PerSecond, v.Exhaustive.PerSecondMin, v.Exhaustive.PerSecondMax,
				v.Indexed.PerSecond, v.Indexed.PerSecondMin, v.Indexed.PerSecondMax, v.Speedup, v.Exhaustive.P99Micros, v.Indexed.P99Micros)
		}
		tw.Flush()
	}
}

// hardViews places the job over views shaped against the index's bounds:
// most machines outside their lending window (the cheapest, idle ones),
// most offers ending before the run would, a thousand small sites, no
// sites at all, and measured RTTs (whose network term the index cannot
// bound below 0).
func hardViews(job scheduler.Job, n, rounds int, per time.Duration) []variantRow {
	shapes := []struct {
		name  string
		shape func(v *scheduler.View, r *rand.Rand)
	}{
		{"80% outside their window (19:00-07:00, idle)", func(v *scheduler.View, r *rand.Rand) {
			for i := range v.Machines {
				if r.IntN(5) > 0 {
					v.Machines[i].Window = scheduler.Window{StartMin: 19 * 60, EndMin: 7 * 60}
					v.Machines[i].Allocated = scheduler.Resources{}
				}
			}
		}},
		{"80% of offers end in 30 min (idle)", func(v *scheduler.View, r *rand.Rand) {
			for i := range v.Machines {
				if r.IntN(5) > 0 {
					v.Machines[i].Until = now.Add(30 * time.Minute)
					v.Machines[i].Allocated = scheduler.Resources{}
				}
			}
		}},
		{"1,000 sites", func(v *scheduler.View, r *rand.Rand) {
			for i := range v.Machines {
				v.Machines[i].Site = fmt.Sprint("site-", r.IntN(1000))
			}
		}},
		{"no sites", func(v *scheduler.View, r *rand.Rand) {
			for i := range v.Machines {
				v.Machines[i].Site = ""
			}
		}},
		{"measured RTTs (10 sites)", func(v *scheduler.View, r *rand.Rand) {
			site := make([]int, len(v.Machines))
			for i := range site {
				site[i] = r.IntN(10)
			}
			v.RTT = func(a, b int) (time.Duration, bool) {
				if site[a] == site[b] {
					return 300 * time.Microsecond, true
				}
				return time.Duration(10+5*(site[a]+site[b])) * time.Millisecond, true
			}
		}},
	}
	var out []variantRow
	for _, sh := range shapes {
		const nv = 2
		views := make([]scheduler.View, nv)
		idx := make([]*scheduler.Index, nv)
		r := rand.New(rand.NewPCG(uint64(n), 2))
		for i := range views {
			views[i] = randomView(r, n)
			sh.shape(&views[i], r)
			idx[i] = scheduler.NewIndex(views[i], scheduler.Params{})
			want, werr := scheduler.Place(views[i], job, now, scheduler.Params{})
			got, err := idx[i].Place(job, now)
			if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(err, werr) {
				log.Fatalf("%s: the index placed %v (%v), Place %v (%v)", sh.name, got.Machines, err, want.Machines, werr)
			}
		}
		m := measure(n, []placer{
			{"marginal-cost", func(k int, j scheduler.Job) error {
				_, err := scheduler.Place(views[k%nv], j, now, scheduler.Params{})
				return err
			}},
			{"marginal-cost-indexed", func(k int, j scheduler.Job) error {
				_, err := idx[k%nv].Place(j, now)
				return err
			}},
		}, []scheduler.Job{job}, rounds, per)
		out = append(out, variantRow{Machines: n, View: sh.name, Exhaustive: m[0], Indexed: m[1], Speedup: m[1].PerSecond / m[0].PerSecond})
	}
	return out
}

func randomView(r *rand.Rand, n int) scheduler.View {
	v := scheduler.View{Machines: make([]scheduler.Machine, n)}
	for i := range v.Machines {
		lent := scheduler.Resources{Cores: uint32(4 + r.IntN(61)), MemBytes: uint64(8+r.IntN(249)) << 30, GPUs: uint32(r.IntN(5) / 3)}
		v.Machines[i] = scheduler.Machine{
			ID: fmt.Sprintf("m%05d", i), Site: []string{"psu", "osu", "uw"}[r.IntN(3)], Lent: lent,
			Allocated: scheduler.Resources{Cores: uint32(r.IntN(int(lent.Cores))), MemBytes: uint64(r.Int64N(int64(lent.MemBytes) / 2)), GPUs: 0},
			Speed:     0.5 + r.Float64(), Dedicated: r.IntN(3) == 0, Completed: uint64(r.IntN(100)), Failed: uint64(r.IntN(5)),
		}
	}
	return v
}

// quality replays the shipped scenarios under every policy, the same work
// for each, and prints the comparisons the scheduler is judged by.
func quality(seeds int) []*sim.Report {
	start := time.Now()
	ws, err := sim.WorkstationsExperiment([]float64{0.3, 0.5, 0.7, 0.85, 0.95}, seeds).Run(nil)
	if err != nil {
		log.Fatal(err)
	}
	edge, err := sim.EdgeExperiment([]float64{0.3, 0.5, 0.7, 0.9}, seeds).Run(nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("\nquality: mean slowdown, %d seeded scenarios per load, same trace for every policy (%s)\n", seeds, time.Since(start).Round(time.Second))
	kube := []string{"least-requested", "balanced-resource", "kube-default"}
	for _, rep := range []*sim.Report{ws, edge} {
		fmt.Printf("\n%s (%s model)\n", rep.Experiment, rep.Model)
		tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
		fmt.Fprint(tw, "load\tmarginal cost\tindexed\tindexed / exhaustive (goal within 2%)\tdecentralized-4\tround robin\tbest Kubernetes-style\t")
		if rep.Model == sim.Shared {
			fmt.Fprint(tw, "mosix\tRR / MC (paper 1.47)\tMC / mosix (paper 1.14)\tRR / mosix (paper 1.68)\t")
		}
		fmt.Fprintln(tw, "MC / RR (goal <= 0.70)\tMC / best kube (goal <= 0.90)\tdecentral / central (goal within 10%)")
		for _, load := range rep.Loads {
			mc, _ := rep.Row("marginal-cost", load)
			ix, _ := rep.Row("marginal-cost-indexed", load)
			dc, _ := rep.Row("decentralized-4", load)
			rr, _ := rep.Row("round-robin", load)
			best := sim.Summary{MeanSlowdown: math.Inf(1)}
			for _, k := range kube {
				if s, ok := rep.Row(k, load); ok && s.MeanSlowdown < best.MeanSlowdown {
					best = s
				}
			}
			fmt.Fprintf(tw, "%.2f\t%.2f\t%.2f\t%+.1f%%\t%.2f\t%.2f\t%.2f (%s)\t", load, mc.MeanSlowdown, ix.MeanSlowdown, 100*(ix.MeanSlowdown/mc.MeanSlowdown-1),
				dc.MeanSlowdown, rr.MeanSlowdown, best.MeanSlowdown, best.Policy)
			if rep.Model == sim.Shared {
				mo, _ := rep.Row("mosix", load)
				fmt.Fprintf(tw, "%.2f\t%.2f\t%.2f\t%.2f\t", mo.MeanSlowdown, rr.MeanSlowdown/mc.MeanSlowdown, mc.MeanSlowdown/mo.MeanSlowdown, rr.MeanSlowdown/mo.MeanSlowdown)
			}
			fmt.Fprintf(tw, "%.2f\t%.2f\t%+.1f%%\n", mc.MeanSlowdown/rr.MeanSlowdown, mc.MeanSlowdown/best.MeanSlowdown, 100*(dc.MeanSlowdown/mc.MeanSlowdown-1))
		}
		tw.Flush()
	}
	return []*sim.Report{ws, edge}
}
