// Command jobs is `make bench-jobs`: what a job costs on its way through
// DeepMarket, measured on a submitter and lender nodes in this process on
// loopback (one fresh ledger, as node/jobs_e2e_test.go builds it), each
// figure next to its reference or goal in the same run.
//
//   - Launch latency with 2 / 4 / 8 workers (-sizes), -reps times each:
//     a generic job whose workers only sleep, its bundle already in every
//     node's storage, so no data moves and no TensorFlow is imported.
//     From Submit returning (it waits for quotes first, reported apart:
//     thrice the first placement's delay, 0.25 s at least) until every
//     worker runs, and from Submit called (goal: p50 <= 1 s), timed by the
//     lenders' own start times, by each worker's first Python line, and
//     as client.Job shows it (the submitter polls starting workers every 0.3 s).
//   - Time to first training step and steady examples/s of
//     examples/fashion-mnist/train.py on 2 workers through DeepMarket,
//     next to the same 2 workers started by hand with a hand-written
//     TF_CONFIG on loopback (DM_CORES=1, same arguments, data local, each
//     pinned to the CPU its DeepMarket twin is pinned to), in rounds
//     ordered hand, DeepMarket, DeepMarket, hand (goals: first step
//     <= 1.2x, steady examples/s >= 0.95x the hand-started workers).
//   - Fashion-MNIST time per full epoch with 1, 2, 3 workers through
//     DeepMarket (the lenders pin to CPUs 0, 1, 0: on a 2-core machine
//     3 workers oversubscribe).
//
// Every node answers bids, as configured by default (-quoters submitter
// leaves it to the submitter alone). When the nodes' schedulers race for
// the same machines a bid can get no placement at all: the submitter bids
// again (inside Submit); such bids are counted and reported, and a job
// that fails for want of a placement is submitted once more.
// Inputs are added to every node's storage first (the same CID), so no
// job moves data at launch.
//
// Sandbox overhead and tunnel throughput are measured elsewhere
// (node/sandbox BenchmarkCPUBound, bench/tunnel). Needs root (the
// sandbox), a Python with tensorflow-cpu and tf_keras (-python), and the
// dataset (-data). Output: a table, and JSON with -out
// (bench/results/jobs.json from make).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/deepmarket/deepmarket/node/sandbox"
)

// launchGoal is the launch latency goal, p50: from submit called to
// every worker running (in Python).
const launchGoal = time.Second

// Goals of the training comparison (DeepMarket / by hand).
const (
	firstStepGoal = 1.2
	steadyGoal    = 0.95
)

type results struct {
	Date    string  `json:"date"`
	CPUs    int     `json:"cpus"`
	Python  string  `json:"python"`
	Lenders int     `json:"lenders"`
	Quoters string  `json:"quoters"` // nodes answering bids: all or submitter
	TotalS  float64 `json:"total_s"`
	// Launch: launch latency per job size.
	Launch []launchCase `json:"launch,omitempty"`
	// Compare: 2 workers through DeepMarket vs started by hand.
	Compare *trainCompare `json:"compare,omitempty"`
	// Scaling: full epochs with 1, 2, 3 workers through DeepMarket.
	Scaling []scaleCase        `json:"scaling,omitempty"`
	Ratios  map[string]float64 `json:"ratios"`
	Errors  []string           `json:"errors,omitempty"`
}

func main() {
	sandbox.MaybeRunTrampoline() // workers start by re-executing this binary
	python := flag.String("python", "/opt/deepmarket/venv/bin/python3", "Python with tensorflow-cpu and tf_keras")
	bundleDir := flag.String("bundle", "examples/fashion-mnist", "the training program's directory (train.py)")
	dataDir := flag.String("data", "/usr/share/datasets/fashion-mnist", "Fashion-MNIST IDX files")
	out := flag.String("out", "", "write JSON results here")
	sizesFlag := flag.String("sizes", "2,4,8", "launch benchmark: workers per job")
	reps := flag.Int("reps", 5, "launch benchmark: jobs per size")
	rounds := flag.Int("rounds", 2, "first step / throughput: hand-started and DeepMarket runs of each")
	compareArgs := flag.String("compare-args", "--epochs 3 --steps-per-epoch 150", "train.py arguments of the first step / throughput comparison")
	scaleFlag := flag.String("scale", "1,2,3", "workers per job of the full-epoch runs (empty: skip)")
	scaleArgs := flag.String("scale-args", "--epochs 2", "train.py arguments of the full-epoch runs")
	quoters := flag.String("quoters", "all", "which nodes answer bids: all (the default config) or submitter (no competing schedulers)")
	keep := flag.Bool("keep", false, "keep the work directories (node homes, nodes.log)")
	flag.Parse()
	log.SetFlags(0)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, config{python: *python, bundleDir: *bundleDir, dataDir: *dataDir, out: *out,
		sizes: ints(*sizesFlag), reps: *reps, rounds: *rounds, compareArgs: strings.Fields(*compareArgs),
		scale: ints(*scaleFlag), scaleArgs: strings.Fields(*scaleArgs), keep: *keep, quoters: *quoters})
	stop()
	if err != nil {
		log.Printf("bench-jobs: %v", err)
		os.Exit(1)
	}
}

type config struct {
	python, bundleDir, dataDir, out string
	quoters                         string
	sizes                           []int
	reps, rounds                    int
	compareArgs                     []string
	scale                           []int
	scaleArgs                       []string
	keep                            bool
}

func logf(format string, args ...any) {
	log.Printf("%s "+format, append([]any{time.Now().Format("15:04:05")}, args...)...)
}

func run(ctx context.Context, cfg config) error {
	start := time.Now()
	if err := sandbox.Probe().Essential(); err != nil {
		return fmt.Errorf("this machine cannot run sandboxed jobs (run as root on Linux): %w", err)
	}
	// Also pages TensorFlow in, so neither side of the comparison pays
	// the cold read.
	if outp, err := exec.CommandContext(ctx, cfg.python, "-c", "import tensorflow, tf_keras").CombinedOutput(); err != nil {
		return fmt.Errorf("%s has no tensorflow and tf_keras (run `make deps`): %v\n%s", cfg.python, err, outp)
	}
	bundleDir, err := filepath.Abs(cfg.bundleDir)
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(bundleDir, "train.py")); err != nil {
		return fmt.Errorf("no train.py in %s (run from the repository root or pass -bundle)", bundleDir)
	}
	if _, err := os.Stat(cfg.dataDir); err != nil {
		return fmt.Errorf("dataset: %w (run `make deps`)", err)
	}
	tmp, err := os.MkdirTemp("", "bench-jobs-")
	if err != nil {
		return err
	}
	// Workers run as an unprivileged user: their work dirs must be
	// reachable, so not under a private temporary directory.
	work, err := os.MkdirTemp("/var/tmp", "bench-jobs-")
	if err != nil {
		return err
	}
	os.Chmod(work, 0o711)
	if cfg.keep {
		logf("work directories kept: %s %s", tmp, work)
	} else {
		defer os.RemoveAll(tmp)
		defer os.RemoveAll(work)
	}

	lenders := max(3, (slices.Max(append([]int{1}, cfg.sizes...))+1)/2)
	if len(cfg.scale) > 0 {
		lenders = max(lenders, slices.Max(cfg.scale))
	}
	res := &results{Date: time.Now().UTC().Format(time.RFC3339), CPUs: runtime.NumCPU(), Python: cfg.python,
		Lenders: lenders, Quoters: cfg.quoters, Ratios: map[string]float64{}}
	logf("starting a submitter and %d lenders (node logs: %s)", lenders, filepath.Join(tmp, "nodes.log"))
	if cfg.quoters != "all" && cfg.quoters != "submitter" {
		return fmt.Errorf("-quoters %q: want all or submitter", cfg.quoters)
	}
	c, err := startCluster(ctx, tmp, work, cfg.python, lenders, cfg.quoters == "all")
	if err != nil {
		return err
	}
	defer c.stop()
	fail := func(err error) {
		logf("FAILED: %v", err)
		res.Errors = append(res.Errors, err.Error())
	}

	// 1. Launch latency: every lender lends 2 cores.
	if len(cfg.sizes) > 0 && cfg.reps > 0 {
		err := func() error {
			sleepDir := filepath.Join(tmp, "sleep-bundle")
			if err := writeSleepBundle(sleepDir); err != nil {
				return err
			}
			bundle, err := c.addEverywhere(ctx, sleepDir)
			if err != nil {
				return err
			}
			cores := make([]int, lenders)
			for i := range cores {
				cores[i] = 2
			}
			if err := c.lend(ctx, cores, 1<<30); err != nil {
				return err
			}
			res.Launch, err = runLaunch(ctx, c, bundle, cfg.sizes, cfg.reps)
			return err
		}()
		if err != nil {
			fail(err)
		}
	}

	// 2 and 3 share the training inputs, in every node's storage.
	var bundle, dataset string
	if (cfg.rounds > 0 || len(cfg.scale) > 0) && ctx.Err() == nil {
		if bundle, err = c.addEverywhere(ctx, bundleDir); err == nil {
			dataset, err = c.addEverywhere(ctx, cfg.dataDir)
		}
		if err != nil {
			fail(err)
		}
	}
	if cfg.rounds > 0 && dataset != "" && ctx.Err() == nil {
		res.Compare, err = runCompare(ctx, c, cfg.python, bundleDir, cfg.dataDir, bundle, dataset, cfg.compareArgs, cfg.rounds, tmp)
		if err != nil {
			fail(err)
			res.Compare = nil
		}
	}
	if len(cfg.scale) > 0 && dataset != "" && ctx.Err() == nil {
		res.Scaling, err = runScaling(ctx, c, bundle, dataset, cfg.scale, cfg.scaleArgs, tmp)
		if err != nil {
			fail(err)
		}
	}
	res.TotalS = time.Since(start).Seconds()
	fillRatios(res)
	printResults(res)
	fmt.Printf("\ntotal run time %.0f s\n", res.TotalS)
	if cfg.out != "" {
		b, err := json.MarshalIndent(res, "", "  ")
		if err != nil {
			return fmt.Errorf("results: %w", err)
		}
		if err := os.WriteFile(cfg.out, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	if len(res.Errors) > 0 {
		if !cfg.keep {
			fmt.Printf("(rerun with -keep to look at the node logs)\n")
		}
		return errors.New(strings.Join(res.Errors, "\n"))
	}
	return ctx.Err()
}

func fillRatios(r *results) {
	defer func() {
		for k, v := range r.Ratios {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				delete(r.Ratios, k)
			}
		}
	}()
	for _, lc := range r.Launch {
		r.Ratios[fmt.Sprintf("launch_%dw_started_p50_vs_goal", lc.Workers)] = lc.Started.P50 / launchGoal.Seconds()
		r.Ratios[fmt.Sprintf("launch_%dw_python_p50_vs_goal", lc.Workers)] = lc.Python.P50 / launchGoal.Seconds()
		r.Ratios[fmt.Sprintf("launch_%dw_seen_p50_vs_goal", lc.Workers)] = lc.Seen.P50 / launchGoal.Seconds()
		r.Ratios[fmt.Sprintf("launch_%dw_submit_to_python_p50_vs_goal", lc.Workers)] = lc.Total.P50 / launchGoal.Seconds()
	}
	if tc := r.Compare; tc != nil {
		r.Ratios["first_step_vs_hand"] = tc.FirstStepX
		r.Ratios["wall_first_step_vs_hand"] = tc.WallFirstX
		r.Ratios["steady_examples_vs_hand"] = tc.SteadyX
		r.Ratios["result_examples_vs_hand"] = tc.ResultExX
	}
	for _, s := range r.Scaling {
		if s.SpeedupX > 0 {
			r.Ratios[fmt.Sprintf("scaling_%dw_examples_vs_1w", s.Workers)] = s.SpeedupX
		}
	}
}

func printResults(r *results) {
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	if len(r.Launch) > 0 {
		quoters := "every node quotes (the default)"
		if r.Quoters == "submitter" {
			quoters = "only the submitter quotes"
		}
		fmt.Printf("\nLaunch latency: sleeping workers (no data, no TensorFlow), %d lenders x 2 cores, %s.\n", r.Lenders, quoters)
		fmt.Printf("Seconds after Submit returned (it waits for quotes first), p50 / p90 (n); goal: submit called -> all in Python, p50 <= 1 s.\n")
		fmt.Fprintf(w, "workers\tSubmit itself\tlaunch begins\tall started (lenders)\tall in Python\tall seen running (client.Job)\tp50 / goal: started, Python, seen\tsubmit called -> all in Python\tbids unplaced\n")
		for _, lc := range r.Launch {
			fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%s, %s, %s\t%s\t%s\n", lc.Workers, fmtStat(lc.Submit), fmtStat(lc.Launch),
				fmtStat(lc.Started), fmtStat(lc.Python), fmtStat(lc.Seen),
				ratio(lc.Started.P50/launchGoal.Seconds()), ratio(lc.Python.P50/launchGoal.Seconds()), ratio(lc.Seen.P50/launchGoal.Seconds()),
				fmtStat(lc.Total), fmt.Sprintf("%d of %d", lc.Unplaced, lc.Bids))
		}
		w.Flush()
		fmt.Printf("(client.Job learns worker states from the submitter's status poll, every 0.3 s while workers start. \"bids unplaced\":\n bids that got no placement as the nodes' schedulers raced to hold the same machines; the submitter bids again\n 2-3 s later, inside Submit, which is then that much longer)\n")
	}
	if tc := r.Compare; tc != nil {
		fmt.Printf("\n2 workers, train.py %s; DeepMarket vs started by hand, median (min-max) of %d runs each\n", strings.Join(tc.Args, " "), tc.DM.N)
		fmt.Fprintf(w, "\tDeepMarket\tby hand\tDeepMarket / hand\tgoal\n")
		fmt.Fprintf(w, "first step, s after process start (train.py's)\t%.2f (%.2f-%.2f)\t%.2f (%.2f-%.2f)\t%s\t<= %.2fx\n",
			tc.DM.FirstStepS, tc.DM.FirstStepRange[0], tc.DM.FirstStepRange[1],
			tc.Hand.FirstStepS, tc.Hand.FirstStepRange[0], tc.Hand.FirstStepRange[1], ratio(tc.FirstStepX), firstStepGoal)
		fmt.Fprintf(w, "first step, s after submit called / processes started\t%.2f\t%.2f\t%s\t-\n", tc.DM.WallFirstStepS, tc.Hand.WallFirstStepS, ratio(tc.WallFirstX))
		fmt.Fprintf(w, "TensorFlow import, s\t%.2f\t%.2f\t%s\t-\n", tc.DM.TFImportS, tc.Hand.TFImportS, ratio(tc.DM.TFImportS/tc.Hand.TFImportS))
		fmt.Fprintf(w, "steady examples/s (epochs 2+)\t%.0f (%.0f-%.0f)\t%.0f (%.0f-%.0f)\t%s\t>= %.2fx\n",
			tc.DM.SteadyExS, tc.DM.SteadyRange[0], tc.DM.SteadyRange[1],
			tc.Hand.SteadyExS, tc.Hand.SteadyRange[0], tc.Hand.SteadyRange[1], ratio(tc.SteadyX), steadyGoal)
		fmt.Fprintf(w, "examples/s, all epochs (result.json)\t%.0f\t%.0f\t%s\t-\n", tc.DM.ResultExS, tc.Hand.ResultExS, ratio(tc.ResultExX))
		fmt.Fprintf(w, "test accuracy\t%.3f\t%.3f\t\t\n", tc.DM.TestAccuracy, tc.Hand.TestAccuracy)
		fmt.Fprintf(w, "CPU of the %d nodes (this process) over the run, cores\t%.2f\t%.2f\t\t\n", r.Lenders+1, tc.DM.NodesCPU, tc.Hand.NodesCPU)
		w.Flush()
		fmt.Printf("(by hand: unsandboxed processes, each pinned to the CPU its DeepMarket twin gets, talking over plain\n loopback; through DeepMarket their gRPC goes through the lenders' libp2p tunnels, in the nodes' process)\n")
	}
	if len(r.Scaling) > 0 {
		fmt.Printf("\nFashion-MNIST through DeepMarket, train.py %s (60,000 examples an epoch)\n", strings.Join(r.Scaling[0].Args, " "))
		fmt.Fprintf(w, "workers\tplacement\tfirst step, s\tepoch 1, s\tlater epochs, s\tsteady examples/s\tvs 1 worker\ttest accuracy\n")
		for _, s := range r.Scaling {
			later := "-"
			if len(s.EpochS) > 1 {
				var xs []string
				for _, e := range s.EpochS[1:] {
					xs = append(xs, strconv.FormatFloat(e, 'f', 1, 64))
				}
				later = strings.Join(xs, ", ")
			}
			fmt.Fprintf(w, "%d\t%s\t%.1f\t%.1f\t%s\t%.0f\t%s\t%.3f\n", s.Workers, s.Placement, s.FirstStepS, s.EpochS[0], later, s.SteadyExS, ratio(s.SpeedupX), s.TestAccuracy)
		}
		w.Flush()
		fmt.Printf("(%d CPUs; the lenders pin workers to CPUs 0, 1, 0: 3 workers share 2 CPUs", r.CPUs)
		if r.Compare != nil {
			fmt.Printf("; 2 workers by hand, above: %.0f examples/s", r.Compare.Hand.SteadyExS)
		}
		fmt.Printf(")\n")
	}
	unplaced, bids := 0, 0
	if r.Compare != nil {
		for _, t := range r.Compare.Runs {
			unplaced, bids = unplaced+t.Unplaced, bids+t.Bids
		}
	}
	for _, s := range r.Scaling {
		unplaced, bids = unplaced+s.Unplaced, bids+s.Bids
	}
	if bids > 0 {
		fmt.Printf("(training jobs: %d of %d bids got no placement)\n", unplaced, bids)
	}
	for _, e := range r.Errors {
		fmt.Printf("\nFAILED: %s\n", e)
	}
}

func fmtStat(s stat) string {
	if s.N == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f / %.2f (%d)", s.P50, s.P90, s.N)
}

func ratio(x float64) string {
	if math.IsNaN(x) || math.IsInf(x, 0) || x == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", x)
}

// percentile is the nearest-rank percentile of xs.
func percentile(xs []float64, p float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	k := int(math.Ceil(p*float64(len(s)))) - 1
	return s[max(0, min(k, len(s)-1))]
}

func ints(s string) []int {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			log.Fatalf("%q: want a comma-separated list of positive numbers", s)
		}
		out = append(out, n)
	}
	return out
}

// opt is a figure that may not have been measured (NaN): null in JSON.
type opt float64

func (x opt) MarshalJSON() ([]byte, error) {
	if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
		return []byte("null"), nil
	}
	return json.Marshal(float64(x))
}
