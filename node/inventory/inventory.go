package inventory

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/deepmarket/deepmarket/p2p"
)

// Inventory is what this machine has: the ceiling for what it may lend.
type Inventory struct {
	Cores      int       `json:"cores"`
	MemBytes   uint64    `json:"mem_bytes"`
	GPUs       []p2p.GPU `json:"gpus"`
	DiskFree   uint64    `json:"disk_free_bytes"`
	OS         string    `json:"os"`
	Arch       string    `json:"arch"`
	Python     string    `json:"python,omitempty"`     // version, empty if none
	TensorFlow string    `json:"tensorflow,omitempty"` // version, empty if not importable
	// Probing is set while the Python and TensorFlow probe (seconds, off
	// the start-up path) has not finished: Python and TensorFlow are not
	// known yet, rather than absent.
	Probing bool `json:"probing,omitempty"`
}

// Detect probes the machine: cores, memory, GPUs (through
// nvidia-smi when it is on PATH), free disk under dir, and whether python
// can import TensorFlow. Probes that fail leave their fields empty; the
// TensorFlow probe is bounded by ctx and PythonProbeTimeout, and one cut
// short (a busy machine imports TensorFlow slowly) leaves Probing set:
// not known yet, rather than absent.
func Detect(ctx context.Context, dir, python string) Inventory {
	inv := Inventory{Cores: runtime.NumCPU(), OS: runtime.GOOS, Arch: runtime.GOARCH}
	inv.MemBytes = memTotal()
	inv.DiskFree = DiskFree(dir)
	inv.GPUs = detectGPUs(ctx)
	var done bool
	inv.Python, inv.TensorFlow, done = detectPython(ctx, python)
	inv.Probing = !done
	return inv
}

// PythonProbeTimeout bounds one Python and TensorFlow probe: importing
// TensorFlow takes seconds on an idle machine and minutes on a busy one.
var PythonProbeTimeout = 3 * time.Minute

func memTotal() uint64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "MemTotal:" {
			kb, _ := strconv.ParseUint(fields[1], 10, 64)
			return kb * 1024
		}
	}
	return 0
}

// DiskFree is the bytes free on dir's filesystem, or the nearest existing
// parent's, for an unprivileged user.
func DiskFree(dir string) uint64 {
	for ; dir != ""; dir = parentDir(dir) {
		var st syscall.Statfs_t
		if err := syscall.Statfs(dir, &st); err == nil {
			return st.Bavail * uint64(st.Bsize)
		}
	}
	return 0
}

func parentDir(d string) string {
	i := strings.LastIndexByte(strings.TrimRight(d, "/"), '/')
	if i <= 0 {
		if d == "/" {
			return ""
		}
		return "/"
	}
	return d[:i]
}

// detectGPUs asks nvidia-smi for each GPU's index, name and memory.
func detectGPUs(ctx context.Context) []p2p.GPU {
	path, err := exec.LookPath("nvidia-smi")
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "--query-gpu=index,name,memory.total",
		"--format=csv,noheader,nounits").Output()
	if err != nil {
		return nil
	}
	return parseNvidiaSMI(out)
}

// parseNvidiaSMI reads "index, name, memory MiB" lines.
func parseNvidiaSMI(out []byte) []p2p.GPU {
	var gpus []p2p.GPU
	for _, line := range strings.Split(string(out), "\n") {
		parts := strings.Split(line, ",")
		if len(parts) != 3 {
			continue
		}
		idx, err1 := strconv.ParseUint(strings.TrimSpace(parts[0]), 10, 32)
		mib, err2 := strconv.ParseUint(strings.TrimSpace(parts[2]), 10, 64)
		name := strings.TrimSpace(parts[1])
		if err1 != nil || err2 != nil || name == "" {
			continue
		}
		gpus = append(gpus, p2p.GPU{Index: uint32(idx), Model: name, MemBytes: mib << 20})
	}
	return gpus
}

// detectPython returns python's version and TensorFlow's, if importable,
// and whether the probe finished (false: it was cut short, and neither
// is known). Importing TensorFlow takes seconds, so this runs off the
// start-up path, and a finished probe is kept (ProbeCacheDir) until the
// environment changes.
func detectPython(ctx context.Context, python string) (string, string, bool) {
	if python == "" {
		return "", "", true
	}
	ctx, cancel := context.WithTimeout(ctx, PythonProbeTimeout)
	defer cancel()
	key, keyed := probeKey(python)
	if keyed {
		if py, tf, ok := cachedProbe(key); ok {
			return py, tf, true
		}
		unlock, err := lockProbe(ctx, key)
		if err != nil {
			return "", "", false // another node's probe of it is still running
		}
		defer unlock()
		if py, tf, ok := cachedProbe(key); ok {
			return py, tf, true
		}
	}
	const probe = `import platform, sys
print(platform.python_version())
sys.stdout.flush()
try:
    import os
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf
    print(tf.__version__)
except Exception:
    print("")
`
	cmd := exec.CommandContext(ctx, python, "-c", probe)
	cmd.WaitDelay = 5 * time.Second // a child left holding its stdout does not hold the probe
	out, err := cmd.Output()
	if err != nil && ctx.Err() != nil {
		return "", "", false
	}
	if err != nil && len(out) == 0 {
		return "", "", true
	}
	lines := strings.Split(string(bytes.TrimRight(out, "\n")), "\n")
	py := strings.TrimSpace(lines[0])
	tf := ""
	if len(lines) > 1 {
		tf = strings.TrimSpace(lines[len(lines)-1])
	}
	if keyed && err == nil {
		keepProbe(key, py, tf)
	}
	return py, tf, true
}

// String summarises the inventory for logs and the CLI.
func (inv Inventory) String() string {
	tf := "no TensorFlow"
	switch {
	case inv.Probing:
		tf = "TensorFlow not checked yet"
	case inv.TensorFlow != "":
		tf = "TensorFlow " + inv.TensorFlow
	}
	return fmt.Sprintf("%d cores, %d MiB memory, %d GPUs, %s", inv.Cores, inv.MemBytes>>20, len(inv.GPUs), tf)
}
