package sim

import (
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/deepmarket/deepmarket/scheduler"
)

type policyKind int

const (
	static policyKind = iota
	marginal
	indexed
	decentralized
	mosix
)

// Policy is a way of placing jobs the simulator can replay a trace
// under.
type Policy struct {
	Name string
	kind policyKind
	// newStatic makes a fresh baseline for a run.
	newStatic func(seed uint64) scheduler.Policy
	// physicalFirst: in the Shared model, try machines with a free core
	// and free memory before over-committing (what a capacity-checking
	// scheduler does when it must place every job).
	physicalFirst bool
	// unbounded: in the Shared model, every machine has room (PVM's
	// round robin places without looking).
	unbounded bool
	// K and Share: the decentralized mode's schedulers and the share of
	// the machines each one sees.
	K     int
	Share float64
}

// MarginalCost is scheduler.Place (and scheduler.Quote's admission where
// jobs have a benefit) over all machines: the centralized policy.
func MarginalCost() Policy { return Policy{Name: "marginal-cost", kind: marginal} }

// MarginalCostIndexed is MarginalCost through a scheduler.Index built from
// each placement's view: what a node pricing many bids against one view
// runs. It places exactly as MarginalCost does; the simulator shows that
// on the same work.
func MarginalCostIndexed() Policy { return Policy{Name: "marginal-cost-indexed", kind: indexed} }

// Decentralized is K marginal-cost schedulers, each seeing an overlapping
// subset of about share of the machines (Shared model: a random subset;
// Reserved: the sites nearest its own); a bid reaches every scheduler and
// the bidder takes the cheapest quote.
func Decentralized(k int, share float64) Policy {
	return Policy{Name: "decentralized-" + strconv.Itoa(k), kind: decentralized, K: max(k, 1), Share: share}
}

// Mosix is a least-loaded balancer that migrates running processes
// (Shared model only): a new process goes where it would run fastest with
// its memory fitting; after every arrival and completion, a process moves
// from the machine where it runs slowest to one where it would run at
// least 1.25 times faster, paying MigrateMBps for its memory.
func Mosix() Policy { return Policy{Name: "mosix", kind: mosix} }

// Baselines are the non-migrating baselines of package scheduler.
func Baselines() []Policy {
	return []Policy{
		{Name: "round-robin", unbounded: true, newStatic: func(uint64) scheduler.Policy { return &scheduler.RoundRobin{} }},
		{Name: "random", unbounded: true, newStatic: func(seed uint64) scheduler.Policy {
			return scheduler.Random{Rand: rand.New(rand.NewPCG(seed, 0x5eed))}
		}},
		{Name: "first-fit", physicalFirst: true, newStatic: func(uint64) scheduler.Policy { return scheduler.FirstFit{} }},
		{Name: "least-requested", physicalFirst: true, newStatic: func(uint64) scheduler.Policy { return scheduler.LeastRequested{} }},
		{Name: "balanced-resource", physicalFirst: true, newStatic: func(uint64) scheduler.Policy { return scheduler.BalancedResource{} }},
		{Name: "kube-default", physicalFirst: true, newStatic: func(uint64) scheduler.Policy { return scheduler.KubeDefault{} }},
	}
}

// Policies are every policy that fits the model: marginal cost, by
// exhaustive search and through an index, decentralized marginal cost (4
// schedulers seeing half the machines each), the baselines, and Mosix in
// the Shared model.
func Policies(m Model) []Policy {
	ps := append([]Policy{MarginalCost(), MarginalCostIndexed(), Decentralized(4, 0.5)}, Baselines()...)
	if m == Shared {
		ps = append(ps, Mosix())
	}
	return ps
}

// PolicyByName finds one of Policies(m), or a decentralized-K.
func PolicyByName(m Model, name string) (Policy, bool) {
	for _, p := range Policies(m) {
		if p.Name == name {
			return p, true
		}
	}
	if k, ok := strings.CutPrefix(name, "decentralized-"); ok {
		if n, err := strconv.Atoi(k); err == nil && n >= 1 && n <= 64 {
			return Decentralized(n, 0.5), true
		}
	}
	return Policy{}, false
}

// view is the scheduler's view of the machines in subset (all when nil).
// In the Shared model, a virtual view encodes the paper's loads as
// scheduler resources: CPU capacity is cores x speed x the discovered
// maximum CPU load (processes per unit of speed, a power of two, grown as
// needed: the paper's doubling), memory capacity is physical x memScale
// (over-commitment allowed up to that), and the exponential's base is
// n^memScale: with capacity c times larger and base n^c, the scheduler's
// cost base * capacity * (N^(load'+d') - N^load') / ln N is exactly the
// paper's n^(load) of the physical loads. Without virtual, capacity is
// physical: a core and its share of memory per process.
func (r *run) view(subset []int, virtual bool) (scheduler.View, scheduler.Params) {
	idx := subset
	if idx == nil {
		idx = make([]int, len(r.s.Machines))
		for i := range idx {
			idx[i] = i
		}
	}
	v := scheduler.View{Machines: make([]scheduler.Machine, len(idx))}
	var p scheduler.Params
	for k, mi := range idx {
		spec, st := &r.s.Machines[mi], &r.ms[mi]
		m := scheduler.Machine{ID: spec.ID, Site: r.s.Sites[spec.Site], Speed: spec.Speed, Dedicated: true}
		switch {
		case r.s.Model == Reserved:
			m.Lent = scheduler.Resources{Cores: uint32(spec.Cores), MemBytes: spec.MemBytes, GPUs: uint32(spec.GPUs)}
			m.Allocated = scheduler.Resources{Cores: uint32(st.cores), MemBytes: st.mem, GPUs: uint32(st.gpus)}
		case virtual:
			m.Lent = scheduler.Resources{
				Cores:    uint32(math.Ceil(cpuUnit * float64(spec.Cores) * spec.Speed * r.cpuMax * r.memScale)),
				MemBytes: uint64(float64(spec.MemBytes) * r.memScale),
			}
			m.Allocated = scheduler.Resources{Cores: uint32(cpuUnit * len(st.workers)), MemBytes: st.mem}
		default:
			m.Lent = scheduler.Resources{Cores: uint32(spec.Cores), MemBytes: spec.MemBytes}
			m.Allocated = scheduler.Resources{Cores: uint32(len(st.workers)), MemBytes: st.mem}
		}
		v.Machines[k] = m
	}
	if r.s.Model == Reserved {
		v.RTT = func(i, j int) (time.Duration, bool) {
			a, b := r.s.Machines[idx[i]].Site, r.s.Machines[idx[j]].Site
			return time.Duration(2 * r.paths.latMs[a][b] * float64(time.Millisecond)), true
		}
	}
	if r.s.Model == Shared && virtual {
		// Weigh a whole average machine's CPU (at the discovered maximum
		// load) like its whole memory, as the paper's sum of n^load does.
		var cpu, mem float64
		for _, mi := range idx {
			cpu += cpuUnit * float64(r.s.Machines[mi].Cores) * r.s.Machines[mi].Speed * r.cpuMax
			mem += float64(r.s.Machines[mi].MemBytes) / (1 << 30)
		}
		p.Base = scheduler.Prices{CoreHour: 1000, MemGiBHour: uint64(max(1, math.Round(1000*cpu/mem)))}
		n := max(len(idx), 2)
		p.N = int(math.Min(math.Pow(float64(n), r.memScale), 1<<62))
	}
	return v, p
}

// job is the scheduler's form of a sim job.
func (r *run) job(j *jobState) scheduler.Job {
	sj := scheduler.Job{ID: j.spec.ID, Workers: j.spec.Workers, Per: j.spec.Per,
		Duration: time.Duration(max(j.spec.Work, 1) * float64(time.Second)),
		Benefit:  scheduler.Benefit{Kind: scheduler.FixedPrice, Max: j.spec.Benefit}}
	if r.s.Model == Shared {
		sj.Per.Cores = cpuUnit
		sj.Per.GPUs = 0
	}
	if j.spec.Benefit == 0 {
		sj.Benefit.Max = math.MaxUint64 / 4
	}
	return sj
}

// grow sets the Shared model's assumed maximum CPU load to the smallest
// power of two at which the job fits some machine in the virtual view
// (the paper discovers the maximum load by doubling; we also let it fall
// again when load falls, which measured better than a maximum that only
// grows), and raises the memory over-commitment allowed, doubling up to 8
// times, until the job fits some machine.
func (r *run) grow(j *jobState) {
	fits := func(cpu bool) bool {
		for mi := range r.ms {
			spec, st := &r.s.Machines[mi], &r.ms[mi]
			if cpu && float64(len(st.workers)+j.spec.Workers) <= float64(spec.Cores)*spec.Speed*r.cpuMax {
				return true
			}
			if !cpu && float64(st.mem+uint64(j.spec.Workers)*j.spec.Per.MemBytes) <= float64(spec.MemBytes)*r.memScale {
				return true
			}
		}
		return false
	}
	r.cpuMax = 1.0 / 64
	for !fits(true) {
		r.cpuMax *= 2
	}
	for r.memScale < 8 && !fits(false) {
		r.memScale *= 2
	}
}

// place chooses machines for j's workers now, or reports it waits.
func (r *run) place(j *jobState) ([]int, bool) {
	now := epoch.Add(time.Duration(r.now * float64(time.Second)))
	sj := r.job(j)
	shared := r.s.Model == Shared
	if shared {
		r.grow(j)
	}
	switch r.pol.kind {
	case mosix:
		return r.mosixPlace(j), true
	case marginal, indexed, decentralized:
		subs := r.subsets
		if r.pol.kind != decentralized {
			subs = [][]int{nil}
		}
		// In the Shared model, memory is first held to its physical size
		// (over-committing it thrashes); only a job that fits nowhere then
		// is priced with over-commitment.
		scales := []float64{r.memScale}
		if shared && r.memScale > 1 {
			scales = []float64{1, r.memScale}
		}
		if shared {
			// A free core and free memory first, as DeepMarket lends.
			pj := sj
			pj.Per.Cores = 1
			if ms := r.cheapest(subs, 1, false, pj, now); ms != nil {
				return ms, true
			}
		}
		for _, scale := range scales {
			if ms := r.cheapest(subs, scale, shared, sj, now); ms != nil {
				return ms, true
			}
		}
	default:
		if shared && r.pol.physicalFirst {
			v, _ := r.view(nil, false)
			pj := sj
			pj.Per.Cores = 1 // a core per process
			if ms, err := r.static.Place(v, pj, now); err == nil {
				return ms, true
			}
		}
		v, _ := r.view(nil, shared)
		if shared && r.pol.unbounded {
			for i := range v.Machines {
				m := &v.Machines[i]
				m.Lent.Cores = m.Allocated.Cores + uint32(j.spec.Workers)*sj.Per.Cores
				m.Lent.MemBytes = m.Allocated.MemBytes + uint64(j.spec.Workers)*sj.Per.MemBytes
			}
		}
		if ms, err := r.static.Place(v, sj, now); err == nil {
			return ms, true
		}
	}
	if shared {
		// Everything is over-committed past what the view can express:
		// the least over-committed memory takes it.
		return r.leastMemory(j), true
	}
	return nil, false
}

// cheapest asks the marginal-cost scheduler over each subset (nil: all
// machines) for a quote and keeps the cheapest: the bidder shopping.
func (r *run) cheapest(subs [][]int, memScale float64, virtual bool, j scheduler.Job, now time.Time) []int {
	saved := r.memScale
	r.memScale = memScale
	defer func() { r.memScale = saved }()
	var best []int
	bestTotal := uint64(math.MaxUint64)
	for _, sub := range subs {
		v, p := r.view(sub, virtual)
		pl, err := r.quote(v, j, now, p)
		if err != nil || pl.Total >= bestTotal {
			continue
		}
		best, bestTotal = pl.Machines, pl.Total
		if sub != nil {
			best = make([]int, len(pl.Machines))
			for w, k := range pl.Machines {
				best[w] = sub[k]
			}
		}
	}
	return best
}

// quote is Quote's miserly admission in the Reserved model; the Shared
// model places every job, as the paper's policies do.
func (r *run) quote(v scheduler.View, j scheduler.Job, now time.Time, p scheduler.Params) (scheduler.Placement, error) {
	if r.pol.kind == indexed {
		x := scheduler.NewIndex(v, p)
		if r.s.Model == Shared {
			return x.Place(j, now)
		}
		return x.Quote(j, now)
	}
	if r.s.Model == Shared {
		return scheduler.Place(v, j, now, p)
	}
	return scheduler.Quote(v, j, now, p)
}

func (r *run) leastMemory(j *jobState) []int {
	out := make([]int, j.spec.Workers)
	extra := make([]uint64, len(r.ms))
	for w := range out {
		best, bestLoad := 0, math.Inf(1)
		for mi := range r.ms {
			l := float64(r.ms[mi].mem+extra[mi]+j.spec.Per.MemBytes) / float64(r.s.Machines[mi].MemBytes)
			if l < bestLoad {
				best, bestLoad = mi, l
			}
		}
		out[w] = best
		extra[best] += j.spec.Per.MemBytes
	}
	return out
}

// mosixPlace puts each worker where it would run fastest, among the
// machines where its memory fits; where it fits nowhere, the least
// over-committed memory.
func (r *run) mosixPlace(j *jobState) []int {
	out := make([]int, j.spec.Workers)
	extraProcs := make([]int, len(r.ms))
	extraMem := make([]uint64, len(r.ms))
	for w := range out {
		best, bestRate := -1, -1.0
		for mi := range r.ms {
			spec, st := &r.s.Machines[mi], &r.ms[mi]
			if st.mem+extraMem[mi]+j.spec.Per.MemBytes > spec.MemBytes {
				continue
			}
			if rate := spec.Speed * min(1, float64(spec.Cores)/float64(len(st.workers)+extraProcs[mi]+1)); rate > bestRate {
				best, bestRate = mi, rate
			}
		}
		if best < 0 {
			return r.leastMemory(j)
		}
		out[w] = best
		extraProcs[best]++
		extraMem[best] += j.spec.Per.MemBytes
	}
	return out
}

// rebalance migrates processes, one at a time, from where they run
// slowest to where they would run at least 1.25 times faster, memory
// permitting; at most one move per machine per event.
func (r *run) rebalance() {
	for range len(r.ms) {
		type cand struct {
			mi   int
			rate float64
		}
		var worst []cand
		for mi := range r.ms {
			if len(r.ms[mi].workers) > 0 {
				worst = append(worst, cand{mi, r.procRate(mi, 0)})
			}
		}
		slices.SortFunc(worst, func(a, b cand) int {
			switch {
			case a.rate < b.rate:
				return -1
			case a.rate > b.rate:
				return 1
			}
			return a.mi - b.mi
		})
		moved := false
		for _, src := range worst {
			// The process with the most work left moves (it gains most).
			var pick slot
			found := false
			for _, s := range r.ms[src.mi].workers {
				if s.j.paused[s.w] > r.now || s.j.spec.Workers > 1 {
					continue
				}
				if !found || s.j.left > pick.j.left {
					pick, found = s, true
				}
			}
			if !found {
				continue
			}
			mem := pick.j.spec.Per.MemBytes
			dst, dstRate := -1, src.rate*1.25
			for mi := range r.ms {
				spec, st := &r.s.Machines[mi], &r.ms[mi]
				if mi == src.mi || st.mem+mem > spec.MemBytes {
					continue
				}
				// Processes still landing there count: they will share it.
				if rate := spec.Speed * min(1, float64(spec.Cores)/float64(len(st.workers)+1)); rate > dstRate {
					dst, dstRate = mi, rate
				}
			}
			if dst < 0 {
				continue
			}
			r.migrate(pick, src.mi, dst)
			moved = true
			break
		}
		if !moved {
			return
		}
	}
}

func (r *run) migrate(s slot, from, to int) {
	j, w := s.j, s.w
	r.detach(j, w, from)
	pause := 0.0
	if r.s.MigrateMBps > 0 {
		pause = float64(j.spec.Per.MemBytes) / (r.s.MigrateMBps * 1e6)
	}
	j.machines[w] = to
	j.since[w] = r.now
	j.price[w] = workerPrice(r.unitPrices()[to], j.spec.Per)
	r.attach(j, w, to)
	if pause > 0 {
		j.paused[w] = r.now + pause
		r.ms[to].procs-- // it takes no CPU until it lands
	}
	r.res.Migrations++
}

// subsets gives each of k schedulers the machines it sees: about share
// of them, overlapping, every machine seen by at least one.
func subsets(s *Scenario, k int, share float64, seed uint64) [][]int {
	n := len(s.Machines)
	size := max(1, min(n, int(math.Ceil(share*float64(n)))))
	out := make([][]int, k)
	if s.Model == Reserved && len(s.Sites) > 1 {
		// Scheduler i lives at site i*len(sites)/k and sees the machines
		// of the sites nearest it by latency.
		p := s.paths()
		for i := range k {
			home := i * len(s.Sites) / k
			order := make([]int, len(s.Sites))
			for x := range order {
				order[x] = x
			}
			slices.SortStableFunc(order, func(a, b int) int {
				switch la, lb := p.latMs[home][a], p.latMs[home][b]; {
				case la < lb:
					return -1
				case la > lb:
					return 1
				}
				return 0
			})
			for _, site := range order {
				for mi, m := range s.Machines {
					if m.Site == site {
						out[i] = append(out[i], mi)
					}
				}
				if len(out[i]) >= size {
					break
				}
			}
		}
		// A site no scheduler reached goes to the one nearest it: every
		// machine's offers reach some scheduler.
		seen := make([]bool, n)
		for _, sub := range out {
			for _, mi := range sub {
				seen[mi] = true
			}
		}
		for mi, m := range s.Machines {
			if seen[mi] {
				continue
			}
			near := 0
			for i := range k {
				if p.latMs[i*len(s.Sites)/k][m.Site] < p.latMs[near*len(s.Sites)/k][m.Site] {
					near = i
				}
			}
			out[near] = append(out[near], mi)
		}
		for i := range out {
			slices.Sort(out[i])
		}
		return out
	}
	rng := rand.New(rand.NewPCG(seed, 0xd1ce))
	for i := range k {
		seen := map[int]bool{}
		for mi := i; mi < n; mi += k {
			seen[mi] = true // coverage: machine mi is in subset mi mod k
		}
		for _, mi := range rng.Perm(n) {
			if len(seen) >= size {
				break
			}
			seen[mi] = true
		}
		for mi := range seen {
			out[i] = append(out[i], mi)
		}
		slices.Sort(out[i])
	}
	return out
}
