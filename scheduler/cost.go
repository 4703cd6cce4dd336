package scheduler

import (
	"math"
	"time"
)

// DefaultBase is the price of a unit-hour on an idle machine, in
// micro-credits: 0.1 credit a core-hour, 0.02 a GiB-hour, 1 a GPU-hour.
var DefaultBase = Prices{CoreHour: 100_000, MemGiBHour: 20_000, GPUHour: 1_000_000}

// Params tune the cost model. The zero value gives the documented
// defaults.
type Params struct {
	// Base is each resource's price per unit-hour at load 0; zero fields
	// take DefaultBase's.
	Base Prices
	// The network term, per hour for each pair of a job's workers on
	// different machines: SameSite between machines of one site (default
	// 0.1 credit), CrossSite between sites (default 10 credits); with a
	// measured RTT, PerRTTMs per millisecond of it (default 1 credit)
	// instead. Workers across slow links train many times slower, which
	// costs the job its whole placement for longer: the edge scenario of
	// package sim measured terms a tenth of these leaving a fifth of
	// multi-worker jobs spread over sites at light load, with slowdowns
	// ten times those of site-local placements.
	SameSite, CrossSite, PerRTTMs uint64
	// N is the base of the exponential; 0 means the number of machines in
	// the view (at least 2), as in the paper.
	N int
	// FailurePrior is the failure rate assumed for an opportunistic
	// machine with no record, as failures per jobs; default 1/10. A record
	// updates it (Laplace-style: (failed + 1) / (jobs + 10)).
	FailurePrior float64
}

func (p Params) withDefaults(machines int) Params {
	if p.Base.CoreHour == 0 {
		p.Base.CoreHour = DefaultBase.CoreHour
	}
	if p.Base.MemGiBHour == 0 {
		p.Base.MemGiBHour = DefaultBase.MemGiBHour
	}
	if p.Base.GPUHour == 0 {
		p.Base.GPUHour = DefaultBase.GPUHour
	}
	if p.SameSite == 0 {
		p.SameSite = 100_000
	}
	if p.CrossSite == 0 {
		p.CrossSite = 10_000_000
	}
	if p.PerRTTMs == 0 {
		p.PerRTTMs = 1_000_000
	}
	if p.N == 0 {
		p.N = machines
	}
	p.N = max(p.N, 2)
	if p.FailurePrior <= 0 || p.FailurePrior >= 1 {
		p.FailurePrior = 0.1
	}
	return p
}

// model evaluates the cost functions for one view.
type model struct {
	p   Params
	lnN float64
}

func newModel(p Params, machines int) model {
	p = p.withDefaults(machines)
	return model{p: p, lnN: math.Log(float64(p.N))}
}

// resourceCost is the hourly cost of adding d units to a resource with
// capacity lent and load alloc: the integral of base * n^(load) over the
// units added, base * lent * (n^((alloc+d)/lent) - n^(alloc/lent)) / ln n,
// but at least the lender's reserve price for them. +Inf if it does not
// fit.
func (md model) resourceCost(lent, alloc, d, base, reserve float64) float64 {
	if d == 0 {
		return 0
	}
	if lent <= 0 || alloc+d > lent {
		return math.Inf(1)
	}
	c := base * lent * (math.Exp(md.lnN*(alloc+d)/lent) - math.Exp(md.lnN*alloc/lent)) / md.lnN
	return max(c, reserve*d)
}

// unitPrice is the price of the next unit of a resource at load l.
func (md model) unitPrice(l, base, reserve float64) float64 {
	return max(base*math.Exp(md.lnN*min(l, 1)), reserve)
}

// risk is the price multiplier for a machine that may leave: 1/(1-p) for
// its estimated failure rate p, at most 10. Dedicated machines: 1.
func (md model) risk(m *Machine) float64 {
	if m.Dedicated {
		return 1
	}
	prior := md.p.FailurePrior
	const weight = 10 // the prior counts as this many jobs
	p := (float64(m.Failed) + prior*weight) / (float64(m.Completed+m.Failed) + weight)
	return min(1/(1-min(p, 0.9)), 10)
}

// workerCost is the hourly cost of adding one worker of d to m, by
// resource (cores, memory, GPUs), risk included.
func (md model) workerCost(m *Machine, d Resources) (total float64, byRes [3]float64) {
	r := md.risk(m)
	byRes[0] = r * md.resourceCost(float64(m.Lent.Cores), float64(m.Allocated.Cores), float64(d.Cores),
		float64(md.p.Base.CoreHour), float64(m.Reserve.CoreHour))
	byRes[1] = r * md.resourceCost(float64(m.Lent.MemBytes)/gib, float64(m.Allocated.MemBytes)/gib, float64(d.MemBytes)/gib,
		float64(md.p.Base.MemGiBHour), float64(m.Reserve.MemGiBHour))
	byRes[2] = r * md.resourceCost(float64(m.Lent.GPUs), float64(m.Allocated.GPUs), float64(d.GPUs),
		float64(md.p.Base.GPUHour), float64(m.Reserve.GPUHour))
	return byRes[0] + byRes[1] + byRes[2], byRes
}

// workerLowerBound is a cheap lower bound of workerCost's total: with
// y = (d/lent) ln n, n^(y/ln n)-1 >= y and n^(alloc/lent) >= 1 +
// (alloc/lent) ln n, so each resource costs at least
// base * d * (1 + (alloc/lent) ln n), and at least its reserve floor.
// Place evaluates the exponentials only where this bound could win.
func (md model) workerLowerBound(m *Machine, d Resources) float64 {
	lb := func(lent, alloc, d, base, reserve float64) float64 {
		if d == 0 {
			return 0
		}
		return max(base*d*(1+md.lnN*alloc/lent), reserve*d)
	}
	return md.risk(m) * (lb(float64(m.Lent.Cores), float64(m.Allocated.Cores), float64(d.Cores),
		float64(md.p.Base.CoreHour), float64(m.Reserve.CoreHour)) +
		lb(float64(m.Lent.MemBytes)/gib, float64(m.Allocated.MemBytes)/gib, float64(d.MemBytes)/gib,
			float64(md.p.Base.MemGiBHour), float64(m.Reserve.MemGiBHour)) +
		lb(float64(m.Lent.GPUs), float64(m.Allocated.GPUs), float64(d.GPUs),
			float64(md.p.Base.GPUHour), float64(m.Reserve.GPUHour)))
}

// pairCost is the hourly network cost of two workers on machines i and j.
func (md model) pairCost(v *View, i, j int) float64 {
	if i == j {
		return 0
	}
	if v.RTT != nil {
		if rtt, ok := v.RTT(i, j); ok {
			return float64(md.p.PerRTTMs) * float64(rtt) / float64(time.Millisecond)
		}
	}
	if v.Machines[i].Site != "" && v.Machines[i].Site == v.Machines[j].Site {
		return float64(md.p.SameSite)
	}
	return float64(md.p.CrossSite)
}

func hours(d time.Duration) float64 { return d.Hours() }
