package jobs

import (
	"strings"
	"testing"
	"time"
)

// A worker's reports make its curve: a point when its step grows or an
// evaluation comes, none for a repeat; a full curve thins to half and
// keeps its evaluations.
func TestRecordCurve(t *testing.T) {
	var w Worker
	Record(&w, 10, 100, 1.2, 0.5, 0, 0, 0, 5)
	Record(&w, 10, 100, 1.2, 0.5, 0, 0, 0, 6) // no growth: no point
	Record(&w, 20, 100, 0.9, 0.6, 0.95, 0.62, 18, 10)
	Record(&w, 20, 100, 0.9, 0.6, 0.95, 0.62, 18, 11) // the same evaluation again
	if len(w.Curve) != 2 || w.Curve[1] != (Point{T: 10, Step: 20, Loss: 0.9, Accuracy: 0.6, EvalLoss: 0.95, EvalAccuracy: 0.62, EvalAt: 18}) ||
		w.Steps != 20 || w.Total != 100 || w.EvalAccuracy != 0.62 || w.EvalAt != 18 {
		t.Fatalf("curve %+v, worker %+v", w.Curve, w)
	}
	for i := range 2 * MaxCurvePoints {
		Record(&w, uint64(21+i), 1000, 0.5, 0.8, 0, 0, 0, float64(12+i))
	}
	if n := len(w.Curve); n > MaxCurvePoints || n < MaxCurvePoints/2 {
		t.Errorf("a full curve has %d points; want at most %d, at least half", n, MaxCurvePoints)
	}
	if w.Curve[1].EvalAccuracy != 0.62 || w.Curve[len(w.Curve)-1].Step != uint64(20+2*MaxCurvePoints) {
		t.Errorf("thinning lost the evaluation or the last point: %+v ... %+v", w.Curve[:2], w.Curve[len(w.Curve)-1])
	}
}

// A job's summary: the slowest worker's share of its steps and the time
// left at its recent pace; the holder's evaluation before a worker's,
// an evaluation before training figures; how long it ran.
func TestSummarize(t *testing.T) {
	start := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	now := start.Add(100 * time.Second)
	w0, w1 := Worker{}, Worker{}
	for s := range 10 {
		Record(&w0, uint64(10*(s+1)), 1000, 0.5, 0.8, 0, 0, 0, float64(10*(s+1))) // 1 step a second
		Record(&w1, uint64(20*(s+1)), 1000, 0.4, 0.85, 0, 0, 0, float64(10*(s+1)))
	}
	j := &Job{State: Running, Runs: []Run{{Started: start, Workers: []Worker{w0, w1}}}}
	s := Summarize(j, now)
	if s == nil || s.Steps != 100 || s.Total != 1000 || s.Percent != 10 || s.ETA != 900 || s.Duration != 100 ||
		s.Evaluated || s.From != "worker 0's training" || s.Accuracy != 0.8 {
		t.Fatalf("running: %+v", s)
	}
	if line := ProgressLine(s); !strings.Contains(line, "progress 10% (100 of 1000 steps), about 15m0s left; loss 0.5, accuracy 0.8000") {
		t.Errorf("progress line %q", line)
	}
	Record(&j.Runs[0].Workers[1], 210, 1000, 0.4, 0.85, 0.42, 0.84, 200, 105)
	if s := Summarize(j, now); !s.Evaluated || s.Accuracy != 0.84 || s.From != "worker 1's evaluation" {
		t.Errorf("a worker's evaluation: %+v", s)
	}
	j.Runs[0].Holder = &Worker{EvalAccuracy: 0.88, EvalLoss: 0.33}
	j.State, j.Runs[0].Ended = Succeeded, start.Add(300*time.Second)
	if s := Summarize(j, now); s.Accuracy != 0.88 || s.From != "the holder's evaluation" || s.Duration != 300 || s.Percent != 0 ||
		!s.Ended.Equal(start.Add(300*time.Second)) {
		t.Errorf("ended, held: %+v", s)
	}
	if s := Summarize(&Job{State: Quoting}, now); s != nil {
		t.Errorf("a job not started: %+v", s)
	}
}
