package market

import (
	"slices"
	"time"

	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/scheduler"
)

// The wire's types (p2p) and the scheduler's meet here, and only here: the
// scheduler stays free of the wire, the wire of the scheduler.

// SchedulerResources is an amount of resources as the scheduler counts it.
func SchedulerResources(r p2p.Resources) scheduler.Resources {
	return scheduler.Resources{Cores: r.Cores, MemBytes: r.MemBytes, GPUs: r.GPUs}
}

// SchedulerPrices is a machine's reserve prices as the scheduler reads them.
func SchedulerPrices(p p2p.Prices) scheduler.Prices {
	return scheduler.Prices{CoreHour: p.CoreHour, MemGiBHour: p.MemGiBHour, GPUHour: p.GPUHour}
}

// SchedulerMachine is an offer as the scheduler sees the machine (without
// its record of past jobs, which the view adds).
func SchedulerMachine(o p2p.Offer) scheduler.Machine {
	m := scheduler.Machine{ID: o.Machine, Site: o.Site, Lent: SchedulerResources(o.Lent),
		Allocated: SchedulerResources(o.Allocated), Reserve: SchedulerPrices(o.Price)}
	if o.AvailableUntil > 0 {
		m.Until = time.Unix(o.AvailableUntil, 0)
	}
	return m
}

// WithImageSetup is v, whose machines are offers', with each machine
// that does not hold bid b's image set up for it (p2p.ColdStart), in a copy;
// false, and v itself, when b names no image.
func WithImageSetup(v scheduler.View, offers []p2p.Offer, b p2p.Bid) (scheduler.View, bool) {
	if b.Image == "" {
		return v, false
	}
	setup := p2p.ColdStart(b.ImageBytes)
	out := scheduler.View{Machines: slices.Clone(v.Machines), RTT: v.RTT}
	for i := range out.Machines {
		if !offers[i].HoldsImage(b.Image) {
			out.Machines[i].Setup = setup
		}
	}
	return out, true
}

// SchedulerJob is a bid as the scheduler prices it.
func SchedulerJob(b p2p.Bid) scheduler.Job {
	job := scheduler.Job{ID: b.JobID, Workers: int(b.Workers),
		Per:      SchedulerResources(b.PerWorker),
		Duration: time.Duration(b.Duration) * time.Second,
		Benefit:  scheduler.Benefit{Kind: scheduler.FixedPrice, Max: b.MaxPrice}}
	if b.Deadline > 0 {
		job.Benefit = scheduler.Benefit{Kind: scheduler.ByDeadline, Max: b.MaxPrice, Deadline: time.Unix(b.Deadline, 0)}
	}
	return job
}

// defaultSyncEvery and defaultWire are what the deepmarket Python package
// uses when a diloco job's spec leaves sync_every and compress out.
const (
	defaultSyncEvery = p2p.DefaultSyncEvery
	defaultWire      = 0.25 // int8
)

// SchedulerTraining is a bid's training block as the scheduler's
// workload, with the compute of its steps on a reference machine; ok is
// false when the bid does not describe its work (steps and params).
func SchedulerTraining(b p2p.Bid) (t scheduler.Training, compute time.Duration, ok bool) {
	tr := b.Training
	if tr == nil || tr.Steps <= 0 || tr.Params <= 0 {
		return scheduler.Training{}, 0, false
	}
	t = scheduler.Training{Steps: int(tr.Steps), ModelBytes: uint64(tr.Params) * 4, Sync: tr.Mode != "diloco"}
	if len(tr.StepsRatio) > 0 {
		e, err := scheduler.EfficiencyFromRatios(t.Sync, tr.StepsRatio)
		if err != nil {
			return scheduler.Training{}, 0, false
		}
		t.Efficiency = &e
	}
	if !t.Sync {
		t.SyncEvery, t.Wire = tr.SyncEvery, defaultWire
		if t.SyncEvery == 0 {
			t.SyncEvery = defaultSyncEvery
		}
		switch tr.Compress {
		case "fp16":
			t.Wire = 0.5
		case "none":
			t.Wire = 1
		}
	}
	compute = time.Duration(b.Duration) * time.Second
	if tr.StepMillis > 0 {
		compute = time.Duration(float64(tr.Steps) * tr.StepMillis * float64(time.Millisecond))
	}
	return t, compute, true
}

// Links is what the offers say of the paths between machines i and j of
// a view built from them: either machine's measurement (the freshest
// that either published), for scheduler.Predict.
func Links(offers []p2p.Offer) func(i, j int) (scheduler.Link, bool) {
	type pair struct{ a, b string }
	known := map[pair]p2p.LinkSample{}
	for _, o := range offers {
		for _, l := range o.Links {
			known[pair{o.Machine, l.Machine}] = l
		}
	}
	return func(i, j int) (scheduler.Link, bool) {
		if i == j { // two workers on one machine: loopback
			return scheduler.Link{RTT: 50 * time.Microsecond, BytesPerSec: 1e9}, true
		}
		a, b := offers[i].Machine, offers[j].Machine
		l, ok := known[pair{a, b}]
		if !ok {
			l, ok = known[pair{b, a}]
		}
		if !ok {
			return scheduler.Link{}, false
		}
		return scheduler.Link{RTT: time.Duration(l.RTTMicros) * time.Microsecond, BytesPerSec: float64(l.KBps) * 1000}, true
	}
}
