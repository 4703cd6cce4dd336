package main

import (
	"fmt"
	"strings"

	"github.com/deepmarket/deepmarket/node/jobs"
)

// modeLabel is how the table names a job's mode: one worker has nothing
// to synchronize (it runs mode sync, plain single-worker Keras).
func modeLabel(r Result) string {
	if r.Workers == 1 && r.From != "" {
		return "single (" + r.From + "'s run)"
	}
	if r.Workers == 1 {
		return "single"
	}
	return r.Mode
}

// cutS is when a job that timed out was cancelled (reports from before
// -cut-factor have only the job timeout).
func cutS(r Result, cfg Config) float64 {
	if r.CutS > 0 {
		return r.CutS
	}
	return cfg.JobTimeoutS
}

// targetCell is the time to the target, or why there is none.
func targetCell(r Result, cfg Config) string {
	switch {
	case r.TargetReached && r.TimeToTargetS > 0:
		return fmt.Sprintf("%.1f", r.TimeToTargetS)
	case r.TimedOut:
		return fmt.Sprintf("not reached (cut at %.0f s)", cutS(r, cfg))
	case r.State == string(jobs.Succeeded):
		return fmt.Sprintf("not reached in %d steps", cfg.MaxSteps)
	}
	return "-"
}

func markdown(rep Report) string {
	cfg := rep.Config
	var b strings.Builder
	var counts []string
	for _, w := range cfg.Workers {
		counts = append(counts, fmt.Sprint(w))
	}
	fmt.Fprintf(&b, "# Training benchmark: time to %.2f test accuracy, %s workers, %s, %d network%s\n\n",
		cfg.Target, strings.Join(counts, ", "), strings.Join(cfg.Modes, " vs "), len(cfg.Profiles),
		map[bool]string{true: "s"}[len(cfg.Profiles) > 1])
	machine := fmt.Sprintf("%d lenders, a core each, sharing this host's %d CPUs", max(cfg.Lenders, 2), rep.CPUs)
	if cfg.Machine != nil {
		machine = fmt.Sprintf("**%d lenders, each an emulated machine of %s**: its node (ledger replica, gossip, tunnels) "+
			"and the workers it launches confined to a cgroup of their own with that CPU quota and memory limit "+
			"(testnet RunOptions.Machine), so the node's own overhead counts inside its machine. Each lends 1 core "+
			"(the market lends whole cores; the quota is what the machine really has)", max(cfg.Lenders, 2), cfg.Machine)
	}
	fmt.Fprintf(&b, "%s, %d CPUs, links shaped by %s; the whole run took %.0f s. Job: `%s` (examples/fashion-mnist) "+
		"submitted through the market, with `[training] mode = \"sync\"` "+
		"(MultiWorkerMirroredStrategy, gradients all-reduced every step, the learning rate scaled by the square root "+
		"of the worker count after a 200-step warm-up; one worker trains alone with plain Keras) or `mode = \"diloco\"`, "+
		"`sync_every = %d`, `compress = \"%s\"`%s (the deepmarket package averages over the job's tunnels). "+
		"%s, on sites univ-a and univ-b in turn, so two workers span the sites. A job stops at the target "+
		"(evaluated every %d steps a worker), after %d steps a worker, or is cancelled %.0f s after it was submitted%s.\n\n",
		rep.Date, rep.CPUs, rep.Shaper, rep.TookS, strings.Join(rep.Command, " "),
		cfg.SyncEvery, cfg.Compress, dilocoArgsNote(cfg), machine, cfg.EvalEvery, cfg.MaxSteps, cfg.JobTimeoutS, cutNote(cfg))
	fmt.Fprintf(&b, "| Profile | Workers | Mode | Time to %.2f (s) | vs 1 worker | Evaluations excluded (s) | vs 1 | Steps to target | Final test acc | "+
		"Examples/s | MB sent/worker | Machine CPU (cores) | Completion (s) | Sites | State |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n", cfg.Target)
	for _, r := range rep.Results {
		speed := "-"
		if r.SpeedUp > 0 {
			speed = fmt.Sprintf("%.2fx", r.SpeedUp)
		}
		noEval, speedNoEval := "-", "-"
		if r.TargetReached && r.TimeToTargetS > 0 {
			noEval = fmt.Sprintf("%.1f", r.TimeToTargetS-r.EvalToTargetS)
			if one := baseline(rep.Results, r.Profile); one != nil {
				speedNoEval = fmt.Sprintf("%.2fx", (one.TimeToTargetS-one.EvalToTargetS)/(r.TimeToTargetS-r.EvalToTargetS))
			}
		}
		steps := "-"
		if r.StepsToTarget > 0 {
			steps = fmt.Sprint(r.StepsToTarget)
		}
		acc := "-"
		if r.TestAccuracy > 0 {
			acc = fmt.Sprintf("%.4f", r.TestAccuracy)
			if r.State != string(jobs.Succeeded) {
				acc += fmt.Sprintf(" (last eval, %d steps)", r.Steps)
			}
		}
		exs, sent := "-", "-"
		if r.ExamplesPerS > 0 {
			exs = fmt.Sprintf("%.0f", r.ExamplesPerS)
		}
		if r.State == string(jobs.Succeeded) {
			sent = fmt.Sprintf("%.2f", float64(r.BytesSent)/1e6)
			if r.BytesEstimated && r.BytesSent > 0 {
				sent += " (est.)"
			}
		}
		cpu := "-"
		if len(r.MachineCPU) > 0 {
			var parts []string
			for _, c := range r.MachineCPU {
				parts = append(parts, fmt.Sprintf("%.2f", c))
			}
			cpu = strings.Join(parts, " / ")
		}
		state := r.State
		if r.TimedOut {
			state += " (time limit)"
		}
		if r.Reason != "" && r.State != string(jobs.Succeeded) || strings.HasPrefix(r.Reason, "result:") {
			state += ": " + strings.ReplaceAll(firstN(r.Reason, 100), "|", "/")
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %.1f | %s | %s |\n", r.Profile, r.Workers, modeLabel(r),
			targetCell(r, cfg), speed, noEval, speedNoEval, steps, acc, exs, sent, cpu, r.CompletionS, strings.Join(r.Sites, ", "), state)
	}
	b.WriteString("\n![time to target](report.png)\n\n")
	if notes := compare(rep.Results); len(notes) > 0 {
		b.WriteString("DiLoCo next to sync, same profile and worker count:\n\n")
		for _, n := range notes {
			b.WriteString("- " + n + "\n")
		}
		b.WriteString("\n")
	}
	b.WriteString(predictionTable(rep))
	b.WriteString("## Reading the numbers\n\n" +
		"- **Time to target** is train.py's `time_to_target_s`: from worker 0's process start (TensorFlow import, " +
		"data load, training and the evaluations on the way) to the evaluation that reached the target. In diloco mode " +
		"the evaluation waits for the end of an averaging round and worker 0 evaluates alone while the other worker " +
		"trains on. **Completion** is the market's view, submitted to done: quotes, escrow, the inputs crossing the " +
		"profile's links, launch, the run, storing the output.\n" +
		"- **vs 1 worker** is the 1-worker time to the target over this job's, on the same profile (above 1: sooner). " +
		"One worker runs in mode sync (on the first profile only when the row says so: it sends nothing while it trains, and its time starts at its process start): it has nothing to synchronize (train.py trains it with plain " +
		"Keras), so it is the baseline of both modes (DiLoCo with one worker would still apply its outer optimizer, " +
		"which nobody would run on one machine). **Evaluations excluded** takes worker 0's evaluations up to the " +
		"target out of its time to target, and its **vs 1** compares those.\n" +
		"- **Steps to target** counts one worker's steps (batch 64 each): with two workers a step trains 128 examples.\n" +
		"- **Examples/s** is train.py's `examples_per_s` on worker 0: the examples all workers trained over the " +
		"training time (fit less the evaluations), so it includes waiting for the all-reduce or the round's end. In " +
		"diloco mode it runs high: the other workers keep training while worker 0 evaluates, and those steps count " +
		"over worker 0's training time.\n" +
		"- **MB sent/worker**: in sync mode train.py's estimate (a ring all-reduce sends 2(W-1)/W of the float32 " +
		"gradients a step from each worker; marked est.); in diloco mode what worker 0 sent, counted by the averager: " +
		"with two workers it coordinates the rounds and sends one averaged update a round, the size of the other " +
		"worker's pseudo-gradient.\n" +
		"- A job that did not finish shows the last test accuracy its log has.\n\n")
	b.WriteString(byHandTable(rep))
	b.WriteString(goals(rep))
	if cfg.Machine != nil {
		fmt.Fprintf(&b, "## Machines of known size\n\n"+
			"This host has %d CPUs. Each lender is a machine of %s: a cgroup holding its node and every worker it "+
			"launches (the workers' own cgroups nest inside it), with a CPU quota and a memory limit. Its workers "+
			"are not pinned to CPUs (`[executor] share_cpus`): the machines share the host's CPUs, each held to its size "+
			"by its quota. The two validators and the benchmark itself run outside "+
			"the machines, on what the quotas leave. **Machine CPU** is each lender machine's CPU use over the job "+
			"(node and workers), in cores: a busy machine shows its quota; what the node takes from it is what a "+
			"worker on that machine does not get.\n\n", rep.CPUs, cfg.Machine)
	} else {
		fmt.Fprintf(&b, "## One machine\n\nEvery node and worker shares this host's %d CPUs (no machine sizes): "+
			"speed-ups are bounded by the cores, not by the market.\n\n", rep.CPUs)
	}
	b.WriteString("## Profiles\n\n")
	for _, p := range rep.Profiles {
		fmt.Fprintf(&b, "- **%s**: %s\n", p.Name, p.Doc)
	}
	b.WriteString("\nSee docs/network-profiles.md for the numbers and their sources; univ-a and univ-b are " +
		"the first two sites (on multi-dc: us-east-1 and eu-west-1, 80 ms apart).\n")
	return b.String()
}

// compare sets diloco beside sync for each profile and worker count that
// has both.
func compare(rs []Result) []string {
	var out []string
	for _, d := range rs {
		if d.Mode != "diloco" || d.Workers < 2 {
			continue
		}
		for _, s := range rs {
			if s.Mode != "sync" || s.Workers != d.Workers || s.Profile != d.Profile {
				continue
			}
			var parts []string
			switch {
			case d.TargetReached && s.TargetReached && d.TimeToTargetS > 0 && s.TimeToTargetS > 0:
				parts = append(parts, fmt.Sprintf("reaches the target %.2fx %s", max(s.TimeToTargetS/d.TimeToTargetS, d.TimeToTargetS/s.TimeToTargetS),
					map[bool]string{true: "sooner", false: "later"}[d.TimeToTargetS <= s.TimeToTargetS]))
			case d.TargetReached && !s.TargetReached:
				parts = append(parts, "reaches the target, sync does not")
			case !d.TargetReached && s.TargetReached:
				parts = append(parts, "does not reach the target, sync does")
			}
			if d.TestAccuracy > 0 && s.TestAccuracy > 0 {
				parts = append(parts, fmt.Sprintf("final accuracy %+.2f points", 100*(d.TestAccuracy-s.TestAccuracy)))
			}
			if d.BytesSent > 0 && s.BytesSent > 0 {
				parts = append(parts, fmt.Sprintf("%.3fx the bytes sent per worker (sync's estimated)", float64(d.BytesSent)/float64(s.BytesSent)))
			}
			if len(parts) > 0 {
				out = append(out, fmt.Sprintf("%s, %d workers: DiLoCo %s", d.Profile, d.Workers, strings.Join(parts, ", ")))
			}
		}
	}
	return out
}

// baseline is the 1-worker job of a profile that reached the target.
func baseline(rs []Result, profile string) *Result {
	for i, r := range rs {
		if r.Profile == profile && r.Workers == 1 && r.TargetReached && r.TimeToTargetS > 0 {
			return &rs[i]
		}
	}
	return nil
}

// byHandTable sets the by-hand examples/s beside the market's.
func byHandTable(rep Report) string {
	if len(rep.ByHand) == 0 || len(rep.Config.Profiles) == 0 {
		return ""
	}
	var b strings.Builder
	prof := rep.Config.Profiles[0]
	fmt.Fprintf(&b, "## Through the market against by hand\n\n"+
		"The same train.py, started by hand on machines of the same size with no node in them (worker processes "+
		"unpinned like the market's, talking over loopback), for %d steps a worker without evaluations, next to "+
		"the market's run on %s. Examples/s is train.py's (examples over the training time, evaluations excluded).\n\n"+
		"| Workers | Mode | By hand (examples/s) | Through the market (examples/s) | Market / by hand |\n|---|---|---|---|---|\n",
		rep.Config.ByHandSteps, prof)
	for _, h := range rep.ByHand {
		market, ratio := "-", "-"
		for _, r := range rep.Results {
			if r.Profile == prof && r.Workers == h.Workers && (r.Mode == h.Mode || r.Workers == 1) && r.ExamplesPerS > 0 {
				market = fmt.Sprintf("%.0f", r.ExamplesPerS)
				if h.ExamplesPerS > 0 {
					ratio = fmt.Sprintf("%.2fx", r.ExamplesPerS/h.ExamplesPerS)
				}
			}
		}
		hand := fmt.Sprintf("%.0f", h.ExamplesPerS)
		if h.Error != "" {
			hand = "failed: " + strings.ReplaceAll(firstN(h.Error, 80), "|", "/")
		}
		fmt.Fprintf(&b, "| %d | %s | %s | %s | %s |\n", h.Workers, modeLabel(Result{Workers: h.Workers, Mode: h.Mode}), hand, market, ratio)
	}
	b.WriteString("\n")
	return b.String()
}

// goals checks the run against the goals, each with its figure.
func goals(rep Report) string {
	var b strings.Builder
	find := func(profile string, workers int, mode string) *Result {
		for i, r := range rep.Results {
			if r.Profile == profile && r.Workers == workers && (r.Mode == mode || workers == 1) {
				return &rep.Results[i]
			}
		}
		return nil
	}
	line := func(goal string, want float64, r *Result) {
		switch {
		case r == nil:
			fmt.Fprintf(&b, "- %s: not run\n", goal)
		case r.SpeedUp == 0:
			fmt.Fprintf(&b, "- %s: **missed**, the target was not reached (%s)\n", goal, r.State)
		default:
			verdict := "**met**"
			if r.SpeedUp < want {
				verdict = "**missed**"
			}
			fmt.Fprintf(&b, "- %s: %s, %.2fx\n", goal, verdict, r.SpeedUp)
		}
	}
	b.WriteString("## Goals\n\n")
	for _, mode := range []string{"sync", "diloco"} {
		line("lan, 2 machines ("+mode+") at least 1.7x sooner than 1", 1.7, find("lan", 2, mode))
		line("lan, 3 machines ("+mode+") at least 2.4x", 2.4, find("lan", 3, mode))
	}
	line("multi-dc, DiLoCo, 2 machines at least 1.5x", 1.5, find("multi-dc", 2, "diloco"))
	worst, n := 0.0, 0
	for _, r := range rep.Results {
		if p := r.Predicted; p != nil && r.TargetReached && r.TimeToTargetS > 0 && r.Workers > 1 {
			worst, n = max(worst, abs(p.TimeToTargetS-r.TimeToTargetS)/r.TimeToTargetS), n+1
		}
	}
	if n > 0 {
		verdict := "**met**"
		if worst > 0.25 {
			verdict = "**missed**"
		}
		fmt.Fprintf(&b, "- every prediction within 25%% of the measurement: %s, the worst of %d is %.0f%% off\n", verdict, n, 100*worst)
	}
	for _, h := range rep.ByHand {
		for _, r := range rep.Results {
			if len(rep.Config.Profiles) > 0 && r.Profile == rep.Config.Profiles[0] && r.Workers == h.Workers &&
				(r.Mode == h.Mode || r.Workers == 1) && r.ExamplesPerS > 0 && h.ExamplesPerS > 0 {
				ratio := r.ExamplesPerS / h.ExamplesPerS
				verdict := "**met**"
				if ratio < 0.95 {
					verdict = "**missed**"
				}
				fmt.Fprintf(&b, "- examples/s through the market at least 0.95x of by hand (%d %s): %s, %.2fx\n",
					h.Workers, modeLabel(r), verdict, ratio)
			}
		}
	}
	b.WriteString("- a GPU job through the market at least 0.95x of by hand: not run here (no GPU lent to this session; see `make bench-gpu`)\n\n")
	return b.String()
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// cutNote says when a job of several workers is cut short.
func cutNote(cfg Config) string {
	if cfg.CutFactor == 0 {
		return ""
	}
	return fmt.Sprintf(", or, with 2 or more workers, once it has run %g times the 1-worker job's completion on "+
		"the same profile (by then it is slower than one worker)", cfg.CutFactor)
}

// dilocoArgsNote names the flags diloco jobs add to the command.
func dilocoArgsNote(cfg Config) string {
	if len(cfg.DiLoCoArgs) == 0 {
		return ""
	}
	return " and `" + strings.Join(cfg.DiLoCoArgs, " ") + "` added to its command"
}
