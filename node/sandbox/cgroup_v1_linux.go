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

// cgroupV1 is the legacy layout: one hierarchy per controller (or a few
// co-mounted ones), each with the same deepmarket/<job> path.
type cgroupV1 struct {
	// mounts maps controller name to its hierarchy's mount point.
	mounts map[string]string
}

var _ hierarchy = (*cgroupV1)(nil)

func (h *cgroupV1) version() int { return 1 }

func (h *cgroupV1) controllers() []string {
	var cs []string
	for c := range h.mounts {
		cs = append(cs, c)
	}
	slices.Sort(cs)
	return cs
}

func (h *cgroupV1) swapLimited() bool {
	m, ok := h.mounts["memory"]
	if !ok {
		return false
	}
	// Without swap accounting (no memsw files) create falls back to
	// swappiness 0, which keeps anonymous memory out of swap in practice.
	_, err := os.Stat(filepath.Join(m, "memory.swappiness"))
	_, err2 := os.Stat(filepath.Join(m, "memory.memsw.limit_in_bytes"))
	return err == nil || err2 == nil
}

// dirs returns the distinct job dirs, one per mounted hierarchy.
func (h *cgroupV1) dirs(name string) map[string]string {
	d := map[string]string{}
	for c, m := range h.mounts {
		d[c] = filepath.Join(m, parentCgroup, name)
	}
	return d
}

func (h *cgroupV1) jobDirs(name string) map[string]string {
	d := map[string]string{}
	for _, m := range h.mounts {
		d[m] = filepath.Join(m, parentCgroup, name) // co-mounted controllers share one
	}
	return d
}

func (h *cgroupV1) create(name string, l Limits) (cgroup, error) {
	for _, c := range []string{"memory", "pids"} {
		if _, ok := h.mounts[c]; !ok {
			return nil, fmt.Errorf("%w: cgroup v1 controller %s is not mounted", ErrUnsupported, c)
		}
	}
	cg := &cgroupV1Job{dirs: h.dirs(name)}
	created := map[string]bool{}
	fail := func(err error) (cgroup, error) {
		for dir := range created {
			_ = syscall.Rmdir(dir)
		}
		return nil, err
	}
	// Co-mounted controllers (cpu,cpuacct) share a dir; make each once, and
	// the cpuset one first: nothing may join it before cpus and mems are set.
	order := []string{"cpuset", "cpu", "cpuacct", "memory", "pids", "freezer"}
	for _, c := range order {
		dir, ok := cg.dirs[c]
		if !ok || created[dir] {
			continue
		}
		parent := filepath.Dir(dir)
		if err := os.MkdirAll(parent, 0o755); err != nil {
			return fail(fmt.Errorf("create cgroup %s: %w", parent, err))
		}
		if c == "cpuset" {
			if err := initCpusetV1(h.mounts[c], parent); err != nil {
				return fail(err)
			}
		}
		if err := makeJobDir(dir); err != nil {
			return fail(err)
		}
		created[dir] = true
	}
	if err := cg.configure(l); err != nil {
		return fail(err)
	}
	return cg, nil
}

func (h *cgroupV1) open(name string) (cgroup, bool) {
	// Every hierarchy's dir, present or not: a reader of a missing one
	// sees no processes, and removing one is a no-op.
	cg := &cgroupV1Job{dirs: h.dirs(name)}
	for _, d := range cg.dirs {
		if _, err := os.Stat(d); err == nil {
			return cg, true
		}
	}
	return nil, false
}

func (h *cgroupV1) jobsCPU() (time.Duration, error) {
	m, ok := h.mounts["cpuacct"]
	if !ok {
		return 0, fmt.Errorf("%w: CPU accounting needs the cgroup v1 cpuacct controller", ErrUnsupported)
	}
	// cpuacct charges every ancestor as it charges a task's cgroup, so the
	// parent keeps the usage of the jobs whose cgroups are gone.
	n, err := readUint(filepath.Join(m, parentCgroup, "cpuacct.usage"))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	return time.Duration(n), err
}

// initCpusetV1 gives the deepmarket parent, and every cgroup between it and
// root, its parent's cpuset.cpus and cpuset.mems where they are empty: v1
// starts a new cpuset empty, and an empty one can hold no task and no child.
func initCpusetV1(root, parent string) error {
	if up := filepath.Dir(parent); up != root && strings.HasPrefix(up, root+"/") {
		if err := initCpusetV1(root, up); err != nil {
			return err
		}
		root = up
	}
	for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
		cur, err := readString(filepath.Join(parent, f))
		if err != nil {
			return fmt.Errorf("read %s: %w", f, err)
		}
		if cur != "" {
			continue
		}
		v, err := readString(filepath.Join(root, f))
		if err != nil {
			return fmt.Errorf("read root %s: %w", f, err)
		}
		if err := writeFile(filepath.Join(parent, f), v); err != nil {
			return err
		}
	}
	return nil
}

// ancestorQuotaV1 is the smallest CPU quota, per cfsPeriod, of dir and the
// cgroups above it that set one (0: none does).
func ancestorQuotaV1(dir string) int64 {
	var least int64
	for d := dir; ; d = filepath.Dir(d) {
		q, err1 := readString(filepath.Join(d, "cpu.cfs_quota_us"))
		p, err2 := readString(filepath.Join(d, "cpu.cfs_period_us"))
		if err1 != nil || err2 != nil {
			return least // above the hierarchy's root
		}
		quota, err1 := strconv.ParseInt(q, 10, 64)
		period, err2 := strconv.ParseInt(p, 10, 64)
		if err1 == nil && err2 == nil && quota > 0 && period > 0 {
			if per := quota * cfsPeriod / period; least == 0 || per < least {
				least = per
			}
		}
		if d == "/" || d == "." {
			return least
		}
	}
}

// cgroupV1Job is one job's dirs across the v1 hierarchies.
type cgroupV1Job struct {
	dirs map[string]string
}

var _ cgroup = (*cgroupV1Job)(nil)

func (cg *cgroupV1Job) file(controller, name string) (string, bool) {
	d, ok := cg.dirs[controller]
	return filepath.Join(d, name), ok
}

func (cg *cgroupV1Job) configure(l Limits) error {
	if d, ok := cg.dirs["cpuset"]; ok {
		parent := filepath.Dir(d)
		mems, err := readString(filepath.Join(parent, "cpuset.mems"))
		if err != nil {
			return fmt.Errorf("read cpuset.mems: %w", err)
		}
		cpus := cpuList(l.CPUs)
		if len(l.CPUs) == 0 {
			if cpus, err = readString(filepath.Join(parent, "cpuset.cpus")); err != nil {
				return fmt.Errorf("read cpuset.cpus: %w", err)
			}
		}
		if err := writeFile(filepath.Join(d, "cpuset.mems"), mems); err != nil {
			return err
		}
		if err := writeFile(filepath.Join(d, "cpuset.cpus"), cpus); err != nil {
			return fmt.Errorf("pin to CPUs %s: %w", cpus, err)
		}
	} else if len(l.CPUs) > 0 {
		return fmt.Errorf("%w: CPU pinning needs the cpuset controller", ErrUnsupported)
	}
	if cores := quotaCores(l); cores > 0 {
		d, ok := cg.dirs["cpu"]
		if !ok {
			return fmt.Errorf("%w: a CPU quota needs the cpu controller", ErrUnsupported)
		}
		if err := writeFile(filepath.Join(d, "cpu.cfs_period_us"), strconv.Itoa(cfsPeriod)); err != nil {
			return err
		}
		// v1 refuses a quota above an ancestor's (a node confined to a
		// machine smaller than what it lends): the job gets what its
		// machine has, which is all it could use anyway.
		q := quotaMicros(cores)
		if up := ancestorQuotaV1(filepath.Dir(d)); up > 0 && up < q {
			q = up
		}
		if err := writeFile(filepath.Join(d, "cpu.cfs_quota_us"), strconv.FormatInt(q, 10)); err != nil {
			return err
		}
	}
	if l.MemBytes > 0 {
		d := cg.dirs["memory"]
		v := strconv.FormatUint(l.MemBytes, 10)
		if err := writeFile(filepath.Join(d, "memory.limit_in_bytes"), v); err != nil {
			return err
		}
		// memsw is memory+swap: equal to the memory limit means no swap. It
		// exists only with swap accounting; swappiness 0 is the fallback.
		memsw := filepath.Join(d, "memory.memsw.limit_in_bytes")
		if _, err := os.Stat(memsw); err == nil {
			if err := writeFile(memsw, v); err != nil {
				return err
			}
		} else if err := writeFile(filepath.Join(d, "memory.swappiness"), "0"); err != nil {
			return err
		}
	}
	return writeFile(filepath.Join(cg.dirs["pids"], "pids.max"), strconv.Itoa(pidsMax(l)))
}

func (cg *cgroupV1Job) joinFiles() []string {
	seen := map[string]bool{}
	var files []string
	for _, d := range cg.dirs {
		if !seen[d] {
			seen[d] = true
			files = append(files, filepath.Join(d, "cgroup.procs"))
		}
	}
	slices.Sort(files)
	return files
}

func (cg *cgroupV1Job) cloneDir() string { return "" }

// pids lists the pids hierarchy: every job process joins every hierarchy.
func (cg *cgroupV1Job) pids() ([]int, error) {
	f, _ := cg.file("pids", "cgroup.procs")
	return readPids(f)
}

func (cg *cgroupV1Job) setFrozen(frozen bool, timeout time.Duration) error {
	state, ok := cg.file("freezer", "freezer.state")
	if !ok {
		return fmt.Errorf("%w: freezing a job needs the cgroup v1 freezer controller", ErrUnsupported)
	}
	want := "THAWED"
	if frozen {
		want = "FROZEN"
	}
	if err := writeFile(state, want); err != nil {
		return err
	}
	// Freezing is asynchronous: the state reads FREEZING until every task
	// stopped.
	return awaitFreezer(timeout, func() (bool, error) {
		s, err := readString(state)
		return s == want, err
	})
}

func (cg *cgroupV1Job) frozen() (bool, error) {
	state, ok := cg.file("freezer", "freezer.state")
	if !ok {
		return false, nil
	}
	s, err := readString(state)
	return s == "FROZEN", err
}

// freeze freezes the cgroup for one kill or signal round. A cgroup still
// FREEZING counts as frozen: the caller then signals some unfrozen tasks,
// which is no worse than having no freezer, and thaws it after.
func (cg *cgroupV1Job) freeze() error {
	if err := cg.setFrozen(true, killFreezeTimeout); err != nil && !errors.Is(err, errStillFreezing) {
		return err
	}
	return nil
}

func (cg *cgroupV1Job) thaw() error { return cg.setFrozen(false, killFreezeTimeout) }

func (cg *cgroupV1Job) signal(sig syscall.Signal, skip func(int) bool) (int, error) {
	if _, ok := cg.dirs["freezer"]; ok && cg.freeze() == nil {
		defer cg.thaw()
	}
	pids, err := cg.pids()
	if err != nil {
		return 0, err
	}
	return signalPids(pids, sig, skip)
}

func (cg *cgroupV1Job) kill() error {
	if _, ok := cg.dirs["freezer"]; ok {
		return killLoop(cg.pids, cg.freeze, cg.thaw)
	}
	return killLoop(cg.pids, nil, nil)
}

func (cg *cgroupV1Job) stats() cgroupStats {
	var s cgroupStats
	if f, ok := cg.file("memory", "memory.oom_control"); ok {
		if n, ok := readKeyed(f, "oom_kill"); ok {
			s.oomKilled = n > 0
		} else if fc, _ := cg.file("memory", "memory.failcnt"); fc != "" {
			// Kernels before 4.13 do not count OOM kills.
			n, err := readUint(fc)
			s.memLimitHit = err == nil && n > 0
		}
	}
	if f, ok := cg.file("pids", "pids.events"); ok {
		if n, ok := readKeyed(f, "max"); ok {
			s.pidsLimited = n > 0
		}
	}
	s.cpu, _ = cg.cpuUsage()
	if f, ok := cg.file("memory", "memory.max_usage_in_bytes"); ok {
		s.peak, _ = readUint(f)
	}
	return s
}

func (cg *cgroupV1Job) cpuUsage() (time.Duration, error) {
	f, ok := cg.file("cpuacct", "cpuacct.usage")
	if !ok {
		return 0, fmt.Errorf("%w: CPU accounting needs the cgroup v1 cpuacct controller", ErrUnsupported)
	}
	n, err := readUint(f)
	return time.Duration(n), err
}

func (cg *cgroupV1Job) remove() error {
	seen := map[string]bool{}
	var errs []error
	for _, d := range cg.dirs {
		if seen[d] {
			continue
		}
		seen[d] = true
		if err := removeDir(d); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
