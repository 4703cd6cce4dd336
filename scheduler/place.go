package scheduler

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/deepmarket/deepmarket/units"
)

// Placement is where a job's workers go and what that costs.
type Placement struct {
	// Machines holds, per worker, an index into the view's machines.
	Machines []int
	// Worker holds, per worker, its hourly price in micro-credits (its
	// marginal cost when added, with its share of the network term):
	// what that worker's machine is paid.
	Worker []uint64
	// PerHour is the job's hourly price, and Total its price over the
	// expected duration on the placed machines (they go at the pace of
	// the slowest), both in micro-credits.
	PerHour uint64
	Total   uint64
	// Done is the expected completion time.
	Done time.Time
	// ByResource splits PerHour into cores, memory, GPUs and network.
	ByResource [4]uint64
}

var resourceNames = [4]string{"cores", "memory", "gpus", "network"}

// Place puts the job's workers, one at a time, on the machine where the
// marginal cost of adding it (its resources at that machine's load, the
// machine's risk, its network distance to the workers already placed,
// times the hours it will run there) is least, updating the load after
// each: all workers or none. Machines whose window does not cover the run
// are not used; of machines that cost the same, the lowest index wins. It
// does not judge whether the job is worth its price: see Quote.
//
// Place looks at every machine in the view for every worker: it is the
// reference that Index, built once for many placements, matches exactly.
func Place(v View, j Job, now time.Time, p Params) (Placement, error) {
	if err := j.Validate(); err != nil {
		return Placement{}, &Rejection{Resource: "job", Reason: err.Error()}
	}
	md := newModel(p, len(v.Machines))
	n := len(v.Machines)
	// Per machine: the hourly cost of one more worker, its network term
	// to the workers placed so far, and the hours the job runs there.
	buf := make([]float64, 4*n)
	cost, net, hrs, lb := buf[:n], buf[n:2*n], buf[2*n:3*n], buf[3*n:]
	usable := 0
	// lb holds a cheap lower bound of each machine's cost (+Inf where the
	// job cannot go); cost is filled in lazily, only for
	// machines whose bound could beat the best found so far.
	for i := range v.Machines {
		m := &v.Machines[i]
		hrs[i] = hours(j.Duration)/m.speed() + hours(m.Setup)
		cost[i] = math.NaN()
		if !m.fits(j.Per) || !m.available(now, now.Add(time.Duration(hrs[i]*float64(time.Hour)))) {
			lb[i], cost[i] = math.Inf(1), math.Inf(1)
			continue
		}
		lb[i] = md.workerLowerBound(m, j.Per)
		usable++
	}
	if usable == 0 {
		return Placement{}, explain(v, j, now, 0)
	}
	exact := func(i int) float64 {
		if math.IsNaN(cost[i]) {
			cost[i], _ = md.workerCost(&v.Machines[i], j.Per)
		}
		return cost[i]
	}

	// The network term of machine i: with measured RTTs, kept up to date
	// in net; otherwise from counts of the workers placed per site and
	// per machine, so each scan stays a few operations per machine.
	var sites []int32
	var perSite []int
	perMachine := make([]int32, n)
	if v.RTT == nil {
		sites = make([]int32, n)
		perSite = make([]int, 1, 16)
		var names []string // a lab market has a handful of sites: a list beats a map
		var ids map[string]int32
		for i := range v.Machines {
			s := v.Machines[i].Site
			id := int32(-1)
			if s != "" {
				if ids != nil {
					if x, ok := ids[s]; ok {
						id = x
					}
				} else {
					for k, name := range names {
						if name == s {
							id = int32(k + 1)
							break
						}
					}
				}
			}
			if id < 0 { // a new site; a machine with none is a site of its own
				id = int32(len(perSite))
				perSite = append(perSite, 0)
				if s != "" {
					names = append(names, s)
					if ids != nil {
						ids[s] = id
					} else if len(names) > 32 {
						ids = make(map[string]int32, 64)
						for k, name := range names {
							ids[name] = int32(k + 1)
						}
					}
				} else {
					names = append(names, "\x00")
				}
			}
			sites[i] = id
		}
	}
	sameSite, crossSite := float64(md.p.SameSite), float64(md.p.CrossSite)
	netOf := func(i, placed int) float64 {
		if sites == nil || placed == 0 {
			return net[i]
		}
		onSite := perSite[sites[i]]
		return sameSite*float64(onSite-int(perMachine[i])) + crossSite*float64(placed-onSite)
	}

	// Machines the job is placed on get a private copy to load.
	touched := map[int]*Machine{}
	t := newTally(j.Workers)
	for w := 0; w < j.Workers; w++ {
		// Seed with the best lower bound's machine, then evaluate exactly
		// only the machines whose bound is below the best so far.
		seed, seedBound := -1, math.Inf(1)
		for i, b := range lb {
			if b = (b + netOf(i, w)) * hrs[i]; b < seedBound {
				seed, seedBound = i, b
			}
		}
		best, bestCost := -1, math.Inf(1)
		if seed >= 0 {
			best, bestCost = seed, (exact(seed)+netOf(seed, w))*hrs[seed]
			for i, b := range lb {
				net := netOf(i, w)
				// A bound equal to the best still gets its exact cost:
				// ties go to the lowest index.
				if (b+net)*hrs[i] > bestCost || i == seed {
					continue
				}
				if c := (exact(i) + net) * hrs[i]; c < bestCost || (c == bestCost && i < best) {
					best, bestCost = i, c
				}
			}
			if math.IsInf(bestCost, 1) {
				best = -1
			}
		}
		if best < 0 {
			return Placement{}, explain(v, j, now, w)
		}
		m, ok := touched[best]
		if !ok {
			c := v.Machines[best]
			m = &c
			touched[best] = m
		}
		t.add(md, best, m, j.Per, cost[best], netOf(best, w))
		m.add(j.Per)
		if m.fits(j.Per) {
			cost[best], _ = md.workerCost(m, j.Per)
			lb[best] = md.workerLowerBound(m, j.Per)
		} else {
			cost[best], lb[best] = math.Inf(1), math.Inf(1)
		}
		if sites != nil {
			perSite[sites[best]]++
			perMachine[best]++
		} else {
			for i := range net {
				net[i] += md.pairCost(&v, i, best)
			}
		}
	}
	return t.finish(j, now), nil
}

// tally builds a Placement as workers are added, with the same arithmetic
// for the exhaustive search and the index, so the two give equal results.
type tally struct {
	pl      Placement
	sums    [4]float64
	slowest float64
	setup   time.Duration // the longest of the machines'
}

func newTally(workers int) tally {
	return tally{pl: Placement{Machines: make([]int, 0, workers), Worker: make([]uint64, 0, workers)}, slowest: math.Inf(1)}
}

// add records a worker on machine i, whose state before the worker is m:
// cost is md.workerCost(m, d)'s total, net the worker's network term.
func (t *tally) add(md model, i int, m *Machine, d Resources, cost, net float64) {
	t.pl.Machines = append(t.pl.Machines, i)
	t.pl.Worker = append(t.pl.Worker, uint64(math.Ceil(cost+net)))
	_, byRes := md.workerCost(m, d)
	for r := range 3 {
		t.sums[r] += byRes[r]
	}
	t.sums[3] += net
	t.slowest = min(t.slowest, m.speed())
	t.setup = max(t.setup, m.Setup)
}

func (t *tally) finish(j Job, now time.Time) Placement {
	pl := t.pl
	for r, s := range t.sums {
		pl.ByResource[r] = uint64(math.Ceil(s))
	}
	for _, c := range pl.Worker {
		pl.PerHour += c
	}
	run := time.Duration(float64(j.Duration) / t.slowest)
	pl.Done = now.Add(t.setup + run)
	pl.Total = uint64(math.Ceil(float64(pl.PerHour) * run.Hours()))
	return pl
}

// Quote places the job (see Place) and admits it only if its benefit at
// the expected completion covers the price: the paper's miserly admission.
// A job that does not fit, or costs more than it is worth, gets a
// *Rejection saying which resource is missing or too expensive.
func Quote(v View, j Job, now time.Time, p Params) (Placement, error) {
	pl, err := Place(v, j, now, p)
	if err != nil {
		return Placement{}, err
	}
	return admit(pl, j, now)
}

// admit is Quote's miserly admission of a placement.
func admit(pl Placement, j Job, now time.Time) (Placement, error) {
	worth := j.Benefit.At(now, pl.Done)
	if worth >= pl.Total {
		return pl, nil
	}
	dear := 0
	for r, c := range pl.ByResource {
		if c > pl.ByResource[dear] {
			dear = r
		}
	}
	why := fmt.Sprintf("the job costs %s credits at current prices, more than its benefit %s",
		units.FormatCredits(pl.Total), units.FormatCredits(worth))
	switch {
	case worth == 0 && j.Benefit.Kind == ByDeadline:
		why = fmt.Sprintf("the job would complete at %s, after its deadline %s",
			pl.Done.UTC().Format(time.RFC3339), j.Benefit.Deadline.UTC().Format(time.RFC3339))
	case pl.ByResource[dear] > 0:
		why += fmt.Sprintf(" (%s is the dearest part: %s of %s credits an hour)",
			resourceNames[dear], units.FormatCredits(pl.ByResource[dear]), units.FormatCredits(pl.PerHour))
	}
	return Placement{}, &Rejection{Resource: "price", Reason: why, Price: pl.Total}
}

// explain says why only placed of j's workers fit: which resource runs
// out first, or the windows.
func explain(v View, j Job, now time.Time, placed int) *Rejection {
	if len(v.Machines) == 0 {
		return &Rejection{Resource: "job", Reason: "no machines are on offer in this scheduler's view"}
	}
	// How many workers each resource alone would allow, over machines
	// whose window covers the run.
	var allow [3]int
	inWindow := 0
	var most Resources
	for i := range v.Machines {
		m := &v.Machines[i]
		run := time.Duration(float64(j.Duration) / m.speed())
		if !m.available(now, now.Add(run)) {
			continue
		}
		inWindow++
		f := m.Free()
		allow[0] += fitCount(uint64(f.Cores), uint64(j.Per.Cores))
		allow[1] += fitCount(f.MemBytes, j.Per.MemBytes)
		allow[2] += fitCount(uint64(f.GPUs), uint64(j.Per.GPUs))
		most.Cores, most.MemBytes, most.GPUs = max(most.Cores, f.Cores), max(most.MemBytes, f.MemBytes), max(most.GPUs, f.GPUs)
	}
	if inWindow == 0 {
		return &Rejection{Resource: "window", Reason: fmt.Sprintf(
			"none of the %d machines in view is available for the whole run (%s) from now: their lending windows close sooner",
			len(v.Machines), j.Duration)}
	}
	want := [3]uint64{uint64(j.Per.Cores), j.Per.MemBytes, uint64(j.Per.GPUs)}
	have := [3]uint64{uint64(most.Cores), most.MemBytes, uint64(most.GPUs)}
	order := []int{2, 0, 1} // GPUs first: the scarcest
	slices.SortStableFunc(order, func(a, b int) int { return allow[a] - allow[b] })
	for _, r := range order {
		if want[r] == 0 || allow[r] >= j.Workers {
			continue
		}
		if have[r] < want[r] {
			return &Rejection{Resource: resourceNames[r], Reason: fmt.Sprintf(
				"no machine in view has %s free for one worker (the most free on one machine is %s)",
				amount(r, want[r]), amount(r, have[r]))}
		}
		return &Rejection{Resource: resourceNames[r], Reason: fmt.Sprintf(
			"%s: free %s on the machines in view holds %d of the %d workers",
			resourceNames[r], resourceNames[r], allow[r], j.Workers)}
	}
	return &Rejection{Resource: "cores", Reason: fmt.Sprintf(
		"only %d of the %d workers fit: no machine has room for a whole worker (%d cores, %s memory, %d GPUs) beside them",
		placed, j.Workers, j.Per.Cores, amount(1, j.Per.MemBytes), j.Per.GPUs)}
}

func fitCount(free, per uint64) int {
	if per == 0 {
		return math.MaxInt32
	}
	return int(min(free/per, math.MaxInt32))
}

func amount(r int, n uint64) string {
	switch r {
	case 1:
		return fmt.Sprintf("%.1f GiB", float64(n)/gib)
	case 2:
		return fmt.Sprintf("%d GPUs", n)
	default:
		return fmt.Sprintf("%d cores", n)
	}
}
