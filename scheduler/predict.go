package scheduler

import (
	"fmt"
	"math"
	"time"
)

// Training is what the scheduler knows of a data-parallel training job to
// predict its time on given machines: the steps one worker would take to
// its target, the weights it exchanges, and how it synchronizes.
//
// The job's Duration is the compute of those Steps on a speed-1 machine.
// With k workers, each takes Steps x Efficiency.Ratio(k) steps over its
// own batches: what the statistics allow, measured (1/k would be perfect
// scaling, which no optimizer reaches); a synchronous job all-reduces its
// gradients after every step, a local-SGD job (DiLoCo) averages its
// weights every SyncEvery steps.
type Training struct {
	Steps      int
	ModelBytes uint64 // the weights, as float32
	// Sync: every step; otherwise every SyncEvery local steps.
	Sync      bool
	SyncEvery int
	// Wire is the bytes sent per byte of weights in an averaging round:
	// 1 uncompressed, 0.5 fp16, 0.25 int8 (0 means 1).
	Wire float64
	// Efficiency is the job's own measured statistical efficiency; nil
	// means DefaultEfficiency.
	Efficiency *Efficiency
}

// ratio is the steps per worker with k workers over one worker's.
func (t Training) ratio(k int) float64 {
	if t.Efficiency != nil {
		return t.Efficiency.Ratio(t.Sync, k)
	}
	return DefaultEfficiency.Ratio(t.Sync, k)
}

// Validate checks the workload's shape.
func (t Training) Validate() error {
	switch {
	case t.Steps < 1:
		return fmt.Errorf("training steps %d: want at least 1", t.Steps)
	case !t.Sync && t.SyncEvery < 1:
		return fmt.Errorf("sync_every %d: want at least 1 for local steps", t.SyncEvery)
	case t.Wire < 0 || t.Wire > 1:
		return fmt.Errorf("wire ratio %g: want 0 to 1", t.Wire)
	}
	if t.Efficiency != nil {
		return t.Efficiency.Validate()
	}
	return nil
}

// Link is a measured path between two machines.
type Link struct {
	RTT time.Duration
	// BytesPerSec is the throughput one stream gets; 0 means unknown.
	BytesPerSec float64
}

// Unmeasured links are assumed to be a campus LAN: what a scheduler must
// assume of two machines nobody has measured.
var defaultLink = Link{RTT: time.Millisecond, BytesPerSec: 100e6}

// Prediction is the expected time of a training job on some machines.
type Prediction struct {
	Workers int `json:"workers"`
	// Steps is what each worker takes to the target (see Efficiency).
	Steps int `json:"steps"`
	// Step is one step's wall time on a worker, its share of
	// synchronization included; Compute and Comm split Total.
	Step    time.Duration `json:"step_ns"`
	Total   time.Duration `json:"total_ns"`
	Compute time.Duration `json:"compute_ns"`
	Comm    time.Duration `json:"comm_ns"`
	// SpeedUp is one worker's Total (on the fastest of the machines) over
	// this Total.
	SpeedUp float64 `json:"speed_up"`
}

// Predict gives the job's time on the machines of the given speeds (one
// worker each, 0 meaning 1), link(a, b) being the measured path between
// workers a and b (ok false when unmeasured). The model:
//
//   - steps: each worker takes Steps x the statistical efficiency's ratio
//     for k workers (Training.Efficiency, else DefaultEfficiency): a
//     goodput model in the spirit of Pollux (OSDI 2021), throughput times
//     what each step is worth;
//   - compute: Duration/Steps per step at the pace of the slowest worker
//     (synchronous) or, for local steps, each round at the slowest's pace;
//   - a synchronous step all-reduces the gradients over a ring: 2(k-1)
//     hops of ModelBytes/k each over the ring's slowest link, each hop
//     paying half that link's RTT;
//   - a local-SGD round sends every worker's compressed delta to the
//     coordinator (worker 0) and the average back, one worker after
//     another over its link to the coordinator, plus an RTT each way.
//
// It ignores what overlap hides; the benchmark (make bench-training)
// compares it with measured runs.
func Predict(t Training, duration time.Duration, speeds []float64, link func(a, b int) (Link, bool)) (Prediction, error) {
	k := len(speeds)
	if err := t.Validate(); err != nil {
		return Prediction{}, err
	}
	if k == 0 {
		return Prediction{}, fmt.Errorf("no workers to predict for")
	}
	slowest, fastest := math.Inf(1), 0.0
	for _, s := range speeds {
		if s <= 0 {
			s = 1
		}
		slowest, fastest = min(slowest, s), max(fastest, s)
	}
	stepCompute := duration.Seconds() / float64(t.Steps)
	steps := math.Ceil(float64(t.Steps) * t.ratio(k))
	compute := steps * stepCompute / slowest
	comm := 0.0
	if k > 1 {
		if t.Sync {
			comm = steps * ringAllReduce(float64(t.ModelBytes), k, link)
		} else {
			rounds := math.Ceil(steps / float64(t.SyncEvery))
			comm = rounds * starRound(float64(t.ModelBytes)*wireRatio(t.Wire), k, link)
		}
	}
	total := compute + comm
	one := float64(t.Steps) * stepCompute / fastest
	return Prediction{
		Workers: k,
		Steps:   int(steps),
		Step:    seconds((compute + comm) / steps),
		Total:   seconds(total),
		Compute: seconds(compute),
		Comm:    seconds(comm),
		SpeedUp: one / total,
	}, nil
}

// Fewest returns the predictions for the first 1, 2, ... len(speeds)
// workers, and the count among them that finishes soonest (the fewest
// workers of those within 1 % of the best, as more workers cost more).
func Fewest(t Training, duration time.Duration, speeds []float64, link func(a, b int) (Link, bool)) ([]Prediction, int, error) {
	out := make([]Prediction, 0, len(speeds))
	best := 0
	for k := 1; k <= len(speeds); k++ {
		p, err := Predict(t, duration, speeds[:k], link)
		if err != nil {
			return nil, 0, err
		}
		out = append(out, p)
		if best == 0 || float64(p.Total) < 0.99*float64(out[best-1].Total) {
			best = k
		}
	}
	return out, best, nil
}

func ringAllReduce(bytes float64, k int, link func(a, b int) (Link, bool)) float64 {
	worst := 0.0
	for a := range k {
		l := linkOr(link, a, (a+1)%k)
		hop := l.RTT.Seconds()/2 + bytes/float64(k)/l.BytesPerSec
		worst = max(worst, hop)
	}
	return 2 * float64(k-1) * worst
}

func starRound(bytes float64, k int, link func(a, b int) (Link, bool)) float64 {
	send, rtt := 0.0, 0.0
	for j := 1; j < k; j++ {
		l := linkOr(link, 0, j)
		send += bytes / l.BytesPerSec
		rtt = max(rtt, l.RTT.Seconds())
	}
	return 2 * (send + rtt)
}

func linkOr(link func(a, b int) (Link, bool), a, b int) Link {
	if link == nil {
		return defaultLink
	}
	l, ok := link(a, b)
	if !ok {
		return defaultLink
	}
	if l.BytesPerSec <= 0 {
		l.BytesPerSec = defaultLink.BytesPerSec
	}
	return l
}

func wireRatio(w float64) float64 {
	if w <= 0 {
		return 1
	}
	return w
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// Spread judges a placement's machines for a training job: it returns
// the prediction for all of them, the worker count that would finish
// soonest (see Fewest) and, for a synchronous job that fewer of
// them would finish sooner (its exchanges cost more than the extra
// workers save), a rejection that says so with both times. A local-SGD
// job is never refused here: it exchanges rarely by design.
func Spread(t Training, duration time.Duration, speeds []float64, link func(a, b int) (Link, bool)) (Prediction, int, *Rejection, error) {
	all, best, err := Fewest(t, duration, speeds, link)
	if err != nil {
		return Prediction{}, 0, nil, err
	}
	p := all[len(all)-1]
	if !t.Sync || best == len(all) {
		return p, best, nil, nil
	}
	b := all[best-1]
	return p, best, &Rejection{Resource: "network", Reason: fmt.Sprintf(
		"synchronous training over these links: %d workers would take %s (%s exchanging gradients), %d would take %s; "+
			"use [training] mode = \"diloco\", or fewer workers", p.Workers, round(p.Total), round(p.Comm), b.Workers, round(b.Total))}, nil
}

func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Hour:
		return d.Round(time.Minute)
	case d >= time.Minute:
		return d.Round(time.Second)
	}
	return d.Round(100 * time.Millisecond)
}
