package jobs

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Point is one progress report of a worker as its submitter recorded it:
// seconds since its run started, its training step, its loss and accuracy,
// and, on a report that brought a new evaluation, what it gave and at
// which step.
type Point struct {
	T            float64 `json:"t"`
	Step         uint64  `json:"step"`
	Loss         float64 `json:"loss,omitempty"`
	Accuracy     float64 `json:"acc,omitempty"`
	EvalLoss     float64 `json:"eval_loss,omitempty"`
	EvalAccuracy float64 `json:"eval_acc,omitempty"`
	EvalAt       uint64  `json:"eval_at,omitempty"`
}

// MaxCurvePoints bounds a worker's curve: a full curve keeps every other
// point, so a long run's curve spans it all at half the detail.
const MaxCurvePoints = 256

// AddPoint appends p to curve, thinning it when full (evaluations kept).
func AddPoint(curve []Point, p Point) []Point {
	if len(curve) >= MaxCurvePoints {
		kept := make([]Point, 0, MaxCurvePoints) // readers may hold the old one
		for i, q := range curve {
			if i%2 == 0 || q.EvalLoss > 0 || q.EvalAccuracy > 0 {
				kept = append(kept, q)
			}
		}
		if len(kept) >= MaxCurvePoints { // evaluations alone fill it: drop the oldest half
			kept = append(kept[:0], kept[len(kept)/2:]...)
		}
		curve = kept
	}
	return append(curve, p)
}

// Record notes a training program's progress report in worker w at t
// seconds into its run: its figures, and a point of its curve when its
// step grew or a new evaluation came.
func Record(w *Worker, steps, total uint64, loss, acc, evalLoss, evalAcc float64, evalAt uint64, t float64) {
	newEval := (evalLoss > 0 || evalAcc > 0) && (evalAt != w.EvalAt || evalLoss != w.EvalLoss || evalAcc != w.EvalAccuracy)
	grew := steps > w.Steps
	w.Steps, w.Total, w.Loss, w.Accuracy = max(w.Steps, steps), total, loss, acc
	if !grew && !newEval {
		return
	}
	p := Point{T: math.Round(t*10) / 10, Step: w.Steps, Loss: loss, Accuracy: acc}
	if newEval {
		w.EvalLoss, w.EvalAccuracy, w.EvalAt = evalLoss, evalAcc, evalAt
		p.EvalLoss, p.EvalAccuracy, p.EvalAt = evalLoss, evalAcc, evalAt
	}
	w.Curve = AddPoint(w.Curve, p)
}

// Summary is what a person looks for first in a job: its progress while
// it runs (steps of the planned total, the share done, an ETA from the
// recent pace), its result (accuracy and loss, evaluated when a worker
// evaluated the model, else the last training figures), and when it
// started and ended.
type Summary struct {
	Steps    uint64  `json:"steps,omitempty"`
	Total    uint64  `json:"total_steps,omitempty"`
	Percent  float64 `json:"percent,omitempty"`
	ETA      float64 `json:"eta_s,omitempty"`
	Accuracy float64 `json:"accuracy,omitempty"`
	Loss     float64 `json:"loss,omitempty"`
	// Evaluated says Accuracy and Loss are an evaluation's (the holder's
	// or a worker's), not the training figures; From names whose.
	Evaluated bool      `json:"evaluated,omitempty"`
	From      string    `json:"from,omitempty"`
	Started   time.Time `json:"started,omitzero"`
	Ended     time.Time `json:"ended,omitzero"`
	Duration  float64   `json:"duration_s,omitempty"`
}

// etaWindow is how far back the pace an ETA is worked out from reaches.
const etaWindow = 2 * time.Minute

// Summarize works out j's summary at now; nil when there is nothing to say.
func Summarize(j *Job, now time.Time) *Summary {
	var s Summary
	for i := range j.Runs {
		if r := &j.Runs[i]; !r.Started.IsZero() && (s.Started.IsZero() || r.Started.Before(s.Started)) {
			s.Started = r.Started
		}
	}
	run := j.Current()
	if run != nil && j.State.Terminal() {
		s.Ended = run.Ended
		if s.Ended.IsZero() {
			s.Ended = j.Updated
		}
	}
	switch {
	case !s.Started.IsZero() && !s.Ended.IsZero():
		s.Duration = s.Ended.Sub(s.Started).Seconds()
	case !s.Started.IsZero():
		s.Duration = now.Sub(s.Started).Seconds()
	}
	if run != nil {
		result(&s, run)
		if !j.State.Terminal() {
			progress(&s, run, now)
		}
	}
	if s == (Summary{}) {
		return nil
	}
	s.Duration = math.Round(s.Duration)
	return &s
}

// result takes the run's evaluated figures (the holder's first, then the
// lowest-ranked worker's), else worker 0's training figures.
func result(s *Summary, run *Run) {
	ws := make([]*Worker, 0, len(run.Workers)+1)
	names := []string{}
	if run.Holder != nil {
		ws, names = append(ws, run.Holder), append(names, "the holder")
	}
	for i := range run.Workers {
		ws, names = append(ws, &run.Workers[i]), append(names, "worker "+strconv.Itoa(i))
	}
	for i, w := range ws {
		if w.EvalAccuracy > 0 || w.EvalLoss > 0 {
			s.Accuracy, s.Loss, s.Evaluated, s.From = w.EvalAccuracy, w.EvalLoss, true, names[i]+"'s evaluation"
			return
		}
	}
	for i, w := range ws {
		if w.Accuracy > 0 || w.Loss > 0 {
			s.Accuracy, s.Loss, s.From = w.Accuracy, w.Loss, names[i]+"'s training"
			return
		}
	}
}

// progress is the slowest worker's share of its planned steps, and the
// time left at its pace over the last etaWindow.
func progress(s *Summary, run *Run, now time.Time) {
	share := -1.0
	for i := range run.Workers {
		w := &run.Workers[i]
		if w.Total == 0 {
			continue
		}
		f := min(1, float64(w.Steps)/float64(w.Total))
		if share >= 0 && f >= share {
			continue
		}
		share, s.Steps, s.Total = f, w.Steps, w.Total
		s.ETA = 0
		if rate := pace(w.Curve, now.Sub(run.Started).Seconds()); rate > 0 && w.Total > w.Steps {
			s.ETA = math.Round(float64(w.Total-w.Steps) / rate)
		}
	}
	if share >= 0 {
		s.Percent = math.Round(share*1000) / 10
	}
}

// pace is the steps a second of a curve over its last etaWindow up to t.
func pace(curve []Point, t float64) float64 {
	if len(curve) < 2 {
		return 0
	}
	last := curve[len(curve)-1]
	first := last
	for i := len(curve) - 2; i >= 0 && t-curve[i].T <= etaWindow.Seconds(); i-- {
		first = curve[i]
	}
	if first.T >= last.T || first.Step >= last.Step {
		if first = curve[0]; first.T >= last.T || first.Step >= last.Step {
			return 0
		}
	}
	return float64(last.Step-first.Step) / (last.T - first.T)
}

// ProgressLine says a running job's summary in a line: "progress 40%
// (720 of 1800 steps), about 2m10s left; loss 0.52, accuracy 0.81
// (worker 0's training)".
func ProgressLine(s *Summary) string {
	var b strings.Builder
	fmt.Fprintf(&b, "progress %s%% (%d of %d steps)", strconv.FormatFloat(s.Percent, 'f', -1, 64), s.Steps, s.Total)
	if s.ETA > 0 {
		fmt.Fprintf(&b, ", about %s left", (time.Duration(s.ETA) * time.Second).String())
	}
	if s.Loss != 0 || s.Accuracy != 0 {
		fmt.Fprintf(&b, "; loss %.4g", s.Loss)
		if s.Accuracy > 0 {
			fmt.Fprintf(&b, ", accuracy %.4f", s.Accuracy)
		}
		fmt.Fprintf(&b, " (%s)", s.From)
	}
	return b.String()
}
