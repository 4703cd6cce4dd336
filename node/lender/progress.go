package lender

import (
	"encoding/json"
	"io"
	"math"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/deepmarket/deepmarket/p2p"
)

// progressFile is where, inside its dir, a worker reports its progress
// (DM_PROGRESS_FILE, written by the deepmarket package).
var progressFile = filepath.Join("tmp", "progress.json")

// maxProgressBytes bounds what is read of a worker's progress file.
const maxProgressBytes = 1024

// readProgress is what worker w last reported of its progress, nil when
// it has not (or wrote something else). The file is the job's: it is
// opened beneath the worker's dir (no link leads out), without blocking
// (a FIFO does not hold the node), only if regular, and read up to a
// bound.
func (e *Executor) readProgress(w *worker) *p2p.Progress {
	dir, err := e.root.OpenRoot(w.name)
	if err != nil {
		return nil
	}
	defer dir.Close()
	f, err := dir.OpenFile(progressFile, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil
	}
	b, err := io.ReadAll(io.LimitReader(f, maxProgressBytes+1))
	if err != nil || len(b) > maxProgressBytes {
		return nil
	}
	var rec struct {
		Units *uint64 `json:"units"`
		p2p.Progress
	}
	if json.Unmarshal(b, &rec) != nil || rec.Units == nil {
		return nil
	}
	p := rec.Progress
	p.Units = *rec.Units
	// A figure out of bounds is left out, not the report.
	for _, f := range []*float64{&p.Loss, &p.EvalLoss} {
		if !(math.Abs(*f) < math.MaxFloat32) {
			*f = 0
		}
	}
	for _, f := range []*float64{&p.Accuracy, &p.EvalAccuracy} {
		if !(*f >= 0 && *f <= 1) {
			*f = 0
		}
	}
	if max(p.Units, p.Steps, p.Total, p.EvalAt, p.Accepted, p.Refused, p.RefusedRun) > p2p.MaxProgressCount {
		return nil
	}
	return &p
}

// answered reads worker w's round answers from its progress report,
// logs them when they changed, and returns how many of the last it was
// refused in a row.
func (e *Executor) answered(w *worker) uint64 {
	p := e.readProgress(w)
	if p == nil {
		return 0
	}
	now := [2]uint64{p.Accepted, p.Refused}
	w.mu.Lock()
	changed := now != w.answers
	w.answers = now
	w.mu.Unlock()
	if changed {
		e.log.Info("round answers", "module", "executor", "job", w.l.JobID[:12], "worker", w.l.Index,
			"accepted", p.Accepted, "refused", p.Refused, "refused_in_a_row", p.RefusedRun)
	}
	return p.RefusedRun
}

// statusOf is worker w's report to its submitter, with its progress.
func (e *Executor) statusOf(w *worker) p2p.JobStatus {
	st := w.status(time.Now())
	st.Progress = e.readProgress(w)
	return st
}
