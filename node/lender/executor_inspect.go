package lender

import "github.com/deepmarket/deepmarket/node/sandbox"

// What the node's end-to-end tests look at on a lending machine, beyond
// the job protocol: where the workers' files are, and their live sandboxes.

// Dir is the work area: one dir per worker, and logs/ with one log dir
// per worker.
func (e *Executor) Dir() string { return e.dir }

// Sandboxed is a started worker's sandbox: its process, the uid it runs
// as, and its run's network namespace on this machine.
type Sandboxed struct {
	Job   string
	Index int
	Pid   int
	UID   int
	NetNS *sandbox.NetNS
	// Frozen is what its cgroup's freezer says now.
	Frozen bool
}

// Sandboxes lists the workers here whose sandbox has started.
func (e *Executor) Sandboxes() []Sandboxed {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []Sandboxed
	for _, w := range e.workers {
		w.mu.Lock()
		if w.proc != nil {
			s := Sandboxed{Job: w.l.JobID, Index: w.l.Index, Pid: w.proc.Pid(), UID: w.proc.UID(), Frozen: w.proc.Frozen()}
			if rn := e.nets[w.l.JobID]; rn != nil {
				s.NetNS = rn.ns
			}
			out = append(out, s)
		}
		w.mu.Unlock()
	}
	return out
}
