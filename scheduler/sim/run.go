package sim

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/deepmarket/deepmarket/scheduler"
)

// epoch is the wall-clock time the trace's second 0 maps to for the
// scheduler (it reads windows and expiries; scenarios have none).
var epoch = time.Date(2026, 1, 5, 0, 0, 0, 0, time.UTC)

// Result is what one policy did with one scenario.
type Result struct {
	Scenario string  `json:"scenario"`
	Policy   string  `json:"policy"`
	Load     float64 `json:"offered_load"`
	Jobs     int     `json:"jobs"`
	Rejected int     `json:"rejected"`
	// Slowdown is time from arrival to completion over the time the job
	// takes alone on the fastest machine(s); in the Reserved model, that
	// time is taken as at least BoundedSlowdownS and slowdown at least 1.
	MeanSlowdown float64 `json:"mean_slowdown"`
	P95Slowdown  float64 `json:"p95_slowdown"`
	// MeanCompletion is the mean time from arrival to completion, in
	// seconds; MeanWait the part spent waiting to be placed.
	MeanCompletion float64 `json:"mean_completion_s"`
	MeanWait       float64 `json:"mean_wait_s"`
	Makespan       float64 `json:"makespan_s"`
	// CPUUtil is the time-averaged share of CPU capacity (cores x speed)
	// busy; MemUtil the share of memory in use (at most the physical).
	CPUUtil float64 `json:"cpu_util"`
	MemUtil float64 `json:"mem_util"`
	// MaxLoad is the highest load any machine reached, per resource
	// (cores, memory, GPUs): allocated, or processes per core, over
	// capacity; above 1 is over-commitment (Shared model only).
	MaxLoad [3]float64 `json:"max_load"`
	// Thrashing is the time-averaged share of machines whose memory is
	// over-committed (Shared model).
	Thrashing float64 `json:"thrashing,omitempty"`
	// CrossSite is the share of multi-worker jobs placed on more than
	// one site.
	CrossSite float64 `json:"cross_site,omitempty"`
	// Migrations counts processes a migrating balancer moved.
	Migrations int `json:"migrations,omitempty"`
	// Credits holds what each machine earned (micro-credits): each
	// worker pays its machine's unit prices when it was placed there,
	// for as long as it stayed.
	Credits []uint64 `json:"credits_per_machine"`
}

// BoundedSlowdownS is the floor on a job's ideal time when slowdown is
// taken in the Reserved model: 10 s, the usual bound in the parallel job
// scheduling literature.
const BoundedSlowdownS = 10.0

// pricing constants for the Shared model's encoding of CPU shares as
// scheduler resources: one process is cpuUnit units of a speed-1 core.
const cpuUnit = 100

type jobState struct {
	spec     *Job
	idx      int
	machines []int     // per worker
	paused   []float64 // per worker: stands still until then (migration)
	since    []float64 // per worker: on its machine since
	price    []float64 // per worker: hourly price its machine is paid
	left     float64   // work left per worker
	rate     float64
	placed   float64
	done     bool
}

type machineState struct {
	procs   int    // resident workers that are not migrating
	cores   uint64 // allocated (Reserved)
	mem     uint64 // resident memory
	gpus    uint64
	workers []slot // resident workers
}

type slot struct {
	j *jobState
	w int
}

// run is one simulation in progress.
type run struct {
	s      *Scenario
	pol    Policy
	paths  paths
	now    float64
	ms     []machineState
	active []*jobState
	wait   []*jobState
	res    Result
	// integrals over time of busy CPU and used memory
	cpuInt, memInt   float64
	thrashInt        float64
	multi, cross     int
	cpuCap, memCap   float64
	maxSpeed         float64
	cpuMax, memScale float64 // Shared: discovered maximum CPU load, memory over-commit scale
	credits          []float64
	slowdowns        []float64
	sumCompl, sumWt  float64
	static           scheduler.Policy
	subsets          [][]int
}

// Run simulates the scenario under the policy. seed drives the random
// choices of policies that make them (the random baseline); the scenario
// is fixed.
func Run(s *Scenario, pol Policy, seed uint64) (Result, error) {
	if err := s.Validate(); err != nil {
		return Result{}, err
	}
	if s.Model == Reserved && pol.kind == mosix {
		return Result{}, fmt.Errorf("policy %s migrates processes: it needs the shared model, not %q", pol.Name, s.Model)
	}
	r := &run{s: s, pol: pol, paths: s.paths(), ms: make([]machineState, len(s.Machines)),
		cpuMax: 1, memScale: 1, credits: make([]float64, len(s.Machines))}
	r.res = Result{Scenario: s.Name, Policy: pol.Name, Load: s.Load, Jobs: len(s.Jobs)}
	for _, m := range s.Machines {
		r.cpuCap += float64(m.Cores) * m.Speed
		r.memCap += float64(m.MemBytes)
		r.maxSpeed = max(r.maxSpeed, m.Speed)
	}
	if pol.newStatic != nil {
		r.static = pol.newStatic(seed)
	}
	if pol.kind == decentralized {
		r.subsets = subsets(s, pol.K, pol.Share, seed)
	}
	next := 0
	for next < len(s.Jobs) || len(r.active) > 0 {
		if s.Model == Shared { // Reserved rates are set once, at start
			for _, j := range r.active {
				j.rate = r.rate(j)
			}
		}
		// The next event: an arrival, a completion or the end of a
		// migration.
		t := math.Inf(1)
		if next < len(s.Jobs) {
			t = s.Jobs[next].Arrival
		}
		for _, j := range r.active {
			if j.rate > 0 {
				t = min(t, r.now+j.left/j.rate)
			}
			for _, p := range j.paused {
				if p > r.now {
					t = min(t, p)
				}
			}
		}
		if math.IsInf(t, 1) {
			return Result{}, errors.New("sim: running jobs make no progress (a machine without speed or a partitioned network)")
		}
		r.advance(t)
		freed := false
		for _, j := range slices.Clone(r.active) {
			if j.left <= 1e-9*j.spec.Work {
				r.finish(j)
				freed = true
			}
		}
		waited := len(r.wait)
		for next < len(s.Jobs) && s.Jobs[next].Arrival <= r.now {
			j := &jobState{spec: &s.Jobs[next], idx: next, left: s.Jobs[next].Work}
			next++
			if !r.fitsEmpty(j) {
				r.res.Rejected++
				continue
			}
			r.wait = append(r.wait, j)
		}
		// Jobs that waited already are tried again only when something
		// left: until then, neither room nor prices have changed.
		from := waited
		if freed {
			from = 0
		}
		r.placeWaiting(from)
		if pol.kind == mosix {
			r.rebalance()
		}
		if next >= len(s.Jobs) && len(r.active) == 0 && len(r.wait) > 0 {
			// Nothing runs and nothing will arrive: what waits is refused
			// for good (miserly admission with benefits below the price).
			r.res.Rejected += len(r.wait)
			r.wait = nil
		}
	}
	r.summarize()
	return r.res, nil
}

// advance moves time to t, running every job at its rate.
func (r *run) advance(t float64) {
	dt := t - r.now
	if dt <= 0 {
		return
	}
	for _, j := range r.active {
		j.left -= j.rate * dt
	}
	defer r.land()
	for i := range r.ms {
		m, spec := &r.ms[i], &r.s.Machines[i]
		busy := 0.0
		if r.s.Model == Shared {
			busy = float64(min(m.procs, spec.Cores))
		} else {
			busy = float64(min(m.cores, uint64(spec.Cores)))
		}
		r.cpuInt += busy * spec.Speed * dt
		r.memInt += float64(min(m.mem, spec.MemBytes)) * dt
		if r.s.Model == Shared && m.mem > spec.MemBytes {
			r.thrashInt += dt
		}
	}
	r.now = t
}

// land counts the processes whose migration has ended on their new
// machine's CPU again.
func (r *run) land() {
	for _, j := range r.active {
		for w, p := range j.paused {
			if p > 0 && p <= r.now {
				j.paused[w] = 0
				r.ms[j.machines[w]].procs++
			}
		}
	}
}

// rate is how many seconds of work each of j's workers does per second.
func (r *run) rate(j *jobState) float64 {
	slowest := math.Inf(1)
	for w, mi := range j.machines {
		if j.paused[w] > r.now {
			return 0
		}
		slowest = min(slowest, r.procRate(mi, 0))
	}
	if j.spec.StepWork <= 0 || j.spec.Workers < 2 || j.spec.CommBytes <= 0 {
		return slowest
	}
	step := j.spec.StepWork/slowest + r.commTime(j.spec, j.machines)
	return j.spec.StepWork / step
}

// procRate is the speed of one process on machine mi with extra more
// processes and extraMem more memory there.
func (r *run) procRate(mi, extra int) float64 {
	spec, m := &r.s.Machines[mi], &r.ms[mi]
	if r.s.Model == Reserved {
		return spec.Speed
	}
	procs := m.procs + extra
	rate := spec.Speed * min(1, float64(spec.Cores)/float64(max(procs, 1)))
	if m.mem > spec.MemBytes {
		rate /= r.s.Thrash
	}
	return rate
}

// commTime is the time of one ring all-reduce of the job's workers on
// the given machines: 2(W-1)/W of CommBytes through the ring's slowest
// link, plus 2(W-1) times its longest latency.
func (r *run) commTime(j *Job, machines []int) float64 {
	w := len(machines)
	if w < 2 || j.CommBytes <= 0 {
		return 0
	}
	ring := slices.Clone(machines)
	sort.Slice(ring, func(a, b int) bool {
		sa, sb := r.s.Machines[ring[a]].Site, r.s.Machines[ring[b]].Site
		if sa != sb {
			return sa < sb
		}
		return ring[a] < ring[b]
	})
	bw, lat := math.Inf(1), 0.0
	for k := range ring {
		a, b := ring[k], ring[(k+1)%w]
		if a == b {
			continue
		}
		sa, sb := r.s.Machines[a].Site, r.s.Machines[b].Site
		bw = min(bw, r.paths.mbps[sa][sb])
		lat = max(lat, r.paths.latMs[sa][sb])
	}
	if math.IsInf(bw, 1) {
		return 0 // all on one machine
	}
	n := float64(w)
	return 2*(n-1)/n*j.CommBytes*8/(bw*1e6) + 2*(n-1)*lat/1000
}

// ideal is the job's run time alone on the fastest machines of one site.
func (r *run) ideal(j *Job) float64 {
	if j.StepWork <= 0 || j.Workers < 2 || j.CommBytes <= 0 {
		return j.Work / r.maxSpeed
	}
	n := float64(j.Workers)
	comm := 2*(n-1)/n*j.CommBytes*8/(r.s.LANMbps*1e6) + 2*(n-1)*r.s.LANLatencyMs/1000
	return j.Work / j.StepWork * (j.StepWork/r.maxSpeed + comm)
}

// fitsEmpty reports whether the job could ever be placed: in the Reserved
// model, whether its workers fit the idle machines.
func (r *run) fitsEmpty(j *jobState) bool {
	if r.s.Model == Shared {
		return true
	}
	n := 0
	for _, m := range r.s.Machines {
		c, mem, g := uint64(m.Cores), m.MemBytes, uint64(m.GPUs)
		per := j.spec.Per
		k := math.MaxInt
		if per.Cores > 0 {
			k = min(k, int(c/uint64(per.Cores)))
		}
		if per.MemBytes > 0 {
			k = min(k, int(mem/per.MemBytes))
		}
		if per.GPUs > 0 {
			k = min(k, int(g/uint64(per.GPUs)))
		}
		n += k
		if n >= j.spec.Workers {
			return true
		}
	}
	return false
}

// placeWaiting places the waiting jobs from index from on that fit now,
// in arrival order.
func (r *run) placeWaiting(from int) {
	kept := r.wait[:from]
	for _, j := range r.wait[from:] {
		if !r.roomFor(j) {
			kept = append(kept, j)
			continue
		}
		ms, ok := r.place(j)
		if !ok {
			kept = append(kept, j)
			continue
		}
		r.start(j, ms)
	}
	clear(r.wait[len(kept):])
	r.wait = kept
}

// roomFor is a quick check that the free capacity could hold j's workers
// at all (Reserved model), before asking a policy.
func (r *run) roomFor(j *jobState) bool {
	if r.s.Model == Shared {
		return true
	}
	per, n := j.spec.Per, 0
	for mi := range r.ms {
		spec, st := &r.s.Machines[mi], &r.ms[mi]
		k := j.spec.Workers
		if per.Cores > 0 {
			k = min(k, int((uint64(spec.Cores)-min(st.cores, uint64(spec.Cores)))/uint64(per.Cores)))
		}
		if per.MemBytes > 0 {
			k = min(k, int((spec.MemBytes-min(st.mem, spec.MemBytes))/per.MemBytes))
		}
		if per.GPUs > 0 {
			k = min(k, int((uint64(spec.GPUs)-min(st.gpus, uint64(spec.GPUs)))/uint64(per.GPUs)))
		}
		if n += k; n >= j.spec.Workers {
			return true
		}
	}
	return false
}

func (r *run) start(j *jobState, machines []int) {
	n := len(machines)
	j.machines, j.paused, j.since, j.price = machines, make([]float64, n), make([]float64, n), make([]float64, n)
	j.placed = r.now
	if n > 1 {
		r.multi++
		for _, mi := range machines[1:] {
			if r.s.Machines[mi].Site != r.s.Machines[machines[0]].Site {
				r.cross++
				break
			}
		}
	}
	prices := r.unitPrices()
	for w, mi := range machines {
		j.since[w] = r.now
		j.price[w] = workerPrice(prices[mi], j.spec.Per)
		r.attach(j, w, mi)
	}
	j.rate = r.rate(j)
	r.active = append(r.active, j)
}

func (r *run) attach(j *jobState, w, mi int) {
	m := &r.ms[mi]
	m.procs++
	m.cores += uint64(j.spec.Per.Cores)
	m.mem += j.spec.Per.MemBytes
	m.gpus += uint64(j.spec.Per.GPUs)
	m.workers = append(m.workers, slot{j, w})
	r.noteLoad(mi)
}

func (r *run) detach(j *jobState, w, mi int) {
	m := &r.ms[mi]
	if j.paused[w] <= r.now {
		m.procs--
	}
	m.cores -= uint64(j.spec.Per.Cores)
	m.mem -= j.spec.Per.MemBytes
	m.gpus -= uint64(j.spec.Per.GPUs)
	for k, s := range m.workers {
		if s.j == j && s.w == w {
			m.workers = slices.Delete(m.workers, k, k+1)
			break
		}
	}
	r.credits[mi] += j.price[w] * (r.now - j.since[w]) / 3600
}

func (r *run) noteLoad(mi int) {
	m, spec := &r.ms[mi], &r.s.Machines[mi]
	cores := float64(m.cores) / float64(spec.Cores)
	if r.s.Model == Shared {
		cores = float64(m.procs) / float64(spec.Cores)
	}
	r.res.MaxLoad[0] = max(r.res.MaxLoad[0], cores)
	r.res.MaxLoad[1] = max(r.res.MaxLoad[1], float64(m.mem)/float64(spec.MemBytes))
	if spec.GPUs > 0 {
		r.res.MaxLoad[2] = max(r.res.MaxLoad[2], float64(m.gpus)/float64(spec.GPUs))
	}
}

func (r *run) finish(j *jobState) {
	for w, mi := range j.machines {
		r.detach(j, w, mi)
	}
	j.done = true
	r.active = slices.DeleteFunc(r.active, func(x *jobState) bool { return x == j })
	took := r.now - j.spec.Arrival
	if r.s.Model == Reserved {
		// Bounded slowdown (Feitelson et al.), so a job of seconds that
		// waits a few is not weighed like a day-long one that waits hours.
		r.slowdowns = append(r.slowdowns, max(1, took/max(r.ideal(j.spec), BoundedSlowdownS)))
	} else {
		r.slowdowns = append(r.slowdowns, took/r.ideal(j.spec))
	}
	r.sumCompl += took
	r.sumWt += j.placed - j.spec.Arrival
}

func (r *run) summarize() {
	res := &r.res
	if n := len(r.slowdowns); n > 0 {
		for _, s := range r.slowdowns {
			res.MeanSlowdown += s
		}
		res.MeanSlowdown /= float64(n)
		sorted := slices.Clone(r.slowdowns)
		slices.Sort(sorted)
		res.P95Slowdown = sorted[min(n-1, int(math.Ceil(0.95*float64(n)))-1)]
		res.MeanCompletion = r.sumCompl / float64(n)
		res.MeanWait = r.sumWt / float64(n)
	}
	res.Makespan = r.now
	if r.multi > 0 {
		res.CrossSite = float64(r.cross) / float64(r.multi)
	}
	if r.now > 0 {
		res.CPUUtil = r.cpuInt / (r.cpuCap * r.now)
		res.MemUtil = r.memInt / (r.memCap * r.now)
		res.Thrashing = r.thrashInt / (float64(len(r.ms)) * r.now)
	}
	res.Credits = make([]uint64, len(r.credits))
	for i, c := range r.credits {
		res.Credits[i] = uint64(math.Round(c))
	}
}

// unitPrices are the machines' current unit prices (the market's view
// of all machines, at physical capacity).
func (r *run) unitPrices() []scheduler.UnitPrices {
	v, p := r.view(nil, false)
	mk := scheduler.MarketPrices(v, epoch.Add(time.Duration(r.now*float64(time.Second))), p)
	out := make([]scheduler.UnitPrices, len(mk.Machines))
	for i, m := range mk.Machines {
		out[i] = m.Unit
	}
	return out
}

func workerPrice(u scheduler.UnitPrices, per scheduler.Resources) float64 {
	cores := max(per.Cores, 1) // a Shared-model process uses a core's worth
	return float64(u.Core)*float64(cores) + float64(u.MemGiB)*float64(per.MemBytes)/(1<<30) + float64(u.GPU)*float64(per.GPUs)
}
