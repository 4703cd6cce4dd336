package main

import (
	"fmt"
	"image"
	"image/color"
	"math"
	"strconv"

	"github.com/deepmarket/deepmarket/bench/internal/plot"
)

// Bar colours, one per kind of job (1 worker, then each mode with 2+).
var barColors = []color.RGBA{{0x4c, 0x72, 0xb0, 0xff}, {0xdd, 0x84, 0x52, 0xff}, {0x55, 0xa8, 0x68, 0xff},
	{0x81, 0x72, 0xb2, 0xff}, {0x93, 0x78, 0x60, 0xff}, {0xda, 0x8b, 0xc3, 0xff}}

func kind(r Result) string {
	if r.Workers == 1 {
		return "1 worker"
	}
	return fmt.Sprintf("%d workers, %s", r.Workers, r.Mode)
}

// writeChart draws the times to the target as grouped bars: a group per
// profile, a bar per job, labelled with its speed-up over 1 worker; a job
// that did not reach the target is a red stub.
func writeChart(path string, rep Report) error {
	const w, h = 960, 540
	const left, right, top, bottom = 80, 30, 60, 80
	img := plot.New(w, h)
	ink, grid := plot.Ink, plot.Grid

	var profiles, kinds []string
	colorOf := map[string]color.RGBA{}
	maxS := 10.0
	for _, r := range rep.Results {
		if len(profiles) == 0 || profiles[len(profiles)-1] != r.Profile {
			profiles = append(profiles, r.Profile)
		}
		if _, ok := colorOf[kind(r)]; !ok {
			colorOf[kind(r)] = barColors[len(kinds)%len(barColors)]
			kinds = append(kinds, kind(r))
		}
		if r.TargetReached {
			maxS = math.Max(maxS, r.TimeToTargetS)
		} else {
			maxS = math.Max(maxS, lastEvalS(r))
		}
	}
	step := plot.NiceStep(maxS / 5)
	top_ := math.Ceil(maxS*1.08/step) * step // room for the labels
	plotH := float64(h - top - bottom)
	y := func(s float64) int { return h - bottom - int(s/top_*plotH) }
	for i := 0; float64(i)*step <= top_+step/2; i++ {
		v := float64(i) * step
		plot.HLine(img, left, w-right, y(v), grid)
		plot.Label(img, left-8, y(v)+4, strconv.FormatFloat(v, 'g', 6, 64), ink, plot.Right)
	}
	plot.VLine(img, left, top, h-bottom, ink)
	plot.HLine(img, left, w-right, h-bottom, ink)
	plot.Label(img, w/2, 24, fmt.Sprintf("Time to %.2f test accuracy (s), Fashion-MNIST %s through the market; "+
		"label: speed-up over 1 worker", rep.Config.Target, rep.Config.Model), ink, plot.Center)
	plot.Label(img, left, top-12, "seconds (lower is better)", ink, plot.Left)

	groupW := float64(w-left-right) / float64(max(len(profiles), 1))
	barW := min(int(groupW/float64(len(kinds)+2)), 90)
	for g, p := range profiles {
		gx := left + int(groupW*float64(g)) + int(groupW/2)
		plot.Label(img, gx, h-bottom+20, p, ink, plot.Center)
		var bars []Result
		for _, r := range rep.Results {
			if r.Profile == p {
				bars = append(bars, r)
			}
		}
		x0 := gx - len(bars)*barW/2
		for k, r := range bars {
			x := x0 + k*barW
			if !r.TargetReached || r.TimeToTargetS <= 0 {
				// Red: as high as the last evaluation, which had not
				// reached the target (a stub when there was none).
				s, what := lastEvalS(r), "failed"
				if r.State == "succeeded" || r.TimedOut {
					what = "not reached"
				}
				s = math.Max(s, top_*0.02)
				plot.Fill(img, image.Rect(x+3, y(s), x+barW-3, h-bottom), plot.Red)
				if lastEvalS(r) > 0 {
					plot.Label(img, x+barW/2, y(s)-20, fmt.Sprintf("> %.0f s", lastEvalS(r)), ink, plot.Center)
				}
				plot.Label(img, x+barW/2, y(s)-6, what, ink, plot.Center)
				continue
			}
			plot.Fill(img, image.Rect(x+3, y(r.TimeToTargetS), x+barW-3, h-bottom), colorOf[kind(r)])
			lbl := fmt.Sprintf("%.0f s", r.TimeToTargetS)
			if r.Workers > 1 && r.SpeedUp > 0 {
				lbl = fmt.Sprintf("%.2fx", r.SpeedUp)
				plot.Label(img, x+barW/2, y(r.TimeToTargetS)-20, fmt.Sprintf("%.0f s", r.TimeToTargetS), ink, plot.Center)
			}
			plot.Label(img, x+barW/2, y(r.TimeToTargetS)-6, lbl, ink, plot.Center)
		}
	}
	// Legend.
	lx := left + 10
	for _, k := range kinds {
		plot.Fill(img, image.Rect(lx, h-30, lx+14, h-16), colorOf[k])
		plot.Label(img, lx+20, h-18, k, ink, plot.Left)
		lx += 30 + 7*len(k)
	}
	return plot.WritePNG(path, img)
}

// lastEvalS is when worker 0's last evaluation was (seconds since its
// start), 0 when there was none.
func lastEvalS(r Result) float64 {
	if len(r.Evals) == 0 {
		return 0
	}
	return r.Evals[len(r.Evals)-1][0]
}
