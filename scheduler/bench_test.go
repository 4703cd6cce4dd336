package scheduler

import (
	"math/rand/v2"
	"testing"
	"time"
)

func BenchmarkPlace1000(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	v := randomView(r, 1000)
	for i := range v.Machines {
		v.Machines[i].Allocated = Resources{}
		v.Machines[i].Lent.Cores += 8
		v.Machines[i].Lent.MemBytes += 32 * gib
	}
	j := Job{ID: "b", Workers: 8, Per: Resources{Cores: 2, MemBytes: 4 * gib}, Duration: time.Hour, Benefit: Benefit{Max: 1 << 50}}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Place(v, j, t0, Params{}); err != nil {
			b.Fatal(err)
		}
	}
}
