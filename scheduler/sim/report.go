package sim

import (
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
)

// Experiment replays every policy on scenarios drawn at each offered load
// with seeds 1..Seeds: the same work for every policy.
type Experiment struct {
	Name     string
	Model    Model
	Loads    []float64
	Seeds    int
	Draw     func(load float64, seed uint64) *Scenario
	Policies []Policy
}

// WorkstationsExperiment is scenario (a) at the given loads.
func WorkstationsExperiment(loads []float64, seeds int) Experiment {
	return Experiment{Name: "workstations", Model: Shared, Loads: loads, Seeds: seeds, Policies: Policies(Shared),
		Draw: func(load float64, seed uint64) *Scenario { return Workstations(DefaultWorkstations, load, seed) }}
}

// EdgeExperiment is scenario (b) at the given loads.
func EdgeExperiment(loads []float64, seeds int) Experiment {
	return Experiment{Name: "edge", Model: Reserved, Loads: loads, Seeds: seeds, Policies: Policies(Reserved),
		Draw: func(load float64, seed uint64) *Scenario { return Edge(DefaultEdge, load, seed) }}
}

// Summary is one policy at one load, averaged over the seeds.
type Summary struct {
	Policy         string     `json:"policy"`
	Load           float64    `json:"offered_load"`
	Runs           int        `json:"runs"`
	MeanSlowdown   float64    `json:"mean_slowdown"`
	P95Slowdown    float64    `json:"p95_slowdown"`
	MeanCompletion float64    `json:"mean_completion_s"`
	MeanWait       float64    `json:"mean_wait_s"`
	CPUUtil        float64    `json:"cpu_util"`
	MemUtil        float64    `json:"mem_util"`
	MaxLoad        [3]float64 `json:"max_load"`
	Rejected       float64    `json:"rejected_per_run"`
	Jobs           int        `json:"jobs_per_run"`
	Thrashing      float64    `json:"thrashing,omitempty"`
	CrossSite      float64    `json:"cross_site,omitempty"`
	Migrations     float64    `json:"migrations_per_run,omitempty"`
	// Credits per machine, in credits: the mean, and the least and most
	// any machine earned, averaged over runs.
	CreditsMean float64 `json:"credits_mean"`
	CreditsMin  float64 `json:"credits_min"`
	CreditsMax  float64 `json:"credits_max"`
}

// Report is an experiment's results.
type Report struct {
	Experiment string    `json:"experiment"`
	Model      Model     `json:"model"`
	Loads      []float64 `json:"loads"`
	Seeds      int       `json:"seeds"`
	Policies   []string  `json:"policies"`
	Rows       []Summary `json:"rows"`
}

// Run replays the experiment, runs spread over the CPUs; progress, when
// set, is called after each run.
func (e Experiment) Run(progress func(done, total int)) (*Report, error) {
	type task struct {
		load   float64
		seed   uint64
		policy int
	}
	var tasks []task
	for _, load := range e.Loads {
		for seed := uint64(1); seed <= uint64(e.Seeds); seed++ {
			for p := range e.Policies {
				tasks = append(tasks, task{load, seed, p})
			}
		}
	}
	results := make([]Result, len(tasks))
	errs := make([]error, len(tasks))
	// Scenarios are drawn once per (load, seed) and shared, read-only.
	scenarios := map[[2]float64]*Scenario{}
	for _, t := range tasks {
		k := [2]float64{t.load, float64(t.seed)}
		if scenarios[k] == nil {
			scenarios[k] = e.Draw(t.load, t.seed)
		}
	}
	var mu sync.Mutex
	done := 0
	next := make(chan int)
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				t := tasks[i]
				results[i], errs[i] = Run(scenarios[[2]float64{t.load, float64(t.seed)}], e.Policies[t.policy], t.seed)
				mu.Lock()
				done++
				if progress != nil {
					progress(done, len(tasks))
				}
				mu.Unlock()
			}
		}()
	}
	for i := range tasks {
		next <- i
	}
	close(next)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	rep := &Report{Experiment: e.Name, Model: e.Model, Loads: e.Loads, Seeds: e.Seeds}
	for _, p := range e.Policies {
		rep.Policies = append(rep.Policies, p.Name)
	}
	for _, load := range e.Loads {
		for pi, p := range e.Policies {
			s := Summary{Policy: p.Name, Load: load}
			for i, t := range tasks {
				if t.load == load && t.policy == pi {
					s.add(results[i])
				}
			}
			s.finish()
			rep.Rows = append(rep.Rows, s)
		}
	}
	return rep, nil
}

func (s *Summary) add(r Result) {
	s.Runs++
	s.MeanSlowdown += r.MeanSlowdown
	s.P95Slowdown += r.P95Slowdown
	s.MeanCompletion += r.MeanCompletion
	s.MeanWait += r.MeanWait
	s.CPUUtil += r.CPUUtil
	s.MemUtil += r.MemUtil
	for i := range s.MaxLoad {
		s.MaxLoad[i] = max(s.MaxLoad[i], r.MaxLoad[i])
	}
	s.Rejected += float64(r.Rejected)
	s.Jobs = r.Jobs
	s.Thrashing += r.Thrashing
	s.CrossSite += r.CrossSite
	s.Migrations += float64(r.Migrations)
	lo, hi, sum := math.Inf(1), 0.0, 0.0
	for _, c := range r.Credits {
		x := float64(c) / 1e6
		lo, hi, sum = min(lo, x), max(hi, x), sum+x
	}
	if len(r.Credits) > 0 {
		s.CreditsMean += sum / float64(len(r.Credits))
		s.CreditsMin += lo
		s.CreditsMax += hi
	}
}

func (s *Summary) finish() {
	if s.Runs == 0 {
		return
	}
	n := float64(s.Runs)
	for _, f := range []*float64{&s.MeanSlowdown, &s.P95Slowdown, &s.MeanCompletion, &s.MeanWait, &s.CPUUtil, &s.MemUtil,
		&s.Rejected, &s.Thrashing, &s.CrossSite, &s.Migrations, &s.CreditsMean, &s.CreditsMin, &s.CreditsMax} {
		*f /= n
	}
}

// Row finds a policy's summary at a load.
func (r *Report) Row(policy string, load float64) (Summary, bool) {
	for _, s := range r.Rows {
		if s.Policy == policy && s.Load == load {
			return s, true
		}
	}
	return Summary{}, false
}

// Markdown writes a table per load: each policy's figures and its mean
// slowdown over marginal cost's.
func (r *Report) Markdown(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "## %s (%s model, %d seeded scenarios per load)\n\n", r.Experiment, r.Model, r.Seeds)
	for _, load := range r.Loads {
		ref, _ := r.Row("marginal-cost", load)
		fmt.Fprintf(&b, "### offered load %.2f\n\n", load)
		b.WriteString("| policy | mean slowdown | vs marginal cost | p95 slowdown | mean completion | mean wait | CPU util | mem util | max load (cores / mem) | rejected | credits per machine: mean (min-max) |")
		extra := ""
		if r.Model == Shared {
			b.WriteString(" thrashing | migrations |\n")
			extra = "---|---|"
		} else {
			b.WriteString(" jobs across sites |\n")
			extra = "---|"
		}
		b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|" + extra + "\n")
		for _, s := range r.Rows {
			if s.Load != load {
				continue
			}
			fmt.Fprintf(&b, "| %s | %.2f | %.2fx | %.2f | %s | %s | %.0f%% | %.0f%% | %.2f / %.2f | %.1f of %d | %.2f (%.2f-%.2f) |",
				s.Policy, s.MeanSlowdown, s.MeanSlowdown/ref.MeanSlowdown, s.P95Slowdown, seconds(s.MeanCompletion), seconds(s.MeanWait),
				100*s.CPUUtil, 100*s.MemUtil, s.MaxLoad[0], s.MaxLoad[1], s.Rejected, s.Jobs, s.CreditsMean, s.CreditsMin, s.CreditsMax)
			if r.Model == Shared {
				fmt.Fprintf(&b, " %.1f%% | %.0f |\n", 100*s.Thrashing, s.Migrations)
			} else {
				fmt.Fprintf(&b, " %.0f%% |\n", 100*s.CrossSite)
			}
		}
		b.WriteString("\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func seconds(s float64) string {
	switch {
	case s >= 3600:
		return fmt.Sprintf("%.1f h", s/3600)
	case s >= 60:
		return fmt.Sprintf("%.1f min", s/60)
	}
	return fmt.Sprintf("%.1f s", s)
}

// SVG plots mean slowdown against offered load, a line per policy, on a
// log scale.
func (r *Report) SVG(w io.Writer) error {
	const W, H, left, right, top, bottom = 760, 440, 70, 190, 40, 50
	pw, ph := float64(W-left-right), float64(H-top-bottom)
	lo, hi := math.Inf(1), 0.0
	for _, s := range r.Rows {
		if s.MeanSlowdown > 0 {
			lo, hi = min(lo, s.MeanSlowdown), max(hi, s.MeanSlowdown)
		}
	}
	if math.IsInf(lo, 1) {
		lo, hi = 1, 2
	}
	ylo, yhi := math.Floor(math.Log10(max(lo, 1e-3))), math.Ceil(math.Log10(hi))
	if yhi <= ylo {
		yhi = ylo + 1
	}
	xlo, xhi := slices.Min(r.Loads), slices.Max(r.Loads)
	if xhi <= xlo {
		xlo, xhi = xlo-0.1, xhi+0.1
	}
	x := func(l float64) float64 { return left + (l-xlo)/(xhi-xlo)*pw }
	y := func(v float64) float64 { return top + (yhi-math.Log10(v))/(yhi-ylo)*ph }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", W, H, W, H)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", W, H)
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="15">%s: mean slowdown vs offered load (%d seeds per point)</text>`+"\n", left, r.Experiment, r.Seeds)
	for e := ylo; e <= yhi; e++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, e)
			if math.Log10(v) > yhi+1e-9 {
				break
			}
			fmt.Fprintf(&b, `<line x1="%d" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, left+pw, y(v), y(v))
			fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%g</text>`+"\n", left-6, y(v)+4, v)
		}
	}
	for _, l := range r.Loads {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%.2f</text>`+"\n", x(l), top+ph+18, l)
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">offered load</text>`+"\n", left+pw/2, H-8)
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.0f" height="%.0f" fill="none" stroke="#333"/>`+"\n", left, top, pw, ph)
	colors := []string{"#d62728", "#ff7f0e", "#1f77b4", "#8c564b", "#7f7f7f", "#2ca02c", "#17becf", "#bcbd22", "#9467bd", "#e377c2"}
	for pi, name := range r.Policies {
		c := colors[pi%len(colors)]
		var pts []string
		for _, l := range r.Loads {
			if s, ok := r.Row(name, l); ok && s.MeanSlowdown > 0 {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(l), y(s.MeanSlowdown)))
			}
		}
		width := 1.5
		if strings.HasPrefix(name, "marginal-cost") || strings.HasPrefix(name, "decentralized") {
			width = 3
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="%.1f" points="%s"/>`+"\n", c, width, strings.Join(pts, " "))
		ly := top + 14 + 18*pi
		fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%d" y2="%d" stroke="%s" stroke-width="%.1f"/>`+"\n", left+pw+12, left+pw+32, ly, ly, c, width)
		fmt.Fprintf(&b, `<text x="%.0f" y="%d">%s</text>`+"\n", left+pw+38, ly+4, name)
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}
