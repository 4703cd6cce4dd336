package main

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"

	"github.com/deepmarket/deepmarket/node/jobs"
)

// Bar colours, one per worker count.
var barColors = []color.RGBA{{0x4c, 0x72, 0xb0, 0xff}, {0xdd, 0x84, 0x52, 0xff}, {0x55, 0xa8, 0x68, 0xff}}

// writeChart draws the completion times as grouped bars: a group per
// profile, a bar per worker count; failed jobs are drawn as a red stub.
func writeChart(path string, rep Report) error {
	const w, h = 900, 520
	const left, right, top, bottom = 80, 30, 60, 70
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	ink := color.RGBA{0x22, 0x22, 0x22, 0xff}
	grid := color.RGBA{0xdd, 0xdd, 0xdd, 0xff}

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
	step := niceStep(maxS / 5)
	top_ := math.Ceil(maxS/step) * step
	plotH := float64(h - top - bottom)
	y := func(s float64) int { return h - bottom - int(s/top_*plotH) }
	for v := 0.0; v <= top_+step/2; v += step {
		hline(img, left, w-right, y(v), grid)
		label(img, left-8, y(v)+4, fmt.Sprintf("%g", v), ink, alignRight)
	}
	vline(img, left, top, h-bottom, ink)
	hline(img, left, w-right, h-bottom, ink)
	label(img, w/2, 30, "Job completion time (s): the same Fashion-MNIST job, 1-3 workers", ink, alignCenter)
	label(img, left, top-12, "seconds", ink, alignLeft)

	groupW := float64(w-left-right) / float64(max(len(profiles), 1))
	barW := int(groupW / 5)
	for g, p := range profiles {
		gx := left + int(groupW*float64(g)) + int(groupW/2)
		label(img, gx, h-bottom+22, p, ink, alignCenter)
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
				fill(img, image.Rect(x+3, y(top_*0.02), x+barW-3, h-bottom), color.RGBA{0xc0, 0x30, 0x30, 0xff})
				label(img, x+barW/2, y(top_*0.02)-6, "failed", ink, alignCenter)
				continue
			}
			fill(img, image.Rect(x+3, y(r.TotalS), x+barW-3, h-bottom), c)
			label(img, x+barW/2, y(r.TotalS)-6, fmt.Sprintf("%.0f", r.TotalS), ink, alignCenter)
		}
	}
	// Legend.
	lx := left + 10
	for n := 1; n <= 3; n++ {
		if !counts[n] {
			continue
		}
		fill(img, image.Rect(lx, h-28, lx+14, h-14), barColors[n-1])
		label(img, lx+20, h-16, fmt.Sprintf("%d worker%s", n, map[bool]string{true: "s"}[n > 1]), ink, alignLeft)
		lx += 120
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// niceStep rounds a raw axis step up to 1, 2 or 5 times a power of ten.
func niceStep(raw float64) float64 {
	if raw <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= raw {
			return m * p
		}
	}
	return 10 * p
}

func fill(img *image.RGBA, r image.Rectangle, c color.Color) {
	draw.Draw(img, r, &image.Uniform{c}, image.Point{}, draw.Src)
}

func hline(img *image.RGBA, x0, x1, y int, c color.Color) { fill(img, image.Rect(x0, y, x1, y+1), c) }
func vline(img *image.RGBA, x, y0, y1 int, c color.Color) { fill(img, image.Rect(x, y0, x+1, y1), c) }

type align int

const (
	alignLeft align = iota
	alignCenter
	alignRight
)

func label(img *image.RGBA, x, y int, s string, c color.Color, a align) {
	d := &font.Drawer{Dst: img, Src: &image.Uniform{c}, Face: basicfont.Face7x13}
	width := d.MeasureString(s).Round()
	switch a {
	case alignCenter:
		x -= width / 2
	case alignRight:
		x -= width
	}
	d.Dot = fixed.P(x, y)
	d.DrawString(s)
}
