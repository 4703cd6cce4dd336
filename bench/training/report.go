package main

import (
	"fmt"
	"strings"

	"github.com/deepmarket/deepmarket/node/jobs"
)

// modeLabel is how the table names a job's mode: one worker has nothing
// to synchronize (it runs mode sync, plain single-worker Keras).
func modeLabel(r Result) string {
	if r.Workers == 1 {
		return "single"
	}
	return r.Mode
}

// targetCell is the time to the target, or why there is none.
func targetCell(r Result, cfg Config) string {
	switch {
	case r.TargetReached && r.TimeToTargetS > 0:
		return fmt.Sprintf("%.1f", r.TimeToTargetS)
	case r.TimedOut:
		return fmt.Sprintf("not reached (cut at %.0f s)", cfg.JobTimeoutS)
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
	fmt.Fprintf(&b, "%s, %d CPUs, links shaped by %s; the whole run took %.0f s. Job: `%s` (examples/fashion-mnist) "+
		"submitted through the market, 1 core and 2 GiB per worker, with `[training] mode = \"sync\"` "+
		"(MultiWorkerMirroredStrategy, gradients all-reduced every step) or `mode = \"diloco\"`, "+
		"`sync_every = %d`, `compress = \"%s\"` (the deepmarket package averages over the job's tunnels). "+
		"%d lenders, a core each, on sites univ-a and univ-b in turn, so two workers span the sites. A job stops at the target "+
		"(evaluated every %d steps a worker), after %d steps a worker, or is cancelled %.0f s after it was submitted.\n\n",
		rep.Date, rep.CPUs, rep.Shaper, rep.TookS, strings.Join(rep.Command, " "),
		cfg.SyncEvery, cfg.Compress, max(cfg.Lenders, 2), cfg.EvalEvery, cfg.MaxSteps, cfg.JobTimeoutS)
	fmt.Fprintf(&b, "| Profile | Workers | Mode | Time to %.2f (s) | vs 1 worker | Steps to target | Final test acc | "+
		"Examples/s | MB sent/worker | Completion (s) | Sites | State |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n", cfg.Target)
	for _, r := range rep.Results {
		speed := "-"
		if r.SpeedUp > 0 {
			speed = fmt.Sprintf("%.2fx", r.SpeedUp)
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
		state := r.State
		if r.TimedOut {
			state += " (time limit)"
		}
		if r.Reason != "" && r.State != string(jobs.Succeeded) || strings.HasPrefix(r.Reason, "result:") {
			state += ": " + strings.ReplaceAll(firstN(r.Reason, 100), "|", "/")
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %.1f | %s | %s |\n", r.Profile, r.Workers, modeLabel(r),
			targetCell(r, cfg), speed, steps, acc, exs, sent, r.CompletionS, strings.Join(r.Sites, ", "), state)
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
		"One worker runs once per profile, in mode sync: it has nothing to synchronize, so it is the baseline of both " +
		"modes (DiLoCo with one worker would still apply its outer optimizer, which nobody would run on one machine).\n" +
		"- **Steps to target** counts one worker's steps (batch 64 each): with two workers a step trains 128 examples.\n" +
		"- **Examples/s** is train.py's `examples_per_s` on worker 0: the examples all workers trained over the " +
		"training time (fit less the evaluations), so it includes waiting for the all-reduce or the round's end.\n" +
		"- **MB sent/worker**: in sync mode train.py's estimate (a ring all-reduce sends 2(W-1)/W of the float32 " +
		"gradients a step from each worker; marked est.); in diloco mode what worker 0 sent, counted by the averager: " +
		"with two workers it coordinates the rounds and sends one averaged update a round, the size of the other " +
		"worker's pseudo-gradient.\n" +
		"- A job that did not finish shows the last test accuracy its log has.\n\n")
	fmt.Fprintf(&b, "## One machine\n\n"+
		"Every node runs on this one machine and shares its %d CPUs: two validators, the lenders, the submitter and "+
		"the workers, each worker on the one core its lender lends (DM_CORES=1). Two workers therefore have at most "+
		"twice one worker's compute, less what the nodes take from the same cores (consensus, gossip, and the "+
		"tunnels that carry the workers' traffic through the userspace link shaper): the 2-worker speed-ups here "+
		"are bounded well below 2x, and on lan they show mostly that bound. On separate machines each worker would "+
		"have its machine's cores to itself and the nodes would not compete with training, so on lan both modes, "+
		"and DiLoCo on every profile, would approach what the second worker buys statistically (fewer steps to the "+
		"target), while sync on wifi and multi-dc would stay bound by the all-reduce every step over the link's "+
		"round trip and bandwidth, which separate machines do not change. That is an expectation, not a "+
		"measurement.\n\n", rep.CPUs)
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
