package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"time"

	"github.com/deepmarket/deepmarket/node/jobs"
)

// sleepPy is the launch benchmark's whole job: it stamps the moment
// Python runs the program, then sleeps, so nothing but the launch is
// measured (no data, no TensorFlow import).
const sleepPy = `import sys, time
print("dm-bench started %.6f" % time.time(), flush=True)
time.sleep(float(sys.argv[1]))
`

// sleepSeconds keeps every worker running across at least one of the
// submitter's 3 s status polls, so client.Job can show them all running.
const sleepSeconds = "5"

var stampRE = regexp.MustCompile(`(?m)^\[w(\d+)\] dm-bench started ([0-9.]+)$`)

// launchRun is one job's launch, in seconds. From "submit returned"
// (Submit came back, with Yes, once a quote was chosen):
//   - Launch: until the submitter began launching (holds committed,
//     escrow open on the ledger);
//   - Started: until the last worker's sandbox started, by its lender's
//     clock (the same clock: one process);
//   - Python: until the last worker's Python ran its first line;
//   - Seen: until client.Job first showed every worker "running" (the
//     submitter polls starting workers every 0.3 s, running ones every second).
type launchRun struct {
	SubmitS  float64 `json:"submit_s"`
	LaunchS  float64 `json:"to_launch_s"`
	StartedS float64 `json:"to_all_started_s"`
	PythonS  float64 `json:"to_all_python_s"`
	SeenS    float64 `json:"to_all_seen_running_s"`
	// Replaced: the job needed a second placement (its first launch failed).
	Replaced bool `json:"replaced,omitempty"`
	// Unplaced of Bids got no placement (the submitter bids again; see
	// placementTries).
	Unplaced int `json:"unplaced_bids,omitempty"`
	Bids     int `json:"bids"`
}

type launchCase struct {
	Workers int         `json:"workers"`
	Runs    []launchRun `json:"runs"`
	Submit  stat        `json:"submit_s"`
	Launch  stat        `json:"to_launch_s"`
	Started stat        `json:"to_all_started_s"`
	Python  stat        `json:"to_all_python_s"`
	Seen    stat        `json:"to_all_seen_running_s"`
	// Total is submit called -> last worker's Python running.
	Total stat `json:"submit_called_to_all_python_s"`
	// Unplaced of Bids got no placement, over all repetitions.
	Unplaced int `json:"unplaced_bids"`
	Bids     int `json:"bids"`
}

// stat is a p50 and p90 (nearest rank) over the repetitions.
type stat struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	N   int     `json:"n"`
}

func statOf(xs []float64) stat {
	var s []float64
	for _, x := range xs {
		if !math.IsNaN(x) {
			s = append(s, x)
		}
	}
	if len(s) == 0 {
		return stat{P50: math.NaN(), P90: math.NaN()}
	}
	return stat{P50: percentile(s, 0.5), P90: percentile(s, 0.9), N: len(s)}
}

// writeSleepBundle makes the launch job's bundle in dir.
func writeSleepBundle(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "sleep.py"), []byte(sleepPy), 0o644)
}

// launchOnce submits a job of workers sleepers (bundle already in every
// node's storage, no dataset) and follows it to its end.
func launchOnce(ctx context.Context, c *cluster, bundle string, workers int) (launchRun, error) {
	nan := math.NaN()
	r := launchRun{LaunchS: nan, StartedS: nan, PythonS: nan, SeenS: nan}
	spec := jobs.File{Name: fmt.Sprintf("launch-%d", workers), Framework: "generic",
		Command: []string{"python3", "sleep.py", sleepSeconds}, Bundle: bundle,
		Workers: workers, Cores: 1, Memory: "256MiB", MaxPrice: "5", MaxDuration: "5m"}
	sub, err := c.submit(ctx, spec)
	r.Unplaced, r.Bids = sub.unplaced, sub.bids
	if err != nil {
		return r, err
	}
	j, t0, t1 := sub.job, sub.called, sub.returned
	r.SubmitS = t1.Sub(t0).Seconds()
	j, err = c.waitJob(ctx, j, t1.Add(2*time.Minute), 50*time.Millisecond, func(j *jobs.Job) {
		if math.IsNaN(r.SeenS) && len(j.Runs) == 1 && allRunning(j) {
			r.SeenS = time.Since(t1).Seconds()
		}
	})
	if err != nil {
		return r, err
	}
	logText := c.jobLog(ctx, j.ID)
	if j.State != jobs.Succeeded {
		return r, fmt.Errorf("job %s %s: %s; log:\n%s", j.ID[:12], j.State, j.Reason, tail(logText, 30))
	}
	run := j.Current()
	r.Replaced = len(j.Runs) > 1
	r.LaunchS = run.Started.Sub(t1).Seconds()
	var last time.Time
	for _, w := range run.Workers {
		if w.Started.After(last) {
			last = w.Started
		}
	}
	r.StartedS = last.Sub(t1).Seconds()
	stamps := map[int]float64{}
	for _, m := range stampRE.FindAllStringSubmatch(logText, -1) {
		i, _ := strconv.Atoi(m[1])
		s, _ := strconv.ParseFloat(m[2], 64)
		stamps[i] = s // a re-placed job's later run overwrites
	}
	if len(stamps) == workers {
		var latest float64
		for _, s := range stamps {
			latest = max(latest, s)
		}
		r.PythonS = latest - float64(t1.UnixNano())/1e9
	}
	return r, c.waitIdle(ctx)
}

func allRunning(j *jobs.Job) bool {
	if len(j.Workers) == 0 {
		return false
	}
	for _, w := range j.Workers {
		if w.State != "running" {
			return false
		}
	}
	return true
}

// runLaunch measures launch latency for each size, the sizes interleaved
// (2, 4, 8, 2, 4, 8, ...) so drift on the machine spreads over all.
func runLaunch(ctx context.Context, c *cluster, bundle string, sizes []int, reps int) ([]launchCase, error) {
	cases := make([]launchCase, len(sizes))
	for i, w := range sizes {
		cases[i].Workers = w
	}
	defer summarize(cases)
	for rep := range reps {
		for i, w := range sizes {
			r, err := launchOnce(ctx, c, bundle, w)
			cases[i].Unplaced += r.Unplaced
			cases[i].Bids += r.Bids
			if errors.Is(err, errNoPlacement) {
				// A measured outcome, not a broken benchmark: counted.
				logf("launch %d workers #%d: abandoned: %v", w, rep+1, err)
				if err := c.waitIdle(ctx); err != nil {
					return cases, err
				}
				continue
			}
			if err != nil {
				return cases, fmt.Errorf("launch, %d workers, repetition %d: %w", w, rep+1, err)
			}
			logf("launch %d workers #%d: submit %.2fs, then launch %.2fs, all started %.2fs, all in Python %.2fs, seen running %.2fs",
				w, rep+1, r.SubmitS, r.LaunchS, r.StartedS, r.PythonS, r.SeenS)
			cases[i].Runs = append(cases[i].Runs, r)
		}
	}
	return cases, nil
}

// summarize fills each case's percentiles from its runs.
func summarize(cases []launchCase) {
	for i := range cases {
		lc := &cases[i]
		pick := func(f func(launchRun) float64) stat {
			var xs []float64
			for _, r := range lc.Runs {
				xs = append(xs, f(r))
			}
			return statOf(xs)
		}
		lc.Submit = pick(func(r launchRun) float64 { return r.SubmitS })
		lc.Launch = pick(func(r launchRun) float64 { return r.LaunchS })
		lc.Started = pick(func(r launchRun) float64 { return r.StartedS })
		lc.Python = pick(func(r launchRun) float64 { return r.PythonS })
		lc.Seen = pick(func(r launchRun) float64 { return r.SeenS })
		lc.Total = pick(func(r launchRun) float64 { return r.SubmitS + r.PythonS })
	}
}

func (s stat) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		P50 opt `json:"p50"`
		P90 opt `json:"p90"`
		N   int `json:"n"`
	}{opt(s.P50), opt(s.P90), s.N})
}

func (r launchRun) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		SubmitS  opt  `json:"submit_s"`
		LaunchS  opt  `json:"to_launch_s"`
		StartedS opt  `json:"to_all_started_s"`
		PythonS  opt  `json:"to_all_python_s"`
		SeenS    opt  `json:"to_all_seen_running_s"`
		Replaced bool `json:"replaced,omitempty"`
		Unplaced int  `json:"unplaced_bids,omitempty"`
		Bids     int  `json:"bids"`
	}{opt(r.SubmitS), opt(r.LaunchS), opt(r.StartedS), opt(r.PythonS), opt(r.SeenS), r.Replaced, r.Unplaced, r.Bids})
}
