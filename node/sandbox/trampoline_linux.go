package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// trampolineEnv marks a re-executed node binary as a trampoline. It is the
// trampoline's only environment variable; the job never sees it.
const trampolineEnv = "_DEEPMARKET_SANDBOX_TRAMPOLINE"

// Fds the trampoline inherits (exec.Cmd.ExtraFiles start at 3).
const (
	configFD = 3 // read: the JSON trampolineConfig
	statusFD = 4 // write, close-on-exec: an error message, or EOF on exec
	// From 5, read and left open across exec: one per seccomp filter, for
	// bwrap's --add-seccomp-fd, then the network namespace to join, when
	// NetNSFD says so.
	firstSeccompFD = 5
)

// hooked records that main called MaybeRunTrampoline, without which a
// re-executed binary would run the whole node again instead of the job.
var hooked atomic.Bool

// trampolineConfig is what the trampoline does between fork and the job.
type trampolineConfig struct {
	JoinFiles []string // cgroup.procs files to write our pid into (v1)
	// CgroupSuffix ("/deepmarket/<name>") is checked in /proc/self/cgroup
	// for CgroupControllers (v1) or the unified line (v2, when empty).
	CgroupSuffix      string
	CgroupControllers []string
	UID, GID          int    // the job's, never root
	FSize             uint64 // RLIMIT_FSIZE, 0 for none
	Dir               string
	Path              string // bwrap, which runs Argv[len(bwrap args):] in the sandbox
	Argv              []string
	Env               []string
	NetNSFD           int // 0: stay in the node's network namespace
}

// MaybeRunTrampoline must be the first call in main (and in TestMain of any
// test that starts sandboxed jobs). In the node it returns at once; in a
// process that Start re-executed as a trampoline it moves into the job's
// cgroup, drops privileges and execs bwrap, which builds the sandbox and
// runs the job in it, and never returns.
func MaybeRunTrampoline() {
	hooked.Store(true)
	if os.Getenv(trampolineEnv) != "1" {
		return
	}
	status := os.NewFile(statusFD, "status")
	if err := runTrampoline(); err != nil {
		_, _ = io.WriteString(status, err.Error())
		os.Exit(127)
	}
	os.Exit(127) // unreachable: runTrampoline execs or fails
}

func runTrampoline() error {
	syscall.CloseOnExec(statusFD)
	cf := os.NewFile(configFD, "config")
	var cfg trampolineConfig
	err := json.NewDecoder(cf).Decode(&cfg)
	cf.Close()
	if err != nil {
		return fmt.Errorf("sandbox trampoline: read config: %w", err)
	}
	if len(cfg.Argv) == 0 || cfg.Path == "" {
		return errors.New("sandbox trampoline: nothing to run")
	}
	if cfg.UID <= 0 || cfg.GID <= 0 {
		return fmt.Errorf("sandbox trampoline: refusing to run a job as %d:%d", cfg.UID, cfg.GID)
	}
	if cfg.NetNSFD > 0 {
		// setns moves only this thread, so the exec below must happen on
		// it: the thread stays locked to this goroutine to the end.
		runtime.LockOSThread()
		if err := unix.Setns(cfg.NetNSFD, unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("join the job's network namespace: %w", err)
		}
		unix.Close(cfg.NetNSFD)
	}
	pid := strconv.Itoa(os.Getpid())
	for _, f := range cfg.JoinFiles {
		if err := writeFile(f, pid); err != nil {
			return fmt.Errorf("join cgroup: %w", err)
		}
	}
	// Never run a job unconfined, whatever went wrong above or in clone.
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return fmt.Errorf("read own cgroup: %w", err)
	}
	if err := checkCgroup(string(b), cfg.CgroupSuffix, cfg.CgroupControllers); err != nil {
		return err
	}
	// Under global memory pressure the job, not the node, should die first.
	_ = os.WriteFile("/proc/self/oom_score_adj", []byte("1000"), 0)
	if cfg.FSize > 0 {
		lim := unix.Rlimit{Cur: cfg.FSize, Max: cfg.FSize}
		if err := unix.Setrlimit(unix.RLIMIT_FSIZE, &lim); err != nil {
			return fmt.Errorf("set RLIMIT_FSIZE: %w", err)
		}
	}
	// A job's core dump would land in its dir and count against the bound.
	_ = unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{})
	// Go applies these to every thread of the process.
	if err := syscall.Setgroups(nil); err != nil {
		return fmt.Errorf("drop groups: %w", err)
	}
	if err := syscall.Setgid(cfg.GID); err != nil {
		return fmt.Errorf("setgid %d: %w", cfg.GID, err)
	}
	if err := syscall.Setuid(cfg.UID); err != nil {
		return fmt.Errorf("setuid %d: %w", cfg.UID, err)
	}
	if os.Getuid() != cfg.UID || os.Geteuid() != cfg.UID || os.Getegid() != cfg.GID {
		return fmt.Errorf("sandbox trampoline: still uid %d after setuid %d", os.Geteuid(), cfg.UID)
	}
	// setuid binaries (su, sudo, ping) must not hand privileges back, and
	// bwrap loads the seccomp filter under it.
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("set no_new_privs: %w", err)
	}
	if err := os.Chdir(cfg.Dir); err != nil {
		return fmt.Errorf("enter job dir: %w", err)
	}
	if err := syscall.Exec(cfg.Path, cfg.Argv, cfg.Env); err != nil {
		return fmt.Errorf("exec %s: %w", cfg.Path, err)
	}
	return nil
}

// checkCgroup verifies, from /proc/self/cgroup content, that the process
// sits in a cgroup ending in suffix in every listed v1 controller's
// hierarchy, or in the unified hierarchy when controllers is empty.
func checkCgroup(procCgroup, suffix string, controllers []string) error {
	found := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(procCgroup), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			found[""] = parts[2]
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			found[c] = parts[2]
		}
	}
	want := controllers
	if len(want) == 0 {
		want = []string{""}
	}
	for _, c := range want {
		if p, ok := found[c]; !ok || !strings.HasSuffix(p, suffix) {
			return fmt.Errorf("sandbox trampoline: in cgroup %q of %q, want one ending in %s", p, c, suffix)
		}
	}
	return nil
}
