// Command scheduler is `make bench-scheduler`: how fast the marginal-cost
// scheduler places an 8-worker job over 100, 1,000 and 10,000 machines on
// one core (goal: >= 10,000 placements/s and p99 <= 1 ms at 1,000
// machines; cost no worse than linear in machines), next to the
// Kubernetes-style baseline on the same views. It prints a table and
// writes JSON (-out).
//
// Each placement is on a fresh random view state (machines of 4-64 cores,
// 8-256 GiB, some GPUs, loads from idle to nearly full, three sites), so
// no answer is cached; views are built before timing.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/deepmarket/deepmarket/scheduler"
	"github.com/deepmarket/deepmarket/scheduler/sim"
)

type row struct {
	Machines      int     `json:"machines"`
	Policy        string  `json:"policy"`
	PerSecond     float64 `json:"placements_per_s"`
	P50Micros     float64 `json:"p50_us"`
	P99Micros     float64 `json:"p99_us"`
	NanosPerMachn float64 `json:"ns_per_machine"`
}

func main() {
	out := flag.String("out", "", "write JSON results here")
	dur := flag.Duration("duration", 3*time.Second, "time per case")
	seeds := flag.Int("seeds", 10, "random scenarios per load in the quality comparison")
	flag.Parse()
	log.SetFlags(0)
	runtime.GOMAXPROCS(1)
	var rows []row
	for _, n := range []int{100, 1000, 10000} {
		views := make([]scheduler.View, 16)
		r := rand.New(rand.NewPCG(uint64(n), 1))
		for i := range views {
			views[i] = randomView(r, n)
		}
		j := scheduler.Job{ID: "bench", Workers: 8, Per: scheduler.Resources{Cores: 2, MemBytes: 4 << 30},
			Duration: time.Hour, Benefit: scheduler.Benefit{Max: 1 << 50}}
		now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
		for _, p := range []scheduler.Policy{scheduler.MarginalCost{}, scheduler.KubeDefault{}} {
			rows = append(rows, measure(n, p, views, j, now, *dur))
		}
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "machines\tpolicy\tplacements/s (1 core)\tp50\tp99\tns per machine\tgoal (1,000 machines, marginal cost)")
	for _, r := range rows {
		goal := ""
		if r.Machines == 1000 && r.Policy == "marginal-cost" {
			goal = fmt.Sprintf(">= 10,000/s: %.2fx; p99 <= 1 ms: %v", r.PerSecond/10000, r.P99Micros <= 1000)
		}
		fmt.Fprintf(tw, "%d\t%s\t%.0f\t%.1f µs\t%.1f µs\t%.1f\t%s\n", r.Machines, r.Policy, r.PerSecond, r.P50Micros, r.P99Micros, r.NanosPerMachn, goal)
	}
	tw.Flush()
	mc := func(n int) row {
		for _, r := range rows {
			if r.Machines == n && r.Policy == "marginal-cost" {
				return r
			}
		}
		return row{}
	}
	fmt.Printf("\ngrowth, marginal cost: 100 -> 10,000 machines is %.0fx the machines and %.1fx the time per placement (linear: 100x)\n",
		100.0, mc(10000).P50Micros/mc(100).P50Micros)
	runtime.GOMAXPROCS(runtime.NumCPU())
	q := quality(*seeds)
	if *out != "" {
		b, _ := json.MarshalIndent(struct {
			Throughput []row         `json:"throughput"`
			Quality    []*sim.Report `json:"quality"`
		}{rows, q}, "", "  ")
		if err := os.WriteFile(*out, append(b, '\n'), 0o644); err != nil {
			log.Fatal(err)
		}
	}
}

func measure(n int, p scheduler.Policy, views []scheduler.View, j scheduler.Job, now time.Time, dur time.Duration) row {
	var lat []time.Duration
	start := time.Now()
	for i := 0; time.Since(start) < dur; i++ {
		t := time.Now()
		if _, err := p.Place(views[i%len(views)], j, now); err != nil {
			log.Fatalf("%s over %d machines: %v", p.Name(), n, err)
		}
		lat = append(lat, time.Since(t))
	}
	total := time.Since(start)
	slices.Sort(lat)
	q := func(f float64) float64 { return float64(lat[int(f*float64(len(lat)-1))].Nanoseconds()) / 1000 }
	return row{Machines: n, Policy: p.Name(), PerSecond: float64(len(lat)) / total.Seconds(),
		P50Micros: q(0.5), P99Micros: q(0.99), NanosPerMachn: q(0.5) * 1000 / float64(n)}
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
		fmt.Fprint(tw, "load\tmarginal cost\tdecentralized-4\tround robin\tbest Kubernetes-style\t")
		if rep.Model == sim.Shared {
			fmt.Fprint(tw, "mosix\tRR / MC (paper 1.47)\tMC / mosix (paper 1.14)\tRR / mosix (paper 1.68)\t")
		}
		fmt.Fprintln(tw, "MC / RR (goal <= 0.70)\tMC / best kube (goal <= 0.90)\tdecentral / central (goal within 10%)")
		for _, load := range rep.Loads {
			mc, _ := rep.Row("marginal-cost", load)
			dc, _ := rep.Row("decentralized-4", load)
			rr, _ := rep.Row("round-robin", load)
			best := sim.Summary{MeanSlowdown: math.Inf(1)}
			for _, k := range kube {
				if s, ok := rep.Row(k, load); ok && s.MeanSlowdown < best.MeanSlowdown {
					best = s
				}
			}
			fmt.Fprintf(tw, "%.2f\t%.2f\t%.2f\t%.2f\t%.2f (%s)\t", load, mc.MeanSlowdown, dc.MeanSlowdown, rr.MeanSlowdown, best.MeanSlowdown, best.Policy)
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
