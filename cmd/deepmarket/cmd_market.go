package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/units"
)

func newStatusCmd(c *cli) *cobra.Command {
	cmd := &cobra.Command{Use: "status", Short: "Show the running node's status", Args: noArgs}
	return showCmd(c, cmd, func(ctx context.Context, cl *api.Client, _ []string) (api.Status, error) {
		return cl.Status(ctx)
	}, func(s api.Status) error {
		lending := "no"
		if s.Lending {
			lending = "yes (offer out)"
			if !s.Offering {
				lending = "yes (outside its window: no offer now)"
			}
		}
		fmt.Fprintf(c.out, "peer ID:   %s\naccount:   %s\nmoniker:   %s (site %s)\nchain ID:  %s\nheight:    %d\nledger:    node %s, RPC %s\npeers:     %d\nlending:   %s\noffers:    %d held\napi:       %s\nversion:   %s, up %s\n",
			s.PeerID, s.Account, s.Moniker, s.Site, s.ChainID, s.Height, s.LedgerNodeID, s.LedgerRPC, s.Peers, lending, s.Offers, s.API, s.Version,
			(time.Duration(s.UptimeS) * time.Second).String())
		for _, a := range s.Addrs {
			fmt.Fprintf(c.out, "addr:      %s\n", a)
		}
		fmt.Fprintf(c.out, "reachable: %s\n", reachability(s.NAT))
		for _, a := range s.NAT.PublicAddrs {
			fmt.Fprintf(c.out, "public:    %s\n", a)
		}
		return nil
	})
}

// reachability says in words how peers reach this node.
func reachability(n p2p.NATStatus) string {
	var s string
	switch n.Reachability {
	case "public":
		s = "yes, directly (AutoNAT)"
	case "private":
		s = "behind a NAT: peers reach it through a relay, then a hole punch"
		if len(n.RelayAddrs) == 0 {
			s += " (no relay slot yet)"
		}
	default:
		s = "not known yet (AutoNAT has not answered)"
	}
	switch {
	case n.Relaying:
		s += "; relays for members (" + n.RelayWhy + ")"
	case n.RelayWhy != "":
		s += "; relays for nobody: " + n.RelayWhy
	}
	if n.HolePunches > 0 {
		s += fmt.Sprintf("; hole punches %d of %d succeeded", n.HolePunchesWon, n.HolePunches)
	}
	if l := n.LastHolePunch; l != nil && !l.Success {
		s += fmt.Sprintf("; the last, with %s, failed after %d attempts: %s", l.Peer, l.Attempts, l.Error)
	}
	return s
}

// parsePrices reads --price "core=0.5,mem=0.1,gpu=2" (credits per
// unit-hour) over the defaults given.
// parsePrices reads --price; given names the units it sets.
func parsePrices(s string) (p *p2p.Prices, given []string, err error) {
	p = &p2p.Prices{}
	seen := map[string]bool{}
	for _, part := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return nil, nil, fmt.Errorf("--price %q: want core=CREDITS,mem=CREDITS,gpu=CREDITS (per unit-hour; mem per GiB-hour)", s)
		}
		amount, err := units.ParseCredits(v)
		if err != nil {
			return nil, nil, fmt.Errorf("--price %s: %v", k, err)
		}
		switch strings.ToLower(k) {
		case "core", "cores", "cpu":
			p.CoreHour, k = amount, "core"
		case "mem", "memory":
			p.MemGiBHour, k = amount, "mem"
		case "gpu", "gpus":
			p.GPUHour, k = amount, "gpu"
		default:
			return nil, nil, fmt.Errorf("--price: unknown resource %q (want core, mem or gpu)", k)
		}
		if seen[k] {
			return nil, nil, fmt.Errorf("--price: %s given twice", k)
		}
		seen[k] = true
		given = append(given, k)
	}
	return p, given, nil
}

func newLendCmd(c *cli) *cobra.Command {
	var cores, gpus int
	var mem, window, price, release string
	var stop, asJSON bool
	var suspendAbove float64
	cmd := &cobra.Command{
		Use:   "lend",
		Short: "Lend this machine's resources, or take them back with --stop",
		Long: `Say what this machine lends. The node checks it against the machine's
inventory, saves it (it survives restarts), and announces a signed offer at once
and then periodically. With --window the offer is out only inside that daily
window (local time; it may run over midnight). --stop withdraws the offer:
peers drop it at once. Without flags, shows what is lent now and the holds
schedulers have on this machine (a hold reserves capacity for a job whose
bidder can pay; it lapses unless the job launches); --release ID drops a hold
that runs no worker.

Peers count the offer only when the ledger backs this machine: its account is
a member of the network (an issuer admitted it or granted it credits), or it
is linked to a member's account (deepmarket ledger link).

Reserve prices are floors in credits per unit-hour (memory per GiB-hour);
without --price the [prices] of config.toml apply.

A machine already lending changes only what the flags name: the others
(cores, memory, GPUs, window, each price, --suspend-above) stay as they are,
and the reply says which were kept. --window all lends all day again.

The owner comes first with --suspend-above CORES: while the machine's own
load (its owner's programs, not the jobs' or the node's) is above CORES, the
jobs here are suspended, unpaid, and nothing is offered; they resume once the
owner has left it alone for a while, and are vacated to other machines if the
owner stays ([owner] in config.toml has the timings).`,
		Example: `  deepmarket lend --cores 4 --mem 8GiB
  deepmarket lend --cores 8 --mem 16G --gpus 1 --window 19:00-07:00 --price core=0.2,mem=0.05,gpu=2
  deepmarket lend --cores 2 --mem 4GiB --suspend-above 0.5   # a desktop: its user first
  deepmarket lend --price gpu=3                               # the GPU's price only
  deepmarket lend --stop
  deepmarket lend --release 3f2a9c0e11d4b7a6`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			f := cmd.Flags()
			setting := f.Changed("cores") || f.Changed("mem") || f.Changed("gpus") || f.Changed("window") || f.Changed("price") ||
				f.Changed("suspend-above")
			if stop && setting {
				return usageError{fmt.Errorf("--stop takes no other lend flags")}
			}
			if release != "" && (stop || setting) {
				return usageError{fmt.Errorf("--release takes no other lend flags")}
			}
			// The flags given, checked before asking the node anything.
			var req api.LendRequest
			var size uint64
			if setting {
				var err error
				if f.Changed("cores") && cores <= 0 {
					return usageError{fmt.Errorf("--cores %d: lend at least 1 core", cores)}
				}
				if gpus < 0 {
					return usageError{fmt.Errorf("--gpus %d: cannot be negative", gpus)}
				}
				if f.Changed("mem") {
					if size, err = units.ParseSize(mem); err != nil {
						return usageError{fmt.Errorf("--mem: %v", err)}
					}
					if size == 0 {
						return usageError{fmt.Errorf("--mem %s: lend more than 0 bytes", mem)}
					}
				}
				if window == "all" {
					window = ""
				}
				if window != "" {
					if _, err := p2p.ParseWindow(window); err != nil {
						return usageError{fmt.Errorf("--window: %v", err)}
					}
				}
				if f.Changed("suspend-above") {
					if suspendAbove < 0 {
						return usageError{fmt.Errorf("--suspend-above %v: cannot be negative (0: never suspend)", suspendAbove)}
					}
					req.SuspendAbove = &suspendAbove
				}
				if price != "" {
					if req.Price, req.PriceGiven, err = parsePrices(price); err != nil {
						return usageError{err}
					}
				}
				req.Cores, req.MemBytes, req.GPUs, req.Window = cores, size, gpus, window
			}
			partial := setting && (!f.Changed("cores") || !f.Changed("mem"))
			unknown := func(err error) error { // a partial change needs what is lent now
				if partial {
					return usageError{fmt.Errorf("lending needs both --cores and --mem (e.g. --cores 4 --mem 8GiB), "+
						"unless this machine lends already, which its node could not say: %v", err)}
				}
				return err
			}
			cl, err := c.client()
			if err != nil {
				return unknown(err)
			}
			ctx, cancel := timeout(cmd.Context())
			defer cancel()
			var kept []string
			if setting {
				cur, err := cl.Lend(ctx)
				if err != nil {
					return unknown(err)
				}
				if kept, err = keepLend(&req, cur.Settings, f.Changed); err != nil {
					return err
				}
			}
			var st api.LendState
			switch {
			case stop:
				st, err = cl.StopLend(ctx)
			case release != "":
				st, err = cl.ReleaseHold(ctx, release)
			case setting:
				st, err = cl.SetLend(ctx, req)
				if apiErr, ok := err.(*api.Error); ok && apiErr.Field != "" {
					err = &api.Error{Status: apiErr.Status, Field: apiErr.Field, Message: "--" + flagOf(apiErr.Field) + ": " + apiErr.Message}
				}
			default:
				st, err = cl.Lend(ctx)
			}
			if err != nil {
				return err
			}
			if asJSON {
				return c.printJSON(st)
			}
			printLendState(c, st, stop)
			if len(kept) > 0 {
				fmt.Fprintf(c.out, "Kept as they were: %s.\n", strings.Join(kept, ", "))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&cores, "cores", 0, "cores to lend")
	f.StringVar(&mem, "mem", "", "memory to lend: 8GiB, 8G, 8192MiB ...")
	f.IntVar(&gpus, "gpus", 0, "GPUs to lend (detected with nvidia-smi)")
	f.StringVar(&window, "window", "", "daily availability window HH:MM-HH:MM, local time, or all (default: all day; a machine lending already keeps its window)")
	f.StringVar(&price, "price", "", "reserve prices per unit-hour: core=CREDITS,mem=CREDITS,gpu=CREDITS")
	f.Float64Var(&suspendAbove, "suspend-above", 0, "suspend the jobs while the owner's own load is above this many cores (0: never; default: [owner] suspend_above)")
	f.BoolVar(&stop, "stop", false, "stop lending and withdraw the offer")
	f.StringVar(&release, "release", "", "drop the hold with this ID (one that runs no worker)")
	f.BoolVar(&asJSON, "json", false, "print as JSON")
	return cmd
}

// keepLend fills in what a lend request's flags leave out from what the
// machine lends now (prev, nil when it lends nothing: then --cores and
// --mem are needed), and says what it kept.
func keepLend(req *api.LendRequest, prev *api.LendRequest, changed func(string) bool) ([]string, error) {
	if prev == nil {
		if !changed("cores") || !changed("mem") {
			return nil, usageError{fmt.Errorf("lending needs both --cores and --mem (e.g. --cores 4 --mem 8GiB)")}
		}
		return nil, nil
	}
	var kept []string
	keep := func(flag, name string, apply func(), shown bool) {
		if !changed(flag) {
			apply()
			if shown {
				kept = append(kept, name)
			}
		}
	}
	keep("cores", "cores", func() { req.Cores = prev.Cores }, true)
	keep("mem", "memory", func() { req.MemBytes = prev.MemBytes }, true)
	keep("gpus", "GPUs", func() { req.GPUs = prev.GPUs }, prev.GPUs > 0)
	keep("window", "window", func() { req.Window = prev.Window }, prev.Window != "")
	keep("suspend-above", "suspend-above", func() { req.SuspendAbove = prev.SuspendAbove }, prev.SuspendAbove != nil)
	if !changed("price") {
		req.Price = prev.Price
		if prev.Price != nil {
			kept = append(kept, "prices")
		}
	} else if len(req.PriceGiven) < 3 {
		kept = append(kept, "the prices not given")
	}
	return kept, nil
}

func flagOf(field string) string {
	switch field {
	case "mem_bytes":
		return "mem"
	case "suspend_above":
		return "suspend-above"
	}
	return field
}

func printLendState(c *cli, st api.LendState, stopped bool) {
	if !st.Lending {
		if stopped {
			fmt.Fprintln(c.out, "Stopped lending: the offer was withdrawn.")
		} else {
			fmt.Fprintln(c.out, "Not lending. Lend with: deepmarket lend --cores N --mem SIZE")
		}
		return
	}
	s := st.Settings
	window := "all day"
	if s.Window != "" {
		window = s.Window
	}
	if st.Unable != "" {
		fmt.Fprintf(c.out, "Not lending: %s.\nSaved settings, offered once the machine can run jobs: %d cores, %s memory, %d GPUs, %s\n",
			st.Unable, s.Cores, units.FormatSize(s.MemBytes), s.GPUs, window)
		return
	}
	fmt.Fprintf(c.out, "Lending %d cores, %s memory, %d GPUs, %s\n", s.Cores, units.FormatSize(s.MemBytes), s.GPUs, window)
	switch {
	case s.SuspendAbove == nil:
		fmt.Fprintln(c.out, "Owner first: as config.toml's [owner] suspend_above says")
	case *s.SuspendAbove == 0:
		fmt.Fprintln(c.out, "Owner first: never (the jobs run whatever the owner's own load)")
	default:
		fmt.Fprintf(c.out, "Owner first: the jobs are suspended while the owner's own load is above %g cores\n", *s.SuspendAbove)
	}
	if s.Price != nil {
		fmt.Fprintf(c.out, "Reserve prices: %s/core-hour, %s/GiB-hour, %s/GPU-hour (credits)\n",
			units.FormatCredits(s.Price.CoreHour), units.FormatCredits(s.Price.MemGiBHour), units.FormatCredits(s.Price.GPUHour))
	}
	switch {
	case st.Offering:
		if st.AnnounceEveryS > 0 {
			fmt.Fprintf(c.out, "Offer: announced to the network every %s; peers keep it %s.\n",
				time.Duration(st.AnnounceEveryS)*time.Second, time.Duration(st.OfferTTLS)*time.Second)
		} else {
			fmt.Fprintln(c.out, "Offer: announced to the network.")
		}
	case st.OwnerBusy != "":
		fmt.Fprintf(c.out, "Offer: none now: %s ([owner] policy; its jobs are suspended meanwhile).\n", st.OwnerBusy)
	case !st.Registered:
		fmt.Fprintln(c.out, "Offer: none: peers refuse the offers of a machine the ledger does not back (see the warning below).")
	case s.Window != "":
		fmt.Fprintln(c.out, "Offer: none now (outside the window).")
	default:
		fmt.Fprintln(c.out, "Offer: none yet (it is being announced).")
	}
	if st.NextChange != nil {
		fmt.Fprintf(c.out, "Window changes at %s\n", st.NextChange.Local().Format("Mon 15:04"))
	}
	if len(st.Frameworks) > 0 {
		fmt.Fprintf(c.out, "Runs: %s jobs", strings.Join(st.Frameworks, " and "))
		if st.Checking {
			fmt.Fprint(c.out, " (checking whether its Python runs TensorFlow: seconds after the node starts)")
		}
		fmt.Fprintln(c.out)
	}
	fmt.Fprintf(c.out, "Reachable: %s\n", reachability(st.NAT))
	for _, w := range st.Warnings {
		fmt.Fprintln(c.out, "Warning: "+w)
	}
	printHolds(c, st.Holds)
}

func printHolds(c *cli, holds []api.Hold) {
	if len(holds) == 0 {
		fmt.Fprintln(c.out, "Holds: none.")
		return
	}
	fmt.Fprintf(c.out, "Holds (%d):\n", len(holds))
	var rows [][]string
	for _, h := range holds {
		lapses := "-"
		if h.Expires != nil {
			lapses = h.Expires.Local().Format("15:04:05")
		}
		rows = append(rows, []string{h.ID, h.State, shortID(h.Job), fmt.Sprint(h.Cores), units.FormatSize(h.MemBytes), fmt.Sprint(h.GPUs), h.Account, lapses})
	}
	c.table("ID\tSTATE\tJOB\tCORES\tMEMORY\tGPUS\tACCOUNT\tLAPSES", rows)
}

func newOffersCmd(c *cli) *cobra.Command {
	cmd := &cobra.Command{Use: "offers", Short: "List the machines offered on the market (as this node sees it)", Args: noArgs}
	return showCmd(c, cmd, func(ctx context.Context, cl *api.Client, _ []string) ([]api.Offer, error) {
		return cl.Offers(ctx)
	}, func(offers []api.Offer) error {
		if len(offers) == 0 {
			fmt.Fprintln(c.out, "No offers yet. Offers arrive from peers within a few seconds of connecting; see `deepmarket peers`.")
			return nil
		}
		var rows [][]string
		for _, o := range offers {
			name := o.Moniker
			if o.Self {
				name += " (this machine)"
			}
			window := "all day"
			if o.Window != "" {
				window = o.Window
			}
			rows = append(rows, []string{shortID(o.Machine), name, o.Site, strconv.Itoa(int(o.Cores)), units.FormatSize(o.MemBytes),
				strconv.Itoa(int(o.GPUs)), units.FormatCredits(o.Price), window, time.Until(o.ExpiresAt).Round(time.Second).String()})
		}
		c.table("MACHINE\tNAME\tSITE\tCORES\tMEMORY\tGPUS\tCREDITS/H\tWINDOW\tEXPIRES IN", rows)
		return nil
	})
}

func shortID(id string) string {
	if len(id) > 16 {
		return id[:6] + "…" + id[len(id)-6:]
	}
	return id
}

func newPeersCmd(c *cli) *cobra.Command {
	cmd := &cobra.Command{Use: "peers", Short: "List connected peers with their sites and latency", Args: noArgs}
	return showCmd(c, cmd, func(ctx context.Context, cl *api.Client, _ []string) ([]api.Peer, error) {
		return cl.Peers(ctx)
	}, func(peers []api.Peer) error {
		if len(peers) == 0 {
			fmt.Fprintln(c.out, "No peers. On a LAN, peers of the same network appear by mDNS; across sites, set bootstrap peers (init --bootstrap or [p2p] bootstrap).")
			return nil
		}
		var rows [][]string
		for _, p := range peers {
			lat := "-"
			if p.LatencyMS > 0 {
				lat = strconv.FormatFloat(p.LatencyMS, 'f', 1, 64) + " ms"
			}
			conn := p.Connection
			if p.Punch != "" {
				conn += " (" + p.Punch + ")"
			}
			rows = append(rows, []string{p.PeerID, p.Moniker, p.Site, lat, strconv.FormatFloat(p.Score, 'f', 1, 64), p.Direction, conn})
		}
		c.table("PEER\tNAME\tSITE\tLATENCY\tSCORE\tDIRECTION\tCONNECTION", rows)
		return nil
	})
}

func newBidsCmd(c *cli) *cobra.Command {
	cmd := &cobra.Command{Use: "bids", Short: "List job bids seen recently, this node's own included (for debugging)", Args: noArgs}
	return showCmd(c, cmd, func(ctx context.Context, cl *api.Client, _ []string) ([]api.SeenBid, error) {
		return cl.Bids(ctx)
	}, func(bids []api.SeenBid) error {
		if len(bids) == 0 {
			fmt.Fprintln(c.out, "No bids seen in the last minutes, this node's own included.")
			return nil
		}
		var rows [][]string
		for _, b := range bids {
			rows = append(rows, []string{b.JobID[:12], shortID(b.From), strconv.Itoa(int(b.Workers)),
				fmt.Sprintf("%dc/%s/%dg", b.PerWorker.Cores, units.FormatSize(b.PerWorker.MemBytes), b.PerWorker.GPUs),
				units.FormatCredits(b.MaxPrice), b.Framework})
		}
		c.table("JOB\tFROM\tWORKERS\tPER WORKER\tMAX CREDITS\tFRAMEWORK", rows)
		return nil
	})
}
