package lender

// Owner first: a lab machine lends only while its owner does not need it,
// in the spirit of HTCondor's START, SUSPEND, CONTINUE and PREEMPT. The
// owner's use is the machine's CPU load other than its jobs' and the
// node's own (OwnerLoad). While the owner is busy the machine offers
// nothing and its jobs are suspended (frozen through their cgroups);
// when the owner has been idle long enough they resume; a suspension
// that lasts is ended by vacating the jobs (stopped with a checkpoint,
// which their submitters re-place elsewhere). A suspended worker is not
// paid for the time it was suspended.

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"syscall"
	"time"
)

// OwnerPolicy is when the machine's owner comes first. The zero policy
// (SuspendAbove 0) never suspends: the machine lends as its settings say.
type OwnerPolicy struct {
	// SuspendAbove is the owner's load, in cores, above which the jobs
	// are suspended and nothing is offered; 0 turns the policy off.
	SuspendAbove float64 `json:"suspend_above"`
	// StartIdle is how long the owner's load must have stayed at or below
	// SuspendAbove before the machine offers itself (again).
	StartIdle time.Duration `json:"start_idle_ns"`
	// ResumeIdle is how long it must have before suspended jobs resume.
	ResumeIdle time.Duration `json:"resume_idle_ns"`
	// VacateAfter is how long a suspension may last before the jobs are
	// vacated: stopped with a checkpoint, to be re-placed elsewhere.
	VacateAfter time.Duration `json:"vacate_after_ns"`
}

// On reports whether the policy ever suspends.
func (p OwnerPolicy) On() bool { return p.SuspendAbove > 0 }

// Validate checks the policy's bounds; field names the setting at fault.
func (p OwnerPolicy) Validate() (field string, err error) {
	switch {
	case p.SuspendAbove < 0 || p.SuspendAbove > 4096 || p.SuspendAbove != p.SuspendAbove:
		return "suspend_above", fmt.Errorf("%v: want 0 (off) to 4096 cores", p.SuspendAbove)
	case p.StartIdle < 0 || p.StartIdle > 24*time.Hour:
		return "start_idle", fmt.Errorf("%s: want 0s to 24h", p.StartIdle)
	case p.ResumeIdle < 0 || p.ResumeIdle > 24*time.Hour:
		return "resume_idle", fmt.Errorf("%s: want 0s to 24h", p.ResumeIdle)
	case p.VacateAfter < time.Second || p.VacateAfter > 7*24*time.Hour:
		return "vacate_after", fmt.Errorf("%s: want 1s to 168h", p.VacateAfter)
	}
	return "", nil
}

// ownerState is what the watch remembers between samples.
type ownerState struct {
	lastBusy  time.Time // the last sample the owner was busy at (zero: never seen busy)
	suspended time.Time // when the jobs were suspended (zero: they run)
}

// ownerActions is what one sample calls for.
type ownerActions struct {
	offer   bool // the machine offers itself
	suspend bool // suspend the running jobs
	resume  bool // resume them
	vacate  bool // vacate them (they stay suspended until stopped)
}

// ownerStep is the policy's decision on one sample: the owner's load at
// now, and whether the owner typed at a terminal since the last sample
// (input), given what the watch remembers and whether jobs run here. It
// is pure, so owner_test.go tests it by tables.
func ownerStep(p OwnerPolicy, s ownerState, load float64, input, jobs bool, now time.Time) (ownerState, ownerActions) {
	if !p.On() {
		if !s.suspended.IsZero() {
			return ownerState{}, ownerActions{offer: true, resume: true}
		}
		return ownerState{}, ownerActions{offer: true}
	}
	busy := load > p.SuspendAbove || input
	if busy {
		s.lastBusy = now
	}
	idleFor := func(d time.Duration) bool { return s.lastBusy.IsZero() || now.Sub(s.lastBusy) >= d }
	var a ownerActions
	switch {
	case s.suspended.IsZero() && busy && jobs:
		s.suspended, a.suspend = now, true
	case !s.suspended.IsZero() && !jobs:
		s.suspended = time.Time{} // they ended (vacated, or stopped by their submitters)
	case !s.suspended.IsZero() && idleFor(p.ResumeIdle):
		s.suspended, a.resume = time.Time{}, true
	case !s.suspended.IsZero() && now.Sub(s.suspended) >= p.VacateAfter:
		a.vacate = true
	}
	a.offer = !busy && s.suspended.IsZero() && idleFor(p.StartIdle)
	return s, a
}

// OwnerJobs is what the watch does to the jobs running here
// (*Executor is one).
type OwnerJobs interface {
	Running() int
	Suspend(reason string)
	Resume()
	Vacate(reason string)
}

// OwnerWatch applies a policy every Every: it samples the owner's load,
// suspends, resumes or vacates the jobs, and tells Offering whether the
// machine may offer itself.
type OwnerWatch struct {
	Policy   func() OwnerPolicy // read at every sample: lend may change it
	Jobs     OwnerJobs
	Offering func(ok bool, why string)
	Every    time.Duration
	Logger   *slog.Logger
	// Sample reads the machine's counters (ReadCPUSample when nil).
	Sample func() (CPUSample, error)
	// LastInput is when the owner last typed at a terminal of this
	// machine (LastTTYInput when nil).
	LastInput func() time.Time
}

// Run watches until ctx ends, resuming any jobs it suspended.
func (o *OwnerWatch) Run(ctx context.Context) error {
	sample := o.Sample
	if sample == nil {
		sample = ReadCPUSample
	}
	every := o.Every
	if every <= 0 {
		every = time.Second
	}
	lastInput := o.LastInput
	if lastInput == nil {
		lastInput = LastTTYInput
	}
	var seenInput time.Time
	var s ownerState
	var prev CPUSample
	var prevNode time.Duration
	sampled := false // prev holds a good sample
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			if !s.suspended.IsZero() {
				o.Jobs.Resume()
			}
			return nil
		case <-t.C:
		}
		p := o.Policy()
		load, input := 0.0, false
		if p.On() {
			in := lastInput()
			input = in.After(seenInput) && !seenInput.IsZero()
			seenInput = in
			cur, err := sample()
			node := nodeCPU()
			if err != nil {
				o.Logger.Warn("owner policy: cannot read the machine's load", "err", err)
			}
			ok := sampled && err == nil
			if ok {
				load = ownerLoadLessNode(prev, cur, node-prevNode)
			}
			prev, prevNode, sampled = cur, node, err == nil
			if !ok {
				continue
			}
		} else {
			sampled = false
		}
		now := time.Now()
		next, a := ownerStep(p, s, load, input, o.Jobs.Running() > 0, now)
		s = next
		why := fmt.Sprintf("the machine's owner is using it (%.1f cores of its own load, above %.1f)", load, p.SuspendAbove)
		if input {
			why = "the machine's owner is using it (typing at a terminal)"
		}
		switch {
		case a.suspend:
			o.Logger.Info("owner busy: suspending jobs", "load", load)
			o.Jobs.Suspend(why)
		case a.resume:
			o.Logger.Info("owner idle: resuming jobs", "load", load)
			o.Jobs.Resume()
		case a.vacate:
			o.Logger.Info("owner busy too long: vacating jobs", "suspended_for", now.Sub(s.suspended))
			o.Jobs.Vacate(fmt.Sprintf("vacated: the machine's owner has been using it for %s", now.Sub(s.suspended).Round(time.Second)))
		}
		if !a.offer {
			o.Offering(false, "the machine's owner is using it, or was within "+p.StartIdle.String())
		} else {
			o.Offering(true, "")
		}
	}
}

// ownerLoadLessNode is OwnerLoad between a and b less the node's own CPU
// time over the same interval: the node is not its owner.
func ownerLoadLessNode(a, b CPUSample, node time.Duration) float64 {
	total := b.Total - a.Total
	if b.CPUs <= 0 || total <= 0 {
		return 0
	}
	wall := total / time.Duration(b.CPUs)
	return max(OwnerLoad(a, b)-float64(node)/float64(wall), 0)
}

// nodeCPU is the CPU time this process (the node) has used.
func nodeCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// LastTTYInput is when someone last typed at a terminal of this machine:
// the latest access time of its consoles and pseudo-terminals, which the
// kernel moves on input (as HTCondor's KeyboardIdle reads it), to within
// 8 s (Linux keeps tty times that coarse). Zero when there are none.
func LastTTYInput() time.Time {
	var last time.Time
	for _, pattern := range []string{"/dev/tty[0-9]*", "/dev/pts/[0-9]*"} {
		names, _ := filepath.Glob(pattern)
		for _, name := range names {
			var st syscall.Stat_t
			if err := syscall.Stat(name, &st); err != nil {
				continue
			}
			if at := time.Unix(st.Atim.Sec, st.Atim.Nsec); at.After(last) {
				last = at
			}
		}
	}
	return last
}
