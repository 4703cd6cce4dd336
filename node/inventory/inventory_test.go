package inventory

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestDetectBasics(t *testing.T) {
	inv := Detect(t.Context(), t.TempDir(), "python3")
	if inv.Cores != runtime.NumCPU() || inv.MemBytes == 0 || inv.DiskFree == 0 {
		t.Fatalf("inventory %+v: want cores, memory and disk", inv)
	}
	if inv.Python == "" {
		t.Fatalf("python3 is on PATH but no version detected: %+v", inv)
	}
}

// A stub nvidia-smi on PATH stands in for a GPU machine.
func TestDetectGPUsWithStubNvidiaSMI(t *testing.T) {
	dir := t.TempDir()
	stub := "#!/bin/sh\necho '0, NVIDIA A100-SXM4-40GB, 40960'\necho '1, NVIDIA A100-SXM4-40GB, 40960'\n"
	if err := os.WriteFile(filepath.Join(dir, "nvidia-smi"), []byte(stub), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	gpus := detectGPUs(context.Background())
	if len(gpus) != 2 || gpus[1].Index != 1 || gpus[0].Model != "NVIDIA A100-SXM4-40GB" || gpus[0].MemBytes != 40960<<20 {
		t.Fatalf("gpus = %+v", gpus)
	}
}

func TestNoNvidiaSMIMeansNoGPUs(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	if g := detectGPUs(context.Background()); len(g) != 0 {
		t.Fatalf("gpus without nvidia-smi: %+v", g)
	}
}

func TestParseNvidiaSMIIgnoresJunk(t *testing.T) {
	got := parseNvidiaSMI([]byte("garbage\n0, Tesla T4, 15360\n\nx, y, z\n"))
	if len(got) != 1 || got[0].Model != "Tesla T4" {
		t.Fatalf("parse = %+v", got)
	}
}

func TestPythonMissing(t *testing.T) {
	py, tf, done := detectPython(context.Background(), "/nonexistent/python3")
	if py != "" || tf != "" || !done {
		t.Fatalf("missing python gave %q %q (done %v)", py, tf, done)
	}
}

// TestSlowProbeIsNotAbsence: a Python that takes longer than the probe's
// timeout to import TensorFlow (a busy machine) leaves the inventory
// probing, software unknown, rather than saying TensorFlow is absent;
// one that answers in time is read.
func TestSlowProbeIsNotAbsence(t *testing.T) {
	defer func(d time.Duration) { PythonProbeTimeout = d }(PythonProbeTimeout)
	PythonProbeTimeout = 500 * time.Millisecond
	defer func(d string) { ProbeCacheDir = d }(ProbeCacheDir)
	ProbeCacheDir = t.TempDir()
	dir := t.TempDir()
	fake := func(name, body string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
			t.Fatal(err)
		}
		return path
	}
	slow := fake("slow", "echo 3.11.2\nexec sleep 30\n")
	if inv := Detect(t.Context(), dir, slow); !inv.Probing || inv.Python != "" || inv.TensorFlow != "" {
		t.Errorf("a probe cut short: %+v, want probing with nothing known", inv)
	}
	quick := fake("quick", "echo 3.11.2\necho 2.20.0\n")
	if inv := Detect(t.Context(), dir, quick); inv.Probing || inv.Python != "3.11.2" || inv.TensorFlow != "2.20.0" {
		t.Errorf("a probe in time: %+v", inv)
	}
	notf := fake("notf", "echo 3.11.2\necho\n")
	if inv := Detect(t.Context(), dir, notf); inv.Probing || inv.Python != "3.11.2" || inv.TensorFlow != "" {
		t.Errorf("a Python without TensorFlow: %+v", inv)
	}
}

// TestProbeIsKept: a finished probe is kept, and read instead of running
// Python again, until the interpreter or its packages change; a probe
// cut short is not kept, nor is anything with the cache off.
func TestProbeIsKept(t *testing.T) {
	defer func(d string) { ProbeCacheDir = d }(ProbeCacheDir)
	ProbeCacheDir = t.TempDir()
	venv := t.TempDir()
	site := filepath.Join(venv, "lib", "python3.11", "site-packages")
	if err := os.MkdirAll(site, 0o755); err != nil {
		t.Fatal(err)
	}
	runs := filepath.Join(venv, "runs")
	python := filepath.Join(venv, "bin", "python3")
	write := func(tf string) {
		os.MkdirAll(filepath.Dir(python), 0o755)
		body := "#!/bin/sh\necho x >>" + runs + "\necho 3.11.2\necho " + tf + "\n"
		if err := os.WriteFile(python, []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	count := func() int {
		b, _ := os.ReadFile(runs)
		return strings.Count(string(b), "x")
	}
	detect := func(want string) {
		t.Helper()
		if inv := Detect(t.Context(), venv, python); inv.Probing || inv.TensorFlow != want {
			t.Fatalf("%+v, want TensorFlow %q", inv, want)
		}
	}
	write("2.20.0")
	detect("2.20.0")
	detect("2.20.0")
	if n := count(); n != 1 {
		t.Fatalf("python ran %d times for two probes, want 1", n)
	}
	// A package installed: the site-packages directory changes.
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(site, later, later); err != nil {
		t.Fatal(err)
	}
	detect("2.20.0")
	if n := count(); n != 2 {
		t.Fatalf("python ran %d times after a package changed, want 2", n)
	}
	// The interpreter replaced.
	write("2.21.0")
	if err := os.Chtimes(python, later.Add(time.Minute), later.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	detect("2.21.0")
	if n := count(); n != 3 {
		t.Fatalf("python ran %d times after it changed, want 3", n)
	}
	ProbeCacheDir = ""
	detect("2.21.0")
	detect("2.21.0")
	if n := count(); n != 5 {
		t.Fatalf("python ran %d times with the cache off, want 5", n)
	}
}

// TestProbesStartedTogetherRunOnce: nodes probing the same environment at
// once share one run of Python; the rest read its answer.
func TestProbesStartedTogetherRunOnce(t *testing.T) {
	defer func(d string) { ProbeCacheDir = d }(ProbeCacheDir)
	ProbeCacheDir = t.TempDir()
	dir := t.TempDir()
	runs := filepath.Join(dir, "runs")
	python := filepath.Join(dir, "python3")
	body := "#!/bin/sh\necho x >>" + runs + "\nsleep 1\necho 3.11.2\necho 2.20.0\n"
	if err := os.WriteFile(python, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if inv := Detect(t.Context(), dir, python); inv.Probing || inv.TensorFlow != "2.20.0" {
				t.Errorf("%+v", inv)
			}
		})
	}
	wg.Wait()
	if b, _ := os.ReadFile(runs); strings.Count(string(b), "x") != 1 {
		t.Fatalf("python ran %d times for 4 probes at once, want 1", strings.Count(string(b), "x"))
	}
}
