package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Process is a job running in its sandbox.
type Process struct {
	spec    Spec
	uid     int
	lease   *Lease // the uid Start leased itself, released once the job is gone
	cg      cgroup
	cmd     *exec.Cmd
	started time.Time

	freezeMu     sync.Mutex     // one Freeze or Thaw at a time
	copiers      sync.WaitGroup // output copy goroutines
	bg           sync.WaitGroup // disk watchdog and context watcher
	stopped      atomic.Bool
	diskExceeded atomic.Bool

	done chan struct{} // closed once the job is gone and its cgroup removed
	exit Exit
	err  error
}

// Start runs s.Argv in a new sandbox and returns once bubblewrap, which
// builds the sandbox and runs the job's program in it, is executing inside
// the job's cgroup as the job's uid. When ctx ends the job is stopped with
// DefaultStopGrace. The caller must call Wait.
func Start(ctx context.Context, s Spec) (*Process, error) {
	if !hooked.Load() {
		return nil, ErrNoTrampoline
	}
	cwd, err := checkSpec(&s)
	if err != nil {
		return nil, err
	}
	name, err := sanitizeName(s.Name)
	if err != nil {
		return nil, err
	}
	h, err := machine()
	if err != nil {
		return nil, err
	}
	bw, err := bwrap()
	if err != nil {
		return nil, err
	}
	progs, err := seccompPrograms()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnsupported, err)
	}
	p := &Process{spec: s, uid: s.UID, done: make(chan struct{})}
	if err := p.leaseUID(); err != nil {
		return nil, err
	}
	if err := p.setUp(h, name, bw, cwd, progs); err != nil {
		return nil, errors.Join(err, p.lease.Release())
	}
	go p.reap()
	p.watch(ctx)
	return p, nil
}

// checkSpec checks what Start needs of s before it touches anything: a
// command, an absolute job dir (which it cleans in s), a cwd inside that dir
// and read-only paths that pass CheckReadOnly and exist. It returns the dir
// the job starts in.
func checkSpec(s *Spec) (cwd string, err error) {
	if len(s.Argv) == 0 {
		return "", errors.New("sandbox: empty Argv")
	}
	if !filepath.IsAbs(s.Dir) {
		return "", fmt.Errorf("sandbox: job dir %q is not absolute", s.Dir)
	}
	s.Dir = filepath.Clean(s.Dir)
	cwd = s.Dir
	if s.Cwd != "" {
		cwd = filepath.Clean(s.Cwd)
		if !under(cwd, s.Dir) {
			return "", fmt.Errorf("sandbox: cwd %s is not inside the job dir %s", cwd, s.Dir)
		}
	}
	for _, ro := range s.ReadOnly {
		if err := CheckReadOnly(ro); err != nil {
			return "", fmt.Errorf("sandbox: read-only path: %w", err)
		}
		if _, err := os.Stat(ro); err != nil {
			return "", fmt.Errorf("sandbox: read-only path: %w", err)
		}
	}
	if s.Root != "" {
		if fi, err := os.Stat(s.Root); err != nil || !fi.IsDir() || !filepath.IsAbs(s.Root) {
			return "", fmt.Errorf("sandbox: image root %q is not an absolute directory (%v)", s.Root, err)
		}
		targets := append([]string{s.Dir, "/var/tmp"}, s.ReadOnly...)
		if len(s.Limits.GPUs) > 0 {
			targets = append(targets, nvidiaDir) // the driver's tmpfs
		}
		if err := imageMountpoints(s.Root, targets); err != nil {
			return "", fmt.Errorf("sandbox: %w", err)
		}
	}
	return cwd, nil
}

// leaseUID leases the job a uid from DefaultIDs when its Spec names none,
// and refuses a uid no job may run as: a negative one or the node's own.
func (p *Process) leaseUID() error {
	switch {
	case p.spec.UID == 0:
		var err error
		if p.lease, err = DefaultIDs.Acquire(); err != nil {
			return err
		}
		p.uid = p.lease.ID
	case p.spec.UID < 0 || p.spec.UID == os.Getuid():
		return fmt.Errorf("sandbox: uid %d is not one a job may run as", p.spec.UID)
	}
	return nil
}

// setUp hands the job dir to the job's uid, creates the job's cgroup, named
// name in hierarchy h, and starts the trampoline, which runs bwrap (bw) with
// the seccomp filters progs. When the trampoline fails to start it kills
// what is in the cgroup and removes it; the caller releases the uid.
func (p *Process) setUp(h hierarchy, name, bw, cwd string, progs [][]byte) error {
	if err := prepareDir(p.spec.Dir, p.uid); err != nil {
		return err
	}
	cfg := p.newTrampolineConfig(bw, cwd, len(progs), h.jobDirs(name))
	var err error
	if p.cg, err = h.create(name, p.spec.Limits); err != nil {
		return fmt.Errorf("create cgroup: %w", err)
	}
	cfg.JoinFiles = p.cg.joinFiles()
	cfg.CgroupSuffix = "/" + parentCgroup + "/" + name
	if h.version() == 1 {
		cfg.CgroupControllers = h.controllers()
	}
	if err := p.start(cfg, progs); err != nil {
		kerr := p.cg.kill()
		return errors.Join(err, kerr, p.cg.remove())
	}
	return nil
}

// newTrampolineConfig says how the trampoline runs the job: as its uid,
// under its file size bound, from cwd, through bwrap (bw) with the job's
// view of the filesystem (where cgroups are concerned, its own cgroup
// dirs alone), its environment and filters seccomp filters read from
// firstSeccompFD on. The cgroup fields are the caller's to fill in.
func (p *Process) newTrampolineConfig(bw, cwd string, filters int, cgroups map[string]string) trampolineConfig {
	s := p.spec
	var scFDs []int
	for i := range filters {
		scFDs = append(scFDs, firstSeccompFD+i)
	}
	hide := append(defaultHidden(), s.Hide...)
	if s.Root != "" {
		hide = s.Hide // the host's homes and secrets are not in an image
	}
	view := bwrapView{Dir: s.Dir, Cwd: cwd, Root: s.Root, ReadOnly: s.ReadOnly, Hide: hide,
		GPUs: s.Limits.GPUs, Cgroups: cgroups, OwnNet: s.NetNS == nil, SeccompFDs: scFDs}
	if s.Root != "" && len(s.Limits.GPUs) > 0 {
		view.DriverLibs, view.DriverBins = driverFiles()
	}
	// The job's environment is the job's program's, which bubblewrap sets
	// inside the sandbox (--clearenv, --setenv): bubblewrap itself runs,
	// still outside, with a PATH alone. A job's LD_PRELOAD (an image's
	// config sets it) must not load a library into it before the sandbox
	// is built.
	view.Env = buildEnv(s)
	return trampolineConfig{
		UID: p.uid, GID: p.uid, FSize: s.Limits.DiskBytes, Dir: cwd,
		Path: bw, Argv: bwrapArgs(bw, view, s.Argv), Env: []string{"PATH=/usr/bin:/bin"},
	}
}

// watch starts, beside reap, the disk watchdog when the job's dir has a
// bound, and a goroutine that stops the job when ctx ends.
func (p *Process) watch(ctx context.Context) {
	if p.spec.Limits.DiskBytes > 0 {
		p.bg.Add(1)
		go p.watchDisk()
	}
	if ctx.Done() != nil {
		p.bg.Add(1)
		go func() {
			defer p.bg.Done()
			select {
			case <-ctx.Done():
				p.Stop(DefaultStopGrace)
			case <-p.done:
			}
		}()
	}
}

// Wait blocks until the job and everything it spawned are gone and the
// cgroup is removed. The error reports a failure of the sandbox itself
// (a cgroup it could not empty or remove), never the job's exit status.
func (p *Process) Wait() (Exit, error) {
	<-p.done
	p.bg.Wait()
	return p.exit, p.err
}

// Freeze stops every process of the job where it stands, through its
// cgroup's freezer, until Thaw: the job keeps its memory and its dir but
// uses no CPU, as when the machine's owner comes back. It returns once the
// kernel reports the whole cgroup frozen; when that takes longer than
// FreezeTimeout (a task stuck in the kernel) it thaws the job again and
// returns an error. Stop ends a frozen job too: it thaws the job, which
// then gets its grace period. A frozen job's clocks run on, so its own
// timeouts may fire once it is thawed.
func (p *Process) Freeze() error {
	p.freezeMu.Lock()
	defer p.freezeMu.Unlock()
	if p.ended() {
		return ErrEnded
	}
	err := p.cg.setFrozen(true, FreezeTimeout)
	if errors.Is(err, errStillFreezing) {
		err = errors.Join(err, p.cg.setFrozen(false, FreezeTimeout))
	}
	if err != nil {
		return fmt.Errorf("sandbox %s: freeze: %w", p.spec.Name, err)
	}
	return nil
}

// Thaw lets a job stopped by Freeze run on; thawing a job that is not
// frozen does nothing.
func (p *Process) Thaw() error {
	p.freezeMu.Lock()
	defer p.freezeMu.Unlock()
	if p.ended() {
		return ErrEnded
	}
	if err := p.cg.setFrozen(false, FreezeTimeout); err != nil {
		return fmt.Errorf("sandbox %s: thaw: %w", p.spec.Name, err)
	}
	return nil
}

// Frozen reports whether the kernel holds every process of the job frozen.
func (p *Process) Frozen() bool {
	select {
	case <-p.done:
		return false
	default:
	}
	f, err := p.cg.frozen()
	return err == nil && f
}

// ended reports whether the job is gone or Stop has begun to end it.
func (p *Process) ended() bool {
	select {
	case <-p.done:
		return true
	default:
		return p.stopped.Load()
	}
}

// CPUUsage is the CPU time every process of the job has used so far; once
// the job is gone, the total that Wait reports.
func (p *Process) CPUUsage() (time.Duration, error) {
	select {
	case <-p.done:
		return p.exit.CPU, nil
	default:
	}
	d, err := p.cg.cpuUsage()
	if err != nil {
		select {
		case <-p.done: // the cgroup was removed as we read it
			return p.exit.CPU, nil
		default:
		}
		return 0, fmt.Errorf("sandbox %s: CPU usage: %w", p.spec.Name, err)
	}
	return d, nil
}

// JobsCPUUsage is the CPU time used by every job sandboxed on this machine
// since the sandboxes' parent cgroup was created, by jobs that have ended
// and by other nodes' jobs on the machine included. Its growth over an
// interval is the CPU that lending took from the machine.
func JobsCPUUsage() (time.Duration, error) {
	h, err := machine()
	if err != nil {
		return 0, err
	}
	d, err := h.jobsCPU()
	if err != nil {
		return 0, fmt.Errorf("sandbox: jobs' CPU usage: %w", err)
	}
	return d, nil
}

// Pid is the pid of the job's main process, bwrap, outside the sandbox.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// UID is the uid the job runs as.
func (p *Process) UID() int { return p.uid }

// buildEnv makes the job's environment from nothing: the node's own may
// hold secrets such as its API token.
func buildEnv(s Spec) []string {
	var keys []string
	vals := map[string]string{}
	set := func(k, v string) {
		if _, ok := vals[k]; !ok {
			keys = append(keys, k)
		}
		vals[k] = v
	}
	set("PATH", "/usr/local/bin:/usr/bin:/bin")
	set("HOME", s.Dir)
	set("LANG", "C.UTF-8")
	set("TMPDIR", "/tmp") // the job's own, in its dir
	set("USER", "job")
	set("LOGNAME", "job")
	for _, kv := range s.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" && k != trampolineEnv {
			set(k, v)
		}
	}
	gpus := make([]string, len(s.Limits.GPUs))
	for i, g := range s.Limits.GPUs {
		gpus[i] = strconv.Itoa(g)
	}
	set("CUDA_VISIBLE_DEVICES", strings.Join(gpus, ","))
	set("NVIDIA_VISIBLE_DEVICES", strings.Join(gpus, ","))
	if s.Root != "" && len(gpus) > 0 {
		ld, path := withDriverPaths(vals["LD_LIBRARY_PATH"], vals["PATH"])
		set("LD_LIBRARY_PATH", ld)
		set("PATH", path)
	}
	env := make([]string, len(keys))
	for i, k := range keys {
		env[i] = k + "=" + vals[k]
	}
	return env
}
