// Command training is `make bench-training`: distributed training judged
// as a user would, by the time it takes to reach a test accuracy. The
// Fashion-MNIST example (examples/fashion-mnist/train.py, --model
// cnn-deep by default) runs through the real market on a 2-site testnet
// on this machine under each network profile (lan, wifi, multi-dc), on
// emulated machines of known size (-machine-cores), with 1, 2 and 3
// workers, and with 2+ workers in both training modes side by side:
// [training] mode = "sync" (TensorFlow's MultiWorkerMirroredStrategy,
// gradients all-reduced every step) and mode = "diloco" (local steps,
// averaged every sync_every steps by the deepmarket Python package over
// the job's tunnels, compressed). One worker runs in sync mode: it has
// nothing to synchronize, and it is the baseline of both modes'
// speed-ups; with -one-worker-once (the default) it runs on the first
// profile only, as it sends nothing while it trains.
//
// Every job stops at the target accuracy (train.py --target-accuracy,
// checked every --eval-every steps) or after -max-steps steps a worker;
// one still running -job-timeout after it was submitted, or -cut-factor
// times the 1-worker job's completion, is cancelled and reported as not
// reaching the target, with the last accuracy its log shows. The report gives, per job: time to the target (train.py's, from
// the worker's process start), final test accuracy, examples/s, bytes sent
// per worker, the speed-up over 1 worker, and the job's completion time
// (submit to done); as report.md, report.json and report.png in -out.
//
// The validators and the benchmark run outside the emulated machines, on
// what their quotas leave of this host. Needs root (network namespaces, the sandbox) and a Python with
// tensorflow-cpu, tf_keras and the deepmarket package (-python).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/deepmarket/deepmarket/bench/internal/testbed"
	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/scheduler"
	"github.com/deepmarket/deepmarket/testnet"
	"github.com/deepmarket/deepmarket/testnet/netlab"
)

// Config is what the run was asked for (the flags).
type Config struct {
	Profiles    []string `json:"profiles"`
	Workers     []int    `json:"workers"`
	Modes       []string `json:"modes"`
	Target      float64  `json:"target_accuracy"`
	Model       string   `json:"model"`
	EvalEvery   int      `json:"eval_every"`
	SyncEvery   int      `json:"sync_every"`
	Compress    string   `json:"compress"`
	MaxSteps    int      `json:"max_steps"`
	JobTimeoutS float64  `json:"job_timeout_s"`
	// DiLoCoArgs are train.py flags added to the command of diloco jobs
	// (such as the outer optimizer's, which [training] does not carry).
	DiLoCoArgs []string `json:"diloco_args,omitempty"`
	// Efficiency is the statistical efficiency predictions use (-stateff,
	// a table for this workload); nil: the scheduler's shipped table.
	Efficiency     *scheduler.Efficiency `json:"efficiency,omitempty"`
	EfficiencyFrom string                `json:"efficiency_from,omitempty"`
	// CutFactor: a job of 2+ workers is also cancelled once it has run
	// this many times the profile's 1-worker completion (0: never).
	CutFactor float64 `json:"cut_factor,omitempty"`
	Lenders   int     `json:"lenders"` // a core each, cycling the two sites
	// Machine is the size of every lender's (and the submitter's)
	// emulated machine: its node and workers confined to a cgroup with
	// this CPU quota and memory limit. Nil: unconfined, sharing the host.
	Machine *testnet.Machine `json:"machine,omitempty"`
	// ByHandSteps: the steps a worker takes in the by-hand runs.
	ByHandSteps int `json:"by_hand_steps,omitempty"`
}

// MeasuredLink is an offer's link sample between two workers' machines.
type MeasuredLink struct {
	A         int     `json:"a"` // worker indices
	B         int     `json:"b"`
	RTTMicros uint32  `json:"rtt_us"`
	MBps      float64 `json:"mb_per_s"`
}

// ByHand is the same workers started by hand, on machines of the same
// size with no node in them, next to the market's.
type ByHand struct {
	Workers      int     `json:"workers"`
	Mode         string  `json:"mode"`
	ExamplesPerS float64 `json:"examples_per_s"`
	Error        string  `json:"error,omitempty"`
}

// Result is one job's figures.
type Result struct {
	Profile string   `json:"profile"`
	Workers int      `json:"workers"`
	Mode    string   `json:"mode"` // sync or diloco; 1 worker runs sync
	State   string   `json:"state"`
	Reason  string   `json:"reason,omitempty"`
	Sites   []string `json:"sites"` // of the workers' machines
	// TimedOut: cancelled CutS after it was submitted (-job-timeout, or
	// -cut-factor times the 1-worker job's completion).
	TimedOut      bool    `json:"timed_out,omitempty"`
	CutS          float64 `json:"cut_s,omitempty"`
	TargetReached bool    `json:"target_reached"`
	// TimeToTargetS is train.py's time_to_target_s: from worker 0's
	// process start (TensorFlow import, data load, training, evaluations)
	// to the evaluation that reached the target.
	TimeToTargetS float64 `json:"time_to_target_s,omitempty"`
	// StepsToTarget: steps a worker had taken at that evaluation.
	StepsToTarget int `json:"steps_to_target,omitempty"`
	// SpeedUp is the 1-worker time to the target over this one's (same
	// profile); 0 when either did not reach it.
	SpeedUp float64 `json:"speed_up,omitempty"`
	// TestAccuracy is the final test accuracy (result.json), or, for a job
	// that did not finish, the last one its log shows.
	TestAccuracy float64 `json:"test_accuracy"`
	Steps        int     `json:"steps"` // a worker's, at the last evaluation
	ExamplesPerS float64 `json:"examples_per_s"`
	// BytesSent is what a worker sent to the others: in sync mode
	// train.py's estimate (a ring all-reduce of the float32 gradients
	// every step), in diloco mode what worker 0 sent, counted by the
	// averager.
	BytesSent      int64 `json:"bytes_sent_per_worker"`
	BytesEstimated bool  `json:"bytes_sent_estimated,omitempty"`
	Rounds         int   `json:"rounds,omitempty"`
	// From names the profile whose 1-worker run this row repeats
	// (-one-worker-once): one worker exchanges nothing while it trains.
	From        string  `json:"from,omitempty"`
	CompletionS float64 `json:"completion_s"` // submitted to done
	RunS        float64 `json:"run_s"`        // launched to done
	Attempts    int     `json:"attempts"`
	// Evals are worker 0's evaluations: [seconds since its start, steps,
	// test accuracy].
	Evals [][3]float64 `json:"evals,omitempty"`
	// EvalToTargetS is the time worker 0 spent evaluating up to and
	// including the evaluation that reached the target.
	EvalToTargetS float64 `json:"eval_to_target_s,omitempty"`
	// Machines are the workers' machines (peer IDs), in worker order, and
	// Links what the submitter's offers said of the paths between them
	// when the job was submitted: the probes' measurements, which quotes
	// predict with.
	Machines []string       `json:"machines,omitempty"`
	Links    []MeasuredLink `json:"links,omitempty"`
	// MachineCPU is each lender machine's CPU use over the job, in cores
	// (its node and its workers), with machines of known size.
	MachineCPU []float64 `json:"machine_cpu,omitempty"`
	// Predicted is the scheduler's prediction for this job (see predict).
	Predicted *Predicted `json:"predicted,omitempty"`
	Log       string     `json:"log,omitempty"` // where the job's log was saved
}

// Report is the JSON output.
type Report struct {
	Date     string           `json:"date"`
	CPUs     int              `json:"cpus"`
	Shaper   string           `json:"shaper"`
	Command  []string         `json:"command"`
	Config   Config           `json:"config"`
	Results  []Result         `json:"results"`
	ByHand   []ByHand         `json:"by_hand,omitempty"`
	Profiles []netlab.Profile `json:"profiles"`
	TookS    float64          `json:"took_s"`
}

func main() {
	bin := flag.String("bin", "bin/deepmarket", "deepmarket binary the nodes run")
	python := flag.String("python", "python3", "Python with tensorflow-cpu, tf_keras and the deepmarket package")
	out := flag.String("out", "bench/results/training", "directory for report.md, report.json and report.png")
	logs := flag.String("logs", "", "directory for the jobs' logs (default: a new one under the temp dir)")
	profiles := flag.String("profiles", "lan,wifi,multi-dc", "network profiles")
	workers := flag.String("workers", "1,2,3", "worker counts (1 to 4)")
	modes := flag.String("modes", "sync,diloco", "training modes of the jobs with 2+ workers")
	target := flag.Float64("target", 0.90, "target test accuracy")
	model := flag.String("model", "cnn-deep", "train.py --model: mlp, cnn, cnn-wide or cnn-deep")
	evalEvery := flag.Int("eval-every", 100, "evaluate the test set every this many steps a worker")
	syncEvery := flag.Int("sync-every", 50, "diloco: local steps between averaging rounds ([training] sync_every)")
	compress := flag.String("compress", "int8", "diloco: int8, fp16 or none ([training] compress)")
	maxSteps := flag.Int("max-steps", 4000, "steps a worker takes at most (a job that has not reached the target by then stops)")
	jobTimeout := flag.Duration("job-timeout", 14*time.Minute, "cancel a job still running this long after it was submitted")
	dilocoArgs := flag.String("diloco-args", "", "train.py flags added to diloco jobs' command, space-separated "+
		"(e.g. \"--outer-lr 1.0 --outer-momentum 0\")")
	stateff := flag.String("stateff", "", "predict with this statistical-efficiency table (python -m deepmarket.stateff "+
		"--go-table) instead of the scheduler's shipped one; with -from, rewrite the report's predictions with it")
	oneWorkerOnce := flag.Bool("one-worker-once", true, "run the 1-worker job on the first profile only and use it "+
		"as every profile's baseline (one worker sends nothing while it trains; its time to target starts at its process start)")
	cutFactor := flag.Float64("cut-factor", 1.5, "cancel a job of 2+ workers once it has run this many times the profile's "+
		"1-worker completion: it can no longer pay off (0: only -job-timeout)")
	machineCores := flag.Float64("machine-cores", 0.5, "emulated machines: each lender's node and workers get this CPU quota, in cores (0: unconfined)")
	machineMem := flag.Float64("machine-mem-gib", 3, "emulated machines: memory limit, GiB")
	byHand := flag.Int("by-hand-steps", 500, "on the first profile, run 1 worker and 2 sync and diloco workers by hand for this many steps, "+
		"on machines of the same size with no node, to compare examples/s (0: skip)")
	from := flag.String("from", "", "run nothing: write report.md and report.png in -out again from this report.json")
	byHandOnly := flag.String("by-hand-only", "", "run only the by-hand workers (-by-hand-steps, with this report's machine size and settings) "+
		"and write them into this report.json, then the report in -out")
	flag.Parse()
	log.SetFlags(0)
	if *byHandOnly != "" {
		if err := redoByHand(*byHandOnly, *out, *python, *logs, *byHand); err != nil {
			log.Fatal(err)
		}
		return
	}
	var eff *scheduler.Efficiency
	if *stateff != "" {
		raw, err := os.ReadFile(*stateff)
		if err != nil {
			log.Fatalf("-stateff: %v", err)
		}
		e, err := scheduler.ParseEfficiency(raw)
		if err != nil {
			log.Fatalf("-stateff %s: %v", *stateff, err)
		}
		eff = &e
	}
	if *from != "" {
		if err := rewrite(*from, *out, eff, *stateff); err != nil {
			log.Fatal(err)
		}
		return
	}
	start := time.Now()

	cfg := Config{Target: *target, Model: *model, EvalEvery: *evalEvery, SyncEvery: *syncEvery, Compress: *compress,
		MaxSteps: *maxSteps, JobTimeoutS: jobTimeout.Seconds(), CutFactor: *cutFactor, ByHandSteps: *byHand,
		DiLoCoArgs: strings.Fields(*dilocoArgs), Efficiency: eff, EfficiencyFrom: *stateff}
	if *machineCores > 0 {
		cfg.Machine = &testnet.Machine{Cores: *machineCores, MemBytes: uint64(*machineMem * (1 << 30))}
	}
	for _, w := range splitList(*workers) {
		n, err := strconv.Atoi(w)
		if err != nil || n < 1 || n > 4 {
			log.Fatalf("-workers: %q: want 1 to 4", w)
		}
		cfg.Workers = append(cfg.Workers, n)
	}
	for _, m := range splitList(*modes) {
		if !p2p.TrainingModes[m] {
			log.Fatalf("-modes: %q: want sync or diloco", m)
		}
		cfg.Modes = append(cfg.Modes, m)
	}
	tr := p2p.Training{Mode: "diloco", SyncEvery: *syncEvery, Compress: *compress}
	switch {
	case len(cfg.Workers) == 0 || len(cfg.Modes) == 0:
		log.Fatal("-workers and -modes name at least one each")
	case !(*target > 0 && *target <= 1):
		log.Fatalf("-target %g: want (0, 1]", *target)
	case !slices.Contains([]string{"mlp", "cnn", "cnn-wide", "cnn-deep"}, *model):
		log.Fatalf("-model %q: want mlp, cnn, cnn-wide or cnn-deep", *model)
	case *evalEvery < 1 || *maxSteps < 1 || *syncEvery < 1:
		log.Fatal("-eval-every, -max-steps and -sync-every must be at least 1")
	case *jobTimeout < time.Minute:
		log.Fatal("-job-timeout: at least 1m")
	case *cutFactor != 0 && *cutFactor < 1:
		log.Fatal("-cut-factor: 0 or at least 1")
	}
	cfg.Lenders = max(2, slices.Max(cfg.Workers))
	if err := tr.Validate(); err != nil {
		log.Fatalf("-sync-every, -compress: %v", err)
	}
	var plist []netlab.Profile
	for _, name := range splitList(*profiles) {
		p, err := netlab.ProfileByName(name)
		if err != nil {
			log.Fatal(err)
		}
		plist = append(plist, p)
		cfg.Profiles = append(cfg.Profiles, p.Name)
	}
	if err := netlab.Available(); err != nil {
		log.Fatalf("bench-training needs network namespaces: %v", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	binPath, err := filepath.Abs(*bin)
	if err != nil {
		log.Fatal(err)
	}
	bundle, err := filepath.Abs("examples/fashion-mnist")
	if err != nil {
		log.Fatal(err)
	}
	if *logs == "" {
		if *logs, err = os.MkdirTemp("", "dm-bench-training-logs-"); err != nil {
			log.Fatal(err)
		}
	} else if err := os.MkdirAll(*logs, 0o755); err != nil {
		log.Fatal(err)
	}
	// --epochs 1 --steps-per-epoch N: one epoch of at most N steps a
	// worker, so the cap is the same in both modes.
	command := []string{"python3", "train.py", "--model", *model,
		"--target-accuracy", strconv.FormatFloat(*target, 'f', -1, 64), "--eval-every", strconv.Itoa(*evalEvery),
		"--epochs", "1", "--steps-per-epoch", strconv.Itoa(*maxSteps)}
	rep := Report{Date: time.Now().UTC().Format(time.RFC3339), CPUs: runtime.NumCPU(), Command: command, Config: cfg, Profiles: plist}
	b := bench{bin: binPath, python: *python, bundle: bundle, command: command, cfg: cfg, logs: *logs,
		timeout: *jobTimeout, oneWorkerOnce: *oneWorkerOnce}
	if cfg.ByHandSteps > 0 && cfg.Machine != nil {
		rep.ByHand = b.runByHand(ctx)
	}
	for _, p := range plist {
		res, shaper, err := b.runProfile(ctx, p.Name)
		rep.Results = append(rep.Results, res...)
		if shaper != "" {
			rep.Shaper = shaper
		}
		if err != nil {
			// Write what was measured, then fail.
			log.Printf("%s: %v", p.Name, err)
			rep.TookS = time.Since(start).Seconds()
			if werr := write(*out, &rep); werr != nil {
				log.Print(werr)
			}
			os.Exit(1)
		}
	}
	rep.TookS = time.Since(start).Seconds()
	if err := write(*out, &rep); err != nil {
		log.Fatal(err)
	}
	fmt.Print(markdown(rep))
	fmt.Printf("\nwrote %s/report.{md,json,png} in %s; job logs in %s\n", *out, time.Since(start).Round(time.Second), *logs)
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// redoByHand runs the by-hand workers again for an earlier report.json
// (on a quiet machine: they are timed) and writes the report in dir.
func redoByHand(from, dir, python, logs string, steps int) error {
	raw, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	var rep Report
	if err := json.Unmarshal(raw, &rep); err != nil {
		return fmt.Errorf("%s: %w", from, err)
	}
	if rep.Config.Machine == nil || steps < 1 {
		return fmt.Errorf("%s: no machine size, or -by-hand-steps 0", from)
	}
	if logs == "" {
		if logs, err = os.MkdirTemp("", "dm-bench-training-logs-"); err != nil {
			return err
		}
	}
	bundle, err := filepath.Abs("examples/fashion-mnist")
	if err != nil {
		return err
	}
	rep.Config.ByHandSteps = steps
	b := bench{python: python, bundle: bundle, cfg: rep.Config, logs: logs}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep.ByHand = b.runByHand(ctx)
	return write(dir, &rep)
}

// rewrite writes the report in dir again from an earlier report.json.
func rewrite(from, dir string, eff *scheduler.Efficiency, effFrom string) error {
	raw, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	var rep Report
	if err := json.Unmarshal(raw, &rep); err != nil {
		return fmt.Errorf("%s: %w", from, err)
	}
	if eff != nil {
		rep.Config.Efficiency, rep.Config.EfficiencyFrom = eff, effFrom
	}
	if err := write(dir, &rep); err != nil {
		return err
	}
	fmt.Printf("wrote %s/report.{md,json,png} from %s\n", dir, from)
	return nil
}

func write(dir string, rep *Report) error {
	speedUps(rep.Results)
	predict(rep)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, _ := json.MarshalIndent(rep, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "report.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "report.md"), []byte(markdown(*rep)), 0o644); err != nil {
		return err
	}
	return writeChart(filepath.Join(dir, "report.png"), *rep)
}

// speedUps fills each result's speed-up over the 1-worker job of its
// profile.
func speedUps(rs []Result) {
	base := map[string]float64{}
	for _, r := range rs {
		if r.Workers == 1 && r.TargetReached && r.TimeToTargetS > 0 {
			base[r.Profile] = r.TimeToTargetS
		}
	}
	for i := range rs {
		r := &rs[i]
		r.SpeedUp = 0
		if b := base[r.Profile]; b > 0 && r.TargetReached && r.TimeToTargetS > 0 {
			r.SpeedUp = b / r.TimeToTargetS
		}
	}
}

// bench runs the jobs.
type bench struct {
	bin, python, bundle string
	command             []string
	cfg                 Config
	logs                string
	timeout             time.Duration
	oneWorkerOnce       bool
	single              *Result // the first profile's 1-worker run
}

// runProfile runs every job on a fresh 2-site testnet under one profile:
// val0, val1 one per site; node0, node1 (lenders, a core each) on sites
// univ-a and univ-b, so two workers always span the two sites (more
// lenders cycle the sites); the last node submits.
func (b *bench) runProfile(ctx context.Context, profile string) ([]Result, string, error) {
	bed, err := testbed.Start(ctx, testbed.Config{Bin: b.bin, Python: b.python, Profile: profile,
		Sites: 2, Lenders: b.cfg.Lenders, Cores: 1, MemBytes: 2 << 30, BasePort: 26300, Machine: b.cfg.Machine})
	if err != nil {
		return nil, "", err
	}
	defer bed.Close()
	var out []Result
	var single time.Duration // the 1-worker job's completion
	for _, w := range b.cfg.Workers {
		modes := b.cfg.Modes
		if w == 1 {
			modes = []string{"sync"} // nothing to synchronize: the baseline of both modes
		}
		if w == 1 && b.oneWorkerOnce && b.single != nil {
			r := *b.single
			r.Profile, r.From = profile, b.single.Profile
			single = time.Duration(r.CompletionS * float64(time.Second))
			out = append(out, r)
			continue
		}
		for _, mode := range modes {
			var r Result
			for attempt := 1; attempt <= 3; attempt++ {
				bed.WaitIdle(ctx)
				cpu0, t0 := machineCPU(bed), time.Now()
				limit := b.timeout
				if w > 1 && single > 0 && b.cfg.CutFactor > 0 {
					limit = min(limit, time.Duration(b.cfg.CutFactor*float64(single)).Round(time.Second))
				}
				r = b.runJob(ctx, bed, profile, mode, w, limit)
				r.MachineCPU = cpuSince(machineCPU(bed), cpu0, time.Since(t0))
				r.Attempts = attempt
				// A bid that found no machines is not a measurement: bid again.
				if r.State == string(jobs.Succeeded) || !testbed.NoMachines(r.Reason) || ctx.Err() != nil {
					break
				}
				log.Printf("   %s, %d workers, %s: no machines (%s); again", profile, w, mode, r.Reason)
			}
			if w == 1 && r.State == string(jobs.Succeeded) {
				single = time.Duration(r.CompletionS * float64(time.Second))
				b.single = &r
			}
			target := "target not reached"
			if r.TargetReached {
				target = fmt.Sprintf("target in %.1f s (%d steps)", r.TimeToTargetS, r.StepsToTarget)
			}
			log.Printf("   %s, %d workers, %s: %s, %s, accuracy %.4f, %.0f examples/s, %.2f MB sent/worker; "+
				"completion %.1f s on %v %s", profile, w, mode, r.State, target, r.TestAccuracy, r.ExamplesPerS,
				float64(r.BytesSent)/1e6, r.CompletionS, r.Sites, firstN(r.Reason, 200))
			out = append(out, r)
			if ctx.Err() != nil {
				return out, bed.Shaper, ctx.Err()
			}
		}
	}
	return out, bed.Shaper, nil
}

// resultFile is what train.py writes to result.json (the fields read here).
type resultFile struct {
	TestAccuracy   float64      `json:"test_accuracy"`
	Workers        int          `json:"workers"`
	Mode           string       `json:"mode"`
	TargetReached  bool         `json:"target_reached"`
	TimeToTargetS  *float64     `json:"time_to_target_s"`
	ExamplesPerS   float64      `json:"examples_per_s"`
	BytesSent      int64        `json:"bytes_sent"`
	BytesEstimated bool         `json:"bytes_sent_estimated"`
	Rounds         int          `json:"rounds"`
	Evals          [][3]float64 `json:"evals"`
}

var (
	evalRE    = regexp.MustCompile(`\[worker 0\] eval after (\d+) steps, ([\d.]+)s: test accuracy ([\d.]+) \(([\d.]+)s\)`)
	reachedRE = regexp.MustCompile(`\[worker 0\] reached the target accuracy [\d.]+ after ([\d.]+)s`)
)

func (b *bench) runJob(ctx context.Context, bed *testbed.Bed, profile, mode string, workers int, limit time.Duration) Result {
	r := Result{Profile: profile, Workers: workers, Mode: mode}
	tr := &p2p.Training{Mode: mode}
	if mode == "diloco" {
		tr.SyncEvery, tr.Compress = b.cfg.SyncEvery, b.cfg.Compress
	}
	name := fmt.Sprintf("training-%s-%s-%d", profile, mode, workers)
	command := b.command
	if mode == "diloco" {
		command = append(slices.Clone(command), b.cfg.DiLoCoArgs...)
	}
	spec := jobs.File{Name: name, Framework: "tensorflow", Command: command,
		Bundle: b.bundle, Dataset: "/usr/share/datasets/fashion-mnist", Workers: workers, Cores: 1, Memory: "2GiB",
		// Workers on different sites pay for the link between them
		// (scheduler network prices): the budget must allow it.
		MaxPrice: "100", MaxDuration: fmt.Sprintf("%dm", max(30, int(math.Ceil(b.timeout.Minutes()))+10)),
		Training: tr}
	sub := bed.Sub
	offers, _ := sub.Offers(ctx)
	j, err := sub.Submit(ctx, api.SubmitRequest{Spec: spec, Yes: true})
	if err != nil {
		r.State, r.Reason = "error", err.Error()
		return r
	}
	deadline, extended, cancelled := time.Now().Add(limit), false, time.Time{}
	for !j.State.Terminal() && ctx.Err() == nil {
		time.Sleep(time.Second)
		if cur, err := sub.Job(ctx, j.ID); err == nil {
			j = cur
		}
		switch {
		case j.State.Terminal() || time.Now().Before(deadline):
		case !extended && reachedRE.MatchString(testbed.JobLog(ctx, sub, j.ID)):
			// It reached the target and is finishing (the final
			// evaluation, saving the model, storing the output).
			extended, deadline = true, deadline.Add(3*time.Minute)
			log.Printf("   %s: reached the target at the time limit; waiting up to 3 more minutes for it to finish", name)
		case cancelled.IsZero():
			log.Printf("   %s: still running after %s: cancelling it", name, limit)
			r.TimedOut, r.CutS, cancelled = true, limit.Seconds(), time.Now()
			if cur, err := sub.CancelJob(ctx, j.ID); err == nil && cur != nil {
				j = cur
			}
		case time.Since(cancelled) > 2*time.Minute:
			r.State, r.Reason = string(j.State), "did not end within 2 minutes of being cancelled"
			return r
		}
	}
	r.State, r.Reason = string(j.State), j.Reason
	r.CompletionS = j.Updated.Sub(j.Created).Seconds()
	if run := j.Current(); run != nil {
		if !run.Started.IsZero() && !run.Ended.IsZero() {
			r.RunS = run.Ended.Sub(run.Started).Seconds()
		}
		r.Sites = bed.Sites(run)
		for _, w := range run.Workers {
			r.Machines = append(r.Machines, w.Machine)
		}
		r.Links = measuredLinks(offers, r.Machines)
	}
	text := testbed.JobLog(context.WithoutCancel(ctx), sub, j.ID)
	r.Log = filepath.Join(b.logs, name+".log")
	if err := os.WriteFile(r.Log, []byte(text), 0o644); err != nil {
		log.Printf("   %s: save the log: %v", name, err)
		r.Log = ""
	}
	// What the log shows, for a job that did not finish too.
	reached := false
	for _, m := range evalRE.FindAllStringSubmatch(text, -1) {
		steps, _ := strconv.Atoi(m[1])
		at, _ := strconv.ParseFloat(m[2], 64)
		acc, _ := strconv.ParseFloat(m[3], 64)
		took, _ := strconv.ParseFloat(m[4], 64)
		if !reached {
			r.EvalToTargetS += took
			reached = acc >= b.cfg.Target
		}
		r.Evals = append(r.Evals, [3]float64{at, float64(steps), acc})
	}
	if m := reachedRE.FindStringSubmatch(text); m != nil {
		r.TargetReached = true
		r.TimeToTargetS, _ = strconv.ParseFloat(m[1], 64)
	}
	if j.State == jobs.Succeeded && j.ResultCID != "" {
		if err := b.readResult(ctx, sub, j.ResultCID, &r); err != nil {
			r.Reason = "result: " + err.Error()
		}
	}
	if n := len(r.Evals); n > 0 {
		r.Steps = int(r.Evals[n-1][1])
		if r.TestAccuracy == 0 {
			r.TestAccuracy = r.Evals[n-1][2]
		}
	}
	for _, e := range r.Evals {
		if e[2] >= b.cfg.Target {
			r.StepsToTarget = int(e[1])
			break
		}
	}
	return r
}

// readResult fetches the job's output (worker 0's output dir) and reads
// its result.json into r.
func (b *bench) readResult(ctx context.Context, sub *api.Client, cid string, r *Result) error {
	dir, err := os.MkdirTemp("", "dm-bench-training-result-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "result")
	if _, err := sub.DataGet(ctx, cid, out, nil); err != nil {
		return err
	}
	raw, err := os.ReadFile(filepath.Join(out, "result.json"))
	if err != nil {
		return err
	}
	var res resultFile
	if err := json.Unmarshal(raw, &res); err != nil {
		return err
	}
	if res.Workers != r.Workers || res.Mode != r.Mode {
		return fmt.Errorf("result.json says %d workers in mode %s, want %d in %s", res.Workers, res.Mode, r.Workers, r.Mode)
	}
	r.TestAccuracy, r.TargetReached = res.TestAccuracy, res.TargetReached
	if res.TimeToTargetS != nil {
		r.TimeToTargetS = *res.TimeToTargetS
	}
	r.ExamplesPerS, r.BytesSent, r.BytesEstimated, r.Rounds = res.ExamplesPerS, res.BytesSent, res.BytesEstimated, res.Rounds
	if len(res.Evals) > 0 {
		r.Evals = res.Evals
	}
	return nil
}

func firstN(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// machineCPU is each lender machine's CPU time so far.
func machineCPU(bed *testbed.Bed) []time.Duration {
	out := make([]time.Duration, len(bed.Lenders))
	for k, i := range bed.Lenders {
		out[k], _ = bed.Net.MachineCPU(i)
	}
	return out
}

// cpuSince is each machine's CPU use between two samples, in cores.
func cpuSince(now, then []time.Duration, wall time.Duration) []float64 {
	if wall <= 0 || len(now) != len(then) {
		return nil
	}
	out := make([]float64, len(now))
	any := false
	for k := range now {
		out[k] = math.Round(100*(now[k]-then[k]).Seconds()/wall.Seconds()) / 100
		any = any || now[k] > 0
	}
	if !any {
		return nil
	}
	return out
}

// measuredLinks is what the offers said of the paths between the machines
// (by worker index): either end's sample, the freshest first as offers
// list them.
func measuredLinks(offers []api.Offer, machines []string) []MeasuredLink {
	var out []MeasuredLink
	for a := range machines {
		for b := a + 1; b < len(machines); b++ {
			if l, ok := linkBetween(offers, machines[a], machines[b]); ok {
				out = append(out, MeasuredLink{A: a, B: b, RTTMicros: l.RTTMicros, MBps: float64(l.KBps) / 1000})
			}
		}
	}
	return out
}

func linkBetween(offers []api.Offer, a, b string) (p2p.LinkSample, bool) {
	for _, o := range offers {
		for _, l := range o.Links {
			if o.Machine == a && l.Machine == b || o.Machine == b && l.Machine == a {
				return l, true
			}
		}
	}
	return p2p.LinkSample{}, false
}
