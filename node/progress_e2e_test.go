package node

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/jobs"
)

// TestStalledJobStopsAndPaysForProgress: a real job on a real lender
// reports progress through the deepmarket package for a few seconds, then
// hangs. The submitter stops the run once it has made no progress for the
// job's stall_after (not at its max duration), does not re-place it, and
// pays the machine its price only up to the worker's last progress, and
// for the time it hung only the job's floor.
func TestStalledJobStopsAndPaysForProgress(t *testing.T) {
	t.Parallel()
	py := jobPython(t)
	c := startJobClusterLending(t, py, 1, api.LendRequest{Cores: 1, MemBytes: 1 << 30})
	dir := t.TempDir()
	script := "import time\nimport deepmarket.progress as p\np.report(0, force=True)\n" +
		"for i in range(1, 4):\n    time.sleep(1)\n    p.report(i, 1.0 / i, force=True)\n" +
		"print('stalling', flush=True)\ntime.sleep(600)\n"
	if err := os.WriteFile(filepath.Join(dir, "job.py"), []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := jobs.File{Name: "stalls", Framework: "generic", Command: []string{"python3", "job.py"}, Bundle: dir,
		Workers: 1, Cores: 1, Memory: "256MiB", MaxPrice: "1", MaxDuration: "10m", StallAfter: "10s"}
	j, err := c.sub.client.Submit(t.Context(), api.SubmitRequest{Spec: spec, Yes: true})
	if err != nil {
		t.Fatal(err)
	}
	j = waitJob(t, c.sub, j.ID, 2*time.Minute)
	if j.State != jobs.Failed || !strings.Contains(j.Reason, "no progress") || len(j.Runs) != 1 {
		t.Fatalf("the stalled job: %s (%s), %d run(s)\n%s", j.State, j.Reason, len(j.Runs), jobLog(t, c.sub, j.ID))
	}
	run := j.Current()
	w := run.Workers[0]
	if !run.Progress || w.Units != 3 || w.ProgressAt.IsZero() || w.Started.IsZero() {
		t.Fatalf("the worker's progress: %+v", w)
	}
	hung := w.LastSeen.Sub(w.ProgressAt)
	if w.Ended.After(w.ProgressAt) {
		hung = w.Ended.Sub(w.ProgressAt)
	}
	if hung < 10*time.Second || hung > 40*time.Second {
		t.Errorf("stopped %s after its last progress, want stall_after (10s) and a poll or two", hung)
	}
	// Paid for its progress, and the job's floor (half its price) for the
	// time it hung until the submitter stopped it: not its full price.
	progressed := w.ProgressAt.Sub(w.Started)
	full := uint64(float64(w.PerHour)*(progressed+hung).Hours()) + 1
	slack := uint64(float64(w.PerHour) * (2 * time.Second).Hours()) // the settlement counts to the last poll
	if !run.Settled || run.Paid < uint64(float64(w.PerHour)*progressed.Hours()) || run.Paid > full/2+slack {
		t.Errorf("paid %d for %s of progress (the whole %d), settled %v; it hung %s more", run.Paid, progressed, full, run.Settled, hung)
	}
	if rep, err := settledAudit(t, c.sub); err != nil || !rep.OK || rep.Escrowed != 0 {
		t.Fatalf("audit: %+v %v", rep, err)
	}
}
