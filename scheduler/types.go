package scheduler

import (
	"fmt"
	"time"
)

// Resources is an amount of each resource the scheduler places.
type Resources struct {
	Cores    uint32 `json:"cores"`
	MemBytes uint64 `json:"mem_bytes"`
	GPUs     uint32 `json:"gpus"`
}

// Prices are in micro-credits per unit-hour: per core-hour, per GiB-hour
// of memory, per GPU-hour.
type Prices struct {
	CoreHour   uint64 `json:"core_hour"`
	MemGiBHour uint64 `json:"mem_gib_hour"`
	GPUHour    uint64 `json:"gpu_hour"`
}

// Window is a daily availability window in the machine's local time,
// minutes after midnight; End before Start runs over midnight. The zero
// Window means all day.
type Window struct {
	StartMin, EndMin int
	// OffsetMin is the machine's offset from UTC in minutes.
	OffsetMin int
}

// AllDay reports whether w is the whole day.
func (w Window) AllDay() bool { return w.StartMin == w.EndMin }

// Covers reports whether the machine is available for all of [from, to).
// Jobs longer than a day only fit all-day machines.
func (w Window) Covers(from, to time.Time) bool {
	if w.AllDay() {
		return true
	}
	if !to.After(from) {
		return w.contains(minuteOfDay(from, w.OffsetMin))
	}
	if to.Sub(from) >= 24*time.Hour {
		return false
	}
	start := minuteOfDay(from, w.OffsetMin)
	if !w.contains(start) {
		return false
	}
	// Minutes left in the window from start, against the job's length.
	left := w.EndMin - start
	if left <= 0 {
		left += 24 * 60
	}
	return to.Sub(from) <= time.Duration(left)*time.Minute
}

func (w Window) contains(m int) bool {
	if w.StartMin < w.EndMin {
		return m >= w.StartMin && m < w.EndMin
	}
	return m >= w.StartMin || m < w.EndMin
}

func minuteOfDay(t time.Time, offsetMin int) int {
	t = t.UTC().Add(time.Duration(offsetMin) * time.Minute)
	return t.Hour()*60 + t.Minute()
}

// Machine is one lending machine as a scheduler sees it: what its offer
// lends, what is already allocated on it, its reserve prices and record.
type Machine struct {
	ID        string
	Site      string
	Lent      Resources
	Allocated Resources
	Reserve   Prices
	Window    Window
	// Until, when set, is when the machine's offer ends (the close of
	// its lending window, as the lender announced it).
	Until time.Time
	// Speed is relative (1 = the reference machine Job.Duration is for);
	// 0 means 1.
	Speed float64
	// Dedicated machines stay for the jobs they take; opportunistic ones
	// (the default: lab desktops) may leave, and are priced for the risk.
	Dedicated bool
	// Completed and Failed count the machine's past jobs (the ledger's
	// machine record), when known.
	Completed, Failed uint64
	// Setup is how long the machine takes to get ready for the job being
	// placed before it runs: fetching and unpacking the job's image, 0
	// when it holds it. Its workers are priced for it as for the run, so
	// of two machines alike the one that holds the image wins, and the
	// placement is done that much later. Index ignores it: a view with
	// setups is placed exhaustively (Place, Quote).
	Setup time.Duration
}

func (m *Machine) speed() float64 {
	if m.Speed <= 0 {
		return 1
	}
	return m.Speed
}

// Free is what is left to allocate.
func (m *Machine) Free() Resources {
	return Resources{
		Cores:    m.Lent.Cores - min(m.Allocated.Cores, m.Lent.Cores),
		MemBytes: m.Lent.MemBytes - min(m.Allocated.MemBytes, m.Lent.MemBytes),
		GPUs:     m.Lent.GPUs - min(m.Allocated.GPUs, m.Lent.GPUs),
	}
}

// available reports whether the machine can run a job over [from, to).
func (m *Machine) available(from, to time.Time) bool {
	return m.Window.Covers(from, to) && (m.Until.IsZero() || !to.After(m.Until))
}

func (m *Machine) fits(d Resources) bool {
	f := m.Free()
	return d.Cores <= f.Cores && d.MemBytes <= f.MemBytes && d.GPUs <= f.GPUs
}

func (m *Machine) add(d Resources) {
	m.Allocated.Cores += d.Cores
	m.Allocated.MemBytes += d.MemBytes
	m.Allocated.GPUs += d.GPUs
}

// View is the machines one scheduler sees.
type View struct {
	Machines []Machine
	// RTT, when set, gives the measured round-trip time between machines
	// i and j (indexes into Machines); ok is false when unknown, and then
	// site labels decide.
	RTT func(i, j int) (rtt time.Duration, ok bool)
}

// BenefitKind says how a job's worth depends on when it completes.
type BenefitKind int

// Benefit kinds.
const (
	// FixedPrice: worth Max whenever it completes.
	FixedPrice BenefitKind = iota
	// ByDeadline: worth Max if it completes by Deadline, else nothing.
	ByDeadline
	// LinearDecay: worth Max if it completed at once, falling linearly to
	// nothing at ZeroAt.
	LinearDecay
)

// Benefit is what a job is worth to its submitter: the most it pays.
type Benefit struct {
	Kind     BenefitKind
	Max      uint64 // micro-credits
	Deadline time.Time
	ZeroAt   time.Time
}

// At is the benefit of completing at done, for a job submitted at now.
func (b Benefit) At(now, done time.Time) uint64 {
	switch b.Kind {
	case ByDeadline:
		if done.After(b.Deadline) {
			return 0
		}
		return b.Max
	case LinearDecay:
		if !done.Before(b.ZeroAt) {
			return 0
		}
		span := b.ZeroAt.Sub(now)
		if span <= 0 {
			return 0
		}
		left := b.ZeroAt.Sub(done)
		if left >= span {
			return b.Max
		}
		return uint64(float64(b.Max) * float64(left) / float64(span))
	default:
		return b.Max
	}
}

// Job is a request to place Workers workers of Per resources each.
type Job struct {
	ID      string
	Workers int
	Per     Resources
	// Duration is the expected run time on a speed-1 machine. Workers of
	// a synchronous job go at the pace of the slowest.
	Duration time.Duration
	Benefit  Benefit
}

// Validate checks the job's shape.
func (j Job) Validate() error {
	switch {
	case j.Workers < 1:
		return fmt.Errorf("job %s: workers %d: want at least 1", j.ID, j.Workers)
	case j.Workers > 10000:
		return fmt.Errorf("job %s: workers %d: want at most 10000", j.ID, j.Workers)
	case j.Per == Resources{}:
		return fmt.Errorf("job %s: a worker must ask for some cores, memory or GPUs", j.ID)
	case j.Duration <= 0:
		return fmt.Errorf("job %s: expected duration must be positive", j.ID)
	}
	return nil
}

// Rejection says why a job gets no quote. Resource names what is missing
// or too expensive: "cores", "memory", "gpus", "window", "price" or "job".
type Rejection struct {
	Resource string `json:"resource"`
	Reason   string `json:"reason"`
	// Price is the job's current price (micro-credits) when it fits but
	// costs more than its benefit; 0 otherwise.
	Price uint64 `json:"price,omitempty"`
}

func (r *Rejection) Error() string { return r.Reason }

const gib = 1 << 30
