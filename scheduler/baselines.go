package scheduler

import (
	"math"
	"math/rand/v2"
	"time"
)

// Policy places a job's workers: a machine index per worker, or a
// *Rejection. Every policy places all workers or none, never beyond a
// machine's free capacity, and only on machines whose window covers the
// run.
type Policy interface {
	Name() string
	Place(v View, j Job, now time.Time) ([]int, error)
}

// MarginalCost is the paper's policy (see Place).
type MarginalCost struct{ Params Params }

// Name implements Policy.
func (MarginalCost) Name() string { return "marginal-cost" }

// Place implements Policy.
func (p MarginalCost) Place(v View, j Job, now time.Time) ([]int, error) {
	pl, err := Place(v, j, now, p.Params)
	return pl.Machines, err
}

// RoundRobin hands workers to machines in turn, skipping those without
// room. It keeps its place between jobs.
type RoundRobin struct{ next int }

// Name implements Policy.
func (*RoundRobin) Name() string { return "round-robin" }

// Place implements Policy.
func (p *RoundRobin) Place(v View, j Job, now time.Time) ([]int, error) {
	return greedy(v, j, now, func(ms []Machine, ok []bool) int {
		for k := range ms {
			i := (p.next + k) % len(ms)
			if ok[i] {
				p.next = i + 1
				return i
			}
		}
		return -1
	})
}

// Random puts each worker on a machine with room, chosen uniformly.
type Random struct{ Rand *rand.Rand }

// Name implements Policy.
func (Random) Name() string { return "random" }

// Place implements Policy.
func (p Random) Place(v View, j Job, now time.Time) ([]int, error) {
	return greedy(v, j, now, func(ms []Machine, ok []bool) int {
		pick, seen := -1, 0
		for i := range ms {
			if ok[i] {
				seen++
				if p.Rand.IntN(seen) == 0 { // reservoir sampling
					pick = i
				}
			}
		}
		return pick
	})
}

// FirstFit puts each worker on the first machine with room.
type FirstFit struct{}

// Name implements Policy.
func (FirstFit) Name() string { return "first-fit" }

// Place implements Policy.
func (FirstFit) Place(v View, j Job, now time.Time) ([]int, error) {
	return greedy(v, j, now, func(ms []Machine, ok []bool) int {
		for i := range ms {
			if ok[i] {
				return i
			}
		}
		return -1
	})
}

// LeastRequested is Kubernetes' NodeResourcesLeastAllocated scoring: the
// machine with the largest share of its capacity still free after the
// worker, averaged over the resources the job asks for.
type LeastRequested struct{}

// Name implements Policy.
func (LeastRequested) Name() string { return "least-requested" }

// Place implements Policy.
func (LeastRequested) Place(v View, j Job, now time.Time) ([]int, error) {
	return greedy(v, j, now, best(j, leastRequested))
}

// BalancedResource is Kubernetes' NodeResourcesBalancedAllocation
// scoring: the machine whose resources are most evenly used after the
// worker (one minus the standard deviation of the used fractions).
type BalancedResource struct{}

// Name implements Policy.
func (BalancedResource) Name() string { return "balanced-resource" }

// Place implements Policy.
func (BalancedResource) Place(v View, j Job, now time.Time) ([]int, error) {
	return greedy(v, j, now, best(j, balanced))
}

// KubeDefault adds the two scores, as Kubernetes' default profile does.
type KubeDefault struct{}

// Name implements Policy.
func (KubeDefault) Name() string { return "kube-default" }

// Place implements Policy.
func (KubeDefault) Place(v View, j Job, now time.Time) ([]int, error) {
	return greedy(v, j, now, best(j, func(m *Machine, d Resources) float64 {
		return leastRequested(m, d) + balanced(m, d)
	}))
}

// fractions are the used shares of the resources d asks for, after adding
// d to m.
func fractions(m *Machine, d Resources) []float64 {
	var f []float64
	if d.Cores > 0 || d.GPUs == 0 {
		f = append(f, float64(m.Allocated.Cores+d.Cores)/math.Max(float64(m.Lent.Cores), 1))
	}
	if d.MemBytes > 0 || d.GPUs == 0 {
		f = append(f, float64(m.Allocated.MemBytes+d.MemBytes)/math.Max(float64(m.Lent.MemBytes), 1))
	}
	if d.GPUs > 0 {
		f = append(f, float64(m.Allocated.GPUs+d.GPUs)/math.Max(float64(m.Lent.GPUs), 1))
	}
	return f
}

func leastRequested(m *Machine, d Resources) float64 {
	f := fractions(m, d)
	s := 0.0
	for _, x := range f {
		s += 1 - x
	}
	return s / float64(len(f))
}

func balanced(m *Machine, d Resources) float64 {
	f := fractions(m, d)
	mean := 0.0
	for _, x := range f {
		mean += x
	}
	mean /= float64(len(f))
	v := 0.0
	for _, x := range f {
		v += (x - mean) * (x - mean)
	}
	return 1 - math.Sqrt(v/float64(len(f)))
}

// best picks the machine with room and the highest score (the lowest
// index on ties).
func best(j Job, score func(m *Machine, d Resources) float64) func(ms []Machine, ok []bool) int {
	return func(ms []Machine, ok []bool) int {
		pick, top := -1, math.Inf(-1)
		for i := range ms {
			if ok[i] {
				if s := score(&ms[i], j.Per); s > top {
					pick, top = i, s
				}
			}
		}
		return pick
	}
}

// greedy places workers one by one with pick, on a copy of the machines
// whose allocations it updates; all or nothing.
func greedy(v View, j Job, now time.Time, pick func(ms []Machine, ok []bool) int) ([]int, error) {
	if err := j.Validate(); err != nil {
		return nil, &Rejection{Resource: "job", Reason: err.Error()}
	}
	ms := append([]Machine(nil), v.Machines...)
	ok := make([]bool, len(ms))
	any := false
	for i := range ms {
		run := time.Duration(float64(j.Duration) / ms[i].speed())
		ok[i] = ms[i].fits(j.Per) && ms[i].available(now, now.Add(run))
		any = any || ok[i]
	}
	if !any {
		return nil, explain(v, j, now, 0)
	}
	out := make([]int, 0, j.Workers)
	for w := 0; w < j.Workers; w++ {
		i := pick(ms, ok)
		if i < 0 {
			return nil, explain(v, j, now, w)
		}
		out = append(out, i)
		ms[i].add(j.Per)
		ok[i] = ok[i] && ms[i].fits(j.Per)
	}
	return out, nil
}
