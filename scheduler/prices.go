package scheduler

import (
	"math"
	"slices"
	"time"
)

// UnitPrices are the prices of the next unit of each resource, in
// micro-credits per unit-hour (memory per GiB-hour).
type UnitPrices struct {
	Core   uint64 `json:"core"`
	MemGiB uint64 `json:"mem_gib"`
	GPU    uint64 `json:"gpu"`
}

// MachinePrices is one machine's current prices and loads.
type MachinePrices struct {
	ID   string     `json:"machine"`
	Site string     `json:"site,omitempty"`
	Unit UnitPrices `json:"unit"`
	// Load is allocated / lent for cores, memory and GPUs (0 where
	// nothing is lent).
	Load [3]float64 `json:"load"`
	// Available is false outside the machine's lending window.
	Available bool `json:"available"`
}

// Market is the prices a scheduler sees: per machine, and market-wide the
// lowest and the median unit price among available machines that lend the
// resource.
type Market struct {
	Machines []MachinePrices `json:"machines"`
	Lowest   UnitPrices      `json:"lowest"`
	Median   UnitPrices      `json:"median"`
}

// MarketPrices reports each machine's current unit prices (base * n^load, the
// lender's reserve price as a floor, times the machine's risk) and the
// market's.
func MarketPrices(v View, now time.Time, p Params) Market {
	md := newModel(p, len(v.Machines))
	mk := Market{Machines: make([]MachinePrices, 0, len(v.Machines))}
	var cores, mem, gpus []uint64
	for i := range v.Machines {
		m := &v.Machines[i]
		risk := md.risk(m)
		load := func(alloc, lent float64) float64 {
			if lent <= 0 {
				return 0
			}
			return min(alloc/lent, 1)
		}
		mp := MachinePrices{ID: m.ID, Site: m.Site, Available: m.available(now, now)}
		mp.Load = [3]float64{
			load(float64(m.Allocated.Cores), float64(m.Lent.Cores)),
			load(float64(m.Allocated.MemBytes), float64(m.Lent.MemBytes)),
			load(float64(m.Allocated.GPUs), float64(m.Lent.GPUs)),
		}
		price := func(l float64, base, reserve uint64) uint64 {
			return uint64(math.Ceil(risk * md.unitPrice(l, float64(base), float64(reserve))))
		}
		if m.Lent.Cores > 0 {
			mp.Unit.Core = price(mp.Load[0], md.p.Base.CoreHour, m.Reserve.CoreHour)
		}
		if m.Lent.MemBytes > 0 {
			mp.Unit.MemGiB = price(mp.Load[1], md.p.Base.MemGiBHour, m.Reserve.MemGiBHour)
		}
		if m.Lent.GPUs > 0 {
			mp.Unit.GPU = price(mp.Load[2], md.p.Base.GPUHour, m.Reserve.GPUHour)
		}
		if mp.Available {
			if m.Free().Cores > 0 {
				cores = append(cores, mp.Unit.Core)
			}
			if m.Free().MemBytes >= gib {
				mem = append(mem, mp.Unit.MemGiB)
			}
			if m.Free().GPUs > 0 {
				gpus = append(gpus, mp.Unit.GPU)
			}
		}
		mk.Machines = append(mk.Machines, mp)
	}
	mk.Lowest = UnitPrices{lowest(cores), lowest(mem), lowest(gpus)}
	mk.Median = UnitPrices{median(cores), median(mem), median(gpus)}
	return mk
}

func lowest(xs []uint64) uint64 {
	if len(xs) == 0 {
		return 0
	}
	return slices.Min(xs)
}

func median(xs []uint64) uint64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
