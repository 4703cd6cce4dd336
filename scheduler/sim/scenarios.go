package sim

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/deepmarket/deepmarket/scheduler"
)

const mib = 1 << 20

// WorkstationParams are the choices behind Workstations. The paper (Amir
// et al., TPDS 2000) gives the model: machines share CPU equally among
// their processes, over-committed memory divides every share by 10, a job
// is a fixed amount of work, the metric is slowdown against the job alone
// on the best machine, many random scenarios. It does not give the
// distributions, so these are ours: a 1990s-style cluster of heterogeneous
// single-CPU workstations and sequential jobs whose memory sometimes
// over-commits a machine, at the offered load asked for.
type WorkstationParams struct {
	Machines int       // 16
	Speeds   []float64 // drawn uniformly: 1, 1.25, 1.5, 2
	MemMiB   []uint64  // drawn uniformly: 128, 256, 512
	Jobs     int       // 1000 per scenario
	// MeanWork is the mean of the exponential work per job, seconds on a
	// speed-1 machine (300).
	MeanWork float64
	// MeanMemMiB is the mean of the exponential memory per job (8 MiB,
	// capped at the largest machine's memory): most jobs are small, a
	// few are large enough to over-commit a machine placed blindly.
	MeanMemMiB float64
	// Thrash divides CPU shares on over-committed machines (10: the
	// paper's).
	Thrash float64
	// MigrateMBps is the migrating balancer's transfer rate (12.5 MB/s:
	// 100 Mbit/s Ethernet of the time).
	MigrateMBps float64
}

// DefaultWorkstations are the parameters `make sim` uses.
var DefaultWorkstations = WorkstationParams{
	Machines: 16, Speeds: []float64{1, 1.25, 1.5, 2}, MemMiB: []uint64{128, 256, 512},
	Jobs: 1000, MeanWork: 300, MeanMemMiB: 8, Thrash: 10, MigrateMBps: 12.5,
}

// Workstations draws scenario (a), the authors' workstation-cluster model,
// at offered load (work arriving per second over the cluster's CPU
// capacity; Poisson arrivals).
func Workstations(p WorkstationParams, load float64, seed uint64) *Scenario {
	rng := rand.New(rand.NewPCG(seed, 0xa))
	s := &Scenario{Name: fmt.Sprintf("workstations/load=%.2f/seed=%d", load, seed), Model: Shared,
		Sites: []string{"lab"}, LANMbps: 100, LANLatencyMs: 0.2, Thrash: p.Thrash, MigrateMBps: p.MigrateMBps, Load: load}
	capacity := 0.0
	var maxMem uint64
	for i := range p.Machines {
		m := Machine{ID: fmt.Sprintf("ws%02d", i), Cores: 1,
			Speed:    p.Speeds[rng.IntN(len(p.Speeds))],
			MemBytes: p.MemMiB[rng.IntN(len(p.MemMiB))] * mib}
		capacity += m.Speed
		maxMem = max(maxMem, m.MemBytes)
		s.Machines = append(s.Machines, m)
	}
	rate := load * capacity / p.MeanWork // jobs per second
	t := 0.0
	for i := range p.Jobs {
		t += rng.ExpFloat64() / rate
		mem := min(uint64(rng.ExpFloat64()*p.MeanMemMiB*mib), maxMem)
		s.Jobs = append(s.Jobs, Job{ID: fmt.Sprintf("j%04d", i), Arrival: t, Workers: 1,
			Per:  scheduler.Resources{Cores: 1, MemBytes: max(mem, mib)},
			Work: max(rng.ExpFloat64()*p.MeanWork, 1)})
	}
	return s
}

// EdgeParams are the choices behind Edge, the thesis' ENTS setting:
// sites joined by a random topology of average degree 3 with 1-10 Mbit/s
// links, Poisson arrivals at 0.5 jobs/s. The rest is ours: lab machines
// at each site, distributed-training jobs of 1-4 workers that exchange
// their gradients every step.
type EdgeParams struct {
	Sites           int     // 8
	MachinesPerSite int     // 4
	Cores           []int   // drawn uniformly: 4, 8, 16; memory 4 GiB a core
	SpeedMin        float64 // 0.5
	SpeedMax        float64 // 2
	LinkMbpsMin     float64 // 1
	LinkMbpsMax     float64 // 10
	LatencyMsMin    float64 // 5 per link
	LatencyMsMax    float64 // 40
	ArrivalsPerSec  float64 // 0.5
	Jobs            int     // 600
	// Workers per job, drawn uniformly: 1, 2, 2, 4; cores per worker: 1,
	// 2, 4; memory per worker 1-4 GiB a core, uniformly.
	Workers, WorkerCores []int
	// StepWork is the computation per step (0.5 s); ModelMiB the
	// gradient bytes each worker exchanges per step, uniform 0.05-2 MiB
	// (Fashion-MNIST's MLP is 0.4 MiB).
	StepWork                 float64
	ModelMiBMin, ModelMiBMax float64
	// BenefitFactor sets each job's benefit (the most it pays) to this
	// many times its price on idle machines of one site at the mean
	// speed (10): dear enough placements, such as workers spread over
	// slow links, are refused by marginal-cost admission and wait.
	BenefitFactor float64
}

// DefaultEdge are the parameters `make sim` uses.
var DefaultEdge = EdgeParams{
	Sites: 8, MachinesPerSite: 4, Cores: []int{4, 8, 16}, SpeedMin: 0.5, SpeedMax: 2,
	LinkMbpsMin: 1, LinkMbpsMax: 10, LatencyMsMin: 5, LatencyMsMax: 40,
	ArrivalsPerSec: 0.5, Jobs: 600, Workers: []int{1, 2, 2, 4}, WorkerCores: []int{1, 2, 4},
	StepWork: 0.5, ModelMiBMin: 0.05, ModelMiBMax: 2, BenefitFactor: 10,
}

// Edge draws scenario (b) at offered load: the mean work per job is set so
// that work arrives at load x the CPU capacity.
func Edge(p EdgeParams, load float64, seed uint64) *Scenario {
	rng := rand.New(rand.NewPCG(seed, 0xb))
	s := &Scenario{Name: fmt.Sprintf("edge/load=%.2f/seed=%d", load, seed), Model: Reserved,
		LANMbps: 1000, LANLatencyMs: 0.2, Thrash: 10, Load: load}
	for i := range p.Sites {
		s.Sites = append(s.Sites, fmt.Sprintf("site%d", i))
	}
	// A random spanning tree, then random extra links up to average
	// degree 3 (1.5 links per site).
	link := func(a, b int) {
		s.Links = append(s.Links, Link{A: a, B: b,
			Mbps:      p.LinkMbpsMin + rng.Float64()*(p.LinkMbpsMax-p.LinkMbpsMin),
			LatencyMs: p.LatencyMsMin + rng.Float64()*(p.LatencyMsMax-p.LatencyMsMin)})
	}
	has := map[[2]int]bool{}
	for i := 1; i < p.Sites; i++ {
		j := rng.IntN(i)
		link(j, i)
		has[[2]int{j, i}] = true
	}
	want := int(math.Round(1.5 * float64(p.Sites)))
	for tries := 0; len(s.Links) < want && tries < 1000; tries++ {
		a, b := rng.IntN(p.Sites), rng.IntN(p.Sites)
		if a > b {
			a, b = b, a
		}
		if a == b || has[[2]int{a, b}] {
			continue
		}
		has[[2]int{a, b}] = true
		link(a, b)
	}
	capacity := 0.0
	for site := range p.Sites {
		for k := range p.MachinesPerSite {
			c := p.Cores[rng.IntN(len(p.Cores))]
			m := Machine{ID: fmt.Sprintf("s%d-m%d", site, k), Site: site, Cores: c, MemBytes: uint64(c) * 4 << 30,
				Speed: p.SpeedMin + rng.Float64()*(p.SpeedMax-p.SpeedMin)}
			capacity += float64(c) * m.Speed
			s.Machines = append(s.Machines, m)
		}
	}
	meanSpeed := (p.SpeedMin + p.SpeedMax) / 2
	// Mean core-work of a job is E[workers x cores] x mean work.
	meanCoreWorkers := 0.0
	for _, w := range p.Workers {
		for _, c := range p.WorkerCores {
			meanCoreWorkers += float64(w * c)
		}
	}
	meanCoreWorkers /= float64(len(p.Workers) * len(p.WorkerCores))
	meanWork := load * capacity / (p.ArrivalsPerSec * meanCoreWorkers)
	t := 0.0
	for i := range p.Jobs {
		t += rng.ExpFloat64() / p.ArrivalsPerSec
		c := p.WorkerCores[rng.IntN(len(p.WorkerCores))]
		w := p.Workers[rng.IntN(len(p.Workers))]
		model := (p.ModelMiBMin + rng.Float64()*(p.ModelMiBMax-p.ModelMiBMin)) * mib
		j := Job{ID: fmt.Sprintf("j%04d", i), Arrival: t, Workers: w,
			Per:  scheduler.Resources{Cores: uint32(c), MemBytes: uint64(c) * uint64(1+rng.IntN(4)) << 30},
			Work: max(rng.ExpFloat64()*meanWork, p.StepWork), StepWork: p.StepWork, CommBytes: model}
		if p.BenefitFactor > 0 {
			base := scheduler.DefaultBase
			hourly := float64(w)*(float64(c)*float64(base.CoreHour)+float64(j.Per.MemBytes)/(1<<30)*float64(base.MemGiBHour)) +
				float64(w*(w-1)/2)*0.4*1e6 // LAN pairs at 0.4 ms RTT, 1 credit per ms-hour
			j.Benefit = uint64(p.BenefitFactor * hourly * j.Work / 3600 / meanSpeed)
		}
		s.Jobs = append(s.Jobs, j)
	}
	return s
}
