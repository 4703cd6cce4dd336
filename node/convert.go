package node

import (
	"time"

	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/scheduler"
)

// The wire's types (p2p) and the scheduler's meet here, and only here: the
// scheduler stays free of the wire, the wire of the scheduler.

func schedulerResources(r p2p.Resources) scheduler.Resources {
	return scheduler.Resources{Cores: r.Cores, MemBytes: r.MemBytes, GPUs: r.GPUs}
}

func schedulerPrices(p p2p.Prices) scheduler.Prices {
	return scheduler.Prices{CoreHour: p.CoreHour, MemGiBHour: p.MemGiBHour, GPUHour: p.GPUHour}
}

// schedulerMachine is an offer as the scheduler sees the machine (without
// its record of past jobs, which the view adds).
func schedulerMachine(o p2p.Offer) scheduler.Machine {
	m := scheduler.Machine{ID: o.Machine, Site: o.Site, Lent: schedulerResources(o.Lent),
		Allocated: schedulerResources(o.Allocated), Reserve: schedulerPrices(o.Price)}
	if o.AvailableUntil > 0 {
		m.Until = time.Unix(o.AvailableUntil, 0)
	}
	return m
}

// schedulerJob is a bid as the scheduler prices it.
func schedulerJob(b p2p.Bid) scheduler.Job {
	job := scheduler.Job{ID: b.JobID, Workers: int(b.Workers),
		Per:      schedulerResources(b.PerWorker),
		Duration: time.Duration(b.Duration) * time.Second,
		Benefit:  scheduler.Benefit{Kind: scheduler.FixedPrice, Max: b.MaxPrice}}
	if b.Deadline > 0 {
		job.Benefit = scheduler.Benefit{Kind: scheduler.ByDeadline, Max: b.MaxPrice, Deadline: time.Unix(b.Deadline, 0)}
	}
	return job
}
