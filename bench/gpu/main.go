// Command gpu is `make bench-gpu`: a short check (5 minutes at most) that
// a lender's GPU serves a training job through the market as fast as the
// same job started by hand on it. The Fashion-MNIST example
// (examples/fashion-mnist/train.py --model cnn-wide, a fixed number of
// steps, no target accuracy) runs three ways, one after another, and a
// fourth job checks a GPU job in an image:
//
//   - gpu: by hand on the GPU, a plain process (CUDA_VISIBLE_DEVICES=0);
//   - cpu: by hand on a CPU worker (CUDA_VISIBLE_DEVICES="", fewer steps),
//     the baseline the GPU is set against;
//   - market: through the market as a 1-GPU job (gpus = 1 in the job
//     spec): a testnet on loopback (one validator, a lender lending the
//     GPU and -cores cores, a node that submits), the job's output fetched
//     from storage when it succeeds;
//   - market-image (-image, on by default): a 1-GPU job in an image that
//     holds no driver and no framework, only a CUDA probe compiled with
//     the host's cc and its C libraries: it passes when the worker, in
//     the image's root, reaches the GPU through the driver the lender
//     binds in.
//
// Each run's examples/s is train.py's own (result.json: examples trained
// over the seconds fit() took). All three get the same cores: pinned to
// -cores CPUs with taskset and DM_CORES set, as the market pins and sets a
// worker's. The report gives the device (nvidia-smi), each run's
// examples/s and the most GPU memory and utilization nvidia-smi showed
// during it, and the ratios market/by hand (goal: at least 0.95x) and
// GPU/CPU; as report.md and report.json in -out, job and worker logs in
// -logs.
//
// Prerequisites, checked first (all of them, each reported): root (the
// job sandbox), nvidia-smi listing a GPU, -python (the job environment)
// whose TensorFlow sees a GPU, the data set, the binary. When one is
// missing the command writes a report saying which and exits 1; it also
// exits 1 when a run fails or -timeout cuts it short (having written what
// was measured). A ratio below its goal is reported, not an error.
//
// -framework torch runs the PyTorch example instead
// (examples/torch-fashion-mnist/train.py --model cnn-wide, the same model
// and steps), for a machine whose GPU Python has PyTorch and no
// TensorFlow. Its market job is a generic one run by the lender's own
// Python (-python): framework torch runs in the job's own image, and a
// CUDA PyTorch image is gigabytes this check has no time to move.
//
// -rehearse runs it all on a machine without a GPU, to test this command:
// with a stub nvidia-smi on PATH (the lender lends the GPU it lists; see
// node/gpu_e2e_test.go) and small -steps, TensorFlow's want of a GPU only
// warns; the figures then mean nothing.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Config is what the run was asked for (the flags).
type Config struct {
	Framework string  `json:"framework"` // tensorflow or torch: which example
	Model     string  `json:"model"`
	Steps     int     `json:"steps"`     // the GPU runs' (by hand and market)
	CPUSteps  int     `json:"cpu_steps"` // the CPU run's
	BatchSize int     `json:"batch_size"`
	Cores     int     `json:"cores"` // every run's (DM_CORES, taskset)
	JobMemGiB int     `json:"job_mem_gib"`
	Data      string  `json:"data"`
	TimeoutS  float64 `json:"timeout_s"`
	// Rehearsal: -rehearse, TensorFlow need not see a GPU.
	Rehearsal bool `json:"rehearsal,omitempty"`
}

// Run is one of the three runs.
type Run struct {
	Name    string   `json:"name"` // gpu, cpu or market
	How     string   `json:"how"`
	Steps   int      `json:"steps"`
	CPUs    []int    `json:"cpus,omitempty"` // pinned to (by hand)
	Command []string `json:"command"`
	// ExamplesPerS is train.py's examples_per_s (result.json).
	ExamplesPerS float64 `json:"examples_per_s"`
	FitS         float64 `json:"fit_s,omitempty"`
	FirstStepS   float64 `json:"first_step_s,omitempty"`      // from the process start
	Version      string  `json:"framework_version,omitempty"` // train.py's TensorFlow or PyTorch
	// WallS: the process (by hand), or the job from submitted to done.
	WallS float64 `json:"wall_s"`
	// RunS: the market job from launched to done.
	RunS float64 `json:"run_s,omitempty"`
	// GPUMemMiB and GPUUtil are the most GPU memory in use (MiB) and
	// utilization (%) nvidia-smi showed while it ran, sampled every second.
	GPUMemMiB int    `json:"gpu_mem_max_mib"`
	GPUUtil   int    `json:"gpu_util_max_pct"`
	State     string `json:"state,omitempty"` // the market job's
	Error     string `json:"error,omitempty"`
	Log       string `json:"log,omitempty"`
}

// Report is the JSON output.
type Report struct {
	Date      string   `json:"date"`
	Host      string   `json:"host"`
	CPUs      int      `json:"cpus"`
	Device    string   `json:"device"` // nvidia-smi's name of GPU 0
	GPUs      []string `json:"gpus,omitempty"`
	Framework string   `json:"framework"`
	Version   string   `json:"framework_version,omitempty"` // -python's TensorFlow or PyTorch
	Python    string   `json:"python"`
	// Invocation is this command's; Command is train.py's (the market
	// job's: by hand python3 is -python, DM_DATA_DIR and DM_OUTPUT_DIR
	// are set as the market sets them).
	Invocation []string `json:"invocation"`
	Command    []string `json:"command"`
	Config     Config   `json:"config"`
	Checks     []Check  `json:"checks"`
	Runs       []Run    `json:"runs,omitempty"`
	// MarketVsByHand is the market run's examples/s over the GPU run's by
	// hand; GPUVsCPU the GPU run's (by hand) over the CPU run's. 0: not
	// measured.
	MarketVsByHand float64 `json:"market_vs_by_hand"`
	Goal           float64 `json:"market_vs_by_hand_goal"`
	GoalMet        *bool   `json:"goal_met,omitempty"`
	GPUVsCPU       float64 `json:"gpu_vs_cpu"`
	// OK: every prerequisite held and every run measured.
	OK    bool    `json:"ok"`
	Error string  `json:"error,omitempty"`
	TookS float64 `json:"took_s"`
}

const goal = 0.95

func main() {
	bin := flag.String("bin", "bin/deepmarket", "deepmarket binary the nodes run")
	python := flag.String("python", "python3", "the job environment's Python: TensorFlow that sees the GPU, tf_keras (PyTorch with -framework torch)")
	framework := flag.String("framework", "tensorflow", "which example runs: tensorflow (examples/fashion-mnist) or torch (examples/torch-fashion-mnist)")
	out := flag.String("out", "bench/results/gpu", "directory for report.md and report.json")
	logs := flag.String("logs", "", "directory for the runs' logs (default: logs/ in -out)")
	timeout := flag.Duration("timeout", 5*time.Minute, "bound on the whole run; what was measured by then is reported")
	steps := flag.Int("steps", 4000, "steps of the GPU runs (by hand and through the market)")
	cpuSteps := flag.Int("cpu-steps", 150, "steps of the CPU run")
	batch := flag.Int("batch-size", 256, "train.py --batch-size")
	cores := flag.Int("cores", 4, "cores of every run: the job's (DM_CORES) and the lender's; by hand pinned to as many CPUs")
	jobMem := flag.Int("job-mem-gib", 8, "the job's memory (GiB); the lender lends 4 GiB more")
	data := flag.String("data", "/usr/share/datasets/fashion-mnist", "Fashion-MNIST (the job's dataset)")
	imageRun := flag.Bool("image", true, "also run a 1-GPU job in an image that holds no driver (a CUDA probe compiled with cc): the lender's driver bind, for real")
	rehearse := flag.Bool("rehearse", false, "test this command on a machine without a GPU: a framework that sees no GPU "+
		"only warns (the lender still needs nvidia-smi to list one: a stub on PATH will do); the figures mean nothing")
	flag.Parse()
	log.SetFlags(0)
	start := time.Now()
	switch {
	case *timeout < time.Minute:
		log.Fatal("-timeout: at least 1m")
	case *steps < 1 || *cpuSteps < 1 || *batch < 1:
		log.Fatal("-steps, -cpu-steps and -batch-size must be at least 1")
	case *cores < 1:
		log.Fatal("-cores: at least 1")
	case *jobMem < 1:
		log.Fatal("-job-mem-gib: at least 1")
	case examples[*framework] == "":
		log.Fatalf("-framework %q: want tensorflow or torch", *framework)
	}
	if *logs == "" {
		*logs = filepath.Join(*out, "logs")
	}
	cfg := Config{Framework: *framework, Model: "cnn-wide", Steps: *steps, CPUSteps: *cpuSteps, BatchSize: *batch, Cores: *cores,
		JobMemGiB: *jobMem, Data: *data, TimeoutS: timeout.Seconds(), Rehearsal: *rehearse}
	host, _ := os.Hostname()
	rep := Report{Date: time.Now().UTC().Format(time.RFC3339), Host: host, CPUs: runtime.NumCPU(), Python: *python, Framework: cfg.Framework,
		Invocation: invocation(), Command: trainCommand(cfg, cfg.Steps), Config: cfg, Goal: goal}
	// finish writes the report and exits: 1 when err is set.
	finish := func(err error) {
		if err != nil {
			rep.Error = err.Error()
		}
		rep.OK = err == nil
		rep.TookS = time.Since(start).Seconds()
		ratios(&rep)
		werr := write(*out, &rep)
		fmt.Print(markdown(rep))
		if werr != nil {
			log.Printf("write the report: %v", werr)
		} else {
			logsAt := ""
			if exists(*logs) {
				logsAt = "; logs in " + *logs
			}
			fmt.Printf("\nwrote %s/report.{md,json} in %s%s\n", *out, time.Since(start).Round(time.Second), logsAt)
		}
		if err != nil || werr != nil {
			if err != nil {
				log.Printf("bench-gpu: %v", err)
			}
			os.Exit(1)
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The runs end 30 s before -timeout: time to cancel a job, stop the
	// testnet and write the report.
	ctx, cancel := context.WithDeadline(ctx, start.Add(*timeout-30*time.Second))
	defer cancel()

	b := &bench{cfg: cfg, python: *python, logs: *logs}
	var err error
	if b.bin, err = filepath.Abs(*bin); err != nil {
		log.Fatal(err)
	}
	if b.bundle, err = filepath.Abs(examples[cfg.Framework]); err != nil {
		log.Fatal(err)
	}
	log.Printf("== prerequisites")
	pre := b.prerequisites(ctx)
	rep.Checks, rep.Device, rep.GPUs, rep.Version = pre.checks, pre.device, pre.gpus, pre.version
	for _, c := range rep.Checks {
		mark := "ok     "
		if !c.OK {
			mark = "MISSING"
		}
		log.Printf("   %s %-10s %s", mark, c.Name, c.Detail)
	}
	if missing := pre.missing(); len(missing) > 0 {
		finish(fmt.Errorf("prerequisites missing: %s", strings.Join(missing, "; ")))
	}
	if err := os.MkdirAll(*logs, 0o755); err != nil {
		finish(err)
	}
	b.cpus = pinCPUs(cfg.Cores)

	var failed []string
	runs := []func(context.Context) Run{b.byHandGPU, b.byHandCPU, b.market}
	if *imageRun {
		runs = append(runs, b.marketImage)
	}
	for _, r := range runs {
		if ctx.Err() != nil {
			break
		}
		run := r(ctx)
		log.Printf("   %s: %s", run.Name, summary(run))
		if run.Error != "" {
			failed = append(failed, run.Name+": "+run.Error)
		}
		rep.Runs = append(rep.Runs, run)
	}
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		failed = append(failed, fmt.Sprintf("cut short by -timeout %s", *timeout))
	case ctx.Err() != nil:
		failed = append(failed, "interrupted")
	}
	if len(failed) > 0 {
		finish(errors.New(strings.Join(failed, "; ")))
	}
	finish(nil)
}

// bench runs the three runs.
type bench struct {
	cfg                 Config
	bin, python, bundle string
	logs                string
	cpus                []int // every run is pinned to these
}

// examples are the folders of each framework's train.py.
var examples = map[string]string{"tensorflow": "examples/fashion-mnist", "torch": "examples/torch-fashion-mnist"}

// trainCommand is train.py's command line, the market job's: python3
// becomes the lender's Python, data and output come from DM_DATA_DIR and
// DM_OUTPUT_DIR.
func trainCommand(cfg Config, steps int) []string {
	batch := "--batch-size"
	if cfg.Framework == "torch" {
		batch = "--batch"
	}
	return []string{"python3", "train.py", "--model", cfg.Model, "--epochs", "1",
		"--steps-per-epoch", strconv.Itoa(steps), batch, strconv.Itoa(cfg.BatchSize)}
}

// invocation is this command's line; under `go run`, as typed.
func invocation() []string {
	if strings.Contains(os.Args[0], "go-build") {
		return append([]string{"go", "run", "./bench/gpu"}, os.Args[1:]...)
	}
	return os.Args
}

// pinCPUs is n of this machine's CPUs, the highest-numbered ones (the
// market also takes a worker's CPUs from the top of the lender's pool).
func pinCPUs(n int) []int {
	all := runtime.NumCPU()
	var out []int
	for c := all - n; c < all; c++ {
		out = append(out, c)
	}
	return out
}

// ratios fills the report's ratios from its runs.
func ratios(rep *Report) {
	eps := map[string]float64{}
	for _, r := range rep.Runs {
		if r.Error == "" {
			eps[r.Name] = r.ExamplesPerS
		}
	}
	rep.MarketVsByHand, rep.GPUVsCPU, rep.GoalMet = 0, 0, nil
	if eps["gpu"] > 0 && eps["market"] > 0 {
		rep.MarketVsByHand = eps["market"] / eps["gpu"]
		met := rep.MarketVsByHand >= rep.Goal
		rep.GoalMet = &met
	}
	if eps["gpu"] > 0 && eps["cpu"] > 0 {
		rep.GPUVsCPU = eps["gpu"] / eps["cpu"]
	}
}

func summary(r Run) string {
	if r.Error != "" {
		return "FAILED: " + firstN(r.Error, 300)
	}
	if r.Name == "market-image" {
		return fmt.Sprintf("the worker in the image reached the GPU (job %s in %.1f s)", r.State, r.WallS)
	}
	return fmt.Sprintf("%.0f examples/s (%d steps, fit %.1f s, first step %.1f s after start, wall %.1f s; "+
		"GPU max %d MiB, %d%%)", r.ExamplesPerS, r.Steps, r.FitS, r.FirstStepS, r.WallS, r.GPUMemMiB, r.GPUUtil)
}

func firstN(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// lastLines is the end of a log, for an error message.
func lastLines(text string, n int) string {
	lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
