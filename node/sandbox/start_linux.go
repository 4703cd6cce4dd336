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
	var files startFiles
	defer files.closeAll()
	cfgW, stR, err := files.openPipes(seccompProgs)
	if err != nil {
		return err
	}
	p.cmd = trampolineCmd(p.spec.Argv[0], files.theirs)
	if p.spec.NetNS != nil {
		cfg.NetNSFD = 3 + len(p.cmd.ExtraFiles)
		p.cmd.ExtraFiles = append(p.cmd.ExtraFiles, p.spec.NetNS.f)
	}
	cgroupDir, err := p.connect(&files)
	if err != nil {
		files.closeTheirs()
		p.copiers.Wait()
		return err
	}
	if cgroupDir != nil {
		defer cgroupDir.Close()
	}
	p.started = time.Now()
	err = p.cmd.Start()
	files.closeTheirs()
	if err != nil {
		p.copiers.Wait()
		return fmt.Errorf("start trampoline: %w", err)
	}
	return p.handOver(cfg, cfgW, stR)
}

// startFiles are the descriptors start opens. ours are the node's ends,
// closed when start returns; theirs are the trampoline's, closed as soon as
// it has them (or failed to start), so that only the job holds them and the
// output copies see EOF when it ends.
type startFiles struct {
	ours, theirs []*os.File
}

// openPipes opens the config and status pipes, keeping the node's ends
// (the config's write end and the status's read end, which it returns) and
// giving the trampoline the others, then one pipe per seccomp filter.
func (files *startFiles) openPipes(seccompProgs [][]byte) (cfgW, stR *os.File, err error) {
	pipe := func() (r, w *os.File, err error) {
		if r, w, err = os.Pipe(); err == nil {
			files.ours = append(files.ours, r, w) // until sorted below
		}
		return r, w, err
	}
	cfgR, cfgW, err := pipe()
	if err != nil {
		return nil, nil, err
	}
	stR, stW, err := pipe()
	if err != nil {
		return nil, nil, err
	}
	files.ours, files.theirs = []*os.File{cfgW, stR}, []*os.File{cfgR, stW}
	return cfgW, stR, files.addSeccomp(seccompProgs)
}

// addSeccomp gives the trampoline one pipe per seccomp filter with the
// filter in it. Each filter fits a pipe's buffer whole; bwrap reads them and
// closes them before the job's program runs.
func (files *startFiles) addSeccomp(progs [][]byte) error {
	for _, prog := range progs {
		r, w, err := os.Pipe()
		if err != nil {
			return err
		}
		files.theirs = append(files.theirs, r)
		_, err = w.Write(prog)
		w.Close()
		if err != nil {
			return fmt.Errorf("seccomp filter: %w", err)
		}
	}
	return nil
}

// closeTheirs closes the trampoline's ends.
func (files *startFiles) closeTheirs() {
	for _, f := range files.theirs {
		f.Close()
	}
	files.theirs = nil
}

// closeAll closes what is still open of both sides.
func (files *startFiles) closeAll() {
	for _, f := range append(files.ours, files.theirs...) {
		f.Close()
	}
}

// trampolineCmd re-executes the node binary as the trampoline of a job whose
// program is argv0, handing it extra as its fds from 3 on.
func trampolineCmd(argv0 string, extra []*os.File) *exec.Cmd {
	return &exec.Cmd{
		Path: "/proc/self/exe", // the node binary, even if replaced on disk since
		Args: []string{"deepmarket-sandbox", argv0},
		// The trampoline's only variable; the job's env travels in cfg.
		Env:        []string{trampolineEnv + "=1"},
		Dir:        "/",
		ExtraFiles: slices.Clone(extra), // fds 3, 4, then the filters from firstSeccompFD
		// Its own session: no controlling terminal, no node's process group.
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
}

// connect gives the trampoline the job's stdout and stderr and, on cgroup
// v2, the job's cgroup to be cloned into. It returns that cgroup's dir open
// (nil on v1), for the caller to close once the trampoline has started.
func (p *Process) connect(files *startFiles) (cgroupDir *os.File, err error) {
	if p.cmd.Stdout, err = p.output(p.spec.Stdout, &files.theirs); err != nil {
		return nil, err
	}
	if interfaceEqual(p.spec.Stdout, p.spec.Stderr) {
		p.cmd.Stderr = p.cmd.Stdout
	} else if p.cmd.Stderr, err = p.output(p.spec.Stderr, &files.theirs); err != nil {
		return nil, err
	}
	dir := p.cg.cloneDir()
	if dir == "" {
		return nil, nil
	}
	fd, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("open cgroup: %w", err)
	}
	p.cmd.SysProcAttr.UseCgroupFD = true
	p.cmd.SysProcAttr.CgroupFD = int(fd.Fd())
	return fd, nil
}

// handOver sends the started trampoline its config on cfgW and reads stR
// until the trampoline has exec'd bwrap, which closes the status pipe with
// no message. When it fails, it kills the trampoline and waits for it and
// for the output copies.
func (p *Process) handOver(cfg trampolineConfig, cfgW, stR *os.File) error {
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
