// Command start is `make bench-start`: how long a job takes from its
// submission to all its workers running, on a testnet of real node
// processes, each in a network namespace of its own linked as the lan
// profile says (0.2 ms, 1 Gbit/s): one validator, -lenders machines that
// lend, and a node that submits. It submits -jobs jobs of -workers
// workers one after another (each a generic Python program that sleeps
// -sleep, waited for before the next) and reports, over them, the p50,
// p99 and max of
//
//   - to_launch: the submission (this command's clock, just before the
//     call) to the submitter's launch of the run (the job's run.started,
//     once its quote window closed, its machines held and its escrow
//     committed);
//   - to_all_running: the submission to the last worker's start as its
//     machine reports it (ms);
//
// and, as the part of it the ledger sets, the time a transfer takes to
// commit on the same network (-transfers of them, sent one after another
// through the submitting node), the wait an escrow also has.
//
// Every node runs on this one machine (2 cores here): the figures are
// upper bounds for machines of their own. The goal (issue 39): p50 at
// most 1 s, p99 at most 2 s.
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
	"runtime"
	"slices"
	"syscall"
	"time"

	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/testnet"
)

type config struct {
	bin, profile, python string
	lenders, jobs        int
	workers, transfers   int
	sleep                time.Duration
	basePort             int
}

// figures are one measure's quantiles, in seconds.
type figures struct {
	P50 float64 `json:"p50_s"`
	P99 float64 `json:"p99_s"`
	Max float64 `json:"max_s"`
	N   int     `json:"n"`
}

type report struct {
	What         string    `json:"what"`
	Date         string    `json:"date"`
	CPUs         int       `json:"cpus"`
	Profile      string    `json:"profile"`
	Lenders      int       `json:"lenders"`
	Workers      int       `json:"workers_per_job"`
	ToLaunch     figures   `json:"to_launch"`
	ToAllRunning figures   `json:"to_all_running"`
	TxCommit     figures   `json:"transfer_commit"`
	Failed       int       `json:"jobs_failed"`
	Runs         []jobTime `json:"jobs"`
	Goal         string    `json:"goal"`
	GoalMet      bool      `json:"goal_met"`
}

type jobTime struct {
	ID           string  `json:"id"`
	ToLaunch     float64 `json:"to_launch_s"`
	ToAllRunning float64 `json:"to_all_running_s"`
	State        string  `json:"state"`
}

func main() {
	var c config
	flag.StringVar(&c.bin, "bin", "bin/deepmarket", "the deepmarket binary the nodes run")
	flag.StringVar(&c.profile, "profile", "lan", "network profile (each node in a namespace of its own)")
	flag.StringVar(&c.python, "python", "/usr/bin/python3", "the lenders' Python (the jobs are generic: any python3)")
	flag.IntVar(&c.lenders, "lenders", 3, "machines that lend 1 core each")
	flag.IntVar(&c.jobs, "jobs", 40, "jobs submitted, one after another")
	flag.IntVar(&c.workers, "workers", 2, "workers of each job")
	flag.IntVar(&c.transfers, "transfers", 30, "transfers timed to commit")
	flag.DurationVar(&c.sleep, "sleep", time.Second, "how long each job's program runs")
	flag.IntVar(&c.basePort, "base-port", 32000, "first port of the testnet (4 per node)")
	out := flag.String("out", "bench/results/start.json", "where to write JSON results")
	flag.Parse()
	log.SetFlags(log.Ltime)
	switch {
	case os.Geteuid() != 0:
		log.Fatal("bench-start needs root: every node runs in a network namespace of its own")
	case c.jobs < 1 || c.workers < 1 || c.workers > c.lenders:
		log.Fatal("-jobs at least 1, -workers from 1 to -lenders")
	}
	bin, err := filepath.Abs(c.bin)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := os.Stat(bin); err != nil {
		log.Fatalf("%v: build it first (make build)", err)
	}
	c.bin = bin
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := run(ctx, c)
	if err != nil {
		log.Fatal(err)
	}
	b, _ := json.MarshalIndent(rep, "", "  ")
	if err := os.WriteFile(*out, append(b, '\n'), 0o644); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("\nsubmit to launch:          p50 %.3f s, p99 %.3f s, max %.3f s (%d jobs)\n", rep.ToLaunch.P50, rep.ToLaunch.P99, rep.ToLaunch.Max, rep.ToLaunch.N)
	fmt.Printf("submit to all running:     p50 %.3f s, p99 %.3f s, max %.3f s\n", rep.ToAllRunning.P50, rep.ToAllRunning.P99, rep.ToAllRunning.Max)
	fmt.Printf("a transfer to its commit:  p50 %.3f s, p99 %.3f s, max %.3f s (%d)\n", rep.TxCommit.P50, rep.TxCommit.P99, rep.TxCommit.Max, rep.TxCommit.N)
	fmt.Printf("goal (%s): %v; %d jobs failed\nwrote %s\n", rep.Goal, map[bool]string{true: "met", false: "NOT met"}[rep.GoalMet], rep.Failed, *out)
}

func run(ctx context.Context, c config) (*report, error) {
	dir, err := os.MkdirTemp("", "dm-start-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	tn := filepath.Join(dir, "tn")
	m, err := testnet.Init(testnet.Params{Validators: 1, Nodes: c.lenders + 1, Out: tn, BasePort: c.basePort, Python: c.python})
	if err != nil {
		return nil, err
	}
	log.Printf("== a %s testnet: 1 validator, %d lenders, a submitter", c.profile, c.lenders)
	net, err := testnet.Start(ctx, tn, testnet.RunOptions{Binary: c.bin, Profile: c.profile, StartTimeout: 2 * time.Minute})
	if err != nil {
		return nil, err
	}
	defer net.Close()
	sub := len(m.Nodes) - 1
	sc, err := net.Client(sub)
	if err != nil {
		return nil, err
	}
	for i := 1; i <= c.lenders; i++ {
		lc, err := net.Client(i)
		if err != nil {
			return nil, err
		}
		if _, err := lc.SetLend(ctx, api.LendRequest{Cores: 1, MemBytes: 1 << 30}); err != nil {
			return nil, fmt.Errorf("lend on %s: %w", m.Nodes[i].Name, err)
		}
	}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(500 * time.Millisecond) {
		offers, err := sc.Offers(ctx)
		if err == nil && len(offers) >= c.lenders {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("the submitter holds %d offers of %d after 2 minutes", len(offers), c.lenders)
		}
	}
	rep := &report{What: fmt.Sprintf("submission to all workers running on a %s testnet of real node processes, each in a network namespace "+
		"of its own, all on one %d-core machine: 1 validator, %d lenders (1 core each), a submitter; %d jobs of %d workers one after another",
		c.profile, runtime.NumCPU(), c.lenders, c.jobs, c.workers),
		Date: time.Now().UTC().Format(time.RFC3339), CPUs: runtime.NumCPU(), Profile: c.profile, Lenders: c.lenders, Workers: c.workers,
		Goal: "p50 at most 1 s, p99 at most 2 s"}

	// The ledger's part: a transfer's commit, timed through the submitter.
	to := m.Nodes[1].Account
	var commits []float64
	for i := 0; i < c.transfers && ctx.Err() == nil; i++ {
		t0 := time.Now()
		if _, err := sc.Send(ctx, api.SendRequest{Kind: ledger.TypeTransfer, To: to, Amount: 1}); err != nil {
			return nil, fmt.Errorf("transfer: %w", err)
		}
		commits = append(commits, time.Since(t0).Seconds())
		time.Sleep(time.Duration(i%7) * 150 * time.Millisecond) // not in step with the blocks
	}
	rep.TxCommit = quantiles(commits)
	log.Printf("   a transfer commits in %.3f s (p50)", rep.TxCommit.P50)

	bundle := filepath.Join(dir, "bundle")
	code := fmt.Sprintf("import time\ntime.sleep(%g)\n", c.sleep.Seconds())
	if err := os.MkdirAll(bundle, 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(bundle, "sleep.py"), []byte(code), 0o644); err != nil {
		return nil, err
	}
	var launch, running []float64
	for k := 0; k < c.jobs && ctx.Err() == nil; k++ {
		spec := jobs.File{Name: fmt.Sprintf("start-%d", k), Framework: "generic", Command: []string{"python3", "sleep.py"}, Bundle: bundle,
			Workers: c.workers, Cores: 1, Memory: "256MiB", MaxPrice: "5", MaxDuration: "5m"}
		t0 := time.Now()
		j, err := sc.Submit(ctx, api.SubmitRequest{Spec: spec, Yes: true})
		if err != nil {
			return nil, fmt.Errorf("submit: %w", err)
		}
		for !j.State.Terminal() && ctx.Err() == nil {
			time.Sleep(200 * time.Millisecond)
			if cur, err := sc.Job(ctx, j.ID); err == nil {
				j = cur
			}
		}
		jt := jobTime{ID: j.ID, State: string(j.State)}
		if r := j.Current(); j.State == jobs.Succeeded && r != nil && !r.Started.IsZero() {
			jt.ToLaunch = r.Started.Sub(t0).Seconds()
			var last time.Time
			for _, w := range r.Workers {
				if w.Started.After(last) {
					last = w.Started
				}
			}
			jt.ToAllRunning = last.Sub(t0).Seconds()
			launch, running = append(launch, jt.ToLaunch), append(running, jt.ToAllRunning)
		} else {
			rep.Failed++
			log.Printf("   job %d: %s (%s)", k, j.State, j.Reason)
		}
		rep.Runs = append(rep.Runs, jt)
		if (k+1)%10 == 0 {
			log.Printf("   %d jobs: submit to all running p50 %.3f s", k+1, quantiles(running).P50)
		}
	}
	rep.ToLaunch, rep.ToAllRunning = quantiles(launch), quantiles(running)
	rep.GoalMet = rep.Failed == 0 && rep.ToAllRunning.P50 <= 1 && rep.ToAllRunning.P99 <= 2
	return rep, ctx.Err()
}

// quantiles are v's p50, p99 (nearest rank) and max.
func quantiles(v []float64) figures {
	if len(v) == 0 {
		return figures{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	at := func(q float64) float64 { return s[max(0, int(math.Ceil(q*float64(len(s))))-1)] }
	return figures{P50: at(0.5), P99: at(0.99), Max: s[len(s)-1], N: len(s)}
}
