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

func benchView(n int) View {
	r := rand.New(rand.NewPCG(uint64(n), 1))
	v := View{Machines: make([]Machine, n)}
	for i := range v.Machines {
		lent := Resources{Cores: uint32(4 + r.IntN(61)), MemBytes: uint64(8+r.IntN(249)) << 30, GPUs: uint32(r.IntN(5) / 3)}
		v.Machines[i] = Machine{
			ID: "m", Site: []string{"psu", "osu", "uw"}[r.IntN(3)], Lent: lent,
			Allocated: Resources{Cores: uint32(r.IntN(int(lent.Cores))), MemBytes: uint64(r.Int64N(int64(lent.MemBytes) / 2)), GPUs: 0},
			Speed:     0.5 + r.Float64(), Dedicated: r.IntN(3) == 0, Completed: uint64(r.IntN(100)), Failed: uint64(r.IntN(5)),
		}
	}
	return v
}

func BenchmarkIndexPlace10000(b *testing.B) {
	x := NewIndex(benchView(10000), Params{})
	j := Job{ID: "b", Workers: 8, Per: Resources{Cores: 2, MemBytes: 4 * gib}, Duration: time.Hour, Benefit: Benefit{Max: 1 << 50}}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := x.Place(j, t0); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkNewIndex100000(b *testing.B) {
	v := benchView(100000)
	b.ReportAllocs()
	for b.Loop() {
		NewIndex(v, Params{})
	}
}

// BenchmarkIndexPlaceCold10000 cycles over 16 indexes, as make
// bench-scheduler does: little of any one stays in cache.
func BenchmarkIndexPlaceCold10000(b *testing.B) {
	var xs []*Index
	for k := range 16 {
		v := benchView(10000 + k)
		xs = append(xs, NewIndex(v, Params{}))
	}
	j := Job{ID: "b", Workers: 8, Per: Resources{Cores: 2, MemBytes: 4 * gib}, Duration: time.Hour, Benefit: Benefit{Max: 1 << 50}}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := xs[i%16].Place(j, t0); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
