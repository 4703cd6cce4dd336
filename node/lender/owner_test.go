package lender

import (
	"testing"
	"time"
)

func TestOwnerStep(t *testing.T) {
	p := OwnerPolicy{SuspendAbove: 0.5, StartIdle: 5 * time.Minute, ResumeIdle: time.Minute, VacateAfter: 10 * time.Minute}
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	type step struct {
		at    time.Duration
		load  float64
		jobs  bool
		want  ownerActions
		input bool
	}
	tests := []struct {
		name  string
		p     OwnerPolicy
		steps []step
	}{
		{"off: always offers, never suspends", OwnerPolicy{}, []step{{0, 8, true, ownerActions{offer: true}, false}}},
		{"an idle machine offers itself", p, []step{{0, 0.1, false, ownerActions{offer: true}, false}}},
		{"the owner comes: jobs suspended, nothing offered", p, []step{
			{0, 0.1, true, ownerActions{offer: true}, false},
			{time.Second, 1.5, true, ownerActions{suspend: true}, false},
			{2 * time.Second, 1.5, true, ownerActions{}, false},
		}},
		{"the owner goes: resumed after resume_idle, offered after start_idle", p, []step{
			{0, 1.5, true, ownerActions{suspend: true}, false},
			{time.Second, 0.1, true, ownerActions{}, false},
			{time.Second + time.Minute, 0.1, true, ownerActions{resume: true}, false},
			{2 * time.Minute, 0.1, true, ownerActions{}, false},
			{time.Second + 5*time.Minute, 0.1, true, ownerActions{offer: true}, false},
		}},
		{"the owner stays: vacated after vacate_after", p, []step{
			{0, 1.5, true, ownerActions{suspend: true}, false},
			{9 * time.Minute, 1.5, true, ownerActions{}, false},
			{10 * time.Minute, 1.5, true, ownerActions{vacate: true}, false},
			{10*time.Minute + time.Second, 1.5, false, ownerActions{}, false},
			{11 * time.Minute, 1.5, false, ownerActions{}, false},
		}},
		{"the owner busy with no jobs here: nothing to suspend, nothing offered", p, []step{
			{0, 2, false, ownerActions{}, false},
			{4 * time.Minute, 0, false, ownerActions{}, false},
			{5 * time.Minute, 0, false, ownerActions{offer: true}, false},
		}},
		{"load at the threshold is not busy", p, []step{{0, 0.5, true, ownerActions{offer: true}, false}}},
		{"typing at a terminal is busy, whatever the load", p, []step{
			{0, 0, true, ownerActions{offer: true}, false},
			{time.Second, 0, true, ownerActions{suspend: true}, true},
			{time.Second + time.Minute, 0, true, ownerActions{resume: true}, false},
		}},
		{"start_idle 0: offered once the owner is not busy, not while", OwnerPolicy{SuspendAbove: 0.5, VacateAfter: time.Minute}, []step{
			{0, 2, false, ownerActions{}, false},
			{time.Second, 0, false, ownerActions{offer: true}, false},
		}},
		{"turned off while suspended: resumed", p, []step{
			{0, 1.5, true, ownerActions{suspend: true}, false},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s ownerState
			for i, st := range tt.steps {
				var a ownerActions
				s, a = ownerStep(tt.p, s, st.load, st.input, st.jobs, at(st.at))
				if a != st.want {
					t.Fatalf("step %d (load %.1f at +%s): %+v, want %+v", i, st.load, st.at, a, st.want)
				}
			}
			if tt.name == "turned off while suspended: resumed" {
				if _, a := ownerStep(OwnerPolicy{}, s, 2, false, true, at(time.Second)); a != (ownerActions{offer: true, resume: true}) {
					t.Fatalf("the policy turned off while jobs were suspended: %+v", a)
				}
			}
		})
	}
}

func TestOwnerPolicyValidate(t *testing.T) {
	good := OwnerPolicy{SuspendAbove: 0.5, StartIdle: time.Minute, ResumeIdle: time.Minute, VacateAfter: time.Minute}
	if f, err := good.Validate(); err != nil {
		t.Fatalf("%s: %v", f, err)
	}
	for field, p := range map[string]OwnerPolicy{
		"suspend_above": {SuspendAbove: -1, VacateAfter: time.Minute},
		"start_idle":    {StartIdle: -time.Second, VacateAfter: time.Minute},
		"resume_idle":   {ResumeIdle: 25 * time.Hour, VacateAfter: time.Minute},
		"vacate_after":  {VacateAfter: 0},
	} {
		if f, err := p.Validate(); err == nil || f != field {
			t.Errorf("%+v: %q %v, want an error about %s", p, f, err, field)
		}
	}
}

func TestOwnerLoadLessNode(t *testing.T) {
	a := CPUSample{CPUs: 2, Total: 0, Busy: 0}
	b := CPUSample{CPUs: 2, Total: 2 * time.Second, Busy: 1500 * time.Millisecond, Jobs: 500 * time.Millisecond}
	// One second of wall time: 1.5 s busy, 0.5 s of it jobs, 0.25 s the node.
	if got := ownerLoadLessNode(a, b, 250*time.Millisecond); got < 0.74 || got > 0.76 {
		t.Errorf("owner load = %v, want 0.75", got)
	}
	if got := ownerLoadLessNode(a, b, 5*time.Second); got != 0 {
		t.Errorf("owner load with the node over everything = %v, want 0", got)
	}
}
