package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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

// probes numbers the probes of this process.
var probes atomic.Int64

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
		// Each probe its own cgroup: two nodes in one process (tests, the
		// benchmarks) may probe at once.
		name := "probe-" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatInt(probes.Add(1), 10)
		if cg, err = h.create(name, Limits{MemBytes: 64 << 20, Pids: 16}); err == nil {
			err = cg.remove()
		}
	}
	if err != nil {
		c.Missing = append(c.Missing, "cgroups: "+err.Error()+" (mount cgroup v2 at /sys/fs/cgroup, or v1 with the memory and pids controllers)")
	} else {
		c.CgroupVersion = h.version()
		c.Controllers = h.controllers()
		c.SwapLimited = h.swapLimited()
		if h.version() == 1 && !c.Has("freezer") {
			c.Problems = append(c.Problems, "no cgroup v1 freezer: jobs cannot be suspended when the owner comes back (mount the freezer controller)")
		}
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
