package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// cgroupRoot is where the cgroup hierarchy is looked for.
const cgroupRoot = "/sys/fs/cgroup"

var (
	hierOnce sync.Once
	hier     hierarchy
	hierErr  error

	bwrapOnce sync.Once
	bwrapPath string
	bwrapErr  error
)

// machine detects the cgroup hierarchy once per node process.
func machine() (hierarchy, error) {
	hierOnce.Do(func() {
		if os.Geteuid() != 0 {
			hierErr = fmt.Errorf("%w: the node must run as root to confine jobs (cgroups, a uid per job)", ErrUnsupported)
			return
		}
		hier, hierErr = detectHierarchy(cgroupRoot, "/proc/self/mountinfo")
	})
	return hier, hierErr
}

// bwrap finds bubblewrap once per node process.
func bwrap() (string, error) {
	bwrapOnce.Do(func() { bwrapPath, bwrapErr = findBwrap() })
	if bwrapErr != nil {
		return "", fmt.Errorf("%w: %w", ErrUnsupported, bwrapErr)
	}
	return bwrapPath, nil
}

// probeUID runs Probe's trial job: nobody, which every system has and
// which owns nothing a trial of "true" could touch.
const probeUID = 65534

// Probe reports whether this machine builds the whole sandbox: it needs
// root, cgroups with the memory and pids controllers, bubblewrap 0.8 or
// later and a kernel that lets it make namespaces and load a seccomp
// filter. It creates and removes a probe cgroup and runs one trial job in
// a full sandbox, so call it at node start rather than per job.
func Probe() Capabilities {
	var c Capabilities
	c.Root = os.Geteuid() == 0
	if !c.Root {
		c.Missing = append(c.Missing, "the node is not root: run it as root (sudo, or the packaged systemd unit) so that it can create cgroups and run each job as its own user")
		return c
	}
	h, err := machine()
	if err == nil {
		var cg cgroup
		if cg, err = h.create("probe-"+strconv.Itoa(os.Getpid()), Limits{MemBytes: 64 << 20, Pids: 16}); err == nil {
			err = cg.remove()
		}
	}
	if err != nil {
		c.Missing = append(c.Missing, "cgroups: "+err.Error()+" (mount cgroup v2 at /sys/fs/cgroup, or v1 with the memory and pids controllers)")
	} else {
		c.CgroupVersion = h.version()
		c.Controllers = h.controllers()
		c.SwapLimited = h.swapLimited()
		if !c.SwapLimited {
			c.Problems = append(c.Problems, "swap is not limited: a job may swap beyond its memory limit")
		}
	}
	bw, err := bwrap()
	if err != nil {
		c.Missing = append(c.Missing, err.Error())
		return c
	}
	if c.CgroupVersion == 0 {
		return c
	}
	if err := trial(); err != nil {
		c.Missing = append(c.Missing, "a trial job could not be sandboxed: "+err.Error()+
			" (bubblewrap needs unprivileged user namespaces: sysctl -w user.max_user_namespaces=15000 kernel.unprivileged_userns_clone=1; on Ubuntu 24.04 or later, the bwrap AppArmor profile)")
		return c
	}
	c.Bwrap = bw
	return c
}

// trial runs true in a full sandbox.
func trial() error {
	base, err := os.MkdirTemp("", "deepmarket-probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(base)
	if err := os.Chmod(base, 0o711); err != nil {
		return err
	}
	var out strings.Builder
	p, err := Start(context.Background(), Spec{Name: "probe-" + strconv.Itoa(os.Getpid()), Dir: filepath.Join(base, "job"),
		Argv: []string{"true"}, UID: probeUID, Limits: Limits{MemBytes: 64 << 20, Pids: 16}, Stdout: &out, Stderr: &out})
	if err != nil {
		return err
	}
	e, err := p.Wait()
	if err != nil {
		return err
	}
	if e.Code != 0 || e.Signal != "" {
		return fmt.Errorf("exit %d %s: %s", e.Code, e.Signal, strings.TrimSpace(out.String()))
	}
	return nil
}

// Process is a job running in its sandbox.
type Process struct {
	spec    Spec
	uid     int
	lease   *Lease // the uid Start leased itself, released once the job is gone
	cg      cgroup
	cmd     *exec.Cmd
	started time.Time

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
	if len(s.Argv) == 0 {
		return nil, errors.New("sandbox: empty Argv")
	}
	if !filepath.IsAbs(s.Dir) {
		return nil, fmt.Errorf("sandbox: job dir %q is not absolute", s.Dir)
	}
	s.Dir = filepath.Clean(s.Dir)
	cwd := s.Dir
	if s.Cwd != "" {
		cwd = filepath.Clean(s.Cwd)
		if !under(cwd, s.Dir) {
			return nil, fmt.Errorf("sandbox: cwd %s is not inside the job dir %s", cwd, s.Dir)
		}
	}
	for _, ro := range s.ReadOnly {
		if err := CheckReadOnly(ro); err != nil {
			return nil, fmt.Errorf("sandbox: read-only path: %w", err)
		}
		if _, err := os.Stat(ro); err != nil {
			return nil, fmt.Errorf("sandbox: read-only path: %w", err)
		}
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
	switch {
	case s.UID == 0:
		if p.lease, err = DefaultIDs.Acquire(); err != nil {
			return nil, err
		}
		p.uid = p.lease.ID
	case s.UID < 0 || s.UID == os.Getuid():
		return nil, fmt.Errorf("sandbox: uid %d is not one a job may run as", s.UID)
	}
	fail := func(err error) (*Process, error) {
		return nil, errors.Join(err, p.lease.Release())
	}
	if err := prepareDir(s.Dir, p.uid); err != nil {
		return fail(err)
	}
	var scFDs []int
	for i := range progs {
		scFDs = append(scFDs, firstSeccompFD+i)
	}
	view := bwrapView{Dir: s.Dir, Cwd: cwd, ReadOnly: s.ReadOnly, Hide: append(defaultHidden(), s.Hide...),
		GPU: len(s.Limits.GPUs) > 0, OwnNet: s.NetNS == nil, SeccompFDs: scFDs}
	cfg := trampolineConfig{
		UID: p.uid, GID: p.uid, FSize: s.Limits.DiskBytes, Dir: cwd,
		Path: bw, Argv: bwrapArgs(bw, view, s.Argv), Env: buildEnv(s),
	}
	if p.cg, err = h.create(name, s.Limits); err != nil {
		return fail(fmt.Errorf("create cgroup: %w", err))
	}
	cfg.JoinFiles = p.cg.joinFiles()
	cfg.CgroupSuffix = "/" + parentCgroup + "/" + name
	if h.version() == 1 {
		cfg.CgroupControllers = h.controllers()
	}
	if err := p.start(cfg, progs); err != nil {
		kerr := p.cg.kill()
		return fail(errors.Join(err, kerr, p.cg.remove()))
	}
	go p.reap()
	if s.Limits.DiskBytes > 0 {
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
	return p, nil
}

// start runs the trampoline and waits until it has exec'd bwrap.
func (p *Process) start(cfg trampolineConfig, seccompProgs [][]byte) error {
	// ours are the node's ends, closed on return; theirs are the
	// trampoline's, closed as soon as it has them (or failed to start), so
	// that only the job holds them and the output copies see EOF when it
	// ends.
	var ours, theirs []*os.File
	defer func() {
		for _, f := range append(ours, theirs...) {
			f.Close()
		}
	}()
	closeTheirs := func() {
		for _, f := range theirs {
			f.Close()
		}
		theirs = nil
	}
	pipe := func() (r, w *os.File, err error) {
		if r, w, err = os.Pipe(); err == nil {
			ours = append(ours, r, w) // until sorted below
		}
		return r, w, err
	}
	cfgR, cfgW, err := pipe()
	if err != nil {
		return err
	}
	stR, stW, err := pipe()
	if err != nil {
		return err
	}
	ours, theirs = []*os.File{cfgW, stR}, []*os.File{cfgR, stW}
	// Each filter fits a pipe's buffer whole; bwrap reads them and closes
	// them before the job's program runs.
	for _, prog := range seccompProgs {
		r, w, err := os.Pipe()
		if err != nil {
			return err
		}
		theirs = append(theirs, r)
		_, err = w.Write(prog)
		w.Close()
		if err != nil {
			return fmt.Errorf("seccomp filter: %w", err)
		}
	}

	p.cmd = &exec.Cmd{
		Path: "/proc/self/exe", // the node binary, even if replaced on disk since
		Args: []string{"deepmarket-sandbox", p.spec.Argv[0]},
		// The trampoline's only variable; the job's env travels in cfg.
		Env:        []string{trampolineEnv + "=1"},
		Dir:        "/",
		ExtraFiles: slices.Clone(theirs), // fds 3, 4, then the filters from firstSeccompFD
		// Its own session: no controlling terminal, no node's process group.
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
	if p.spec.NetNS != nil {
		cfg.NetNSFD = 3 + len(p.cmd.ExtraFiles)
		p.cmd.ExtraFiles = append(p.cmd.ExtraFiles, p.spec.NetNS.f)
	}
	if p.cmd.Stdout, err = p.output(p.spec.Stdout, &theirs); err != nil {
		closeTheirs()
		p.copiers.Wait()
		return err
	}
	if interfaceEqual(p.spec.Stdout, p.spec.Stderr) {
		p.cmd.Stderr = p.cmd.Stdout
	} else if p.cmd.Stderr, err = p.output(p.spec.Stderr, &theirs); err != nil {
		closeTheirs()
		p.copiers.Wait()
		return err
	}
	if dir := p.cg.cloneDir(); dir != "" {
		fd, err := os.Open(dir)
		if err != nil {
			closeTheirs()
			p.copiers.Wait()
			return fmt.Errorf("open cgroup: %w", err)
		}
		defer fd.Close()
		p.cmd.SysProcAttr.UseCgroupFD = true
		p.cmd.SysProcAttr.CgroupFD = int(fd.Fd())
	}
	p.started = time.Now()
	err = p.cmd.Start()
	closeTheirs()
	if err != nil {
		p.copiers.Wait()
		return fmt.Errorf("start trampoline: %w", err)
	}
	werr := json.NewEncoder(cfgW).Encode(cfg)
	cfgW.Close()
	msg, rerr := io.ReadAll(stR) // EOF without a message: the exec succeeded
	if len(msg) > 0 || werr != nil || rerr != nil {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
		p.copiers.Wait()
		if len(msg) > 0 {
			return fmt.Errorf("start job: %s", msg)
		}
		return fmt.Errorf("start job: %w", errors.Join(werr, rerr))
	}
	return nil
}

// output gives the job the write end of a pipe whose other end a goroutine
// copies into w: never a file of the node's, which the job could then
// truncate, fallocate or seek. The copy ends when the last process holding
// the pipe dies, which reap ensures by emptying the cgroup first.
func (p *Process) output(w io.Writer, theirs *[]*os.File) (*os.File, error) {
	if w == nil {
		return nil, nil // exec.Cmd opens /dev/null
	}
	r, wf, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	*theirs = append(*theirs, wf)
	p.copiers.Add(1)
	go func() {
		defer p.copiers.Done()
		_, _ = io.Copy(w, r)
		r.Close()
	}()
	return wf, nil
}

// interfaceEqual is a == b without panicking on uncomparable writers.
func interfaceEqual(a, b io.Writer) (eq bool) {
	defer func() { _ = recover() }()
	return a == b
}

// reap waits for the main process, kills what it left behind, collects the
// counters, removes the cgroup and gives the job dir back to root.
func (p *Process) reap() {
	werr := p.cmd.Wait()
	wall := time.Since(p.started)
	var ee *exec.ExitError
	if errors.As(werr, &ee) {
		werr = nil // a failing job is a result, not a sandbox error
	}
	kerr := p.cg.kill()
	p.copiers.Wait()
	st := p.cg.stats()
	if b := p.spec.Limits.DiskBytes; b > 0 && dirUsage(p.spec.Dir) > b {
		p.diskExceeded.Store(true)
	}
	rerr := p.cg.remove()
	// Nothing runs as the job's uid any more: root takes the dir back, so
	// that what the node does with it next (importing the output, removing
	// it) races no process of the job, and the uid owns nothing once leased
	// again.
	var cerr error
	if kerr == nil {
		cerr = chownTree(p.spec.Dir, 0, 0)
	}
	if kerr == nil && cerr == nil {
		cerr = p.lease.Release()
	}

	e := Exit{Wall: wall, CPU: st.cpu, MaxRSS: st.peak, Stopped: p.stopped.Load(), PidsLimited: st.pidsLimited}
	var sig syscall.Signal
	if ps := p.cmd.ProcessState; ps != nil {
		ws, _ := ps.Sys().(syscall.WaitStatus)
		switch {
		case ws.Signaled():
			e.Code, sig = -1, ws.Signal()
		default:
			e.Code = ws.ExitStatus()
			// bwrap reports its child's death by signal n as exit 128+n.
			if e.Code > 128 && e.Code <= 128+64 {
				sig = syscall.Signal(e.Code - 128)
			}
		}
		if ru, ok := ps.SysUsage().(*syscall.Rusage); ok && e.MaxRSS == 0 {
			e.MaxRSS = uint64(ru.Maxrss) * 1024
		}
	}
	if sig != 0 {
		e.Signal = unix.SignalName(sig)
	}
	e.DiskExceeded = p.diskExceeded.Load() || sig == syscall.SIGXFSZ
	e.OOMKilled = st.oomKilled || st.memLimitHit && sig == syscall.SIGKILL && !e.Stopped && !e.DiskExceeded
	p.exit = e
	if err := errors.Join(werr, kerr, rerr, cerr); err != nil {
		p.err = fmt.Errorf("sandbox %s: %w", p.spec.Name, err)
	}
	close(p.done)
}

// Wait blocks until the job and everything it spawned are gone and the
// cgroup is removed. The error reports a failure of the sandbox itself
// (a cgroup it could not empty or remove), never the job's exit status.
func (p *Process) Wait() (Exit, error) {
	<-p.done
	p.bg.Wait()
	return p.exit, p.err
}

// Pid is the pid of the job's main process, bwrap, outside the sandbox.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// UID is the uid the job runs as.
func (p *Process) UID() int { return p.uid }

// Stop sends SIGTERM to every process in the job's cgroup, SIGKILLs them
// all after grace (sooner if the main process exits first), and returns once
// they are gone.
func (p *Process) Stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	p.stopped.Store(true)
	if n, _ := p.cg.signal(syscall.SIGTERM, p.isBwrapMonitor); n == 0 {
		// bwrap has not started the job's own program yet: nothing can
		// shut down gracefully, and ending bwrap ends the job.
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
		return
	case <-t.C:
	}
	_ = p.cg.kill() // reap reports a cgroup that cannot be emptied
	<-p.done
}

// Reap SIGKILLs every process in the sandbox named name (a Spec.Name) and
// removes its cgroup, saying how many processes it killed. It is for the
// sandboxes of a node process that died without stopping them (SIGKILL,
// power cut): nothing else ever ends those jobs. A sandbox that does not
// exist is no error. Reap trusts its caller that the sandbox is no longer
// wanted: never pass the name of a sandbox that a live node still runs.
func Reap(name string) (killed int, err error) {
	if name, err = sanitizeName(name); err != nil {
		return 0, err
	}
	h, err := machine()
	if err != nil {
		return 0, err
	}
	cg, ok := h.open(name)
	if !ok {
		return 0, nil
	}
	// One frozen round counts the job's processes; kill then catches any
	// that could not be frozen and waits until the cgroup is empty.
	killed, serr := cg.signal(syscall.SIGKILL, nil)
	if err := errors.Join(serr, cg.kill()); err != nil {
		return killed, fmt.Errorf("sandbox: reap %s: %w", name, err)
	}
	if err := cg.remove(); err != nil {
		return killed, fmt.Errorf("sandbox: reap %s: %w", name, err)
	}
	return killed, nil
}

// isBwrapMonitor reports whether pid is bwrap's outer process or the init
// of the job's pid namespace. Neither handles SIGTERM, and either one's death
// ends the job at once, so SIGTERM goes only to the job's own processes and
// they get the whole grace period.
func (p *Process) isBwrapMonitor(pid int) bool {
	if pid == p.cmd.Process.Pid {
		return true
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "NSpid:"); ok {
			f := strings.Fields(v)
			return len(f) > 1 && f[len(f)-1] == "1"
		}
	}
	return false
}

// watchDisk stops the job when its dir outgrows DiskBytes: RLIMIT_FSIZE
// bounds one file, this bounds their sum.
func (p *Process) watchDisk() {
	defer p.bg.Done()
	t := time.NewTicker(DiskCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-p.done:
			return
		case <-t.C:
			if dirUsage(p.spec.Dir) > p.spec.Limits.DiskBytes {
				p.diskExceeded.Store(true)
				_ = p.cg.kill()
				return
			}
		}
	}
}

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
	env := make([]string, len(keys))
	for i, k := range keys {
		env[i] = k + "=" + vals[k]
	}
	return env
}
