package scheduler

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"math"
	"slices"
)

// Efficiency is the statistics of data-parallel training: with k workers,
// the steps each takes to the target over the steps one worker alone
// takes. Perfect scaling would be 1/k; a larger batch (sync) or averaging
// local steps (DiLoCo) usually buys less. Points are measured at some k
// (1 included, ratio 1), sorted by k; between them the ratio is
// interpolated in log k, beyond the last it stays (more workers are not
// assumed to buy anything that was not measured).
type Efficiency struct {
	Sync  []EfficiencyPoint `json:"sync"`
	Local []EfficiencyPoint `json:"diloco"`
}

// EfficiencyPoint is one measured worker count.
type EfficiencyPoint struct {
	Workers int     `json:"workers"`
	Ratio   float64 `json:"ratio"`
}

//go:embed stateff.json
var stateffJSON []byte

// DefaultEfficiency is the measured table shipped with the scheduler:
// the Fashion-MNIST example (cnn-wide, batch 64 a worker, Adam) to 0.90
// test accuracy, from python -m deepmarket.stateff (see
// bench/results/training/stateff.md). Sync scales the learning rate
// linearly to the global batch after a warm-up; DiLoCo averages every 100
// steps with int8 pseudo-gradients.
var DefaultEfficiency = mustEfficiency(stateffJSON)

func mustEfficiency(b []byte) Efficiency {
	e, err := ParseEfficiency(b)
	if err != nil {
		panic(fmt.Sprintf("scheduler: stateff.json: %v", err))
	}
	return e
}

// ParseEfficiency reads a table as python -m deepmarket.stateff
// --go-table writes it (such as stateff.json), checked.
func ParseEfficiency(b []byte) (Efficiency, error) {
	var t struct {
		Modes map[string][]EfficiencyPoint `json:"modes"`
	}
	if err := json.Unmarshal(b, &t); err != nil {
		return Efficiency{}, err
	}
	e := Efficiency{Sync: t.Modes["sync"], Local: t.Modes["diloco"]}
	return e, e.Validate()
}

// EfficiencyFromRatios is a job's own table: ratios[k-1] for k workers
// (ratios[0] must be 1), in the mode it runs.
func EfficiencyFromRatios(sync bool, ratios []float64) (Efficiency, error) {
	pts := make([]EfficiencyPoint, len(ratios))
	for i, r := range ratios {
		pts[i] = EfficiencyPoint{Workers: i + 1, Ratio: r}
	}
	e := Efficiency{Sync: pts, Local: pts}
	if !sync {
		e.Sync = nil
	} else {
		e.Local = nil
	}
	return e, e.Validate()
}

// Validate checks the points: k from 1 (ratio 1) up, each ratio in
// (0, 1] and at least 1/k (k workers cannot need fewer than 1/k of the
// steps without a better optimizer, which the table must not smuggle in).
func (e Efficiency) Validate() error {
	for _, pts := range [][]EfficiencyPoint{e.Sync, e.Local} {
		if len(pts) == 0 {
			continue
		}
		if pts[0].Workers != 1 || pts[0].Ratio != 1 {
			return fmt.Errorf("efficiency: the first point must be 1 worker, ratio 1")
		}
		for i, p := range pts {
			if i > 0 && p.Workers <= pts[i-1].Workers {
				return fmt.Errorf("efficiency: worker counts must increase (%d after %d)", p.Workers, pts[i-1].Workers)
			}
			if !(p.Ratio > 0 && p.Ratio <= 1) || p.Ratio < 1/float64(p.Workers)-1e-9 {
				return fmt.Errorf("efficiency: %d workers, ratio %g: want 1/%d to 1", p.Workers, p.Ratio, p.Workers)
			}
		}
	}
	return nil
}

// Ratio is the steps per worker to the target with k workers over one
// worker's, in the mode (sync, else local steps). A mode without points
// falls back to DefaultEfficiency's.
func (e Efficiency) Ratio(sync bool, k int) float64 {
	pts := e.Local
	if sync {
		pts = e.Sync
	}
	if len(pts) == 0 {
		if e.Sync == nil && e.Local == nil && len(DefaultEfficiency.Sync) == 0 {
			return 1 / float64(max(1, k)) // no table at all: the even split
		}
		d := DefaultEfficiency
		if sync {
			pts = d.Sync
		} else {
			pts = d.Local
		}
	}
	if k <= 1 {
		return 1
	}
	i, found := slices.BinarySearchFunc(pts, k, func(p EfficiencyPoint, k int) int { return p.Workers - k })
	switch {
	case found:
		return pts[i].Ratio
	case i >= len(pts):
		return pts[len(pts)-1].Ratio
	}
	a, b := pts[i-1], pts[i]
	f := (math.Log(float64(k)) - math.Log(float64(a.Workers))) / (math.Log(float64(b.Workers)) - math.Log(float64(a.Workers)))
	return math.Exp(math.Log(a.Ratio) + f*(math.Log(b.Ratio)-math.Log(a.Ratio)))
}
