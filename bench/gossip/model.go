package main

import (
	"errors"
	"math"
	"time"
)

// line is y = Fixed + Slope·R, a node's cost per minute against R, the
// offers announced per minute in the whole market (N machines each
// re-announcing every T: R = N·60/T). Every offer reaches every node, so R
// is also what each node validates and relays; Fixed is what does not
// depend on the market's size (heartbeats, scoring, the node's own offer
// flooded to its peers).
type line struct {
	Fixed float64 `json:"fixed"`
	Slope float64 `json:"per_offer_per_min"`
	R2    float64 `json:"r2"`
}

func (l line) at(r float64) float64 { return l.Fixed + l.Slope*r }

// rate is R for n machines re-announcing every interval.
func rate(n int, interval time.Duration) float64 { return float64(n) / interval.Minutes() }

// fit is the least-squares line through (xs, ys).
func fit(xs, ys []float64) (line, error) {
	if len(xs) != len(ys) || len(xs) < 2 {
		return line{}, errors.New("fit: need at least two points")
	}
	n := float64(len(xs))
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx += xs[i]
		sy += ys[i]
		sxx += xs[i] * xs[i]
		sxy += xs[i] * ys[i]
	}
	d := n*sxx - sx*sx
	if d == 0 {
		return line{}, errors.New("fit: every point at one rate")
	}
	l := line{Slope: (n*sxy - sx*sy) / d}
	l.Fixed = (sy - l.Slope*sx) / n
	mean := sy / n
	var res, tot float64
	for i := range xs {
		res += math.Pow(ys[i]-l.at(xs[i]), 2)
		tot += math.Pow(ys[i]-mean, 2)
	}
	l.R2 = 1
	if tot > 0 {
		l.R2 = 1 - res/tot
	}
	return l, nil
}

// intervalFor is the re-announce interval at which n machines keep l
// within budget; 0 when the fixed part alone exceeds it.
func (l line) intervalFor(n int, budget float64) time.Duration {
	if budget <= l.Fixed || l.Slope <= 0 {
		return 0
	}
	r := (budget - l.Fixed) / l.Slope
	return time.Duration(float64(n) / r * float64(time.Minute))
}
