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

	bwrapMu    sync.Mutex
	bwrapByUID = map[int]string{}
)

// machine detects the cgroup hierarchy once per node process.
func machine() (hierarchy, error) {
	hierOnce.Do(func() {
		if os.Geteuid() != 0 {
			hierErr = fmt.Errorf("%w: creating cgroups needs root", ErrUnsupported)
			return
		}
		hier, hierErr = detectHierarchy(cgroupRoot, "/proc/self/mountinfo")
	})
	return hier, hierErr
}

// bwrapFor returns the usable bwrap for id, checking once per uid.
func bwrapFor(id identity) string {
	bwrapMu.Lock()
	defer bwrapMu.Unlock()
	p, ok := bwrapByUID[id.uid]
	if !ok {
		p = findBwrap(id)
		bwrapByUID[id.uid] = p
	}
	return p
}

// Probe reports which enforcement mechanisms work on this machine. It
// creates and removes a probe cgroup, may create the job user, and runs
// bwrap once, so call it at node start rather than per job.
func Probe() Capabilities {
	id := defaultIdentity()
	c := Capabilities{SwitchUser: id.switchUser, JobUser: id.name, JobUID: id.uid, JobGID: id.gid}
	if !id.switchUser {
		c.Problems = append(c.Problems, "not root: jobs run as the node's own user")
	}
	if h, err := machine(); err != nil {
		c.Problems = append(c.Problems, "cgroups: "+err.Error())
	} else if cg, err := h.create("probe-"+strconv.Itoa(os.Getpid()), Limits{MemBytes: 64 << 20, Pids: 16}); err != nil {
		c.Problems = append(c.Problems, "cgroups: "+err.Error())
	} else {
		if err := cg.remove(); err != nil {
			c.Problems = append(c.Problems, "cgroups: "+err.Error())
		}
		c.CgroupVersion = h.version()
		c.Controllers = h.controllers()
		c.SwapLimited = h.swapLimited()
		if !c.SwapLimited {
			c.Problems = append(c.Problems, "swap is not limited: a job may swap beyond its memory limit")
		}
	}
	if c.Bwrap = bwrapFor(id); c.Bwrap == "" {
		c.Problems = append(c.Problems, "bubblewrap is missing or cannot create namespaces: Hide paths and the read-only view rest on file modes")
	}
	return c
}

// Process is a job running in its sandbox.
type Process struct {
	spec    Spec
	cg      cgroup
	cmd     *exec.Cmd
	bwrap   bool
	started time.Time

	copiers      sync.WaitGroup // output copy goroutines
	bg           sync.WaitGroup // disk watchdog and context watcher
	stopped      atomic.Bool
	diskExceeded atomic.Bool

	done chan struct{} // closed once the job is gone and its cgroup removed
	exit Exit
	err  error
}

// Start runs s.Argv in a new sandbox and returns once the job's own program
// is executing inside its cgroup. When ctx ends the job is stopped with
// DefaultStopGrace. The caller must call Wait.
func Start(ctx context.Context, s Spec) (*Process, error) {
	if !hooked.Load() {
		return nil, ErrNoTrampoline
	}
	if len(s.Argv) == 0 {
		return nil, errors.New("sandbox: empty Argv")
	}
	s.Dir = filepath.Clean(s.Dir)
	cwd := s.Dir
	if s.Cwd != "" {
		cwd = filepath.Clean(s.Cwd)
		if rel, err := filepath.Rel(s.Dir, cwd); err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
			return nil, fmt.Errorf("sandbox: cwd %s is not inside the job dir %s", cwd, s.Dir)
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
	id, err := identityFor(s)
	if err != nil {
		return nil, err
	}
	if err := prepareDir(s.Dir, id); err != nil {
		return nil, err
	}
	p := &Process{spec: s, done: make(chan struct{})}
	cfg := trampolineConfig{
		SwitchUser: id.switchUser, UID: id.uid, GID: id.gid,
		FSize: s.Limits.DiskBytes, Dir: cwd, Argv: s.Argv, Env: buildEnv(s, id),
	}
	if bw := bwrapFor(id); bw != "" && !s.noBwrap {
		hide := append(defaultHidden(), s.Hide...)
		view := bwrapView{Dir: s.Dir, Cwd: cwd, ReadOnly: s.ReadOnly, Hide: hide, GPU: len(s.Limits.GPUs) > 0}
		cfg.Path, cfg.Argv, p.bwrap = bw, bwrapArgs(bw, view, s.Argv), true
	}
	if p.cg, err = h.create(name, s.Limits); err != nil {
		return nil, fmt.Errorf("create cgroup: %w", err)
	}
	cfg.JoinFiles = p.cg.joinFiles()
	cfg.CgroupSuffix = "/" + parentCgroup + "/" + name
	if h.version() == 1 {
		cfg.CgroupControllers = h.controllers()
	}
	if err := p.start(cfg); err != nil {
		kerr := p.cg.kill()
		return nil, errors.Join(err, kerr, p.cg.remove())
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

// start runs the trampoline and waits until it has exec'd the job.
func (p *Process) start(cfg trampolineConfig) error {
	cfgR, cfgW, err := os.Pipe()
	if err != nil {
		return err
	}
	defer cfgW.Close()
	stR, stW, err := os.Pipe()
	if err != nil {
		cfgR.Close()
		return err
	}
	defer stR.Close()
	closeAfterStart := []*os.File{cfgR, stW}
	defer func() {
		for _, f := range closeAfterStart {
			f.Close()
		}
	}()

	p.cmd = &exec.Cmd{
		Path: "/proc/self/exe", // the node binary, even if replaced on disk since
		Args: []string{"deepmarket-sandbox", cfg.Argv[0]},
		// The trampoline's only variable; the job's env travels in cfg.
		Env:        []string{trampolineEnv + "=1"},
		Dir:        "/",
		ExtraFiles: []*os.File{cfgR, stW},
		// Its own session: no controlling terminal, no node's process group.
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
	if p.spec.NetNS != nil {
		p.cmd.ExtraFiles = append(p.cmd.ExtraFiles, p.spec.NetNS.f)
		cfg.NetNSFD = netnsFD
	}
	if p.cmd.Stdout, err = p.output(p.spec.Stdout, &closeAfterStart); err != nil {
		return err
	}
	if interfaceEqual(p.spec.Stdout, p.spec.Stderr) {
		p.cmd.Stderr = p.cmd.Stdout
	} else if p.cmd.Stderr, err = p.output(p.spec.Stderr, &closeAfterStart); err != nil {
		return err
	}
	if dir := p.cg.cloneDir(); dir != "" {
		fd, err := os.Open(dir)
		if err != nil {
			return fmt.Errorf("open cgroup: %w", err)
		}
		defer fd.Close()
		p.cmd.SysProcAttr.UseCgroupFD = true
		p.cmd.SysProcAttr.CgroupFD = int(fd.Fd())
	}
	p.started = time.Now()
	if err := p.cmd.Start(); err != nil {
		return fmt.Errorf("start trampoline: %w", err)
	}
	for _, f := range closeAfterStart {
		f.Close()
	}
	closeAfterStart = nil
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

// output gives the job an *os.File for w. A pipe with a copy goroutine
// stands in for other writers; it ends when the last process holding the
// pipe dies, which reap ensures by emptying the cgroup first.
func (p *Process) output(w io.Writer, closeAfterStart *[]*os.File) (*os.File, error) {
	if w == nil {
		return nil, nil // exec.Cmd opens /dev/null
	}
	if f, ok := w.(*os.File); ok {
		return f, nil
	}
	r, wf, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	*closeAfterStart = append(*closeAfterStart, wf)
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
// counters and removes the cgroup.
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
			if p.bwrap && e.Code > 128 && e.Code <= 128+64 {
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
	if err := errors.Join(werr, kerr, rerr); err != nil {
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

// Pid is the pid of the job's main process (of bwrap, when used).
func (p *Process) Pid() int { return p.cmd.Process.Pid }

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
	if !p.bwrap {
		_, _ = p.cg.signal(syscall.SIGTERM, nil) // errors mean the cgroup is already gone
	} else if n, _ := p.cg.signal(syscall.SIGTERM, p.isBwrapMonitor); n == 0 {
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
func buildEnv(s Spec, id identity) []string {
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
	set("TMPDIR", filepath.Join(s.Dir, "tmp"))
	set("USER", id.name)
	set("LOGNAME", id.name)
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
