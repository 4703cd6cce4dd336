package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/deepmarket/deepmarket/testnet"
	"github.com/deepmarket/deepmarket/testnet/netlab"
	"github.com/deepmarket/deepmarket/units"
)

func newTestnetCmd(c *cli) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "testnet",
		Short: "Make and run a multi-university network on this machine",
		Long: `A testnet is a whole DeepMarket network on one machine: several universities
(sites), each with a validator that also issues its members' credits, and lab
machines (full nodes). 'testnet init' makes the genesis and a home per node;
'testnet run' starts every node as its own process, on loopback or, with
--profile, each in a network namespace behind a realistic network (needs root).`,
		Example: `  deepmarket testnet init --validators 3 --nodes 2 --out ./tn
  deepmarket testnet run ./tn
  deepmarket testnet run ./tn --profile multi-dc
  deepmarket testnet status ./tn
  deepmarket --home ./tn/node0 lend --cores 2 --mem 2GiB`,
	}
	cmd.AddCommand(newTestnetInitCmd(c), newTestnetRunCmd(c), newTestnetStatusCmd(c), newTestnetProfilesCmd(c))
	return cmd
}

func newTestnetInitCmd(c *cli) *cobra.Command {
	var p testnet.Params
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "init --validators N [--nodes M] [--sites S] --out DIR",
		Short: "Make a testnet: genesis, and a ready home per node",
		Long: `Make a testnet in DIR: genesis.json with one validator and one issuer (with a
quota) per site and a starter balance for every node; a home per node with
distinct ports (from --base-port, four per node), bootstrap and ledger peers
filled in and its site label; seeds.json (what a joining university needs
with genesis.json); and testnet.json, which 'testnet run' reads.

Validators are val0…; further nodes are node0…; both are spread over the
sites in turn, and site i's first validator is its issuer.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := testnet.Init(p)
			if err != nil {
				return usageError{err}
			}
			if asJSON {
				return c.printJSON(m)
			}
			rows := make([][]string, 0, len(m.Nodes))
			for _, n := range m.Nodes {
				role := "node"
				if n.Validator {
					role = "validator"
				}
				if n.Issuer {
					role += ", issuer"
				}
				rows = append(rows, []string{n.Name, n.Site, role, strconv.Itoa(n.Ports.API), n.Account})
			}
			fmt.Fprintf(c.out, "Testnet %s in %s:\n", m.ChainID, p.Out)
			c.table("NODE\tSITE\tROLE\tAPI PORT\tACCOUNT", rows)
			starter := p.Starter
			if starter == 0 {
				starter = testnet.DefaultStarter
			}
			fmt.Fprintf(c.out, "\nEvery account starts with %s credits.\nNext: deepmarket testnet run %s\n",
				units.FormatCredits(starter), p.Out)
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&p.Validators, "validators", 0, "validators (required), spread over the sites")
	f.IntVar(&p.Nodes, "nodes", 0, "further full nodes: the lab machines")
	f.IntVar(&p.Sites, "sites", 0, "universities (default: one per validator; those beyond the validators run none: labs behind the others' public nodes)")
	f.StringVar(&p.Out, "out", "", "directory to make (required; must be empty or absent)")
	f.IntVar(&p.BasePort, "base-port", testnet.DefaultBasePort, "first of the ports on 127.0.0.1 (four per node)")
	f.StringVar(&p.ChainID, "chain-id", "", "network ID (default deepmarket-testnet-<random>)")
	f.StringVar(&p.Python, "python", "", "Python with TensorFlow that lenders run jobs with (default python3)")
	f.BoolVar(&asJSON, "json", false, "print testnet.json")
	return cmd
}

func newTestnetRunCmd(c *cli) *cobra.Command {
	var opts testnet.RunOptions
	var machineCores float64
	var machineMem string
	cmd := &cobra.Command{
		Use:   "run DIR [--profile lan|wifi|multi-dc]",
		Short: "Start every node of a testnet; Ctrl-C stops them all",
		Long: `Start every node of the testnet in DIR as its own 'deepmarket node run'
process (logs in each home's node.log), wait until each answers, print how to
reach them, and stop them all on Ctrl-C.

--profile puts each node in its own network namespace: one bridge per site,
tc netem for the site's network and for the links between sites (see
'deepmarket testnet profiles'). It needs root (network namespaces and tc);
without it, run on loopback, where every link is a fast local one. Each
node's API and ledger RPC stay reachable on the host's 127.0.0.1.

--machine-cores makes every node but the validators a machine of known size
on this host: the node and everything it runs (its ledger replica, tunnels
and workers) in a cgroup of its own with that CPU quota and --machine-mem of
memory (needs root). Several small machines then run side by side on one
host, each node's own overhead counted inside its machine.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError{fmt.Errorf("testnet run takes the testnet directory")}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := args[0]
			opts.Progress = c.out
			if machineCores > 0 {
				mem, err := units.ParseSize(machineMem)
				if err != nil {
					return usageError{fmt.Errorf("--machine-mem %q: %w", machineMem, err)}
				}
				opts.Machine = &testnet.Machine{Cores: machineCores, MemBytes: mem}
			}
			ctx := cmd.Context()
			net, err := testnet.Start(ctx, dir, opts)
			if err != nil {
				return err
			}
			defer func() {
				fmt.Fprintln(c.out, "Stopping every node…")
				net.Close()
			}()
			m := net.Manifest
			rows := make([][]string, 0, len(m.Nodes))
			for i, n := range m.Nodes {
				rows = append(rows, []string{n.Name, n.Site, net.Addrs[i], fmt.Sprintf("http://127.0.0.1:%d/", n.Ports.API),
					"deepmarket --home " + net.Home(i).Dir + " ui"})
			}
			where := "loopback"
			if opts.Profile != "" {
				where = "profile " + opts.Profile
			}
			fmt.Fprintf(c.out, "\nTestnet %s is running (%d nodes, %s):\n", m.ChainID, len(m.Nodes), where)
			c.table("NODE\tSITE\tIP\tDASHBOARD\tLOGIN LINK", rows)
			fmt.Fprintf(c.out, "\nUse any node with --home, e.g. deepmarket --home %s status\nStatus of all: deepmarket testnet status %s\nCtrl-C stops them all.\n",
				net.Home(0).Dir, dir)
			for i := range m.Nodes {
				go func() {
					<-net.Exited(i)
					if ctx.Err() == nil {
						fmt.Fprintf(c.out, "warning: %s exited; see %s\n", m.Nodes[i].Name, filepath.Join(net.Home(i).Dir, testnet.LogFile))
					}
				}()
			}
			<-ctx.Done()
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Profile, "profile", "", "network profile: lan, wifi or multi-dc (needs root)")
	f.StringVar(&opts.Binary, "bin", "", "deepmarket binary the nodes run (default: this one)")
	f.Float64Var(&machineCores, "machine-cores", 0, "confine every non-validator node to a machine of this many cores (a CPU quota; needs root)")
	f.StringVar(&machineMem, "machine-mem", "3GiB", "with --machine-cores: each machine's memory limit")
	return cmd
}

func newTestnetStatusCmd(c *cli) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status DIR",
		Short: "Show every node of a testnet: up, height, peers, balance",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError{fmt.Errorf("testnet status takes the testnet directory")}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), time.Minute)
			defer cancel()
			rows, err := testnet.Status(ctx, args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return c.printJSON(rows)
			}
			out := make([][]string, 0, len(rows))
			for _, r := range rows {
				role := "node"
				if r.Validator {
					role = "validator"
				}
				if !r.Up {
					out = append(out, []string{r.Name, r.Site, role, "down", "-", "-", "-", "-"})
					continue
				}
				out = append(out, []string{r.Name, r.Site, role, "up", strconv.FormatInt(r.Status.Height, 10),
					strconv.Itoa(r.Status.Peers), strconv.FormatBool(r.Status.Lending), units.FormatCredits(r.Balance)})
			}
			c.table("NODE\tSITE\tROLE\tSTATE\tHEIGHT\tPEERS\tLENDING\tBALANCE", out)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	return cmd
}

func newTestnetProfilesCmd(c *cli) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "profiles",
		Short: "List the network profiles of 'testnet run --profile'",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ps := netlab.Profiles()
			if asJSON {
				return c.printJSON(ps)
			}
			for _, p := range ps {
				fmt.Fprintf(c.out, "%s\n  %s\n", p.Name, p.Doc)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	return cmd
}
