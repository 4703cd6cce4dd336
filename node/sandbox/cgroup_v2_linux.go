package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cgroupV2 is the unified hierarchy mounted at root.
type cgroupV2 struct {
	root string
}

var _ hierarchy = (*cgroupV2)(nil)

// v2Wanted are the controllers jobs use; io is left alone because the disk
// bound is on space, not bandwidth.
var v2Wanted = []string{"cpu", "cpuset", "memory", "pids"}

func (h *cgroupV2) version() int { return 2 }

func (h *cgroupV2) controllers() []string {
	s, err := readString(filepath.Join(h.root, "cgroup.controllers"))
	if err != nil {
		return nil
	}
	var cs []string
	for _, c := range strings.Fields(s) {
		if slices.Contains(v2Wanted, c) {
			cs = append(cs, c)
		}
	}
	slices.Sort(cs)
	return cs
}

func (h *cgroupV2) swapLimited() bool {
	// memory.swap.max exists in non-root cgroups only when the kernel
	// accounts swap; the deepmarket parent exists once a job was created.
	_, err := os.Stat(filepath.Join(h.root, parentCgroup, "memory.swap.max"))
	return err == nil
}

// enable turns the controllers on for dir's children. One write with all of
// them: they come from the root's cgroup.controllers, so each is available.
func enable(dir string, cs []string) error {
	plus := make([]string, len(cs))
	for i, c := range cs {
		plus[i] = "+" + c
	}
	err := writeFile(filepath.Join(dir, "cgroup.subtree_control"), strings.Join(plus, " "))
	if errors.Is(err, syscall.EBUSY) {
		// The "no internal processes" rule: dir holds processes and is not
		// the real root, as in a container's cgroup namespace.
		return fmt.Errorf("enable controllers in %s (move the node's own processes into a leaf cgroup first): %w", dir, err)
	}
	return err
}

func (h *cgroupV2) create(name string, l Limits) (cgroup, error) {
	cs := h.controllers()
	for _, c := range []string{"memory", "pids"} {
		if !slices.Contains(cs, c) {
			return nil, fmt.Errorf("%w: cgroup v2 controller %s is not available in %s", ErrUnsupported, c, h.root)
		}
	}
	if len(l.CPUs) > 0 && !slices.Contains(cs, "cpuset") {
		return nil, fmt.Errorf("%w: CPU pinning needs the cpuset controller", ErrUnsupported)
	}
	if quotaCores(l) > 0 && !slices.Contains(cs, "cpu") {
		return nil, fmt.Errorf("%w: a CPU quota needs the cpu controller", ErrUnsupported)
	}
	if err := enable(h.root, cs); err != nil {
		return nil, err
	}
	// Every level down to the parent, each passing the controllers on.
	parent := h.root
	for _, part := range strings.Split(parentCgroup, "/") {
		parent = filepath.Join(parent, part)
		if err := os.Mkdir(parent, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("create cgroup %s: %w", parent, err)
		}
		if err := enable(parent, cs); err != nil {
			return nil, err
		}
	}
	cg := &cgroupV2Job{dir: filepath.Join(parent, name)}
	if err := makeJobDir(cg.dir); err != nil {
		return nil, err
	}
	if err := cg.configure(l); err != nil {
		_ = syscall.Rmdir(cg.dir)
		return nil, err
	}
	return cg, nil
}

func (h *cgroupV2) jobDirs(name string) map[string]string {
	return map[string]string{h.root: filepath.Join(h.root, parentCgroup, name)}
}

func (h *cgroupV2) open(name string) (cgroup, bool) {
	cg := &cgroupV2Job{dir: filepath.Join(h.root, parentCgroup, name)}
	if _, err := os.Stat(cg.dir); err != nil {
		return nil, false
	}
	return cg, true
}

func (h *cgroupV2) jobsCPU() (time.Duration, error) {
	// A removed cgroup's usage stays counted in its parent's cpu.stat.
	parent := &cgroupV2Job{dir: filepath.Join(h.root, parentCgroup)}
	if _, err := os.Stat(parent.dir); errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	return parent.cpuUsage()
}

// cgroupV2Job is one job's cgroup in the unified hierarchy.
type cgroupV2Job struct {
	dir string
}

var _ cgroup = (*cgroupV2Job)(nil)

func (cg *cgroupV2Job) path(f string) string { return filepath.Join(cg.dir, f) }

func (cg *cgroupV2Job) configure(l Limits) error {
	// cpuset.mems stays empty: v2 then uses the parent's effective mems.
	if len(l.CPUs) > 0 {
		if err := writeFile(cg.path("cpuset.cpus"), cpuList(l.CPUs)); err != nil {
			return fmt.Errorf("pin to CPUs: %w", err)
		}
	}
	if cores := quotaCores(l); cores > 0 {
		v := fmt.Sprintf("%d %d", quotaMicros(cores), cfsPeriod)
		if err := writeFile(cg.path("cpu.max"), v); err != nil {
			return err
		}
	}
	if l.MemBytes > 0 {
		if err := writeFile(cg.path("memory.max"), strconv.FormatUint(l.MemBytes, 10)); err != nil {
			return err
		}
		// Absent without swap accounting, where no swap can be charged anyway.
		if err := writeFile(cg.path("memory.swap.max"), "0"); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, os.ErrPermission) {
			return err
		}
	}
	// On OOM kill the whole job, not one of its processes: a TensorFlow
	// worker that lost a child is broken anyway. Absent before 4.19.
	if err := writeFile(cg.path("memory.oom.group"), "1"); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, os.ErrPermission) {
		return err
	}
	return writeFile(cg.path("pids.max"), strconv.Itoa(pidsMax(l)))
}

func (cg *cgroupV2Job) joinFiles() []string { return nil }

func (cg *cgroupV2Job) cloneDir() string { return cg.dir }

func (cg *cgroupV2Job) pids() ([]int, error) { return readPids(cg.path("cgroup.procs")) }

func (cg *cgroupV2Job) setFrozen(frozen bool, timeout time.Duration) error {
	v, want := "0", uint64(0)
	if frozen {
		v, want = "1", 1
	}
	if err := writeFile(cg.path("cgroup.freeze"), v); err != nil {
		return err
	}
	return awaitFreezer(timeout, func() (bool, error) {
		n, ok := readKeyed(cg.path("cgroup.events"), "frozen")
		if !ok {
			return false, fmt.Errorf("%w: no frozen state in %s (the cgroup v2 freezer needs Linux 5.2)", ErrUnsupported, cg.path("cgroup.events"))
		}
		return n == want, nil
	})
}

func (cg *cgroupV2Job) frozen() (bool, error) {
	n, ok := readKeyed(cg.path("cgroup.events"), "frozen")
	return ok && n == 1, nil
}

// freeze freezes the cgroup for one kill or signal round; one that is
// still freezing, or a kernel without the freezer, counts as frozen (see
// cgroupV1Job.freeze).
func (cg *cgroupV2Job) freeze() error {
	if err := cg.setFrozen(true, killFreezeTimeout); err != nil && !errors.Is(err, errStillFreezing) && !errors.Is(err, ErrUnsupported) {
		return err
	}
	return nil
}

func (cg *cgroupV2Job) thaw() error { return writeFile(cg.path("cgroup.freeze"), "0") }

func (cg *cgroupV2Job) signal(sig syscall.Signal, skip func(int) bool) (int, error) {
	if cg.freeze() == nil {
		defer cg.thaw()
	}
	pids, err := cg.pids()
	if err != nil {
		return 0, err
	}
	return signalPids(pids, sig, skip)
}

func (cg *cgroupV2Job) kill() error {
	// cgroup.kill (5.14+) kills every task atomically, forks in flight too.
	if _, err := os.Stat(cg.path("cgroup.kill")); err == nil {
		// Gone since the Stat: emptied and removed by another killer.
		if err := writeFile(cg.path("cgroup.kill"), "1"); err != nil && !cgroupGone(err) {
			return err
		}
	}
	return killLoop(cg.pids, cg.freeze, cg.thaw)
}

func (cg *cgroupV2Job) stats() cgroupStats {
	var s cgroupStats
	if n, ok := readKeyed(cg.path("memory.events"), "oom_kill"); ok {
		s.oomKilled = n > 0
	}
	if n, ok := readKeyed(cg.path("memory.events"), "oom_group_kill"); ok && n > 0 {
		s.oomKilled = true
	}
	if n, ok := readKeyed(cg.path("pids.events"), "max"); ok {
		s.pidsLimited = n > 0
	}
	s.cpu, _ = cg.cpuUsage()
	s.peak, _ = readUint(cg.path("memory.peak")) // 5.19+
	return s
}

func (cg *cgroupV2Job) cpuUsage() (time.Duration, error) {
	n, ok := readKeyed(cg.path("cpu.stat"), "usage_usec")
	if !ok {
		return 0, fmt.Errorf("no usage_usec in %s", cg.path("cpu.stat"))
	}
	return time.Duration(n) * time.Microsecond, nil
}

func (cg *cgroupV2Job) remove() error { return removeDir(cg.dir) }
