package inventory

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"testing"
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
	py, tf := detectPython(context.Background(), "/nonexistent/python3")
	if py != "" || tf != "" {
		t.Fatalf("missing python gave %q %q", py, tf)
	}
}
