package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/deepmarket/deepmarket/scheduler"
	"github.com/deepmarket/deepmarket/testnet/netlab"
)

// batchSize is train.py's --batch-size default (a worker's batch), which
// the bench does not change.
const batchSize = 64

// Predicted is what the scheduler's model (scheduler.Predict, the one a
// quote uses) expects of a job, next to what the job measured.
type Predicted struct {
	// TrainS is the predicted training time to the target; TimeToTargetS
	// adds what the 1-worker job spent before and around its steps
	// (TensorFlow import, data load, evaluations), which more workers do
	// not shorten.
	TrainS        float64 `json:"train_s"`
	CommS         float64 `json:"comm_s"`
	TimeToTargetS float64 `json:"time_to_target_s"`
	SpeedUp       float64 `json:"speed_up"`
	// Steps is what each worker is predicted to take to the target.
	Steps int `json:"steps"`
	// Fewest is the worker count the model says finishes soonest.
	Fewest int `json:"fewest"`
}

// predict fills each result's prediction from the links the probes
// measured between its machines (else its profile's nominal links), the
// shipped statistical efficiency, and what the run measured of the job
// itself: the 1-worker job's steps to the target and step time, and the
// model's size (from sync mode's bytes per step). Nothing is predicted for
// a profile without a 1-worker job that reached the target.
func predict(rep *Report) {
	modelBytes := modelSize(rep.Results)
	one := map[string]Result{}
	for _, r := range rep.Results {
		if r.Workers == 1 && r.TargetReached && r.StepsToTarget > 0 && r.ExamplesPerS > 0 {
			one[r.Profile] = r
		}
	}
	profiles := map[string]netlab.Profile{}
	for _, p := range rep.Profiles {
		profiles[p.Name] = p
	}
	for i := range rep.Results {
		r := &rep.Results[i]
		r.Predicted = nil
		base, ok := one[r.Profile]
		prof, known := profiles[r.Profile]
		if !ok || !known || modelBytes == 0 && r.Workers > 1 {
			continue
		}
		step, overhead := stepTime(base)
		train := scheduler.Training{Steps: base.StepsToTarget, ModelBytes: modelBytes, Sync: r.Mode != "diloco", Efficiency: rep.Config.Efficiency,
			SyncEvery: rep.Config.SyncEvery, Wire: wire(rep.Config.Compress)}
		speeds := make([]float64, r.Workers)
		site := func(w int) int { // univ-a, univ-b, ... as the testbed names them; else in turn
			if w < len(r.Sites) && strings.HasPrefix(r.Sites[w], "univ-") && len(r.Sites[w]) == 6 {
				return int(r.Sites[w][5] - 'a')
			}
			return w % 2
		}
		link := func(a, b int) (scheduler.Link, bool) {
			// What the probes measured, as a quote would use; else the
			// profile's nominal link.
			for _, l := range r.Links {
				if (l.A == a && l.B == b || l.A == b && l.B == a) && l.MBps > 0 {
					return scheduler.Link{RTT: time.Duration(l.RTTMicros) * time.Microsecond, BytesPerSec: l.MBps * 1e6}, true
				}
			}
			return siteLink(prof, site(a), site(b)), true
		}
		all, best, err := scheduler.Fewest(train, time.Duration(float64(base.StepsToTarget)*step*float64(time.Second)), speeds, link)
		if err != nil {
			continue
		}
		p := all[len(all)-1]
		r.Predicted = &Predicted{
			TrainS: p.Total.Seconds(), CommS: p.Comm.Seconds(), TimeToTargetS: overhead + p.Total.Seconds(),
			SpeedUp: base.TimeToTargetS / (overhead + p.Total.Seconds()), Fewest: best, Steps: p.Steps,
		}
	}
}

// stepTime is a step's time in the 1-worker job, evaluations included,
// from the pace between its first and last evaluation, and the time
// before its steps (import, data load); with fewer than two evaluations,
// from its examples/s.
func stepTime(r Result) (step, overhead float64) {
	step = batchSize / r.ExamplesPerS
	if n := len(r.Evals); n >= 2 && r.Evals[n-1][1] > r.Evals[0][1] {
		step = (r.Evals[n-1][0] - r.Evals[0][0]) / (r.Evals[n-1][1] - r.Evals[0][1])
	}
	return step, max(0, r.TimeToTargetS-float64(r.StepsToTarget)*step)
}

// modelSize is the weights' bytes, from a synchronous job's estimate of
// what a worker sends (train.py: a ring all-reduce of the float32
// gradients, 2(W-1)/W of them a step).
func modelSize(rs []Result) uint64 {
	for _, r := range rs {
		if r.Mode == "sync" && r.Workers > 1 && r.BytesSent > 0 && r.Steps > 0 {
			w := float64(r.Workers)
			return uint64(float64(r.BytesSent) / float64(r.Steps) * w / (2 * (w - 1)))
		}
	}
	return 0
}

// siteLink is the nominal path between a node of site a and one of site
// b: the profile's round trip and its narrowest link on the way.
func siteLink(p netlab.Profile, a, b int) scheduler.Link {
	rate := p.Intra.RateBits
	if a != b {
		for _, s := range []int{a, b} {
			if len(p.WAN) > 0 {
				if w := p.WAN[s%len(p.WAN)].RateBits; w > 0 && (rate == 0 || w < rate) {
					rate = w
				}
			}
		}
	}
	l := scheduler.Link{RTT: p.RTT(a, b)}
	if rate > 0 {
		l.BytesPerSec = float64(rate) / 8
	}
	return l
}

func wire(compress string) float64 {
	switch compress {
	case "int8":
		return 0.25
	case "fp16":
		return 0.5
	}
	return 1
}

// predictionTable sets the predictions beside the measurements.
func predictionTable(rep Report) string {
	var b strings.Builder
	for _, r := range rep.Results {
		p := r.Predicted
		if p == nil {
			continue
		}
		table := "`scheduler/stateff.json`, the scheduler's shipped table"
		if rep.Config.EfficiencyFrom != "" {
			table = "`" + rep.Config.EfficiencyFrom + "`, this workload's table, as a job's `[training] steps_ratio` would give it"
		}
		if b.Len() == 0 {
			b.WriteString("## Predicted and measured\n\n" +
				"What the scheduler's model (`scheduler.Predict`, the one quotes use) expects of each job: the steps each " +
				"worker takes are the 1-worker job's steps to the target times the measured statistical efficiency for " +
				"that many workers and mode (" + table + ", from the harness below); each step takes the " +
				"1-worker job's pace on the slowest machine plus, in sync mode, a ring all-reduce of the gradients over " +
				"the links the lenders' probes measured between the job's machines (a quote's own input; the " +
				"profile's nominal links where none was measured), or, in diloco mode, a round's exchange every " +
				"sync_every steps over them; the " +
				"1-worker job's time before its first step is added. The 1-worker row is the calibration (its pace " +
				"and steps are what the others are predicted from), so it matches by construction.\n\n" +
				"| Profile | Workers | Mode | Predicted steps | Measured steps | Predicted time to target (s) | of which exchanging (s) | Measured (s) | " +
				"Error | Predicted vs 1 | Measured vs 1 | Fewest predicted to finish soonest |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		}
		measured, speed, errCell, steps := "-", "-", "-", "-"
		if r.TargetReached && r.TimeToTargetS > 0 {
			measured = fmt.Sprintf("%.1f", r.TimeToTargetS)
			errCell = fmt.Sprintf("%+.0f%%", 100*(p.TimeToTargetS-r.TimeToTargetS)/r.TimeToTargetS)
		} else if r.TimedOut {
			measured = fmt.Sprintf("> %.0f", cutS(r, rep.Config))
		}
		if r.StepsToTarget > 0 {
			steps = fmt.Sprint(r.StepsToTarget)
		}
		if r.SpeedUp > 0 {
			speed = fmt.Sprintf("%.2fx", r.SpeedUp)
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %d | %s | %.1f | %.1f | %s | %s | %.2fx | %s | %d |\n", r.Profile, r.Workers, modeLabel(r),
			p.Steps, steps, p.TimeToTargetS, p.CommS, measured, errCell, p.SpeedUp, speed, p.Fewest)
	}
	if b.Len() > 0 {
		b.WriteString("\n")
	}
	return b.String()
}
