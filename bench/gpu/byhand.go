package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// resultFile is what train.py writes to result.json (the fields read here).
type resultFile struct {
	ExamplesPerS float64  `json:"examples_per_s"`
	FitS         float64  `json:"fit_seconds"`
	FirstStepS   *float64 `json:"first_step_seconds"`
	Workers      int      `json:"workers"`
	Model        string   `json:"model"`
	TensorFlow   string   `json:"tensorflow"`
	Torch        string   `json:"torch"`
	Steps        int      `json:"steps_per_epoch"`
	Batch        int      `json:"global_batch_size"`
}

// readResultFile reads dir/result.json into r, checking it is the run asked for.
func (b *bench) readResultFile(dir string, r *Run) error {
	raw, err := os.ReadFile(filepath.Join(dir, "result.json"))
	if err != nil {
		return err
	}
	var res resultFile
	if err := json.Unmarshal(raw, &res); err != nil {
		return fmt.Errorf("result.json: %w", err)
	}
	if res.Workers != 1 || res.Model != b.cfg.Model || res.Steps != r.Steps || res.Batch != b.cfg.BatchSize {
		return fmt.Errorf("result.json says %d worker(s), model %s, %d steps of %d; want 1, %s, %d of %d",
			res.Workers, res.Model, res.Steps, res.Batch, b.cfg.Model, r.Steps, b.cfg.BatchSize)
	}
	if res.ExamplesPerS <= 0 {
		return fmt.Errorf("result.json says %g examples/s", res.ExamplesPerS)
	}
	r.ExamplesPerS, r.FitS, r.Version = res.ExamplesPerS, res.FitS, res.TensorFlow+res.Torch
	if res.FirstStepS != nil {
		r.FirstStepS = *res.FirstStepS
	}
	return nil
}

func (b *bench) byHandGPU(ctx context.Context) Run {
	log.Printf("== gpu: by hand on the GPU, %d steps", b.cfg.Steps)
	return b.byHand(ctx, "gpu", "by hand, a plain process on GPU 0 (CUDA_VISIBLE_DEVICES=0)", "0", b.cfg.Steps)
}

func (b *bench) byHandCPU(ctx context.Context) Run {
	log.Printf("== cpu: by hand on %d CPU cores, %d steps", b.cfg.Cores, b.cfg.CPUSteps)
	return b.byHand(ctx, "cpu", fmt.Sprintf("by hand, a CPU worker of %d cores (CUDA_VISIBLE_DEVICES=\"\")", b.cfg.Cores),
		"", b.cfg.CPUSteps)
}

// byHand runs train.py as a plain process in the example's folder,
// pinned to the bench's CPUs with DM_CORES set to their number, seeing
// the GPUs in visible (CUDA_VISIBLE_DEVICES), and reads its result.json.
func (b *bench) byHand(ctx context.Context, name, how, visible string, steps int) Run {
	cmd := trainCommand(b.cfg, steps)
	r := Run{Name: name, How: how, Steps: steps, CPUs: b.cpus, Command: cmd}
	dir, err := os.MkdirTemp("", "dm-bench-gpu-"+name+"-")
	if err != nil {
		r.Error = err.Error()
		return r
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "out")
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	argv := append([]string{"-c", cpuList(b.cpus), b.python}, cmd[1:]...)
	c := exec.CommandContext(ctx, "taskset", argv...)
	c.Dir = b.bundle
	c.Env = append(cleanEnv(), "DM_CORES="+strconv.Itoa(b.cfg.Cores), "DM_DATA_DIR="+b.cfg.Data, "DM_OUTPUT_DIR="+out,
		"CUDA_VISIBLE_DEVICES="+visible, "TF_CPP_MIN_LOG_LEVEL=2")
	r.Log = filepath.Join(b.logs, name+".log")
	logf, err := os.Create(r.Log)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	defer logf.Close()
	fmt.Fprintf(logf, "$ cd %s && CUDA_VISIBLE_DEVICES=%q DM_CORES=%d taskset %s\n", c.Dir, visible, b.cfg.Cores, strings.Join(argv, " "))
	c.Stdout, c.Stderr = logf, logf
	watch := watchGPU(ctx)
	t0 := time.Now()
	err = c.Run()
	r.WallS = time.Since(t0).Seconds()
	r.GPUMemMiB, r.GPUUtil = watch()
	if err != nil {
		text, _ := os.ReadFile(r.Log)
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%v)", err, ctx.Err())
		}
		r.Error = fmt.Sprintf("train.py: %v; the end of its log (%s):\n%s", err, r.Log, lastLines(string(text), 8))
		return r
	}
	if err := b.readResultFile(out, &r); err != nil {
		r.Error = err.Error()
	}
	return r
}

// cleanEnv is this process's environment less what would change how
// train.py runs (a cluster, GPUs, cores, dirs): the runs set their own.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "DM_") || k == "TF_CONFIG" || k == "CUDA_VISIBLE_DEVICES" || k == "NVIDIA_VISIBLE_DEVICES" {
			continue
		}
		env = append(env, kv)
	}
	return env
}

func cpuList(cpus []int) string {
	s := make([]string, len(cpus))
	for i, c := range cpus {
		s[i] = strconv.Itoa(c)
	}
	return strings.Join(s, ",")
}

// watchGPU samples GPU 0's memory in use and utilization every second
// until the returned function is called, which returns the most of each.
// Samples nvidia-smi does not answer are skipped.
func watchGPU(ctx context.Context) func() (memMiB, util int) {
	ctx, cancel := context.WithCancel(ctx)
	var mu sync.Mutex
	var mem, use int
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			if m, u, ok := sampleGPU(ctx); ok {
				mu.Lock()
				mem, use = max(mem, m), max(use, u)
				mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return func() (int, int) {
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		return mem, use
	}
}

func sampleGPU(ctx context.Context) (memMiB, util int, ok bool) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "nvidia-smi", "-i", "0", "--query-gpu=memory.used,utilization.gpu",
		"--format=csv,noheader,nounits").Output()
	if err != nil {
		return 0, 0, false
	}
	f := strings.Split(strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0]), ",")
	if len(f) != 2 {
		return 0, 0, false
	}
	m, err1 := strconv.Atoi(strings.TrimSpace(f[0]))
	u, err2 := strconv.Atoi(strings.TrimSpace(f[1]))
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return m, u, true
}
