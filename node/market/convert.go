package market

import (
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
