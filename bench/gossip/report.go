package main

import (
	"fmt"
	"math"
	"strings"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"

	"github.com/deepmarket/deepmarket/node"
	"github.com/deepmarket/deepmarket/p2p"
)

// tables are the measured runs and the extrapolation, as markdown (they
// read as well on a terminal).
func (r *result) tables() string {
	var b strings.Builder
	b.WriteString("\nMeasured, per node per minute (R: offers announced per minute in the whole swarm)\n\n")
	b.WriteString("| nodes | re-announce | R /min | mean degree | topic peers | peers scored < 0 | sent KiB | received KiB | CPU s | validated | rejected | delivered | process cores | machine busy | CPU-bound |\n")
	b.WriteString("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---|\n")
	for _, s := range r.Samples {
		bound := "no"
		if s.Contended {
			bound = "**yes**"
		}
		fmt.Fprintf(&b, "| %d | %gs | %.0f | %.1f | %.1f | %.1f%% | %.1f | %.1f | %.3f | %.0f | %.1f | %.1f%% | %.2f | %.0f%% | %s |\n",
			s.Nodes, s.IntervalS, s.Announced, s.Degree, s.TopicPeers, 100*s.NegativeScore, s.SentBytes/1024, s.RecvBytes/1024, s.CPUSeconds, s.Validated, s.Rejected,
			100*s.Delivered, s.ProcessCPU, 100*s.MachineBusy, bound)
	}
	fmt.Fprintf(&b, "\nModel: per node per minute = fixed + slope x R, R = N x 60 / interval (least squares over the runs of %s nodes)\n\n", joinInts(r.FitFrom))
	if r.FitBound {
		b.WriteString("**Fewer than two runs delivered every offer: the fit uses CPU-bound runs, whose bytes and CPU are low (lost messages cost nothing); read the estimate as a lower bound and rerun on an idle machine.**\n\n")
	}
	b.WriteString("| figure | fixed | slope: per offer announced per minute | R² |\n|---|---:|---:|---:|\n")
	for _, f := range []struct{ key, name, unit string }{
		{"sent", "bytes sent", "B"}, {"recv", "bytes received", "B"}, {"cpu", "CPU", "s"}, {"validated", "messages validated", ""},
	} {
		l := r.Fits[f.key]
		fmt.Fprintf(&b, "| %s | %s | %s | %.4f |\n", f.name, num(l.Fixed, f.unit), num(l.Slope, f.unit), l.R2)
	}
	fmt.Fprintf(&b, "\nA signed offer is %d bytes; for each offer announced in the market a node sends %.1f and receives %.1f times that "+
		"(its mesh copies and duplicates, IHAVE/IWANT, protobuf, Noise and yamux framing).\n",
		r.OfferBytes, r.Fits["sent"].Slope/float64(r.OfferBytes), r.Fits["recv"].Slope/float64(r.OfferBytes))
	def := node.DefaultConfig().P2P
	fmt.Fprintf(&b, "\nEstimate for one lab machine, side by side: every machine re-announcing every %gs (a fixed interval) "+
		"and at the node's default pace (announce_interval %s, announce_budget %.0f a minute: the interval and TTL stretch once the market would announce more)\n\n",
		r.IntervalS, def.AnnounceInterval.Duration, r.AnnounceBudget)
	b.WriteString("| machines | fixed: R /min | sent kbit/s | received kbit/s | CPU % of a core | paced: every | offer kept | R /min | sent kbit/s | received kbit/s | CPU % of a core | validated/s | sent MiB/day | CPU fixed / paced |\n")
	b.WriteString("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for i, e := range r.Estimates {
		p := r.Paced[i]
		fmt.Fprintf(&b, "| %d | %.0f | %.1f | %.1f | %.2f | %s | %s | %.0f | %.1f | %.1f | %.2f | %.1f | %.0f | %.1fx |\n",
			e.Nodes, float64(e.Nodes)*60/e.IntervalS, e.SentKbit, e.RecvKbit, e.CPUPct,
			secs(p.IntervalS), secs(p.TTLS), float64(p.Nodes)*60/p.IntervalS, p.SentKbit, p.RecvKbit, p.CPUPct, p.Validated, p.SentMiB, e.CPUPct/p.CPUPct)
	}
	fmt.Fprintf(&b, "\nIHAVE at a real node's connection count, at the default pace, computed from gossipsub's parameters (not measured): "+
		"extra kbit/s sent (and received across its peers) beyond the runs' %d connections\n\n", r.Degree)
	b.WriteString("| machines | 64 connections (ConnLow) | 192 connections (ConnHigh) |\n|---:|---:|---:|\n")
	for _, p := range r.Paced {
		rate := float64(p.Nodes) * 60 / p.IntervalS
		extra := func(deg int) float64 { return (r.ihave(deg, rate) - r.ihave(r.Degree, rate)) * 8 / 1000 }
		fmt.Fprintf(&b, "| %d | +%.0f | +%.0f |\n", p.Nodes, extra(64), extra(192))
	}
	fmt.Fprintf(&b, "\n%s\n", r.verdict())
	if j := r.Joined; j != nil {
		b.WriteString(r.joinedTable(j))
	}
	return b.String()
}

// ihave is the bytes a second a node with deg connections sends in IHAVE
// message IDs when the market announces rate offers a minute: each
// heartbeat (1 s) it advertises the IDs of the last HistoryGossip
// heartbeats (at most MaxIHaveLength) to max(Dlazy, GossipFactor x its
// peers outside the mesh) peers.
func (r *result) ihave(deg int, rate float64) float64 {
	peers := math.Max(float64(pubsub.GossipSubDlazy), pubsub.GossipSubGossipFactor*float64(deg-pubsub.GossipSubD))
	ids := math.Min(float64(pubsub.GossipSubHistoryGossip)*rate/60, float64(pubsub.GossipSubMaxIHaveLength))
	return peers * ids * float64(r.MessageIDBytes)
}

// verdict says whether 10,000 machines fit the budgets at the default
// pace, and at the fixed interval.
func (r *result) verdict() string {
	over := func(e estimate) string {
		var out []string
		if e.CPUPct > r.CPUBudget {
			out = append(out, fmt.Sprintf("CPU %.1f%% of a core > %.3g%%", e.CPUPct, r.CPUBudget))
		}
		if link := max(e.SentKbit, e.RecvKbit); link > r.NetBudget {
			out = append(out, fmt.Sprintf("%.0f kbit/s > %.0f kbit/s", link, r.NetBudget))
		}
		return strings.Join(out, "; ")
	}
	var fixed, paced estimate
	for i, e := range r.Estimates {
		if e.Nodes == 10_000 {
			fixed, paced = e, r.Paced[i]
		}
	}
	var s string
	if o := over(paced); o == "" {
		s = fmt.Sprintf("**At 10,000 machines the default pace keeps a lab machine within the budgets:** each re-announces every %s, "+
			"kept %s, and a node spends %.2f%% of a core and %.0f/%.0f kbit/s sent/received on offers (%.3g%% and %.0f kbit/s allowed).",
			secs(paced.IntervalS), secs(paced.TTLS), paced.CPUPct, paced.SentKbit, paced.RecvKbit, r.CPUBudget, r.NetBudget)
	} else {
		s = fmt.Sprintf("**At 10,000 machines the default pace (every %s) is over budget:** %s.", secs(paced.IntervalS), o)
	}
	if o := over(fixed); o != "" {
		s += fmt.Sprintf(" A fixed %gs interval would not: %s.", r.IntervalS, o)
	}
	if r.Suggested > 0 {
		s += fmt.Sprintf(" By this model the budgets allow an interval down to %s at 10,000 machines.", secs(math.Ceil(r.Suggested)))
	}
	return s + " The cost of the stretched TTL: a machine that goes away without withdrawing (a crash, a cut cable) stays on the market until its offer expires; " +
		"a scheduler whose hold it does not answer sets it aside meanwhile."
}

// joinedTable is how soon a newcomer sees the market, measured and at
// the default pace.
func (r *result) joinedTable(j *joined) string {
	var b strings.Builder
	show := func(v float64) string {
		if v < 0 {
			return "not within the wait"
		}
		return fmt.Sprintf("%.2f s", v)
	}
	fmt.Fprintf(&b, "\nJoining the market: two nodes join the %d-node swarm at once (re-announcing every %s), side by side: "+
		"one by gossip alone, one also copying two peers' offer books as a starting node does. Time until each held 95%% of the machines' offers:\n\n",
		j.Nodes, secs(j.IntervalS))
	b.WriteString("| | gossip alone | copying two books | ratio |\n|---|---:|---:|---:|\n")
	ratio := "-"
	if j.GossipS > 0 && j.CopyS > 0 {
		ratio = fmt.Sprintf("%.0fx", j.GossipS/j.CopyS)
	}
	fmt.Fprintf(&b, "| measured, %d machines | %s | %s | %s |\n", j.Nodes, show(j.GossipS), show(j.CopyS), ratio)
	for _, p := range r.Paced {
		if p.Nodes != 10_000 { // past 20,000 (max_offers) no book holds the market
			continue
		}
		// Gossip alone: 95% of the machines announce within 0.95 of an
		// interval. The copy: one book's pages, at the measured time a page.
		perPage := float64(p2p.MaxEnvelopeSize-4<<10) / float64(r.OfferBytes+8)
		copyS := math.Ceil(float64(p.Nodes)/perPage) * j.CopyPage / 1000
		fmt.Fprintf(&b, "| estimated, %d machines at the default pace (every %s) | %s | %.1f s | %.0fx |\n",
			p.Nodes, secs(p.IntervalS), secs(math.Round(0.95*p.IntervalS)), copyS, 0.95*p.IntervalS/copyS)
	}
	fmt.Fprintf(&b, "\nThe copy took %.1f ms a page (about %d offers) over loopback; over a WAN add a round trip a page. "+
		"The estimate at 10,000 machines is that time a page for one book's pages.\n", j.CopyPage, int(float64(p2p.MaxEnvelopeSize-4<<10)/float64(r.OfferBytes+8)))
	return b.String()
}

// secs prints seconds as a duration.
func secs(v float64) string { return (time.Duration(v) * time.Second).String() }

// report is report.md: the tables with how they were measured, the model
// and its limits.
func (r *result) report() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Offer gossip per node, measured and extrapolated to 10,000 machines\n\n")
	fmt.Fprintf(&b, "Written by `make bench-gossip` (`go run ./bench/gossip`) on %s, %s, %d CPUs.\n\n", r.When, r.Go, r.CPUs)
	fmt.Fprintf(&b, `## How it was measured

Each run starts N real libp2p hosts in one process (p2p.NewHost, p2p.NewGossip: gossipsub with
DeepMarket's scoring, flood publishing, and the validator with ledger admission answered from a map of
the registered machines), listening on loopback TCP with Noise and yamux. Each node dials %d/2 random
others (about %d connections each) and re-announces a signed offer of realistic size (four addresses,
software versions, a window) from a random phase, at the node's pace (lender.PaceFor): every %gs (the
node's default announce_interval) until the swarm's announcements would pass its budget of %.0f a
minute, then stretched to stay within it. That budget is the node's default (%.0f) scaled down so that
a swarm that fits this machine's cores reaches it: the runs past it show what a node pays in a market
that has outgrown announce_interval. After a %gs warm-up, the process is measured for %gs rounded up to whole intervals
(so every node announces the same number of times in the window, whatever its phase):

- bytes sent and received: the bytes the process wrote to and read from its sockets (/proc/self/io
  wchar, rchar): gossipsub, identify and everything else on the connections, with Noise and yamux
  framing, without TCP/IP headers; divided by N;
- CPU: process user+system time (getrusage), divided by N; it includes the benchmark's own signing,
  which a real node does for its own offer too, and the Go runtime (GC, scheduler) the nodes share;
- validated: messages that went through DeepMarket's validator (p2p metrics), divided by N;
- R: the offers announced in the window by all nodes, per minute;
- delivered: others' offers accepted by the nodes over those they should have heard (each offer
  announced in the window, by each of the N-1 other nodes). A run is marked CPU-bound when fewer than 98%% arrived
  (gossipsub drops what its queues cannot hold) or the swarm kept over 75%% of the cores busy; it is
  left out of the fit when two or more runs are not. "machine busy" is all processes (/proc/stat):
  other work on the machine slows the swarm but does not inflate CPU time, which counts work done.

`, r.Degree, r.Degree, r.IntervalS, r.SwarmBudget, r.AnnounceBudget, r.WarmupS, r.WindowS)
	b.WriteString("## Results\n")
	b.WriteString(r.tables())
	fmt.Fprintf(&b, `
Budgets used for the verdict (flags -cpu-budget, -net-budget): %.3g%% of a core, the goal bench-p2p
sets for an idle lending node; %.0f kbit/s each way, 1%% of a 1 Gbit/s lab link.

## The model and its limits

Every machine announces once per interval T and every offer must reach every node, so with N
machines each node validates R = N x 60 / T offers a minute, receives each over its mesh about D
times (gossipsub D = 6, duplicates included) plus IHAVE message IDs on its gossip links, and forwards
about as much. Per node per minute each figure is then a line in R: a fixed part (heartbeats,
scoring, the node's own offer flooded to its peers) and a part proportional to R. At a fixed interval
that is a line in N; measuring in R checks that what a node pays depends on the offers it hears
rather than on the number of nodes: if so, the swarms past the budget, re-announcing more slowly,
lie on the same line as the smaller ones (the fit's R² shows it), and a node's cost stops growing
with the market once its pace stretches (R stays at the budget).

Limits:
- The runs share %d cores with everything else on the machine. CPU per node is the process's CPU
  divided by N: it is not inflated by waiting, but when the cores are saturated gossipsub drops or
  delays messages, so bytes and CPU come out low; "delivered" and "CPU-bound" flag those runs.
- In-process nodes share one Go runtime: one GC and scheduler for N nodes is cheaper per node than N
  processes, so the fixed CPU part is a lower bound for a real node (bench-p2p's idle node measures
  that process alone).
- Degree: the runs give each node about %d connections; a real node keeps 64-192 (ConnLow/ConnHigh).
  More connections add gossipsub IHAVE traffic (message IDs to a quarter of the non-mesh peers each
  heartbeat, about 50 bytes per ID) and flood-publish copies of the node's own offer; the mesh (D = 6)
  that carries the bulk does not grow. The estimate is low by that IHAVE share, computed in the table
  under the estimate.
- Loopback: no latency or loss, so fewer IWANT retransmissions than on a WAN; TCP/IP headers (about
  5%% on 1.5 kB segments, more on small frames) are not counted. QUIC was not used.
- Offers only: bids, withdrawals, the ledger's CometBFT gossip and the DHT are not in these figures.
- Linear extrapolation from a few hundred nodes to 10,000 assumes gossipsub behaves the same at that
  size: its seen-message cache, the validator's replay table (20,000 signers) and the offer book
  (max_offers 20,000) all hold 10,000 machines, but queues (512 per peer) meet larger bursts.
`, r.CPUBudget, r.NetBudget, r.CPUs, r.Degree)
	return b.String()
}

func num(v float64, unit string) string {
	switch {
	case unit == "B":
		return fmt.Sprintf("%.0f B", v)
	case unit == "s":
		return fmt.Sprintf("%.5f s", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ", ")
}
