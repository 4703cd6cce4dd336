// Package plot holds the few drawing helpers the benchmarks' PNG charts
// share: filled rectangles, lines, text in the 7x13 bitmap font, axis
// steps, and writing the image.
package plot

import (
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// Colours the charts use.
var (
	Ink  = color.RGBA{0x22, 0x22, 0x22, 0xff}
	Grid = color.RGBA{0xdd, 0xdd, 0xdd, 0xff}
	Red  = color.RGBA{0xc0, 0x30, 0x30, 0xff}
)

// New is a white w x h image.
func New(w, h int) *image.RGBA {
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	return img
}

// NiceStep rounds a raw axis step up to 1, 2 or 5 times a power of ten.
func NiceStep(raw float64) float64 {
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

// Fill paints r.
func Fill(img *image.RGBA, r image.Rectangle, c color.Color) {
	draw.Draw(img, r, &image.Uniform{c}, image.Point{}, draw.Src)
}

// HLine draws a horizontal line from x0 to x1 at y.
func HLine(img *image.RGBA, x0, x1, y int, c color.Color) { Fill(img, image.Rect(x0, y, x1, y+1), c) }

// VLine draws a vertical line from y0 to y1 at x.
func VLine(img *image.RGBA, x, y0, y1 int, c color.Color) { Fill(img, image.Rect(x, y0, x+1, y1), c) }

// Align is where a label's x falls: its left end, centre or right end.
type Align int

// The alignments.
const (
	Left Align = iota
	Center
	Right
)

// Label writes s with its baseline at y.
func Label(img *image.RGBA, x, y int, s string, c color.Color, a Align) {
	d := &font.Drawer{Dst: img, Src: &image.Uniform{c}, Face: basicfont.Face7x13}
	width := d.MeasureString(s).Round()
	switch a {
	case Center:
		x -= width / 2
	case Right:
		x -= width
	}
	d.Dot = fixed.P(x, y)
	d.DrawString(s)
}

// WritePNG writes img to path.
func WritePNG(path string, img image.Image) error {
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
