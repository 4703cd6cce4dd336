package node

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/p2p"
)

// heldBundle is the Fashion-MNIST example with a wrapper, run.py, that
// makes the workers of the ranks plan names hostile
// (python/tests/hostile_worker.py: lazy, scaled, random, nan, empty).
func heldBundle(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	for src, dst := range map[string]string{
		"../examples/fashion-mnist/train.py": "train.py",
		"../python/tests/hostile_worker.py":  "hostile_worker.py",
	} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, dst), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run := `import os, runpy, sys
plan = dict(p.split("=") for p in sys.argv[1].split(",") if p)
if os.environ.get("DM_ROLE") != "holder":
    os.environ["DM_HOSTILE"] = plan.get(os.environ.get("DM_RANK", ""), "")
sys.argv = ["hostile_worker.py"] + sys.argv[2:]
runpy.run_path("hostile_worker.py", run_name="__main__")
`
	if err := os.WriteFile(filepath.Join(dir, "run.py"), []byte(run), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestHeldDiLoCoPaysOnlyForAcceptedRounds: a diloco job whose submitter
// holds the model, on three lenders: worker 1's machine runs nothing at
// all (a lazy lender, its worker reported running), worker 2 multiplies
// its updates by 1000. The submitter's node runs the job's program once
// more as the holder; it refuses every update of worker 2 and drops it,
// goes on without worker 1, and the job succeeds with the holder's own
// model. Worker 0's machine is paid for its accepted rounds; the lazy and
// the poisoning machines only the job's floor (half their price) for the
// few rounds until the submitter stopped the one that handed nothing in
// and the holder dropped the other. Spot checks are on ([verify]): the
// holder replays some of worker 0's rounds, which pass, so none of its pay
// is held back. The bid names the holder's validation batch by content
// address, and the holder checks every update on that batch, as its
// accounts say. (With the holder's checks off the
// same poisoning worker is accepted and wrecks the model:
// python/tests/test_held_training.py, which also catches a worker that
// claims more steps than it took by its spot checks.)
func TestHeldDiLoCoPaysOnlyForAcceptedRounds(t *testing.T) {
	py := jobPython(t)
	c := startJobCluster(t, py, 3)
	a := c.sub
	before, err := a.client.Balance(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	bundle := heldBundle(t)
	batch := validationBatch(t, py, bundle)
	spec := jobs.File{Name: "held", Framework: "tensorflow", Bundle: bundle,
		Command: []string{"python3", "run.py", "1=lazy,2=scaled", "train.py", "--epochs", "3", "--steps-per-epoch", "60",
			"--join-timeout", "30", "--round-timeout", "20", "--no-overlap"},
		Dataset: "/usr/share/datasets/fashion-mnist", Workers: 3, Cores: 1, Memory: "2GiB", MaxPrice: "5", MaxDuration: "15m",
		Training: &p2p.Training{Mode: "diloco", SyncEvery: 20, Compress: "int8", Holder: p2p.HolderSubmitter, Validation: batch},
		Verify:   &jobs.VerifyFile{Rate: 0.5}}
	j, err := a.client.Submit(t.Context(), api.SubmitRequest{Spec: spec, Yes: true})
	if err != nil {
		t.Fatal(err)
	}
	batchCID := j.Spec.Training.Validation
	j = waitJob(t, a, j.ID, 8*time.Minute)
	log := jobLog(t, a, j.ID)
	if j.State != jobs.Succeeded || len(j.Runs) != 1 {
		t.Fatalf("the held job: %s (%s), %d run(s)\n%s", j.State, j.Reason, len(j.Runs), log)
	}
	for _, want := range []string{"[h] [holder] round 0: closing without rank(s) 1", "refused rank 2's update",
		"rank 2 dropped", "the model's holder starts on this machine", "rank 0's spot check passed",
		"adding the validation batch", "checking on the bid's validation batch " + batchCID + " (256 examples)"} {
		if !strings.Contains(log, want) {
			t.Errorf("the log lacks %q\n%s", want, log)
		}
	}
	run := j.Current()
	ws := run.Workers
	if run.Holder == nil || ws[0].Accepted < 8 || ws[0].AcceptedSeconds <= 0 || ws[1].Accepted != 0 || ws[2].Accepted != 0 ||
		ws[2].Refused < 3 || !ws[2].Dropped || ws[0].ChecksPassed < 1 || ws[0].HeldSeconds != 0 || ws[0].Forfeited {
		t.Errorf("the holder's accounts: %+v", ws)
	}

	// The result is the holder's own model.
	out := filepath.Join(t.TempDir(), "result")
	if _, err := a.client.DataGet(t.Context(), j.ResultCID, out, nil); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(out, "result.json"))
	if err != nil {
		t.Fatalf("result: %v\n%s", err, log)
	}
	var res struct {
		Held     bool    `json:"held"`
		Accuracy float64 `json:"test_accuracy"`
	}
	if err := json.Unmarshal(b, &res); err != nil || !res.Held || res.Accuracy < 0.75 {
		t.Errorf("the result %s: want the holder's, above 0.75 accuracy (%v)", b, err)
	}
	if _, err := os.Stat(filepath.Join(out, "model.keras")); err != nil {
		t.Errorf("the holder's model: %v", err)
	}
	var accounts struct {
		Validation string             `json:"validation"`
		Checks     map[string]float64 `json:"checks"`
	}
	if b, err := os.ReadFile(filepath.Join(out, "holder.json")); err != nil || json.Unmarshal(b, &accounts) != nil ||
		!jobs.IsCID(batchCID) || accounts.Validation != batchCID || accounts.Checks["echo"] != p2p.DefaultChecks().Echo {
		t.Errorf("the holder's accounts %s (%v): want checked on the bid's batch %q, by the bid's thresholds", b, err, batchCID)
	}

	// The honest machine is paid for its accepted rounds; the lazy and the
	// poisoning ones the floor only, for the time until the submitter
	// stopped them (absent for 3 rounds) or the holder dropped them.
	var paid [3]uint64
	for i, w := range ws {
		bal, err := a.client.Balance(t.Context(), w.Payee)
		if err != nil {
			t.Fatal(err)
		}
		paid[i] = bal.Balance
	}
	want := jobs.Used(run, &ws[0], time.Now())
	if paid[0] == 0 || paid[0] != want {
		t.Errorf("paid %v, want %d for worker 0 (%.1f s of accepted rounds)", paid, want, ws[0].AcceptedSeconds)
	}
	// Each stopped before the honest one finished, neither lost nor
	// marked failed: paid the floor for the time it ran.
	honest := jobs.RanUntil(&ws[0], time.Now()).Sub(ws[0].Started)
	for i := 1; i <= 2; i++ {
		floor := jobs.FloorOf(run, &ws[i], time.Now())
		ran := ws[i].Ended.Sub(ws[i].Started)
		if ws[i].Ended.IsZero() || paid[i] != floor || ran >= honest {
			t.Errorf("worker %d (benched: %q) ran %s (the honest one %s) and was paid %d: want its floor, %d (%+v)",
				i, ws[i].Benched, ran, honest, paid[i], floor, ws[i])
		}
	}
	if ws[1].Benched == "" {
		t.Errorf("the lazy worker was not stopped: %+v", ws[1])
	}
	waitRefunded(t, a, j)
	after, _ := a.client.Balance(t.Context(), "")
	// What the refused rounds of the poisoning worker would have paid is
	// withheld and burned: refusing them saved the submitter nothing.
	if sum := paid[0] + paid[1] + paid[2] + run.Withheld; before.Balance-after.Balance != sum || j.Cost != sum || run.Withheld == 0 {
		t.Errorf("the submitter spent %d, the job cost %d, the machines earned %v, %d withheld; the workers: %+v\n%s",
			before.Balance-after.Balance, j.Cost, paid, run.Withheld, ws, jobLog(t, a, j.ID))
	}
}

// validationBatch writes the holder's validation batch as the example
// makes it (train.py --write-validation: 256 training examples) and
// returns its path, for a held job's [training] validation.
func validationBatch(t *testing.T, py, bundle string) string {
	t.Helper()
	batch := filepath.Join(t.TempDir(), "validation.npz")
	if out, err := exec.Command(py, filepath.Join(bundle, "train.py"), "--data", "/usr/share/datasets/fashion-mnist",
		"--check-examples", "256", "--write-validation", batch).CombinedOutput(); err != nil {
		t.Fatalf("the validation batch: %v\n%s", err, out)
	}
	return batch
}

// TestHeldJobNeedsAHolderHere: a held job is refused at submit, saying
// why, by a node that could not run its holder (no Python environment),
// before anything is bid or escrowed.
func TestHeldJobNeedsAHolderHere(t *testing.T) {
	t.Parallel()
	h := initHome(t, t.TempDir(), testNet(t))
	n := startNode(t, h, func(c *Config) { c.Inventory.Python = "/nonexistent-deepmarket-venv/bin/python3" })
	spec := jobs.File{Name: "held", Framework: "tensorflow", Bundle: heldBundle(t), Command: []string{"python3", "train.py"},
		Workers: 2, Cores: 1, Memory: "1GiB", MaxPrice: "1", MaxDuration: "10m",
		Training: &p2p.Training{Mode: "diloco", Holder: p2p.HolderSubmitter}}
	_, err := n.client.Submit(t.Context(), api.SubmitRequest{Spec: spec, Yes: true})
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Field != "training.holder" || !strings.Contains(ae.Message, "Python environment") {
		t.Fatalf("a held job on a node that cannot hold it: %v", err)
	}
	if js, err := n.client.Jobs(t.Context()); err != nil || len(js) != 0 {
		t.Errorf("jobs after the refusal: %v %v", js, err)
	}
}
