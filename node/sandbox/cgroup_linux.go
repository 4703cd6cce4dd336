package sandbox

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// parentCgroup is the cgroup, relative to each hierarchy's root, that
// holds every job's cgroup: DefaultCgroupParent unless SetCgroupParent
// chose another (a machine of known size, whose node runs in a cgroup of
// its own, keeps its jobs under it).
var parentCgroup = DefaultCgroupParent

// cfsPeriod is the CFS period in microseconds for both versions; the quota
// is cores × period.
const cfsPeriod = 100000

// killFreezeTimeout bounds how long a kill or signal round waits for the
// cgroup to freeze before it signals anyway.
const killFreezeTimeout = time.Second

// errStillFreezing: the kernel did not finish freezing (or thawing) a
// cgroup in the time given, as when a task is stuck in the kernel.
var errStillFreezing = errors.New("the cgroup is still freezing")

// killTimeout bounds how long killing a cgroup may take before giving up:
// long enough for a fork bomb at its pids limit to be reaped.
const killTimeout = 30 * time.Second

// hierarchy creates job cgroups on one machine (v1 or v2).
type hierarchy interface {
	version() int
	// controllers lists the controllers usable for jobs, sorted.
	controllers() []string
	// swapLimited reports whether jobs' swap use is prevented.
	swapLimited() bool
	// create makes the job cgroup name with the limits written, ready to
	// receive the job.
	create(name string, l Limits) (cgroup, error)
	// jobDirs maps each hierarchy's mount point to job cgroup name's dir
	// in it: what the job sees of cgroups.
	jobDirs(name string) map[string]string
	// open finds the job cgroup name left by an earlier Start; ok is
	// false when no dir of it exists on any hierarchy.
	open(name string) (cg cgroup, ok bool)
	// jobsCPU is the CPU time every job cgroup under the deepmarket parent
	// has used, those already removed included; 0 before the first job.
	jobsCPU() (time.Duration, error)
}

// cgroup is one job's cgroup.
type cgroup interface {
	// joinFiles are the cgroup.procs files a process writes its pid into to
	// join (v1); nil when the process is cloned into the cgroup (v2).
	joinFiles() []string
	// dir is the cgroup directory to clone into (v2), "" for v1.
	cloneDir() string
	// pids lists the processes in the cgroup.
	pids() ([]int, error)
	// signal sends sig once to every process in the cgroup that skip (which
	// may be nil) does not exclude, and says to how many.
	signal(sig syscall.Signal, skip func(pid int) bool) (int, error)
	// kill SIGKILLs every process until the cgroup is empty or gone.
	kill() error
	// setFrozen freezes (true) or thaws (false) every process in the
	// cgroup and waits up to timeout for the kernel to finish; past it the
	// error wraps errStillFreezing.
	setFrozen(frozen bool, timeout time.Duration) error
	// frozen reports whether the kernel holds the whole cgroup frozen.
	frozen() (bool, error)
	// cpuUsage is the CPU time the cgroup's processes have used.
	cpuUsage() (time.Duration, error)
	// stats reads the counters Exit reports; call it before remove.
	stats() cgroupStats
	// remove deletes the cgroup; it must be empty.
	remove() error
}

type cgroupStats struct {
	oomKilled bool
	// memLimitHit: the kernel counts no OOM kills here, but the limit was
	// reached; with a SIGKILLed job that is the best evidence of an OOM kill.
	memLimitHit bool
	pidsLimited bool
	cpu         time.Duration
	peak        uint64
}

// detectHierarchy finds the cgroup hierarchy under root (normally
// /sys/fs/cgroup): v2 when root is a unified hierarchy, else the v1
// controller mounts listed in mountinfo.
func detectHierarchy(root, mountinfo string) (hierarchy, error) {
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err == nil {
		return &cgroupV2{root: root}, nil
	}
	f, err := os.Open(mountinfo)
	if err != nil {
		return nil, fmt.Errorf("read mounts: %w", err)
	}
	defer f.Close()
	mounts := parseV1Mounts(f)
	if len(mounts) == 0 {
		return nil, fmt.Errorf("%w: no cgroup v2 at %s and no cgroup v1 mounts", ErrUnsupported, root)
	}
	return &cgroupV1{mounts: mounts}, nil
}

// parseV1Mounts maps each v1 controller to its mount point from
// /proc/self/mountinfo lines such as
// "35 25 0:30 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory".
func parseV1Mounts(r interface{ Read([]byte) (int, error) }) map[string]string {
	mounts := map[string]string{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		pf, qf := strings.Fields(pre), strings.Fields(post)
		if len(pf) < 5 || len(qf) < 3 || qf[0] != "cgroup" {
			continue
		}
		for _, opt := range strings.Split(qf[2], ",") {
			switch opt {
			case "cpu", "cpuacct", "cpuset", "memory", "pids", "freezer":
				if _, dup := mounts[opt]; !dup {
					mounts[opt] = pf[4]
				}
			}
		}
	}
	return mounts
}

// sanitizeName turns a job name into one path component.
func sanitizeName(name string) (string, error) {
	b := []byte(name)
	for i, c := range b {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_'
		if !ok {
			b[i] = '_'
		}
	}
	s := string(b)
	if len(s) > 200 {
		s = s[:200]
	}
	if s == "" || strings.Trim(s, ".") == "" {
		return "", fmt.Errorf("sandbox: job name %q is not usable as a cgroup name", name)
	}
	return s, nil
}

// writeFile writes a cgroup control file. O_CREATE is harmless on cgroupfs
// (the file exists or the write fails either way) and lets tests run the
// same code against a plain directory tree.
func writeFile(path, value string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %q to %s: %w", value, path, err)
	}
	return nil
}

func readString(path string) (string, error) {
	b, err := os.ReadFile(path)
	return strings.TrimSpace(string(b)), err
}

func readUint(path string) (uint64, error) {
	s, err := readString(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(s, 10, 64)
}

// readKeyed reads key from a flat keyed file ("oom_kill 3\nmax 0").
func readKeyed(path, key string) (uint64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		k, v, ok := bytes.Cut(bytes.TrimSpace(line), []byte(" "))
		if ok && string(k) == key {
			n, err := strconv.ParseUint(string(bytes.TrimSpace(v)), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// cgroupGone reports whether err says that the cgroup whose file was being
// read or written is gone: ENOENT when it went before the open, ENODEV
// when it went between the open and the read or write.
func cgroupGone(err error) bool {
	return errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ENODEV)
}

// readPids parses a cgroup.procs file.
func readPids(path string) ([]int, error) {
	b, err := os.ReadFile(path)
	if cgroupGone(err) {
		return nil, nil // a removed cgroup holds nothing
	}
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			pids = append(pids, n)
		}
	}
	return pids, nil
}

// cpuList renders CPU ids for cpuset.cpus ("0,2,3").
func cpuList(cpus []int) string {
	s := make([]string, len(cpus))
	for i, c := range cpus {
		s[i] = strconv.Itoa(c)
	}
	return strings.Join(s, ",")
}

// quotaCores is the CPU quota in cores, 0 for none.
func quotaCores(l Limits) float64 {
	if len(l.CPUs) > 0 {
		return float64(len(l.CPUs))
	}
	return l.Cores
}

// quotaMicros is the CFS quota per cfsPeriod; the kernel refuses less than 1ms.
func quotaMicros(cores float64) int64 {
	q := int64(cores * cfsPeriod)
	return max(q, 1000)
}

func pidsMax(l Limits) int {
	if l.Pids > 0 {
		return l.Pids
	}
	return DefaultPids
}

// signalPids sends sig to each pid not skipped, ignoring ones that already
// exited, and counts those signalled.
func signalPids(pids []int, sig syscall.Signal, skip func(int) bool) (int, error) {
	var errs []error
	n := 0
	for _, pid := range pids {
		if skip != nil && skip(pid) {
			continue
		}
		err := syscall.Kill(pid, sig)
		switch {
		case err == nil:
			n++
		case !errors.Is(err, syscall.ESRCH):
			errs = append(errs, fmt.Errorf("kill %d: %w", pid, err))
		}
	}
	return n, errors.Join(errs...)
}

// killLoop SIGKILLs whatever list returns until it returns nothing; freeze
// and thaw (may be nil) bracket each round so that no process can fork
// between the listing and the signal.
func killLoop(list func() ([]int, error), freeze, thaw func() error) error {
	deadline := time.Now().Add(killTimeout)
	for {
		pids, err := list()
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup still holds %d processes after %s", len(pids), killTimeout)
		}
		frozen := freeze != nil && freeze() == nil
		if frozen {
			if pids, err = list(); err != nil {
				return err
			}
		}
		_, kerr := signalPids(pids, syscall.SIGKILL, nil)
		if frozen {
			// Killed tasks die only once thawed. A cgroup gone meanwhile
			// has none left to thaw: another killer of the same job (the
			// reap of its Process, racing Reap) saw it empty and removed
			// it, and the next listing finds nothing.
			if err := thaw(); err != nil && !cgroupGone(err) {
				return err
			}
		}
		if kerr != nil {
			return kerr
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// awaitFreezer waits until reached reports the freezer state written, for at
// most timeout. The kernel notifies no change of v1's freezer.state, so
// both versions poll.
func awaitFreezer(timeout time.Duration, reached func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := reached()
		if err != nil || ok {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w after %s", errStillFreezing, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// removeDir removes a cgroup dir, retrying while the kernel still counts
// exiting tasks in it.
func removeDir(dir string) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := syscall.Rmdir(dir)
		if err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("remove cgroup %s: %w", dir, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// makeJobDir creates a job cgroup dir, replacing a stale empty one left by a
// crashed node.
func makeJobDir(dir string) error {
	err := os.Mkdir(dir, 0o755)
	if errors.Is(err, os.ErrExist) {
		if rerr := syscall.Rmdir(dir); rerr != nil {
			return fmt.Errorf("cgroup %s exists and is busy (is the job already running?): %w", dir, rerr)
		}
		err = os.Mkdir(dir, 0o755)
	}
	if err != nil {
		return fmt.Errorf("create cgroup: %w", err)
	}
	return nil
}
