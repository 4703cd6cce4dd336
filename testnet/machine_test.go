package testnet

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A machine of known size holds its node and everything the node starts:
// the node's process is in the machine's cgroup (with the quota and the
// memory limit), its workers' parent is set under it, its CPU time is
// counted there, and the validator stays outside. Closing the network
// removes the machines.
func TestMachinesOfKnownSize(t *testing.T) {
	t.Parallel()
	needRoot(t)
	size := Machine{Cores: 0.5, MemBytes: 1 << 30}
	n := startNet(t, Params{Validators: 1, Nodes: 1}, RunOptions{Machine: &size, Tag: "dmmach"})
	val, nd := 0, 1
	rel := filepath.Join(machineRoot, "dmmach", n.Manifest.Nodes[nd].Name)
	cg := cgroupOf(t, n.PID(nd))
	if !strings.Contains(cg, "/"+rel+"/node") {
		t.Fatalf("the node runs in %q, want its machine %s", cg, rel)
	}
	if vcg := cgroupOf(t, n.PID(val)); strings.Contains(vcg, machineRoot) {
		t.Errorf("the validator runs in a machine: %q", vcg)
	}
	if n.machines.v2 {
		checkFile(t, filepath.Join(cgroupFS, rel, "cpu.max"), "50000 100000")
		checkFile(t, filepath.Join(cgroupFS, rel, "memory.max"), strconv.Itoa(1<<30))
	} else {
		checkFile(t, filepath.Join(n.machines.mounts["cpu"], rel, "cpu.cfs_quota_us"), "50000")
		checkFile(t, filepath.Join(n.machines.mounts["memory"], rel, "memory.limit_in_bytes"), strconv.Itoa(1<<30))
	}
	cfg, err := os.ReadFile(filepath.Join(n.Home(nd).Dir, "config.toml"))
	if err != nil {
		t.Fatal(err)
	}
	if want := `cgroup_parent = "` + filepath.Join(rel, "deepmarket") + `"`; !strings.Contains(string(cfg), want) {
		t.Errorf("the node's config lacks %s", want)
	}
	// Pinned, two machines' workers would take turns on one CPU.
	if !strings.Contains(string(cfg), "share_cpus = true") || !strings.Contains(string(cfg), "cpus = []") {
		t.Errorf("the machine's workers are pinned:\n%s", cfg)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if used, ok := n.MachineCPU(nd); ok && used > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the machine counted no CPU time for its node")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, ok := n.MachineCPU(val); ok {
		t.Error("a validator has a machine")
	}
	dirs := append([]string(nil), n.machines.made...)
	n.Close()
	for _, d := range dirs {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("%s is left after Close", d)
		}
	}
	if _, err := newMachines(Machine{Cores: 0.01, MemBytes: 1 << 30}, "x"); err == nil {
		t.Error("a machine of 0.01 cores was accepted")
	}
}

// cgroupOf is the cgroup lines of a process.
func cgroupOf(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func checkFile(t *testing.T, path, want string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(b)); got != want {
		t.Errorf("%s = %q, want %q", path, got, want)
	}
}

// needRoot fails (not skips) a test that needs root: make test runs as root.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("needs root (cgroups): run make test as root")
	}
}
