package main

import (
	"testing"

	"github.com/deepmarket/deepmarket/node/jobs"
)

// A held run's workers show what the holder said of them.
func TestHeldNote(t *testing.T) {
	for _, tt := range []struct {
		w    jobs.Worker
		want string
	}{
		{jobs.Worker{Accepted: 12, AcceptedSeconds: 31.4}, "12 rounds accepted (31 s), 0 refused"},
		{jobs.Worker{Accepted: 1, Refused: 3, Dropped: true, Reason: "exited with code 1"}, "1 round accepted (0 s), 3 refused, dropped; exited with code 1"},
		{jobs.Worker{Accepted: 5, AcceptedSeconds: 40, ChecksPassed: 2}, "5 rounds accepted (40 s), 0 refused, 2 spot checks passed"},
		{jobs.Worker{Accepted: 5, AcceptedSeconds: 40, HeldSeconds: 10}, "5 rounds accepted (40 s), 0 refused, pay for 10 s held back until it passes a spot check"},
		{jobs.Worker{Accepted: 5, Dropped: true, Forfeited: true, CheckFailure: "round 2 does not replay"},
			"5 rounds accepted (0 s), 0 refused, forfeited its pay: failed a spot check (round 2 does not replay)"},
	} {
		if got := heldNote(tt.w); got != tt.want {
			t.Errorf("heldNote(%+v) = %q, want %q", tt.w, got, tt.want)
		}
	}
}
