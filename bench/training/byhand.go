package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/deepmarket/deepmarket/testnet"
)

// planned is one worker of deepmarket.bench_local's --print-plan: what a
// node would run, with the environment it would give it.
type planned struct {
	Rank int               `json:"rank"`
	Argv []string          `json:"argv"`
	Env  map[string]string `json:"env"`
	Cwd  string            `json:"cwd"`
	Out  string            `json:"out"`
}

// runByHand runs the job's workers by hand, each on a machine of the
// bench's size with no node in it (unpinned, held by the machine's quota
// as the testnet's nodes run them), for -by-hand-steps steps without evaluations,
// and reads their examples/s: what the market's own figure is set against.
func (b *bench) runByHand(ctx context.Context) []ByHand {
	var out []ByHand
	for _, c := range []struct {
		mode    string
		workers int
	}{{"sync", 1}, {"sync", 2}, {"diloco", 2}} {
		r := ByHand{Workers: c.workers, Mode: c.mode}
		eps, err := b.byHand(ctx, c.mode, c.workers)
		if err != nil {
			r.Error = err.Error()
			log.Printf("== by hand, %d worker(s), %s: %v", c.workers, c.mode, err)
		} else {
			r.ExamplesPerS = eps
			log.Printf("== by hand, %d worker(s), %s: %.0f examples/s", c.workers, c.mode, eps)
		}
		out = append(out, r)
		if ctx.Err() != nil {
			break
		}
	}
	return out
}

func (b *bench) byHand(ctx context.Context, mode string, workers int) (float64, error) {
	args := []string{"-m", "deepmarket.bench_local", "--workers", strconv.Itoa(workers), "--modes", mode, "--print-plan",
		"--", "--model", b.cfg.Model, "--epochs", "1", "--steps-per-epoch", strconv.Itoa(b.cfg.ByHandSteps)}
	if mode == "diloco" {
		args = append(args, "--sync-every", strconv.Itoa(b.cfg.SyncEvery), "--compress", b.cfg.Compress)
		args = append(args, b.cfg.DiLoCoArgs...)
	}
	plan := exec.CommandContext(ctx, b.python, args...)
	plan.Dir = filepath.Join(filepath.Dir(filepath.Dir(b.bundle)), "python")
	raw, err := plan.Output()
	if err != nil {
		return 0, fmt.Errorf("bench_local --print-plan: %w", err)
	}
	var runs []struct {
		Specs []planned `json:"specs"`
	}
	if err := json.Unmarshal(raw, &runs); err != nil || len(runs) != 1 || len(runs[0].Specs) != workers {
		return 0, fmt.Errorf("bench_local --print-plan: unexpected plan (%v)", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	var cmds []*exec.Cmd
	defer func() {
		for _, c := range cmds {
			if c.Process != nil {
				c.Process.Kill()
				c.Wait()
			}
		}
	}()
	for k, s := range runs[0].Specs {
		m, err := testnet.NewByHand(*b.cfg.Machine, "dmbh", fmt.Sprintf("hand%d", k))
		if err != nil {
			return 0, err
		}
		defer m.Close()
		// Unpinned, as the testnet's machines run their workers.
		cmd := m.Command(s.Argv[0], s.Argv[1:]...)
		for key, v := range s.Env {
			cmd.Env = append(cmd.Env, key+"="+v)
		}
		cmd.Dir = s.Cwd
		if err := os.MkdirAll(s.Out, 0o755); err != nil {
			return 0, err
		}
		logf, err := os.Create(filepath.Join(b.logs, fmt.Sprintf("by-hand-%s-%d-w%d.log", mode, workers, k)))
		if err != nil {
			return 0, err
		}
		defer logf.Close()
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		cmds = append(cmds, cmd)
	}
	done := make(chan error, len(cmds))
	for _, c := range cmds {
		go func() { done <- c.Wait() }()
	}
	for range cmds {
		select {
		case err := <-done:
			if err != nil {
				return 0, fmt.Errorf("a worker failed: %w (logs in %s)", err, b.logs)
			}
		case <-ctx.Done():
			return 0, fmt.Errorf("by hand: %w", ctx.Err())
		}
	}
	cmds = nil
	rawRes, err := os.ReadFile(filepath.Join(runs[0].Specs[0].Out, "result.json"))
	if err != nil {
		return 0, err
	}
	var res resultFile
	if err := json.Unmarshal(rawRes, &res); err != nil {
		return 0, err
	}
	return res.ExamplesPerS, nil
}
