package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/mattn/go-isatty"
	"github.com/spf13/cobra"

	"github.com/deepmarket/deepmarket/scheduler/sim"
)

func newSimCmd(c *cli) *cobra.Command {
	var scenario, loadsFlag, policiesFlag, trace, writeTrace, out string
	var seeds int
	var seed uint64
	var load float64
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Compare placement policies on the same job trace in a simulator",
		Long: `sim replays job traces over machine sets under each placement policy (the
marginal-cost scheduler, centralized and decentralized, by exhaustive search
and through the index a node uses at scale (marginal-cost-indexed: the same
placements), the round-robin, random, first-fit, least-requested,
balanced-resource and Kubernetes-default baselines, and in the shared model a
Mosix-like migrating balancer) and reports mean and p95 slowdown, completion
time, utilization, peak load, rejected jobs and credits earned per machine.

Shipped scenarios (every parameter is documented in package scheduler/sim):
  workstations  the authors' workstation-cluster model: CPU shared equally,
                over-committed memory thrashes (shares divided by 10)
  edge          sites on a random topology of average degree 3, 1-10 Mbit/s
                links, Poisson arrivals at 0.5 jobs/s, multi-worker jobs
                exchanging gradients every step

It needs no node. No node reads what it writes.`,
		Example: `  deepmarket sim --out sim-results                 # both scenarios, a table and plots
  deepmarket sim --scenario edge --loads 0.5 --seeds 3
  deepmarket sim --scenario edge --load 0.7 --seed 1 --write-trace edge.json
  deepmarket sim --trace edge.json --policies marginal-cost,kube-default`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if seeds < 1 || seeds > 1000 {
				return usageError{fmt.Errorf("--seeds %d: want 1 to 1000", seeds)}
			}
			var exps []sim.Experiment
			switch {
			case writeTrace != "":
				return writeScenario(c, scenario, load, seed, writeTrace)
			case trace != "":
				f, err := os.Open(trace)
				if err != nil {
					return err
				}
				s, err := sim.ReadScenario(f)
				f.Close()
				if err != nil {
					return fmt.Errorf("%s: %w", trace, err)
				}
				exps = append(exps, sim.Experiment{Name: s.Name, Model: s.Model, Loads: []float64{s.Load}, Seeds: 1,
					Policies: sim.Policies(s.Model), Draw: func(float64, uint64) *sim.Scenario { return s }})
			default:
				loads, err := parseLoads(loadsFlag)
				if err != nil {
					return usageError{err}
				}
				switch scenario {
				case "workstations", "all":
					exps = append(exps, sim.WorkstationsExperiment(or(loads, []float64{0.3, 0.5, 0.7, 0.85, 0.95}), seeds))
				}
				switch scenario {
				case "edge", "all":
					exps = append(exps, sim.EdgeExperiment(or(loads, []float64{0.3, 0.5, 0.7, 0.9}), seeds))
				}
				if len(exps) == 0 {
					return usageError{fmt.Errorf("--scenario %q: want workstations, edge or all", scenario)}
				}
			}
			if policiesFlag != "" {
				for i := range exps {
					ps, err := pickPolicies(exps[i].Model, policiesFlag)
					if err != nil {
						return usageError{err}
					}
					exps[i].Policies = ps
				}
			}
			return runSims(c, exps, out, asJSON)
		},
	}
	f := cmd.Flags()
	f.StringVar(&scenario, "scenario", "all", "workstations, edge or all")
	f.StringVar(&loadsFlag, "loads", "", "offered loads, comma-separated (default: 0.3 to 0.95 for workstations, 0.3 to 0.9 for edge)")
	f.IntVar(&seeds, "seeds", 10, "random scenarios per load")
	f.StringVar(&policiesFlag, "policies", "", "policies to compare, comma-separated (default: all that fit the model; marginal-cost is always kept as the reference)")
	f.StringVar(&trace, "trace", "", "replay this scenario file (JSON, as --write-trace writes it) instead")
	f.StringVar(&writeTrace, "write-trace", "", "write the scenario drawn for --scenario, --load and --seed to this file and stop")
	f.Float64Var(&load, "load", 0.7, "with --write-trace: the offered load")
	f.Uint64Var(&seed, "seed", 1, "with --write-trace: the seed")
	f.StringVar(&out, "out", "", "write sim.md, sim.json and a slowdown plot per scenario (SVG) to this directory")
	f.BoolVar(&asJSON, "json", false, "print the results as JSON")
	return cmd
}

func or(a, b []float64) []float64 {
	if len(a) > 0 {
		return a
	}
	return b
}

func parseLoads(s string) ([]float64, error) {
	if s == "" {
		return nil, nil
	}
	var out []float64
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || v <= 0 || v > 2 {
			return nil, fmt.Errorf("--loads: %q: want numbers in (0, 2], such as 0.5,0.9", f)
		}
		out = append(out, v)
	}
	return out, nil
}

func pickPolicies(m sim.Model, list string) ([]sim.Policy, error) {
	out := []sim.Policy{sim.MarginalCost()}
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		if name == "" || name == "marginal-cost" {
			continue
		}
		p, ok := sim.PolicyByName(m, name)
		if !ok {
			var names []string
			for _, p := range sim.Policies(m) {
				names = append(names, p.Name)
			}
			return nil, fmt.Errorf("--policies: %q: no such policy for the %s model (have %s, decentralized-K)", name, m, strings.Join(names, ", "))
		}
		out = append(out, p)
	}
	return out, nil
}

func writeScenario(c *cli, name string, load float64, seed uint64, path string) error {
	var s *sim.Scenario
	switch name {
	case "workstations":
		s = sim.Workstations(sim.DefaultWorkstations, load, seed)
	case "edge":
		s = sim.Edge(sim.DefaultEdge, load, seed)
	default:
		return usageError{fmt.Errorf("--write-trace needs --scenario workstations or edge, not %q", name)}
	}
	var b bytes.Buffer
	if err := s.WriteJSON(&b); err != nil {
		return err
	}
	if err := writeFileAtomic(path, b.Bytes()); err != nil {
		return err
	}
	fmt.Fprintf(c.out, "wrote %s: %d machines, %d jobs (%s)\n", path, len(s.Machines), len(s.Jobs), s.Name)
	return nil
}

func runSims(c *cli, exps []sim.Experiment, out string, asJSON bool) error {
	var reports []*sim.Report
	tty := !asJSON && isatty.IsTerminal(os.Stderr.Fd())
	for _, e := range exps {
		var progress func(done, total int)
		if tty {
			progress = func(done, total int) {
				fmt.Fprintf(os.Stderr, "\r%s: %d/%d runs", e.Name, done, total)
			}
		}
		rep, err := e.Run(progress)
		if tty {
			fmt.Fprintln(os.Stderr)
		}
		if err != nil {
			return err
		}
		reports = append(reports, rep)
	}
	if out != "" {
		if err := writeReports(out, reports); err != nil {
			return err
		}
	}
	if asJSON {
		return c.printJSON(reports)
	}
	for _, rep := range reports {
		tw := tabwriter.NewWriter(c.out, 2, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "%s (%s model, %d seeds): mean slowdown per offered load\n", rep.Experiment, rep.Model, rep.Seeds)
		fmt.Fprint(tw, "POLICY")
		for _, l := range rep.Loads {
			fmt.Fprintf(tw, "\t%.2f", l)
		}
		fmt.Fprintln(tw, "\tREJECTED (last load)")
		for _, p := range rep.Policies {
			fmt.Fprint(tw, p)
			var last sim.Summary
			for _, l := range rep.Loads {
				last, _ = rep.Row(p, l)
				fmt.Fprintf(tw, "\t%.2f", last.MeanSlowdown)
			}
			fmt.Fprintf(tw, "\t%.1f of %d\n", last.Rejected, last.Jobs)
		}
		tw.Flush()
		fmt.Fprintln(c.out)
	}
	if out != "" {
		fmt.Fprintf(c.out, "full tables in %s, plots in %s\n", filepath.Join(out, "sim.md"), filepath.Join(out, "*.svg"))
	}
	return nil
}

func writeReports(dir string, reports []*sim.Report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var md bytes.Buffer
	md.WriteString("# Placement policies compared\n\nWritten by `deepmarket sim`; the scenarios and their parameters are documented in package scheduler/sim.\n\n")
	for _, rep := range reports {
		name := strings.NewReplacer("/", "-", " ", "-").Replace(rep.Experiment)
		fmt.Fprintf(&md, "![%s](%s-slowdown.svg)\n\n", rep.Experiment, name)
		if err := rep.Markdown(&md); err != nil {
			return err
		}
		var svg bytes.Buffer
		if err := rep.SVG(&svg); err != nil {
			return err
		}
		if err := writeFileAtomic(filepath.Join(dir, name+"-slowdown.svg"), svg.Bytes()); err != nil {
			return err
		}
	}
	if err := writeFileAtomic(filepath.Join(dir, "sim.md"), md.Bytes()); err != nil {
		return err
	}
	js, err := json.MarshalIndent(reports, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(dir, "sim.json"), append(js, '\n'))
}

// writeFileAtomic writes beside path and renames, so a crash leaves the
// old file or the new one.
func writeFileAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
