package sandbox

import (
	"errors"
	"io"
	"time"
)

// DefaultPids is the pids.max a job gets when Limits.Pids is 0: enough for a
// TensorFlow worker's thread pools, far too few for a fork bomb to hurt.
const DefaultPids = 512

// DefaultStopGrace is how long a job gets between SIGTERM and SIGKILL when
// Start's context ends.
const DefaultStopGrace = 5 * time.Second

// DiskCheckInterval is how often the watchdog measures a job dir.
const DiskCheckInterval = 2 * time.Second

// JobUserName is the system user jobs run as when the node runs as root.
const JobUserName = "deepmarket-job"

// Sentinel errors callers branch on.
var (
	// ErrUnsupported means this machine cannot enforce the limits (no
	// cgroups, not Linux); the node should not lend.
	ErrUnsupported = errors.New("sandbox: limits cannot be enforced on this machine")
	// ErrNoTrampoline means main did not call MaybeRunTrampoline before Start.
	ErrNoTrampoline = errors.New("sandbox: main must call sandbox.MaybeRunTrampoline() first")
)

// Limits are the resources one job process (and everything it spawns) may use.
type Limits struct {
	// CPUs are the CPU ids the job is pinned to; the CPU quota is then
	// len(CPUs) cores. Empty: no pinning, Cores is the quota.
	CPUs []int
	// Cores is the CPU quota in cores when CPUs is empty; 0 means none.
	Cores float64
	// MemBytes is the hard memory limit (swap disabled where possible); 0 means none.
	MemBytes uint64
	// Pids bounds processes plus threads; 0 means DefaultPids.
	Pids int
	// DiskBytes bounds the job dir's size; 0 means none.
	DiskBytes uint64
	// GPUs become CUDA_VISIBLE_DEVICES and NVIDIA_VISIBLE_DEVICES; empty
	// means none (both set to "").
	GPUs []int
}

// Spec describes one job process.
type Spec struct {
	// Name names the job's cgroup (job id plus worker index); characters
	// other than [A-Za-z0-9._-] become '_'.
	Name string
	// Dir is the job's work dir: its cwd, HOME, TMPDIR parent and the only
	// place it may write. It is created if missing and handed to the job user
	// with everything in it, so give each job a fresh one.
	Dir string
	// NetNS, when set, is the network namespace the job runs in (see
	// NewNetNS); nil leaves it in the node's.
	NetNS *NetNS
	// Cwd, when set, is where the job starts instead of Dir: Dir itself or
	// a directory inside it (a job's code beside its data and output).
	Cwd string
	// Argv is the command; Argv[0] is looked up in the job's PATH.
	Argv []string
	// Env entries ("K=V") are added to a clean environment (PATH, HOME=Dir,
	// LANG=C.UTF-8, TMPDIR=Dir/tmp) and override it, except the GPU variables,
	// which always come from Limits.GPUs.
	Env    []string
	Limits Limits
	// Stdout and Stderr receive the job's output; nil discards it.
	Stdout, Stderr io.Writer
	// ReadOnly are extra paths the job may read (a Python venv, a dataset).
	ReadOnly []string
	// Hide are paths the job must not see, on top of every home under /home
	// and /root; pass the node's own home dir here. Under bwrap the more
	// specific path wins when Hide and ReadOnly (or Dir) nest.
	Hide []string
	// UID and GID run the job as this user when the node is root; 0 means
	// the job user (deepmarket-job, else nobody). Root is never used.
	UID, GID int

	// noBwrap runs without bwrap even where it works, so that tests cover
	// both ways of running.
	noBwrap bool
}

// Exit is how a job ended.
type Exit struct {
	// Code is the main process's exit status; -1 when a signal killed it.
	Code int
	// Signal names the signal that killed the main process ("SIGKILL"), or
	// "" when it exited. Under bwrap a death by signal n shows as Code 128+n
	// and Signal is derived from it.
	Signal string
	// OOMKilled: the kernel killed a process of the job for exceeding MemBytes.
	OOMKilled bool
	// PidsLimited: a fork or clone failed because the job hit Pids.
	PidsLimited bool
	// DiskExceeded: the job dir outgrew DiskBytes or a file hit RLIMIT_FSIZE.
	DiskExceeded bool
	// Stopped: Stop (or the end of Start's context) ended the job.
	Stopped bool
	// Wall is the time from Start until the main process exited.
	Wall time.Duration
	// CPU is the CPU time the whole cgroup used.
	CPU time.Duration
	// MaxRSS is the peak memory charged to the cgroup (page cache included),
	// or the main process's peak RSS where the kernel keeps no cgroup peak.
	MaxRSS uint64
}

// Capabilities says which enforcement mechanisms work on this machine.
type Capabilities struct {
	// CgroupVersion is 1 or 2, or 0 when no usable cgroup hierarchy exists.
	CgroupVersion int
	// Controllers are the controllers the sandbox can use here, sorted.
	Controllers []string
	// SwapLimited: the memory limit also covers swap (or swappiness is 0 on v1).
	SwapLimited bool
	// SwitchUser: the node is root and jobs run as another user.
	SwitchUser bool
	// JobUser, JobUID and JobGID name the user jobs run as.
	JobUser        string
	JobUID, JobGID int
	// Bwrap is the path of a bubblewrap that works here, "" when none does;
	// without it, Hide and the read-only view rest on file modes.
	Bwrap string
	// Problems explains each mechanism that is missing.
	Problems []string
}

// Has reports whether controller c (e.g. "memory") is usable.
func (c Capabilities) Has(controller string) bool {
	for _, x := range c.Controllers {
		if x == controller {
			return true
		}
	}
	return false
}

// Essential returns nil when the limits a lender cannot do without (memory
// and pids, hence a cgroup hierarchy) are enforced here, and otherwise an
// error wrapping ErrUnsupported that says what is missing.
func (c Capabilities) Essential() error {
	var missing []error
	if c.CgroupVersion == 0 {
		missing = append(missing, errors.New("no usable cgroup hierarchy (run the node as root on Linux)"))
	}
	for _, ctl := range []string{"memory", "pids"} {
		if c.CgroupVersion != 0 && !c.Has(ctl) {
			missing = append(missing, errors.New("cgroup controller "+ctl+" unavailable"))
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return errors.Join(append([]error{ErrUnsupported}, missing...)...)
}
