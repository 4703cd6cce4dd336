package jobs

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/p2p"
)

func bundleDir(t *testing.T) string {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "train.py"), []byte("print('hi')\n"), 0o644)
	return dir
}

const good = `
name = "fashion"
framework = "tensorflow"
command = ["python3", "train.py", "--epochs", "2"]
bundle = "."
dataset = "."
workers = 2
cores = 1
memory = "2GiB"
max_price = "5"
max_duration = "30m"
`

func TestParseSpec(t *testing.T) {
	dir := bundleDir(t)
	s, err := ParseSpec([]byte(good), dir)
	if err != nil {
		t.Fatal(err)
	}
	if s.Bundle != dir || s.Workers != 2 || s.MemBytes != 2<<30 || s.MaxPrice != 5_000_000 || s.MaxDuration != 30*time.Minute {
		t.Errorf("parsed %+v", s)
	}
	// [training] reaches the spec, and so every launch.
	tr := good + "[training]\nmode = \"diloco\"\nsync_every = 50\ncompress = \"fp16\"\n"
	if s, err := ParseSpec([]byte(tr), dir); err != nil || s.Training == nil || !reflect.DeepEqual(*s.Training, p2p.Training{Mode: "diloco", SyncEvery: 50, Compress: "fp16"}) {
		t.Errorf("a [training] block: %v %+v", err, s)
	} else if env := strings.Join(s.Training.Env(), " "); env != "DM_TRAINING_MODE=diloco DM_SYNC_EVERY=50 DM_COMPRESS=fp16" {
		t.Errorf("its environment: %s", env)
	}
	// So does the work it describes, for quotes that predict its time.
	work := good + "[training]\nsteps = 5000\nparams = 120000\nstep_ms = 55.5\nsteps_ratio = [1, 0.6, 0.45]\n"
	if s, err := ParseSpec([]byte(work), dir); err != nil || s.Training == nil || !reflect.DeepEqual(*s.Training,
		p2p.Training{Mode: "sync", Steps: 5000, Params: 120_000, StepMillis: 55.5, StepsRatio: []float64{1, 0.6, 0.45}}) {
		t.Errorf("[training] steps, params, step_ms, steps_ratio: %v %+v", err, s)
	}
	// A held job has spot checks whatever it says: each worker checked
	// once in expectation (6 rounds: 1/6), and the default floor.
	if s, err := ParseSpec([]byte(good+"[training]\nmode = \"diloco\"\nholder = \"submitter\"\nsteps = 600\nsync_every = 100\n"), dir); err != nil ||
		s.Training.Verify == nil || s.Training.Verify.Rate != 1.0/6 || s.Training.Verify.Share != p2p.DefaultVerifyShare || s.Floor != p2p.DefaultFloor {
		t.Errorf("a held job's default spot checks: %v %+v", err, s)
	}
	// [verify] turns on a held job's spot checks, with their defaults.
	held := good + "[training]\nmode = \"diloco\"\nholder = \"submitter\"\n[verify]\nrate = 0.25\n"
	if s, err := ParseSpec([]byte(held), dir); err != nil || s.Training == nil || s.Training.Verify == nil ||
		*s.Training.Verify != (p2p.Verify{Rate: 0.25, Share: p2p.DefaultVerifyShare, Tolerance: p2p.DefaultVerifyTolerance}) {
		t.Errorf("[verify]: %v %+v", err, s)
	}
	if s, err := ParseSpec([]byte(held+"share = 0\ntolerance = 0.05\n"), dir); err != nil || *s.Training.Verify != (p2p.Verify{Rate: 0.25, Tolerance: 0.05}) {
		t.Errorf("[verify] share = 0: %v %+v", err, s)
	}
	// [verify] in a diloco job that names no holder asks for one.
	if s, err := ParseSpec([]byte(good+"[training]\nmode = \"diloco\"\n[verify]\nrate = 0.25\n"), dir); err != nil || !s.Training.Held() {
		t.Errorf("[verify] without a holder: %v %+v", err, s)
	}
	// A held job's validation batch is a file (its path made absolute, or
	// a CID), and its thresholds are those named, the rest the defaults.
	if err := os.WriteFile(filepath.Join(dir, "val.npz"), []byte("batch"), 0o600); err != nil {
		t.Fatal(err)
	}
	withBatch := good + "[training]\nmode = \"diloco\"\nholder = \"submitter\"\nvalidation = \"val.npz\"\n[training.checks]\necho = 0.95\n"
	if s, err := ParseSpec([]byte(withBatch), dir); err != nil || s.Training.Validation != filepath.Join(dir, "val.npz") ||
		s.Training.Checks == nil || s.Training.Checks.Echo != 0.95 || s.Training.Checks.Tolerance != p2p.DefaultChecks().Tolerance {
		t.Errorf("[training] validation and checks: %v %+v", err, s)
	}
	for _, v := range []string{"missing.npz", "."} {
		spec := strings.Replace(withBatch, "val.npz", v, 1)
		if _, err := ParseSpec([]byte(spec), dir); err == nil || !strings.Contains(err.Error(), "training.validation") {
			t.Errorf("validation = %q: %v, want refused", v, err)
		}
	}
	if _, err := ParseSpec([]byte(strings.Replace(withBatch, "echo = 0.95", "echo = 0.2", 1)), dir); err == nil ||
		!strings.Contains(err.Error(), "checks echo") {
		t.Errorf("echo = 0.2: %v, want refused", err)
	}
	// Measured statistics better than perfect scaling are refused.
	if _, err := ParseSpec([]byte(good+"[training]\nsteps_ratio = [1, 0.3]\n"), dir); err == nil || !strings.Contains(err.Error(), "steps_ratio") {
		t.Errorf("steps_ratio [1, 0.3]: %v", err)
	}
	// A CID is taken as is.
	cidSpec := strings.Replace(good, `bundle = "."`, `bundle = "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"`, 1)
	if s, err := ParseSpec([]byte(cidSpec), dir); err != nil || !IsCID(s.Bundle) {
		t.Errorf("a bundle CID: %v %+v", err, s)
	}
}

func TestSpecErrorsNameTheKey(t *testing.T) {
	dir := bundleDir(t)
	for _, tc := range []struct{ from, to, key string }{
		{`workers = 2`, `workers = 0`, "workers"},
		{`workers = 2`, `workers = 100000`, "workers"},
		{`cores = 1`, `cores = -1`, "cores"},
		{`memory = "2GiB"`, `memory = "lots"`, "memory"},
		{`memory = "2GiB"`, `memory = "4PiB"`, "memory"},
		{`framework = "tensorflow"`, `framework = "spark"`, "framework"},
		{`framework = "tensorflow"`, `framework = "torch"`, "image"}, // torch runs in the job's own image
		{`max_price = "5"`, `max_price = "0"`, "max_price"},
		{`max_price = "5"`, ``, "max_price"},
		{`max_duration = "30m"`, `max_duration = "30s"`, "max_duration"},
		{`max_duration = "30m"`, `max_duration = "forever"`, "max_duration"},
		{`max_duration = "30m"`, "max_duration = \"30m\"\nmax_wait = \"soon\"", "max_wait"},
		{`max_duration = "30m"`, "max_duration = \"30m\"\nmax_wait = \"-1h\"", "max_wait"},
		{`max_duration = "30m"`, "max_duration = \"30m\"\nmax_wait = \"1000h\"", "max_wait"},
		{`max_duration = "30m"`, "max_duration = \"30m\"\nstall_after = \"soon\"", "stall_after"},
		{`max_duration = "30m"`, "max_duration = \"30m\"\nstall_after = \"5s\"", "stall_after"},
		{`max_duration = "30m"`, "max_duration = \"30m\"\nstall_after = \"31m\"", "stall_after"},
		{`bundle = "."`, `bundle = "./nowhere"`, "bundle"},
		{`bundle = "."`, `bundle = "train.py"`, "bundle"},
		{`command = ["python3", "train.py", "--epochs", "2"]`, `command = []`, "command"},
		{`command = ["python3", "train.py", "--epochs", "2"]`, `command = ["python3", "../../etc/passwd"]`, "command"},
		{`command = ["python3", "train.py", "--epochs", "2"]`, `command = ["/bin/sh", "-c", "cat ~/.ssh/id_rsa"]`, "command"},
		{`command = ["python3", "train.py", "--epochs", "2"]`, `command = ["python3", "missing.py"]`, "command"},
		{`command = ["python3", "train.py", "--epochs", "2"]`, `command = ["./python3", "train.py"]`, "command[0]"},
		{`command = ["python3", "train.py", "--epochs", "2"]`, `command = ["sh", "-c", "cat /etc/passwd"]`, "command[0]"},
		{`command = ["python3", "train.py", "--epochs", "2"]`, `command = ["bash", "train.py"]`, "command[0]"},
		{`name = "fashion"`, `name = "bad name!"`, "name"},
		{`name = "fashion"`, "name = \"fashion\"\ncolour = \"red\"", "colour"},
		{`max_duration = "30m"`, "max_duration = \"30m\"\n[training]\nmode = \"async\"", "training"},
		{`max_duration = "30m"`, "max_duration = \"30m\"\n[training]\nmode = \"diloco\"\nsync_every = -5", "training"},
		{`max_duration = "30m"`, "max_duration = \"30m\"\n[training]\nmode = \"diloco\"\ncompress = \"zip\"", "training"},
		{`max_duration = "30m"`, "max_duration = \"30m\"\n[training]\nsync_every = 10", "training"},
		{`max_duration = "30m"`, "max_duration = \"30m\"\n[training]\nmode = \"diloco\"\nevery = 10", "training.every"},
		{`max_duration = "30m"`, "max_duration = \"30m\"\n[training]\nsteps = -1", "training"},
		{`max_duration = "30m"`, "max_duration = \"30m\"\n[training]\nparams = 100000000001", "training"},
		{`max_duration = "30m"`, "max_duration = \"30m\"\n[training]\nstep_ms = nan", "training"},
		{`max_duration = "30m"`, "max_duration = \"30m\"\n[verify]\nrate = 0.1", "verify"},
		{`max_duration = "30m"`, "max_duration = \"30m\"\n[training]\nmode = \"diloco\"\nholder = \"workers\"\n[verify]\nrate = 0.1", "training"},
		{`max_duration = "30m"`, "max_duration = \"30m\"\n[training]\nmode = \"diloco\"\nholder = \"submitter\"\n[verify]\nrate = 2", "verify"},
		{`max_duration = "30m"`, "max_duration = \"30m\"\n[training]\nmode = \"diloco\"\nholder = \"submitter\"\n[verify]\nrate = 0.1\nshare = 1.5", "verify"},
		// A greedy submitter's terms: everything held back, nothing checked.
		{`max_duration = "30m"`, "max_duration = \"30m\"\n[training]\nmode = \"diloco\"\nholder = \"submitter\"\n[verify]\nrate = 1e-9\nshare = 1.0", "verify"},
		{`max_duration = "30m"`, "max_duration = \"30m\"\n[training]\nmode = \"diloco\"\nholder = \"submitter\"\n[verify]\nrate = 0.5\nshare = 0.21", "verify"},
		{`max_duration = "30m"`, "max_duration = \"30m\"\n[training]\nmode = \"diloco\"\nholder = \"submitter\"\n[verify]\nrate = 0.05", "verify"},
		{`max_duration = "30m"`, "max_duration = \"30m\"\n[training]\nmode = \"diloco\"\nholder = \"submitter\"\nsteps = 600\nsync_every = 100\n[verify]\nrate = 0.1", "verify"},
		{`max_duration = "30m"`, "max_duration = \"30m\"\nfloor = 0.1", "floor"},
		{`max_duration = "30m"`, "max_duration = \"30m\"\nfloor = 1.5", "floor"},
	} {
		in := strings.Replace(good, tc.from, tc.to, 1)
		_, err := ParseSpec([]byte(in), dir)
		se, ok := err.(*SpecError)
		if !ok || se.Key != tc.key {
			t.Errorf("%s -> %s: error %v, want one about %q", tc.from, tc.to, err, tc.key)
		}
	}
}

// TestCommandProgram: the program is an interpreter lenders offer or a
// file of the bundle, and the refusal names the key.
func TestCommandProgram(t *testing.T) {
	dir := bundleDir(t)
	os.WriteFile(filepath.Join(dir, "run.sh"), []byte("#!/bin/sh\necho hi\n"), 0o755)
	for _, cmd := range []string{`["python3", "train.py"]`, `["python", "train.py"]`, `["./run.sh"]`, `["run.sh", "--fast"]`} {
		in := strings.Replace(good, `command = ["python3", "train.py", "--epochs", "2"]`, "command = "+cmd, 1)
		if _, err := ParseSpec([]byte(in), dir); err != nil {
			t.Errorf("command = %s: %v", cmd, err)
		}
	}
	in := strings.Replace(good, `command = ["python3", "train.py", "--epochs", "2"]`, `command = ["./python3", "probe.py"]`, 1)
	_, err := ParseSpec([]byte(in), dir)
	if err == nil || err.Error() != `command[0]: "./python3": not in the bundle and not an interpreter lenders offer (python3, python)` {
		t.Errorf("err = %v", err)
	}
	// A bundle given by CID is checked by the lender; the name must still
	// stay inside it.
	cidBundle := strings.Replace(good, `bundle = "."`, `bundle = "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"`, 1)
	if _, err := ParseSpec([]byte(strings.Replace(cidBundle, `command = ["python3", "train.py", "--epochs", "2"]`, `command = ["./run.sh"]`, 1)), dir); err != nil {
		t.Errorf("a bundle CID with ./run.sh: %v", err)
	}
	if _, err := ParseSpec([]byte(strings.Replace(cidBundle, `command = ["python3", "train.py", "--epochs", "2"]`, `command = ["../run.sh"]`, 1)), dir); err == nil {
		t.Error("a bundle CID with ../run.sh: accepted")
	}
}

// TestSpecMaxWait: a job waits 24h for machines unless it says; "0s"
// means not at all.
func TestSpecMaxWait(t *testing.T) {
	dir := bundleDir(t)
	for _, tc := range []struct {
		line string
		want time.Duration
	}{{"", DefaultMaxWait}, {`max_wait = "2h"`, 2 * time.Hour}, {`max_wait = "0s"`, 0}} {
		s, err := ParseSpec([]byte(strings.Replace(good, `max_duration = "30m"`, "max_duration = \"30m\"\n"+tc.line, 1)), dir)
		if err != nil || s.MaxWait != tc.want {
			t.Errorf("%q: max wait %v (%v), want %s", tc.line, s, err, tc.want)
		}
	}
}

func TestStateMachine(t *testing.T) {
	path := []State{Submitted, Quoting, Reserving, Escrowed, Launching, Running, Succeeded}
	for i := 1; i < len(path); i++ {
		if !CanMove(path[i-1], path[i]) {
			t.Errorf("%s -> %s refused", path[i-1], path[i])
		}
	}
	for _, s := range path[:len(path)-1] {
		if !CanMove(s, Failed) || !CanMove(s, Cancelled) {
			t.Errorf("%s cannot fail or be cancelled", s)
		}
	}
	// A job that finds no machines waits, and bids again from there.
	for _, ok := range [][2]State{{Quoting, Waiting}, {Waiting, Quoting}, {Waiting, Cancelled}, {Waiting, Failed}} {
		if !CanMove(ok[0], ok[1]) {
			t.Errorf("%s -> %s refused", ok[0], ok[1])
		}
	}
	for _, bad := range [][2]State{{Submitted, Running}, {Quoting, Escrowed}, {Succeeded, Running}, {Failed, Quoting}, {Escrowed, Succeeded},
		{Waiting, Reserving}, {Waiting, Running}, {Running, Waiting}, {Cancelled, Waiting}} {
		if CanMove(bad[0], bad[1]) {
			t.Errorf("%s -> %s allowed", bad[0], bad[1])
		}
	}
	if RunID("ab", 0) != "ab" || RunID("ab", 1) == RunID("ab", 2) || len(RunID("ab", 1)) != 64 {
		t.Error("run IDs")
	}
}

// The example researchers start from must stay valid.
func TestExampleJobSpecValidates(t *testing.T) {
	if _, err := os.Stat("/usr/share/datasets/fashion-mnist"); err != nil {
		t.Skip("Fashion-MNIST is not installed (make deps)")
	}
	s, err := ReadSpec("../../examples/fashion-mnist/job.toml")
	if err != nil {
		t.Fatal(err)
	}
	if s.Workers != 2 || s.Framework != "tensorflow" || filepath.Base(s.Bundle) != "fashion-mnist" {
		t.Errorf("example spec: %+v", s)
	}
}

// TestSpecImage: image names an OCI image layout directory or a CID; a
// directory that is not a layout is refused, naming the key. In an image
// command[0] may be a program of the image by its absolute path; without
// one, such a path reaches outside the bundle and is refused.
func TestSpecImage(t *testing.T) {
	dir := bundleDir(t)
	layoutDir := filepath.Join(dir, "img")
	os.MkdirAll(layoutDir, 0o755)
	abs := strings.Replace(good, `command = ["python3", "train.py", "--epochs", "2"]`, `command = ["/usr/bin/python3", "train.py"]`, 1)
	if _, err := ParseSpec([]byte(abs), dir); err == nil || !strings.Contains(err.Error(), "command") {
		t.Errorf("an absolute program without an image: %v", err)
	}
	_, err := ParseSpec([]byte(abs+"image = \"img\"\n"), dir)
	if se := (*SpecError)(nil); err == nil || !errors.As(err, &se) || se.Field() != "image" || !strings.Contains(err.Error(), "index.json") {
		t.Errorf("an image directory that is not a layout: %v", err)
	}
	os.WriteFile(filepath.Join(layoutDir, "index.json"), []byte(`{"schemaVersion":2,"manifests":[]}`), 0o644)
	if s, err := ParseSpec([]byte(abs+"image = \"img\"\n"), dir); err != nil || s.Image != layoutDir || s.Command[0] != "/usr/bin/python3" {
		t.Errorf("an image layout and a program of it: %v %+v", err, s)
	}
	cid := "bafybeigdyrzt5sfp7udm7hu76uh7y26nf3efuylqabf3oclgtqy55fbzdi"
	if s, err := ParseSpec([]byte(abs+"image = \""+cid+"\"\n"), dir); err != nil || s.Image != cid {
		t.Errorf("an image by CID: %v %+v", err, s)
	}
	if _, err := ParseSpec([]byte(strings.Replace(abs, `"/usr/bin/python3"`, `"/usr/../etc/x"`, 1)+"image = \"img\"\n"), dir); err == nil {
		t.Error("a program path climbing with .. in an image was taken")
	}
}
