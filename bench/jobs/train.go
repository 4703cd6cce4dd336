package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/deepmarket/deepmarket/node/jobs"
)

// trainRun is one run of examples/fashion-mnist/train.py, through
// DeepMarket or started by hand.
type trainRun struct {
	Mode    string `json:"mode"` // deepmarket or hand
	Workers int    `json:"workers"`
	// FirstStepS is train.py's own "first step done" (process start ->
	// first training step), the latest over the workers: a step needs all.
	FirstStepS float64 `json:"first_step_s"`
	// WallFirstStepS is from the submit call (DeepMarket) or the first
	// process start (by hand) to the last worker's first step.
	WallFirstStepS float64 `json:"wall_first_step_s"`
	TFImportS      float64 `json:"tf_import_s"`
	// EpochS and EpochExS are the chief's epoch lines.
	EpochS   []float64 `json:"epoch_s"`
	EpochExS []float64 `json:"epoch_examples_per_s"`
	// SteadyExS is the examples/s of epochs 2 and later (harmonic mean):
	// the first epoch pays for tracing and the first all-reduces.
	SteadyExS    float64 `json:"steady_examples_per_s"`
	ResultExS    float64 `json:"result_examples_per_s"` // result.json's, all epochs
	TestAccuracy float64 `json:"test_accuracy"`
	// TotalS is submit called / first process started -> the job ended
	// / every process exited; ChiefS is the chief's own process start ->
	// result written (result.json's seconds).
	TotalS    float64 `json:"total_s"`
	ChiefS    float64 `json:"chief_s"`
	Placement string  `json:"placement,omitempty"`
	// Unplaced of Bids got no placement (the submitter bids again).
	Unplaced int `json:"unplaced_bids,omitempty"`
	Bids     int `json:"bids,omitempty"`
	// NodesCPU is the CPU the nodes (all in this process) used over the
	// run, in cores: where the 2 CPUs went besides the workers.
	NodesCPU float64 `json:"nodes_cpu_cores"`
}

var (
	firstStepRE = regexp.MustCompile(`(?m)^\[w(\d+)\] \[worker \d+\] first step done ([0-9.]+)s after process start`)
	epochRE     = regexp.MustCompile(`(?m)^\[w0\] \[worker 0\] epoch (\d+)/\d+: .*, ([0-9.]+)s, ([0-9.]+) examples/s`)
)

// trainResult is what train.py writes to result.json.
type trainResult struct {
	TestAccuracy float64 `json:"test_accuracy"`
	ExamplesPerS float64 `json:"examples_per_second"`
	FirstStepS   float64 `json:"first_step_seconds"`
	TFImportS    float64 `json:"tf_import_seconds"`
	Workers      int     `json:"workers"`
	Seconds      float64 `json:"seconds"`
}

// parseTrain fills r from the (worker-tagged) log and result.json.
func parseTrain(r *trainRun, logText string, res trainResult, starts map[int]time.Time, t0 time.Time) error {
	r.TestAccuracy, r.ResultExS, r.TFImportS, r.ChiefS = res.TestAccuracy, res.ExamplesPerS, res.TFImportS, res.Seconds
	if res.Workers != r.Workers {
		return fmt.Errorf("result.json says %d workers, want %d", res.Workers, r.Workers)
	}
	seen := 0
	for _, m := range firstStepRE.FindAllStringSubmatch(logText, -1) {
		i, _ := strconv.Atoi(m[1])
		s, _ := strconv.ParseFloat(m[2], 64)
		r.FirstStepS = max(r.FirstStepS, s)
		if st, ok := starts[i]; ok {
			at := st.Add(time.Duration(s * float64(time.Second)))
			r.WallFirstStepS = max(r.WallFirstStepS, at.Sub(t0).Seconds())
		}
		seen++
	}
	if seen != r.Workers {
		return fmt.Errorf("%d of %d workers logged their first step", seen, r.Workers)
	}
	for _, m := range epochRE.FindAllStringSubmatch(logText, -1) {
		s, _ := strconv.ParseFloat(m[2], 64)
		x, _ := strconv.ParseFloat(m[3], 64)
		r.EpochS = append(r.EpochS, s)
		r.EpochExS = append(r.EpochExS, x)
	}
	if len(r.EpochExS) == 0 {
		return fmt.Errorf("the chief logged no epoch")
	}
	steady := r.EpochExS
	if len(steady) > 1 {
		steady = steady[1:]
	}
	var inv float64
	for _, x := range steady {
		inv += 1 / x
	}
	r.SteadyExS = float64(len(steady)) / inv
	return nil
}

// dmTrain runs train.py with args on workers lent machines through
// DeepMarket; its bundle and dataset are already in every node's storage.
func dmTrain(ctx context.Context, c *cluster, bundle, dataset string, workers int, args []string, outDir string) (trainRun, error) {
	r := trainRun{Mode: "deepmarket", Workers: workers}
	cpu0 := selfCPU()
	spec := jobs.File{Name: fmt.Sprintf("fashion-%d", workers), Framework: "tensorflow",
		Command: append([]string{"python3", "train.py"}, args...), Bundle: bundle, Dataset: dataset,
		Workers: workers, Cores: 1, Memory: "2GiB", MaxPrice: "5", MaxDuration: "15m"}
	sub, err := c.submit(ctx, spec)
	r.Unplaced, r.Bids = sub.unplaced, sub.bids
	if err != nil {
		return r, err
	}
	j, t0 := sub.job, sub.called
	if j, err = c.waitJob(ctx, j, t0.Add(6*time.Minute), 200*time.Millisecond, nil); err != nil {
		return r, err
	}
	r.TotalS = time.Since(t0).Seconds()
	r.NodesCPU = (selfCPU() - cpu0).Seconds() / r.TotalS
	logText := c.jobLog(ctx, j.ID)
	if j.State != jobs.Succeeded {
		return r, fmt.Errorf("job %s %s: %s; log:\n%s", j.ID[:12], j.State, j.Reason, tail(logText, 30))
	}
	if len(j.Runs) > 1 {
		return r, fmt.Errorf("job %s was re-placed: its timings mix two runs; log:\n%s", j.ID[:12], tail(logText, 30))
	}
	if _, err := c.sub.c.DataGet(ctx, j.ResultCID, outDir, nil); err != nil {
		return r, fmt.Errorf("get the result %s: %w", j.ResultCID, err)
	}
	res, err := readResult(filepath.Join(outDir, "result.json"))
	if err != nil {
		return r, err
	}
	starts := map[int]time.Time{}
	cpuOf := map[string]int{}
	for _, l := range c.lenders {
		cpuOf[l.n.Host().ID().String()] = l.cpu
	}
	var place []string
	for i, w := range j.Current().Workers {
		starts[i] = w.Started
		place = append(place, fmt.Sprintf("w%d %s (CPU %d)", i, w.Moniker, cpuOf[w.Machine]))
	}
	r.Placement = strings.Join(place, ", ")
	if err := parseTrain(&r, logText, res, starts, t0); err != nil {
		return r, fmt.Errorf("%w; log:\n%s", err, tail(logText, 30))
	}
	return r, c.waitIdle(ctx)
}

// handTrain starts the same train.py by hand: workers processes on this
// machine with a hand-written TF_CONFIG on loopback, DM_CORES=1, the
// same arguments and the data read in place. Worker i is pinned to CPU
// cpus[i] (taskset), as DeepMarket pins its workers, when taskset exists.
func handTrain(ctx context.Context, python, bundleDir, dataDir string, workers int, cpus []int, args []string, outDir string) (trainRun, error) {
	r := trainRun{Mode: "hand", Workers: workers}
	addrs := make([]string, workers)
	for i := range addrs {
		addrs[i] = "127.0.0.1:" + freePort()
	}
	taskset, _ := exec.LookPath("taskset")
	outs := make([]bytes.Buffer, workers)
	errs := make([]error, workers)
	starts := map[int]time.Time{}
	var wg sync.WaitGroup
	cpu0 := selfCPU()
	t0 := time.Now()
	for i := range workers {
		tfc, _ := json.Marshal(map[string]any{
			"cluster": map[string][]string{"worker": addrs},
			"task":    map[string]any{"type": "worker", "index": i},
		})
		argv := append([]string{python, "train.py"}, args...)
		if taskset != "" {
			argv = append([]string{taskset, "-c", strconv.Itoa(cpus[i%len(cpus)])}, argv...)
		}
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.Dir = bundleDir
		cmd.Env = append(os.Environ(), "DM_CORES=1", "TF_CONFIG="+string(tfc), "DM_DATA_DIR="+dataDir,
			"DM_OUTPUT_DIR="+filepath.Join(outDir, fmt.Sprintf("w%d", i)))
		cmd.Stdout, cmd.Stderr = &outs[i], &outs[i]
		starts[i] = time.Now()
		if err := cmd.Start(); err != nil {
			return r, fmt.Errorf("start worker %d: %w", i, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = cmd.Wait()
		}()
	}
	wg.Wait()
	r.TotalS = time.Since(t0).Seconds()
	r.NodesCPU = (selfCPU() - cpu0).Seconds() / r.TotalS
	var logText strings.Builder
	for i := range workers {
		logText.WriteString(tagLines(fmt.Sprintf("[w%d] ", i), outs[i].String()))
	}
	for i, err := range errs {
		if err != nil {
			return r, fmt.Errorf("worker %d: %w; output:\n%s", i, err, tail(outs[i].String(), 30))
		}
	}
	if taskset != "" {
		var p []string
		for i := range workers {
			p = append(p, fmt.Sprintf("w%d CPU %d", i, cpus[i%len(cpus)]))
		}
		r.Placement = strings.Join(p, ", ")
	} else {
		r.Placement = "unpinned (no taskset)"
	}
	res, err := readResult(filepath.Join(outDir, "w0", "result.json"))
	if err != nil {
		return r, err
	}
	if err := parseTrain(&r, logText.String(), res, starts, t0); err != nil {
		return r, fmt.Errorf("%w; log:\n%s", err, tail(logText.String(), 30))
	}
	return r, nil
}

// selfCPU is this process's user and system CPU time (its children's,
// the workers, not included).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func tagLines(tag, s string) string {
	var b strings.Builder
	for _, l := range strings.SplitAfter(s, "\n") {
		if l != "" {
			b.WriteString(tag + l)
		}
	}
	return b.String()
}

func readResult(path string) (trainResult, error) {
	var res trainResult
	b, err := os.ReadFile(path)
	if err != nil {
		return res, fmt.Errorf("result: %w", err)
	}
	return res, json.Unmarshal(b, &res)
}

// trainCompare is DeepMarket next to the same workers started by hand,
// in rounds ordered hand, DeepMarket, DeepMarket, hand, ... so drift on
// the machine falls on both alike.
type trainCompare struct {
	Args       []string   `json:"args"`
	Runs       []trainRun `json:"runs"`
	DM         trainAgg   `json:"deepmarket"`
	Hand       trainAgg   `json:"hand"`
	FirstStepX float64    `json:"first_step_ratio"`      // DM / hand, process start -> first step
	WallFirstX float64    `json:"wall_first_step_ratio"` // DM submit / hand start -> first step
	SteadyX    float64    `json:"steady_examples_ratio"` // DM / hand
	ResultExX  float64    `json:"result_examples_ratio"` // DM / hand, result.json (all epochs)
}

// trainAgg is the median over a mode's runs.
type trainAgg struct {
	FirstStepS     float64 `json:"first_step_s"`
	WallFirstStepS float64 `json:"wall_first_step_s"`
	TFImportS      float64 `json:"tf_import_s"`
	SteadyExS      float64 `json:"steady_examples_per_s"`
	ResultExS      float64 `json:"result_examples_per_s"`
	TestAccuracy   float64 `json:"test_accuracy"`
	NodesCPU       float64 `json:"nodes_cpu_cores"`
	N              int     `json:"n"`
	// Ranges over the runs, min and max.
	FirstStepRange [2]float64 `json:"first_step_range_s"`
	SteadyRange    [2]float64 `json:"steady_examples_range"`
}

func aggregate(runs []trainRun, mode string) trainAgg {
	var fs, wall, tf, steady, resEx, acc, cpu []float64
	for _, r := range runs {
		if r.Mode != mode {
			continue
		}
		fs = append(fs, r.FirstStepS)
		wall = append(wall, r.WallFirstStepS)
		tf = append(tf, r.TFImportS)
		steady = append(steady, r.SteadyExS)
		resEx = append(resEx, r.ResultExS)
		acc = append(acc, r.TestAccuracy)
		cpu = append(cpu, r.NodesCPU)
	}
	span := func(xs []float64) [2]float64 {
		if len(xs) == 0 {
			return [2]float64{}
		}
		return [2]float64{slices.Min(xs), slices.Max(xs)}
	}
	return trainAgg{FirstStepS: median(fs), WallFirstStepS: median(wall), TFImportS: median(tf),
		SteadyExS: median(steady), ResultExS: median(resEx), TestAccuracy: median(acc), NodesCPU: median(cpu), N: len(fs),
		FirstStepRange: span(fs), SteadyRange: span(steady)}
}

func runCompare(ctx context.Context, c *cluster, python, bundleDir, dataDir, bundle, dataset string, args []string, rounds int, tmp string) (*trainCompare, error) {
	tc := &trainCompare{Args: args}
	if err := c.lend(ctx, []int{1, 1}, 2<<30); err != nil {
		return tc, err
	}
	cpus := []int{c.lenders[0].cpu, c.lenders[1].cpu}
	for k := range 2 * rounds {
		out := filepath.Join(tmp, fmt.Sprintf("compare-%d", k))
		var r trainRun
		var err error
		if (k%4 == 0) || (k%4 == 3) {
			r, err = handTrain(ctx, python, bundleDir, dataDir, 2, cpus, args, out)
		} else {
			r, err = dmTrain(ctx, c, bundle, dataset, 2, args, out)
		}
		if err != nil {
			return tc, fmt.Errorf("first step / throughput, %s, run %d: %w", map[bool]string{true: "by hand", false: "DeepMarket"}[r.Mode == "hand"], k+1, err)
		}
		logf("2 workers %s: first step %.2fs after process start (%.2fs wall), steady %.0f examples/s, epochs %v s, accuracy %.3f [%s]",
			r.Mode, r.FirstStepS, r.WallFirstStepS, r.SteadyExS, r.EpochS, r.TestAccuracy, r.Placement)
		tc.Runs = append(tc.Runs, r)
	}
	tc.DM, tc.Hand = aggregate(tc.Runs, "deepmarket"), aggregate(tc.Runs, "hand")
	tc.FirstStepX = tc.DM.FirstStepS / tc.Hand.FirstStepS
	tc.WallFirstX = tc.DM.WallFirstStepS / tc.Hand.WallFirstStepS
	tc.SteadyX = tc.DM.SteadyExS / tc.Hand.SteadyExS
	tc.ResultExX = tc.DM.ResultExS / tc.Hand.ResultExS
	return tc, nil
}

// scaleCase is full Fashion-MNIST epochs with n workers through DeepMarket.
type scaleCase struct {
	trainRun
	// SpeedupX is this case's steady examples/s over one worker's (0
	// when the sizes do not start at 1).
	SpeedupX float64  `json:"speedup_vs_1_worker"`
	Args     []string `json:"args"`
}

func runScaling(ctx context.Context, c *cluster, bundle, dataset string, sizes []int, args []string, tmp string) ([]scaleCase, error) {
	var out []scaleCase
	for _, w := range sizes {
		cores := make([]int, w)
		for i := range cores {
			cores[i] = 1
		}
		if err := c.lend(ctx, cores, 2<<30); err != nil {
			return out, err
		}
		r, err := dmTrain(ctx, c, bundle, dataset, w, args, filepath.Join(tmp, fmt.Sprintf("scale-%d", w)))
		if err != nil {
			return out, fmt.Errorf("epochs with %d workers: %w", w, err)
		}
		logf("%d workers, full epochs: %v s, steady %.0f examples/s, accuracy %.3f [%s]", w, r.EpochS, r.SteadyExS, r.TestAccuracy, r.Placement)
		out = append(out, scaleCase{trainRun: r, Args: args})
	}
	if len(out) > 0 && out[0].Workers == 1 {
		for i := range out {
			out[i].SpeedupX = out[i].SteadyExS / out[0].SteadyExS
		}
	}
	return out, nil
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	return (s[(n-1)/2] + s[n/2]) / 2
}
