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

// FreezeTimeout bounds how long Freeze waits for the kernel to stop every
// process of a job.
const FreezeTimeout = 5 * time.Second

// DiskCheckInterval is how often the watchdog measures a job dir.
const DiskCheckInterval = 2 * time.Second

// Sentinel errors callers branch on.
var (
	// ErrUnsupported means this machine cannot build the sandbox (not root,
	// no cgroups, no bubblewrap, not Linux); the node must not lend.
	ErrUnsupported = errors.New("sandbox: jobs cannot be confined on this machine")
	// ErrNoTrampoline means main did not call MaybeRunTrampoline before Start.
	ErrNoTrampoline = errors.New("sandbox: main must call sandbox.MaybeRunTrampoline() first")
	// ErrNoFreeID means every uid of an IDRange is leased or in use.
	ErrNoFreeID = errors.New("sandbox: no free uid in the range")
	// ErrEnded means the job has ended or is being stopped, so it can no
	// longer be frozen or thawed.
	ErrEnded = errors.New("sandbox: the job has ended or is being stopped")
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
	// means none (both set to ""). A job in an image (Spec.Root) with GPUs
	// also gets the host's driver libraries and tools, read-only, under
	// /usr/local/nvidia, on its LD_LIBRARY_PATH and PATH.
	GPUs []int
}

// Spec describes one job process.
type Spec struct {
	// Name names the job's cgroup (job id plus worker index); characters
	// other than [A-Za-z0-9._-] become '_'.
	Name string
	// Dir is the job's work dir: its cwd, HOME, /tmp and the only place it
	// may write. It is created if missing and handed to the job's uid with
	// everything in it, so give each job a fresh one. Once Wait returns it
	// belongs to root again.
	Dir string
	// NetNS, when set, is the network namespace the job runs in (see
	// NewNetNS); nil gives the job a namespace of its own with nothing but
	// loopback. A job never shares the host's network namespace, whose
	// abstract unix sockets and loopback ports belong to the host.
	NetNS *NetNS
	// Cwd, when set, is where the job starts instead of Dir: Dir itself or
	// a directory inside it (a job's code beside its data and output).
	Cwd string
	// Argv is the command; Argv[0] is looked up in the job's PATH inside the
	// sandbox, or taken relative to Cwd when it holds a '/'.
	Argv []string
	// Env entries ("K=V") are added to a clean environment (PATH, HOME=Dir,
	// LANG=C.UTF-8, TMPDIR=/tmp) and override it, except the GPU variables,
	// which always come from Limits.GPUs.
	Env    []string
	Limits Limits
	// Stdout and Stderr receive the job's output through pipes the node
	// reads: the job never holds a descriptor of the node's own files. nil
	// discards it.
	Stdout, Stderr io.Writer
	// ReadOnly are extra paths the job may read (a Python environment).
	// Each must pass CheckReadOnly.
	ReadOnly []string
	// Root, when set, is an image's unpacked root filesystem (node/image):
	// the job sees its top-level directories, read-only, where it would
	// see the host's system dirs (/usr, /bin, /lib, /etc, ...), and of the
	// host only /sys (its own cgroup), its dir, its /tmp and ReadOnly.
	Root string
	// Hide are paths the job must not see, on top of every home under /home,
	// /root and the secrets under /etc; pass the node's own home dir here.
	// The more specific path wins when Hide and ReadOnly (or Dir) nest.
	Hide []string
	// UID is the job's own uid (its gid is the same number), which no other
	// job and no account may share: lease it with IDRange.Acquire and
	// release it after Wait. 0 makes Start lease one from DefaultIDs for the
	// sandbox's lifetime.
	UID int
}

// Exit is how a job ended.
type Exit struct {
	// Code is the main process's exit status; -1 when a signal killed it.
	Code int
	// Signal names the signal that killed the job's program ("SIGKILL"), or
	// "" when it exited. bwrap reports a death by signal n as exit 128+n;
	// Signal is derived from that.
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

// Capabilities says what of the sandbox works on this machine.
type Capabilities struct {
	// Root: the node runs as root, which creating cgroups and switching
	// jobs to their own uids needs.
	Root bool
	// CgroupVersion is 1 or 2, or 0 when no usable cgroup hierarchy exists.
	CgroupVersion int
	// Controllers are the controllers the sandbox can use here, sorted.
	Controllers []string
	// SwapLimited: the memory limit also covers swap (or swappiness is 0 on v1).
	SwapLimited bool
	// Bwrap is the bubblewrap that builds job sandboxes here, "" when none can.
	Bwrap string
	// Missing says, for each part of the sandbox this machine cannot build,
	// what is wrong and how to fix it. No job may run while it is not empty.
	Missing []string
	// Problems are weaker spots that do not stop lending.
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

// Essential returns nil when this machine builds the whole sandbox (cgroups
// with memory and pids, bubblewrap with its namespaces, seccomp, a uid per
// job), and otherwise an error wrapping ErrUnsupported that says what is
// missing and how to install it. A node must not lend while it fails.
func (c Capabilities) Essential() error {
	if len(c.Missing) == 0 {
		return nil
	}
	errs := []error{ErrUnsupported}
	for _, m := range c.Missing {
		errs = append(errs, errors.New(m))
	}
	return errors.Join(errs...)
}
