package submitter

// A live job and its inbox: how a job has one owner.

import (
	"sync"

	"github.com/deepmarket/deepmarket/node/jobs"
)

// job is a live job as its goroutine (drive) holds it. Only that
// goroutine, and the calls it waits for, read or write it: everyone else
// reads the snapshots Manager.save publishes, and asks through in.
type job struct {
	jobs.Job
	in *inbox
	// cancelled says a cancel was taken from in: the job ends at its
	// next step.
	cancelled bool
}

// ask is what the API may ask of a live job.
type ask uint8

const (
	askConfirm ask = 1 << iota // go on to reserve, pay into escrow and launch
	askCancel                  // stop; what ran is paid, the rest refunded
)

// inbox holds what was asked of a job until its goroutine takes it; a
// token on note says something waits. Asking twice is asking once.
type inbox struct {
	note  chan struct{} // capacity 1
	mu    sync.Mutex
	asked ask
}

func newInbox() *inbox { return &inbox{note: make(chan struct{}, 1)} }

// put leaves a for the job's goroutine.
func (in *inbox) put(a ask) {
	in.mu.Lock()
	in.asked |= a
	in.mu.Unlock()
	select {
	case in.note <- struct{}{}:
	default: // a token waits already
	}
}

// take returns what was asked since the last take.
func (in *inbox) take() ask {
	in.mu.Lock()
	defer in.mu.Unlock()
	a := in.asked
	in.asked = 0
	return a
}

// look takes what was asked of j and applies it, saved at once so readers
// see it: a confirmation, or a cancel, which answers a wait for
// confirmation too (the job goes on, to end).
func (m *Manager) look(j *job) {
	a := j.in.take()
	if a == 0 {
		return
	}
	j.Confirmed = true
	if a&askCancel != 0 {
		j.cancelled = true
	}
	m.save(j)
}
