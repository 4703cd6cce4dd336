package sandbox

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

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

// Reap SIGKILLs every process in the sandbox named name (a Spec.Name) and
// removes its cgroup, saying how many processes it killed. It is for the
// sandboxes of a node process that died without stopping them (SIGKILL,
// power cut): nothing else ever ends those jobs. A sandbox that does not
// exist is no error, nor is one whose cgroup goes while Reap kills it (in a
// process that still holds the sandbox's Process, as a test does, its reap
// removes the cgroup once the job is dead). Reap trusts its caller that the
// sandbox is no longer wanted: never pass the name of a sandbox that a live
// node still runs.
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
