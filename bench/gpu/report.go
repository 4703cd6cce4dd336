package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

func write(dir string, rep *Report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, _ := json.MarshalIndent(rep, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "report.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "report.md"), []byte(markdown(*rep)), 0o644)
}

func markdown(rep Report) string {
	cfg := rep.Config
	var b strings.Builder
	device := rep.Device
	if device == "" {
		device = "no GPU found"
	}
	fmt.Fprintf(&b, "# GPU check: %s\n\n", device)
	if cfg.Rehearsal {
		b.WriteString("**A rehearsal (-rehearse): the framework need not see a GPU; the figures mean nothing.**\n\n")
	}
	fmt.Fprintf(&b, "%s on %s (%d CPUs); took %.0f s (limit %.0f s). Command: `%s`.\n\n", rep.Date, rep.Host, rep.CPUs,
		rep.TookS, cfg.TimeoutS, strings.Join(rep.Invocation, " "))
	fmt.Fprintf(&b, "Job: `%s` (%s, data %s), no target accuracy; the CPU run takes %d steps. "+
		"Every run gets %d cores (DM_CORES; by hand pinned with taskset), Python %s", strings.Join(rep.Command, " "),
		examples[cfg.Framework], cfg.Data, cfg.CPUSteps, cfg.Cores, rep.Python)
	if rep.Version != "" {
		fmt.Fprintf(&b, ", %s %s", map[string]string{"torch": "PyTorch", "tensorflow": "TensorFlow"}[cfg.Framework], rep.Version)
	}
	b.WriteString(".\n\n")

	if rep.OK {
		b.WriteString("**Result: measured.**")
	} else {
		fmt.Fprintf(&b, "**Result: FAILED.** %s", mdLine(rep.Error))
	}
	b.WriteString("\n\n## Prerequisites\n\n| Check | | Detail |\n|---|---|---|\n")
	for _, c := range rep.Checks {
		mark := "ok"
		if !c.OK {
			mark = "**missing**"
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", c.Name, mark, mdLine(c.Detail))
	}
	if len(rep.Runs) > 0 {
		b.WriteString("\n## Runs\n\n| Run | How | Steps | Examples/s | Fit (s) | First step (s) | Wall (s) | GPU memory max (MiB) | GPU util max (%) | Error |\n" +
			"|---|---|---|---|---|---|---|---|---|---|\n")
		for _, r := range rep.Runs {
			eps := "-"
			if r.Error == "" {
				eps = fmt.Sprintf("%.0f", r.ExamplesPerS)
			}
			fmt.Fprintf(&b, "| %s | %s | %d | %s | %.1f | %.1f | %.1f | %d | %d | %s |\n", r.Name, mdLine(r.How), r.Steps, eps,
				r.FitS, r.FirstStepS, r.WallS, r.GPUMemMiB, r.GPUUtil, mdLine(firstN(r.Error, 400)))
		}
	}
	b.WriteString("\n## Ratios\n\n")
	ratio := func(v float64) string {
		if v <= 0 {
			return "not measured"
		}
		return fmt.Sprintf("%.3fx", v)
	}
	verdict := ""
	if rep.GoalMet != nil {
		verdict = map[bool]string{true: " (goal met)", false: " (**below the goal**)"}[*rep.GoalMet]
	}
	fmt.Fprintf(&b, "- market / by hand (GPU): %s, goal at least %.2fx%s\n", ratio(rep.MarketVsByHand), rep.Goal, verdict)
	fmt.Fprintf(&b, "- GPU / CPU (by hand, %d cores): %s\n", cfg.Cores, ratio(rep.GPUVsCPU))
	return b.String()
}

// mdLine fits text in a table cell.
func mdLine(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(strings.TrimSpace(s), "|", "\\|"), "\n", " ⏎ ")
}
