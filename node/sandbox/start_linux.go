package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"syscall"
	"time"
)

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
