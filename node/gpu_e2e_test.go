package node

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/jobs"
)

// gpuProbe prints the GPUs a worker is given, and stays a while so that
// the jobs overlap.
const gpuProbe = `import os, time
print("GPUS=%s" % os.environ.get("CUDA_VISIBLE_DEVICES", "unset"), flush=True)
time.sleep(6)
`

// TestGPUsAreTheWorkersOwn: a lender with two (stub) GPUs runs two GPU
// jobs at once; each worker sees one GPU, and not the same one.
func TestGPUsAreTheWorkersOwn(t *testing.T) {
	stub := t.TempDir()
	script := "#!/bin/sh\necho '0, NVIDIA A100-SXM4-40GB, 40960'\necho '1, NVIDIA A100-SXM4-40GB, 40960'\n"
	if err := os.WriteFile(filepath.Join(stub, "nvidia-smi"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", stub+string(os.PathListSeparator)+os.Getenv("PATH"))
	py := genericPython(t)
	c := startJobClusterLending(t, py, 1, api.LendRequest{Cores: 2, MemBytes: 2 << 30, GPUs: 2})
	a := c.sub
	bundle := t.TempDir()
	os.Chmod(bundle, 0o755)
	if err := os.WriteFile(filepath.Join(bundle, "gpu.py"), []byte(gpuProbe), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := func(name string) jobs.File {
		return jobs.File{Name: name, Framework: "generic", Command: []string{"python3", "gpu.py"}, Bundle: bundle,
			Workers: 1, Cores: 1, GPUs: 1, Memory: "256MiB", MaxPrice: "5", MaxDuration: "10m"}
	}
	var wg sync.WaitGroup
	ids := make([]string, 2)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			j, err := a.client.Submit(t.Context(), api.SubmitRequest{Spec: spec("gpu-" + string(rune('a'+i))), Yes: true})
			if err != nil {
				t.Error(err)
				return
			}
			ids[i] = j.ID
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	seen := regexp.MustCompile(`GPUS=(\S+)`)
	var got, logs []string
	for _, id := range ids {
		j := waitJob(t, a, id, 3*time.Minute)
		log := jobLog(t, a, id)
		if j.State != jobs.Succeeded {
			t.Fatalf("job %s: %s\n%s", j.State, j.Reason, log)
		}
		m := seen.FindStringSubmatch(log)
		if m == nil {
			t.Fatalf("the worker printed no GPUs:\n%s", log)
		}
		got, logs = append(got, m[1]), append(logs, log)
	}
	slices.Sort(got)
	if !slices.Equal(got, []string{"0", "1"}) {
		t.Fatalf("the two jobs' workers saw GPUs %v; want one each, 0 and 1\n%s\n%s", got, logs[0], logs[1])
	}
}
