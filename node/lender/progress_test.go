package lender

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/p2p"
)

// TestReadProgress: the node, as root, reads the progress file a job
// controls. What the deepmarket package writes is reported; a FIFO does
// not hold the node, a link does not lead it out of the worker's dir (to
// another worker's report or the host's files), and an oversized or
// malformed file is no report.
func TestReadProgress(t *testing.T) {
	work := filepath.Join(t.TempDir(), "work")
	e := workAreaExecutor(t, work, newMemStore())
	w := &worker{name: "w1"}
	tmp := filepath.Join(work, "w1", "tmp")
	other := filepath.Join(work, "w2", "tmp")
	for _, d := range []string{tmp, other} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(other, "progress.json"), []byte(`{"units": 999}`), 0o644); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(tmp, "progress.json")
	write := func(s string) {
		os.Remove(file)
		if err := os.WriteFile(file, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if p := e.readProgress(w); p != nil {
		t.Errorf("no file: %+v", p)
	}
	write(`{"units": 42, "loss": 0.31}`)
	if p := e.readProgress(w); p == nil || *p != (p2p.Progress{Units: 42, Loss: 0.31}) {
		t.Errorf("the package's report: %+v", p)
	}
	// A training program's report: steps of total, accuracy, evaluation.
	write(`{"units": 50, "loss": 0.4, "steps": 45, "total": 900, "accuracy": 0.81, "eval_loss": 0.45, "eval_accuracy": 0.8, "eval_at": 40}`)
	if p := e.readProgress(w); p == nil || *p != (p2p.Progress{Units: 50, Loss: 0.4, Steps: 45, Total: 900, Accuracy: 0.81,
		EvalLoss: 0.45, EvalAccuracy: 0.8, EvalAt: 40}) {
		t.Errorf("a training report: %+v", p)
	}
	// A figure out of bounds is left out; the count still counts.
	write(`{"units": 51, "loss": -1e300, "accuracy": 7, "eval_accuracy": -0.5, "eval_loss": 1e300}`)
	if p := e.readProgress(w); p == nil || *p != (p2p.Progress{Units: 51}) {
		t.Errorf("figures out of bounds: %+v", p)
	}
	for name, s := range map[string]string{
		"a count out of bounds": `{"units": 5, "total": 1e18}`,
		"negative":              `{"units": -1}`,
		"no units":              `{"loss": 0.5}`,
		"not JSON":              `units=5`,
		"too large":             `{"units": 1, "pad": "` + strings.Repeat("x", 1<<20) + `"}`,
	} {
		write(s)
		if p := e.readProgress(w); p != nil {
			t.Errorf("%s: %+v", name, p)
		}
	}
	for name, target := range map[string]string{
		"another worker's report": filepath.Join("..", "..", "w2", "tmp", "progress.json"),
		"the host's file":         "/etc/hostname",
	} {
		os.Remove(file)
		if err := os.Symlink(target, file); err != nil {
			t.Fatal(err)
		}
		if p := e.readProgress(w); p != nil {
			t.Errorf("a link to %s: read %+v", name, p)
		}
	}
	os.Remove(file)
	if err := syscall.Mkfifo(file, 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan *p2p.Progress)
	go func() { done <- e.readProgress(w) }()
	select {
	case p := <-done:
		if p != nil {
			t.Errorf("a FIFO: %+v", p)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a FIFO holds the node")
	}
}
