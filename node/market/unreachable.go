package market

import (
	"sync"
	"time"
)

// unreachable remembers machines this node could not reach, so its
// scheduler leaves them out for a while rather than failing quote after
// quote on them (a machine that went away without withdrawing its offer,
// or that never could be reached).
type unreachable struct {
	mu    sync.Mutex
	until map[string]failure
}

type failure struct {
	until time.Time
	wait  time.Duration
}

// Unreachable machines are skipped for unreachableFor, doubling (up to
// unreachableMax) each time one fails again.
const (
	unreachableFor = 30 * time.Second
	unreachableMax = 10 * time.Minute
)

func (f *unreachable) mark(machine string, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.until == nil {
		f.until = map[string]failure{}
	}
	if len(f.until) > 10_000 {
		for m, x := range f.until {
			if now.After(x.until.Add(unreachableMax)) {
				delete(f.until, m)
			}
		}
	}
	x := f.until[machine]
	x.wait = min(max(2*x.wait, unreachableFor), unreachableMax)
	x.until = now.Add(x.wait)
	f.until[machine] = x
}

// skip reports whether machine failed recently.
func (f *unreachable) skip(machine string, now time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	x, ok := f.until[machine]
	return ok && now.Before(x.until)
}

// forget clears a machine that answered again, and reports whether it
// was remembered.
func (f *unreachable) forget(machine string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.until[machine]
	delete(f.until, machine)
	return ok
}
