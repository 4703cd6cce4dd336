package main

import (
	"fmt"
	"image"
	"image/color"
	"math"

	"github.com/deepmarket/deepmarket/bench/internal/plot"
	"github.com/deepmarket/deepmarket/node/jobs"
)

// Bar colours, one per worker count.
var barColors = []color.RGBA{{0x4c, 0x72, 0xb0, 0xff}, {0xdd, 0x84, 0x52, 0xff}, {0x55, 0xa8, 0x68, 0xff}}

// writeChart draws the completion times as grouped bars: a group per
// profile, a bar per worker count; failed jobs are drawn as a red stub.
func writeChart(path string, rep Report) error {
	const w, h = 900, 520
	const left, right, top, bottom = 80, 30, 60, 70
	img := plot.New(w, h)
	ink, grid := plot.Ink, plot.Grid

	var profiles []string
	counts := map[int]bool{}
	maxS := 1.0
	for _, r := range rep.Results {
		if len(profiles) == 0 || profiles[len(profiles)-1] != r.Profile {
			profiles = append(profiles, r.Profile)
		}
		counts[r.Workers] = true
		maxS = math.Max(maxS, r.TotalS)
	}
	step := plot.NiceStep(maxS / 5)
	top_ := math.Ceil(maxS/step) * step
	plotH := float64(h - top - bottom)
	y := func(s float64) int { return h - bottom - int(s/top_*plotH) }
	for v := 0.0; v <= top_+step/2; v += step {
		plot.HLine(img, left, w-right, y(v), grid)
		plot.Label(img, left-8, y(v)+4, fmt.Sprintf("%g", v), ink, plot.Right)
	}
	plot.VLine(img, left, top, h-bottom, ink)
	plot.HLine(img, left, w-right, h-bottom, ink)
	plot.Label(img, w/2, 30, "Job completion time (s): the same Fashion-MNIST job, 1-3 workers", ink, plot.Center)
	plot.Label(img, left, top-12, "seconds", ink, plot.Left)

	groupW := float64(w-left-right) / float64(max(len(profiles), 1))
	barW := int(groupW / 5)
	for g, p := range profiles {
		gx := left + int(groupW*float64(g)) + int(groupW/2)
		plot.Label(img, gx, h-bottom+22, p, ink, plot.Center)
		var bars []Result
		for _, r := range rep.Results {
			if r.Profile == p {
				bars = append(bars, r)
			}
		}
		x0 := gx - len(bars)*barW/2
		for k, r := range bars {
			c := barColors[(r.Workers-1)%len(barColors)]
			x := x0 + k*barW
			if r.State != string(jobs.Succeeded) {
				plot.Fill(img, image.Rect(x+3, y(top_*0.02), x+barW-3, h-bottom), plot.Red)
				plot.Label(img, x+barW/2, y(top_*0.02)-6, "failed", ink, plot.Center)
				continue
			}
			plot.Fill(img, image.Rect(x+3, y(r.TotalS), x+barW-3, h-bottom), c)
			plot.Label(img, x+barW/2, y(r.TotalS)-6, fmt.Sprintf("%.0f", r.TotalS), ink, plot.Center)
		}
	}
	// Legend.
	lx := left + 10
	for n := 1; n <= 3; n++ {
		if !counts[n] {
			continue
		}
		plot.Fill(img, image.Rect(lx, h-28, lx+14, h-14), barColors[n-1])
		plot.Label(img, lx+20, h-16, fmt.Sprintf("%d worker%s", n, map[bool]string{true: "s"}[n > 1]), ink, plot.Left)
		lx += 120
	}
	return plot.WritePNG(path, img)
}
