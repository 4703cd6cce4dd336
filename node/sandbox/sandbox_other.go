//go:build !linux

package sandbox

import (
	"context"
	"time"
)

// Process is a job running in its sandbox; outside Linux none can start.
type Process struct{}

// MaybeRunTrampoline does nothing outside Linux.
func MaybeRunTrampoline() {}

// Start fails outside Linux: there are no cgroups or namespaces to confine
// a job with.
func Start(context.Context, Spec) (*Process, error) { return nil, ErrUnsupported }

// Wait never returns an exit outside Linux.
func (p *Process) Wait() (Exit, error) { return Exit{}, ErrUnsupported }

// Pid is 0 outside Linux.
func (p *Process) Pid() int { return 0 }

// UID is 0 outside Linux.
func (p *Process) UID() int { return 0 }

// Stop does nothing outside Linux.
func (p *Process) Stop(time.Duration) {}

// Freeze fails outside Linux, where no job runs.
func (p *Process) Freeze() error { return ErrUnsupported }

// Thaw fails outside Linux, where no job runs.
func (p *Process) Thaw() error { return ErrUnsupported }

// Frozen is false outside Linux.
func (p *Process) Frozen() bool { return false }

// CPUUsage fails outside Linux, where no job runs.
func (p *Process) CPUUsage() (time.Duration, error) { return 0, ErrUnsupported }

// JobsCPUUsage fails outside Linux: there are no job cgroups to read.
func JobsCPUUsage() (time.Duration, error) { return 0, ErrUnsupported }

// Reap finds nothing to kill outside Linux: no job can have started.
func Reap(string) (int, error) { return 0, nil }

// Probe reports that nothing can be enforced outside Linux.
func Probe() Capabilities {
	return Capabilities{Missing: []string{"not Linux: jobs run only on Linux lenders (cgroups, namespaces, seccomp)"}}
}

// Lease is a uid held for one job (Linux only).
type Lease struct{ ID int }

// Acquire fails outside Linux.
func (r IDRange) Acquire() (*Lease, error) { return nil, ErrUnsupported }

// Release does nothing outside Linux.
func (l *Lease) Release() error { return nil }

// CheckRootOnly has nothing to check outside Linux, where no job runs.
func CheckRootOnly(string) error { return nil }

// parentCgroup is unused outside Linux, where no job runs.
var parentCgroup = DefaultCgroupParent
