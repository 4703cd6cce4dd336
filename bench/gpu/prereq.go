package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Check is one prerequisite.
type Check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

// prereqs is what prerequisites found.
type prereqs struct {
	checks  []Check
	device  string   // GPU 0's name
	gpus    []string // "index, name, memory MiB" per GPU
	version string   // the framework's version in -python
}

func (p *prereqs) add(name string, ok bool, format string, args ...any) {
	p.checks = append(p.checks, Check{Name: name, OK: ok, Detail: fmt.Sprintf(format, args...)})
}

// missing is what the failed checks say.
func (p *prereqs) missing() []string {
	var out []string
	for _, c := range p.checks {
		if !c.OK {
			out = append(out, c.Detail)
		}
	}
	return out
}

// prerequisites checks, all of them whatever fails: root, nvidia-smi and a
// GPU, the Python and whether its TensorFlow sees a GPU, the data set, the
// example and the binary.
func (b *bench) prerequisites(ctx context.Context) prereqs {
	var p prereqs
	if os.Geteuid() == 0 {
		p.add("root", true, "running as root")
	} else {
		p.add("root", false, "not root (uid %d): the market's job sandbox needs root; run as root (sudo make bench-gpu)", os.Geteuid())
	}

	gpus, err := nvidiaSMI(ctx)
	switch {
	case err != nil:
		p.add("nvidia-smi", false, "%v", err)
	case len(gpus) == 0:
		p.add("nvidia-smi", false, "nvidia-smi lists no GPU")
	default:
		p.gpus = gpus
		p.device = strings.TrimSpace(strings.Split(gpus[0], ",")[1])
		p.add("nvidia-smi", true, "%d GPU(s): %s", len(gpus), strings.Join(gpus, "; "))
	}

	venv := filepath.Dir(filepath.Dir(b.python))
	if st, err := os.Stat(b.python); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		p.add("python", false, "no job Python at %s: run `make deps` (it makes the venv %s)", b.python, venv)
		p.add(b.cfg.Framework, false, "%s not checked: no Python at %s", b.cfg.Framework, b.python)
	} else if b.cfg.Framework == "torch" {
		p.add("python", true, "%s", b.python)
		version, n, err := torchGPUs(ctx, b.python)
		p.version = version
		switch {
		case err != nil:
			p.add("torch", false, "PyTorch in %s does not import: %v", b.python, err)
		case n == 0 && b.cfg.Rehearsal:
			p.add("torch", true, "PyTorch %s in %s sees no GPU (ignored: -rehearse)", version, b.python)
		case n == 0:
			p.add("torch", false, "PyTorch %s in %s sees no GPU: a CUDA build of PyTorch is wanted there", version, b.python)
		default:
			p.add("torch", true, "PyTorch %s in %s sees %d GPU(s)", version, b.python, n)
		}
	} else {
		p.add("python", true, "%s", b.python)
		version, n, cuda, err := tfGPUs(ctx, b.python)
		p.version = version
		switch {
		case err != nil:
			p.add("tensorflow", false, "TensorFlow in %s does not import: %v", venv, err)
		case n == 0 && b.cfg.Rehearsal:
			p.add("tensorflow", true, "TensorFlow %s in %s sees no GPU (ignored: -rehearse)", version, venv)
		case n == 0:
			why := ""
			if !cuda {
				why = " (it is built without CUDA: tensorflow-cpu)"
			}
			p.add("tensorflow", false, "TensorFlow %s in %s sees no GPU%s: install tensorflow[and-cuda] there "+
				"(%s/bin/pip install 'tensorflow[and-cuda]==%s')", version, venv, why, venv, version)
		default:
			p.add("tensorflow", true, "TensorFlow %s in %s sees %d GPU(s)", version, venv, n)
		}
	}

	var absent []string
	for _, f := range []string{"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"} {
		if !exists(filepath.Join(b.cfg.Data, f)) && !exists(filepath.Join(b.cfg.Data, f+".gz")) {
			absent = append(absent, f)
		}
	}
	if len(absent) > 0 {
		p.add("data", false, "Fashion-MNIST is not in %s (no %s[.gz]): run `make deps`", b.cfg.Data, strings.Join(absent, ", "))
	} else {
		p.add("data", true, "%s", b.cfg.Data)
	}
	if train := filepath.Join(b.bundle, "train.py"); !exists(train) {
		p.add("example", false, "no %s: run from the repository's root", train)
	} else {
		p.add("example", true, "%s", train)
	}
	if !exists(b.bin) {
		p.add("binary", false, "no %s: run `make build`", b.bin)
	} else {
		p.add("binary", true, "%s", b.bin)
	}
	if n := runtime.NumCPU(); n < b.cfg.Cores {
		p.add("cpus", false, "this machine has %d CPUs, the runs want %d (-cores)", n, b.cfg.Cores)
	} else {
		p.add("cpus", true, "%d, the runs get %d (-cores)", n, b.cfg.Cores)
	}
	if _, err := exec.LookPath("taskset"); err != nil {
		p.add("taskset", false, "no taskset (util-linux) on PATH: the runs by hand are pinned with it")
	} else {
		p.add("taskset", true, "on PATH")
	}
	return p
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// nvidiaSMI asks nvidia-smi for the GPUs, as the node's inventory does:
// "index, name, memory MiB" a line.
func nvidiaSMI(ctx context.Context) ([]string, error) {
	path, err := exec.LookPath("nvidia-smi")
	if err != nil {
		return nil, fmt.Errorf("no nvidia-smi on PATH: this machine has no NVIDIA driver (or no GPU)")
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("nvidia-smi failed: %v: %s", err, firstN(strings.TrimSpace(stderr.String()+string(out)), 300))
	}
	var gpus []string
	for _, line := range strings.Split(string(out), "\n") {
		parts := strings.Split(line, ",")
		if len(parts) != 3 {
			continue
		}
		if _, err := strconv.Atoi(strings.TrimSpace(parts[0])); err != nil || strings.TrimSpace(parts[1]) == "" {
			continue
		}
		gpus = append(gpus, fmt.Sprintf("%s, %s, %s MiB", strings.TrimSpace(parts[0]), strings.TrimSpace(parts[1]),
			strings.TrimSpace(parts[2])))
	}
	return gpus, nil
}

// tfProbe prints TensorFlow's version, the GPUs it sees and whether it
// was built with CUDA, on one line of its own.
const tfProbe = `import os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf
gpus = tf.config.list_physical_devices("GPU")
print("DM_TF %s %d %d" % (tf.__version__, len(gpus), int(tf.test.is_built_with_cuda())), flush=True)
`

// torchProbe prints PyTorch's version and the GPUs it sees.
const torchProbe = `import torch
print("DM_TORCH %s %d" % (torch.__version__, torch.cuda.device_count() if torch.cuda.is_available() else 0), flush=True)
`

// torchGPUs runs python's PyTorch and asks for the GPUs it sees.
func torchGPUs(ctx context.Context, python string) (version string, gpus int, err error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "-c", torchProbe)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "DM_TORCH" {
			n, _ := strconv.Atoi(f[2])
			return f[1], n, nil
		}
	}
	if err == nil {
		err = fmt.Errorf("no answer")
	}
	return "", 0, fmt.Errorf("%v: %s", err, firstN(lastLines(stderr.String(), 5), 600))
}

// tfGPUs runs python's TensorFlow and asks for the GPUs it sees.
func tfGPUs(ctx context.Context, python string) (version string, gpus int, cuda bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "-c", tfProbe)
	cmd.Env = append(os.Environ(), "TF_CPP_MIN_LOG_LEVEL=2")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 4 && f[0] == "DM_TF" {
			n, _ := strconv.Atoi(f[2])
			return f[1], n, f[3] == "1", nil
		}
	}
	if err == nil {
		err = fmt.Errorf("no answer")
	}
	return "", 0, false, fmt.Errorf("%v: %s", err, firstN(lastLines(stderr.String(), 5), 600))
}
