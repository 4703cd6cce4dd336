package testnet

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/deepmarket/deepmarket/node"
)

// Machine is the size of an emulated machine: a node confined with
// everything it runs (its ledger replica, its tunnels, the workers it
// launches) to a cgroup of its own with a CPU quota and a memory limit,
// so that several machines of known size run side by side on one host and
// each node's own overhead counts inside its machine, as on real hardware.
type Machine struct {
	Cores    float64 // CPU quota, in cores (0.5: half a core's time)
	MemBytes uint64  // memory limit
}

func (m Machine) String() string {
	return fmt.Sprintf("%g core(s), %.1f GiB", m.Cores, float64(m.MemBytes)/(1<<30))
}

func (m Machine) validate() error {
	if m.Cores < 0.05 || m.Cores > 1024 || math.IsNaN(m.Cores) {
		return fmt.Errorf("machine size: %g cores, want 0.05 to 1024", m.Cores)
	}
	if m.MemBytes < 256<<20 {
		return fmt.Errorf("machine size: %d bytes of memory, want at least 256 MiB", m.MemBytes)
	}
	return nil
}

// machineRoot is the cgroup, under each hierarchy's root, that holds a
// testnet's machines: machineRoot/TAG/NODE, with the node in NODE/node and
// its workers under NODE/deepmarket.
const machineRoot = "deepmarket-testnet"

// cgroupFS is where the cgroup hierarchies are mounted.
const cgroupFS = "/sys/fs/cgroup"

// machines makes and removes the cgroups of a testnet's machines.
type machines struct {
	size Machine
	tag  string
	v2   bool
	// mounts: v1 controller -> its hierarchy's mount point (cpu, memory).
	mounts map[string]string
	made   []string // cgroup dirs made, parents first
}

func newMachines(size Machine, tag string) (*machines, error) {
	if err := size.validate(); err != nil {
		return nil, err
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("machines of known size need root (cgroups)")
	}
	ms := &machines{size: size, tag: tag}
	if _, err := os.Stat(filepath.Join(cgroupFS, "cgroup.controllers")); err == nil {
		ms.v2 = true
		return ms, nil
	}
	mounts, err := v1Mounts()
	if err != nil {
		return nil, err
	}
	for _, c := range []string{"cpu", "memory"} {
		if _, ok := mounts[c]; !ok {
			return nil, fmt.Errorf("machines of known size: the cgroup v1 %s controller is not mounted", c)
		}
	}
	ms.mounts = mounts
	return ms, nil
}

// rel is node name's machine cgroup, relative to a hierarchy's root.
func (ms *machines) rel(name string) string { return filepath.Join(machineRoot, ms.tag, name) }

// cgroupParent is what node name's [executor] cgroup_parent becomes.
func (ms *machines) cgroupParent(name string) string {
	return filepath.Join(ms.rel(name), "deepmarket")
}

// create makes node name's machine and returns the cgroup.procs files the
// node's process writes itself into before it starts.
func (ms *machines) create(name string) ([]string, error) {
	quota := strconv.FormatInt(int64(math.Round(ms.size.Cores*100000)), 10)
	mem := strconv.FormatUint(ms.size.MemBytes, 10)
	if ms.v2 {
		cs := "+cpu +memory"
		if err := enableV2(cgroupFS, cs); err != nil {
			return nil, err
		}
		dir := cgroupFS
		for _, part := range strings.Split(ms.rel(name), "/") {
			dir = filepath.Join(dir, part)
			if err := ms.mkdir(dir); err != nil {
				return nil, err
			}
			if err := enableV2(dir, cs); err != nil {
				return nil, err
			}
		}
		if err := writeCg(filepath.Join(dir, "cpu.max"), quota+" 100000"); err != nil {
			return nil, err
		}
		if err := writeCg(filepath.Join(dir, "memory.max"), mem); err != nil {
			return nil, err
		}
		_ = writeCg(filepath.Join(dir, "memory.swap.max"), "0")
		leaf := filepath.Join(dir, "node")
		if err := ms.mkdir(leaf); err != nil {
			return nil, err
		}
		return []string{filepath.Join(leaf, "cgroup.procs")}, nil
	}
	var procs []string
	seen := map[string]bool{}
	for _, c := range []string{"cpu", "cpuacct", "memory"} {
		root, ok := ms.mounts[c]
		if !ok || seen[root] {
			continue // co-mounted
		}
		seen[root] = true
		dir := filepath.Join(root, ms.rel(name))
		for d := filepath.Join(root, machineRoot); ; d = filepath.Join(d, strings.Split(strings.TrimPrefix(dir, d+"/"), "/")[0]) {
			if err := ms.mkdir(d); err != nil {
				return nil, err
			}
			if c == "memory" {
				_ = writeCg(filepath.Join(d, "memory.use_hierarchy"), "1") // always 1 on newer kernels
			}
			if d == dir {
				break
			}
		}
		switch c {
		case "cpu":
			if err := writeCg(filepath.Join(dir, "cpu.cfs_period_us"), "100000"); err != nil {
				return nil, err
			}
			if err := writeCg(filepath.Join(dir, "cpu.cfs_quota_us"), quota); err != nil {
				return nil, err
			}
		case "memory":
			if err := writeCg(filepath.Join(dir, "memory.limit_in_bytes"), mem); err != nil {
				return nil, err
			}
			_ = writeCg(filepath.Join(dir, "memory.swappiness"), "0")
		}
		leaf := filepath.Join(dir, "node")
		if err := ms.mkdir(leaf); err != nil {
			return nil, err
		}
		procs = append(procs, filepath.Join(leaf, "cgroup.procs"))
	}
	return procs, nil
}

func (ms *machines) mkdir(dir string) error {
	err := os.Mkdir(dir, 0o755)
	if errors.Is(err, os.ErrExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("machine cgroup: %w", err)
	}
	ms.made = append(ms.made, dir)
	return nil
}

// Usage is the CPU time node name's machine has used, in nanoseconds.
func (ms *machines) usage(name string) (uint64, error) {
	if ms.v2 {
		b, err := os.ReadFile(filepath.Join(cgroupFS, ms.rel(name), "cpu.stat"))
		if err != nil {
			return 0, err
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "usage_usec "); ok {
				n, err := strconv.ParseUint(v, 10, 64)
				return n * 1000, err
			}
		}
		return 0, fmt.Errorf("no usage_usec in cpu.stat")
	}
	root, ok := ms.mounts["cpuacct"]
	if !ok {
		return 0, fmt.Errorf("no cpuacct controller")
	}
	b, err := os.ReadFile(filepath.Join(root, ms.rel(name), "cpuacct.usage"))
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
}

// remove deletes what create made, children first, once the nodes are
// gone: the workers' cgroups the nodes left under them as well.
func (ms *machines) remove() {
	for _, d := range slices.Backward(ms.made) {
		removeTree(d)
	}
	ms.made = nil
}

// removeTree removes an empty cgroup dir and the cgroup dirs under it.
func removeTree(dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if e.IsDir() {
			removeTree(filepath.Join(dir, e.Name()))
		}
	}
	_ = syscall.Rmdir(dir)
}

func enableV2(dir, cs string) error {
	if err := writeCg(filepath.Join(dir, "cgroup.subtree_control"), cs); err != nil {
		return fmt.Errorf("enable %s in %s: %w", cs, dir, err)
	}
	return nil
}

func writeCg(path, v string) error {
	if err := os.WriteFile(path, []byte(v), 0); err != nil {
		return fmt.Errorf("machine cgroup: %w", err)
	}
	return nil
}

// v1Mounts maps each cgroup v1 controller to its mount point.
func v1Mounts() (map[string]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	mounts := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if sep < 0 || sep+3 >= len(fields) || fields[sep+1] != "cgroup" || len(fields) < 5 {
			continue
		}
		for _, opt := range strings.Split(fields[sep+3], ",") {
			switch opt {
			case "cpu", "cpuacct", "memory", "cpuset", "pids", "freezer":
				mounts[opt] = fields[4]
			}
		}
	}
	return mounts, sc.Err()
}

// machineConfig points node i's workers into its machine.
func (n *Network) machineConfig(i int, cfg *node.Config) {
	cfg.Executor.CgroupParent = node.DefaultConfig().Executor.CgroupParent
	if n.machines == nil || n.Manifest.Nodes[i].Validator {
		return
	}
	cfg.Executor.CgroupParent = n.machines.cgroupParent(n.Manifest.Nodes[i].Name)
	// A machine's workers share the host's CPUs, held to the machine's
	// size by its quota: pinned, two machines' workers would take turns
	// on one CPU while the other sat idle.
	cfg.Executor.CPUs = nil
	cfg.Executor.ShareCPUs = true
}

// MachineCPU is the CPU time node i's machine has used (every process in
// it: the node, its ledger replica, its workers); ok is false without
// machines of known size, or for a validator.
func (n *Network) MachineCPU(i int) (d time.Duration, ok bool) {
	if n.machines == nil || n.Manifest.Nodes[i].Validator {
		return 0, false
	}
	ns, err := n.machines.usage(n.Manifest.Nodes[i].Name)
	if err != nil {
		return 0, false
	}
	return time.Duration(ns), true
}

// ByHand is a machine of known size with no node in it: what a benchmark
// runs the same programs in by hand, to compare with the market.
type ByHand struct {
	ms    *machines
	procs []string
}

// NewByHand makes machine name (under tag) of the given size.
func NewByHand(size Machine, tag, name string) (*ByHand, error) {
	ms, err := newMachines(size, tag)
	if err != nil {
		return nil, err
	}
	procs, err := ms.create(name)
	if err != nil {
		ms.remove()
		return nil, err
	}
	return &ByHand{ms: ms, procs: procs}, nil
}

// Command is exec.Command for a program that joins the machine before it
// starts.
func (b *ByHand) Command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command("/bin/sh", append([]string{"-c", joinScript, name}, args...)...)
	cmd.Env = append(os.Environ(), "DM_MACHINE_PROCS="+strings.Join(b.procs, " "))
	return cmd
}

// Close removes the machine; whatever ran in it must have exited. A nil
// ByHand closes nothing.
func (b *ByHand) Close() {
	if b != nil {
		b.ms.remove()
	}
}

// joinScript writes the shell's pid into each of $DM_MACHINE_PROCS and
// execs its arguments.
const joinScript = `for f in $DM_MACHINE_PROCS; do echo $$ > "$f" || exit 1; done; exec "$0" "$@"`
