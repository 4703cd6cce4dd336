package scheduler_test

import (
	"fmt"
	"time"

	"github.com/deepmarket/deepmarket/scheduler"
)

// A node builds an index when the machines in its view change, prices
// every bid against it, and updates a machine when its allocation does:
// here one refuses a hold because another scheduler took its cores.
func ExampleIndex() {
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	v := scheduler.View{}
	for i, site := range []string{"psu", "psu", "osu"} {
		v.Machines = append(v.Machines, scheduler.Machine{ID: fmt.Sprint("m", i), Site: site, Dedicated: true,
			Lent: scheduler.Resources{Cores: 8, MemBytes: 32 << 30}})
	}
	v.Machines[2].Allocated.Cores = 2
	idx := scheduler.NewIndex(v, scheduler.Params{})
	job := scheduler.Job{ID: "j", Workers: 2, Per: scheduler.Resources{Cores: 4, MemBytes: 8 << 30},
		Duration: time.Hour, Benefit: scheduler.Benefit{Max: 10_000_000}}
	pl, err := idx.Quote(job, now)
	fmt.Println(pl.Machines, err)

	// Machine 0 refuses: it has no cores left. The next quote knows.
	m := idx.Machine(0)
	m.Allocated.Cores = m.Lent.Cores
	idx.Update(0, m)
	pl, err = idx.Quote(job, now)
	fmt.Println(pl.Machines, err)
	// Output:
	// [0 1] <nil>
	// [1 1] <nil>
}
