package main

import (
	"math"
	"testing"
)

func TestFitRecoversALine(t *testing.T) {
	xs := []float64{100, 200, 400}
	ys := []float64{1000 + 3*100, 1000 + 3*200, 1000 + 3*400}
	l, err := fit(xs, ys)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(l.Fixed-1000) > 1e-9 || math.Abs(l.Slope-3) > 1e-12 || math.Abs(l.R2-1) > 1e-12 {
		t.Fatalf("fit = %+v, want fixed 1000, slope 3, r2 1", l)
	}
	if got := l.at(10_000); math.Abs(got-31_000) > 1e-6 {
		t.Fatalf("at 10k = %v, want 31000", got)
	}
}

func TestFitNoisyPointsLoseR2(t *testing.T) {
	l, err := fit([]float64{100, 200, 400}, []float64{1300, 1500, 2300})
	if err != nil {
		t.Fatal(err)
	}
	if l.R2 >= 1 || l.R2 < 0.9 {
		t.Fatalf("r2 = %v, want in [0.9, 1)", l.R2)
	}
}

func TestFitRefusesOneSize(t *testing.T) {
	if _, err := fit([]float64{100, 100}, []float64{1, 2}); err == nil {
		t.Fatal("fit at one size: want an error")
	}
	if _, err := fit([]float64{100}, []float64{1}); err == nil {
		t.Fatal("fit of one point: want an error")
	}
}

func TestIntervalForMeetsTheBudget(t *testing.T) {
	l := line{Fixed: 10, Slope: 0.5}
	iv := l.intervalFor(10_000, 110)
	if got := l.at(rate(10_000, iv)); math.Abs(got-110) > 1e-6 {
		t.Fatalf("cost at the suggested interval %v = %v, want the budget 110", iv, got)
	}
	if l.intervalFor(10_000, 5) != 0 {
		t.Fatal("a budget below the fixed cost: want 0 (no interval helps)")
	}
}
