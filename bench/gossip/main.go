// Command gossip is `make bench-gossip`: it measures what offer gossip
// costs each node (bytes sent and received, CPU, messages validated, per
// minute) in swarms of a few hundred real in-process libp2p nodes that
// re-announce signed offers at the node's pace (lender.PaceFor: the
// default interval until the swarm's announcements reach a budget, then
// stretched to stay within it), fits how each figure grows with the offers
// announced per minute in the market, and extrapolates to 100,000
// machines, side by side at a fixed 30 s interval and at the node's
// default pace. It prints tables and writes report.md and gossip.json to
// bench/results/gossip/.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/deepmarket/deepmarket/node"
	"github.com/deepmarket/deepmarket/node/lender"
	"github.com/deepmarket/deepmarket/p2p"
)

// result is everything the run measured and concluded; report.md and
// gossip.json are written from it.
type result struct {
	When       string  `json:"when"`
	Go         string  `json:"go"`
	CPUs       int     `json:"cpus"`
	IntervalS  float64 `json:"announce_interval_s"`
	TTLS       float64 `json:"offer_ttl_s"`
	Degree     int     `json:"degree"`
	OfferBytes int     `json:"offer_envelope_bytes"` // one signed offer as gossiped
	// MessageIDBytes is a gossipsub message ID in an IHAVE: the author's
	// peer ID, its sequence number, and protobuf's tag and length.
	MessageIDBytes int             `json:"message_id_bytes"`
	WarmupS        float64         `json:"warmup_s"`
	WindowS        float64         `json:"window_s"`
	CPUBudget      float64         `json:"cpu_budget_pct_core"`
	NetBudget      float64         `json:"net_budget_kbit_s"`
	Samples        []sample        `json:"samples"`
	FitFrom        []int           `json:"fit_from_nodes"`
	Fits           map[string]line `json:"fits"`      // per node per minute, against offers announced per minute in the market
	Estimates      []estimate      `json:"estimates"` // every machine re-announcing every announce_interval
	// Paced is the same at the node's default pace (announce_budget).
	Paced          []estimate `json:"estimates_at_default_pace"`
	AnnounceBudget float64    `json:"announce_budget_per_min"`      // the node's default
	SwarmBudget    float64    `json:"swarm_budget_per_min"`         // what the runs kept to
	Suggested      float64    `json:"interval_for_budget_at_10k_s"` // 0: the default interval fits
	Joined         *joined    `json:"newcomer,omitempty"`           // the largest run's newcomers
	FitBound       bool       `json:"fit_from_cpu_bound_runs"`      // fewer than two runs were not CPU-bound
}

// estimate is the model's figures for a lab machine in a market of Nodes.
type estimate struct {
	Nodes     int     `json:"nodes"`
	IntervalS float64 `json:"announce_interval_s"`
	TTLS      float64 `json:"offer_ttl_s"`
	SentKbit  float64 `json:"sent_kbit_s"`
	RecvKbit  float64 `json:"recv_kbit_s"`
	CPUPct    float64 `json:"cpu_pct_core"`
	Validated float64 `json:"validated_per_s"`
	SentMiB   float64 `json:"sent_mib_per_day"`
}

func main() {
	def := node.DefaultConfig().P2P
	spec := flag.String("nodes", "50,100,200,300", "runs: swarm sizes, comma-separated; NxK re-announces at K times -interval instead of the pace -budget gives")
	degree := flag.Int("degree", 20, "connections per node, on average")
	interval := flag.Duration("interval", def.AnnounceInterval.Duration, "re-announce interval (the node's default)")
	warmup := flag.Duration("warmup", 10*time.Second, "after connecting, before measuring")
	window := flag.Duration("window", 30*time.Second, "how long to measure each run at least, rounded up to whole re-announce intervals")
	cpuBudget := flag.Float64("cpu-budget", 1, "what a lab machine may spend on offer gossip, % of a core (bench-p2p's idle-node goal)")
	netBudget := flag.Float64("net-budget", 10_000, "what a lab machine may send or receive for offer gossip, kbit/s (1% of a 1 Gbit/s link)")
	budget := flag.Float64("budget", 200, "the swarm's announce_budget, offers a minute: the node's default scaled down, so that a swarm that fits these cores reaches it and the runs past it show what stretching the pace holds")
	out := flag.String("out", "bench/results/gossip", "directory for report.md and gossip.json")
	flag.Parse()
	pace := lender.PaceParams{Interval: *interval, TTL: time.Duration(float64(*interval) * def.OfferTTL.Duration.Seconds() / def.AnnounceInterval.Duration.Seconds()),
		Budget: *budget, MaxTTL: lender.MaxOfferTTL}
	runs, err := parseRuns(*spec, pace)
	if err != nil {
		log.Fatal(err)
	}

	res := result{
		When: time.Now().UTC().Format(time.RFC3339), Go: runtime.Version(), CPUs: runtime.NumCPU(),
		IntervalS: interval.Seconds(), TTLS: def.OfferTTL.Duration.Seconds(), Degree: *degree, WarmupS: warmup.Seconds(), WindowS: window.Seconds(),
		CPUBudget: *cpuBudget, NetBudget: *netBudget, AnnounceBudget: float64(def.AnnounceBudget), SwarmBudget: *budget,
	}
	sealed, err := p2p.Seal(key(0), chain, p2p.TypeOffer, offer(key(0), 0), 1, time.Now().Add(def.OfferTTL.Duration))
	if err != nil {
		log.Fatal(err)
	}
	res.OfferBytes = len(sealed)
	res.MessageIDBytes = len(key(0).PeerID()) + 8 + 2
	rng := rand.New(rand.NewPCG(11, 11))
	for i, r := range runs {
		r.Join = i == len(runs)-1
		r.Degree = min(*degree, r.Nodes-1)
		r.Warmup = *warmup
		// Whole intervals: every node announces the same number of times
		// in the window, whatever its phase.
		r.Window = time.Duration(math.Ceil(float64(*window)/float64(r.Interval))) * r.Interval
		log.Printf("%d nodes re-announcing every %s: connecting, %s warm-up, %s measured", r.Nodes, r.Interval, r.Warmup, r.Window)
		s, j, err := measure(r, rng)
		if err != nil {
			log.Fatalf("%d nodes: %v", r.Nodes, err)
		}
		if j != nil {
			res.Joined = j
			log.Printf("a newcomer to %d nodes held 95%% of the offers after %.1f s by gossip, %.2f s copying two books (%d offers, %.1f ms a page)",
				r.Nodes, j.GossipS, j.CopyS, j.Copied, j.CopyPage)
		}
		log.Printf("%d nodes: %.0f KiB sent, %.2f CPU s, %.0f validated per node per minute; delivered %.1f%%, process %.2f cores, machine %.0f%% busy",
			r.Nodes, s.SentBytes/1024, s.CPUSeconds, s.Validated, 100*s.Delivered, s.ProcessCPU, 100*s.MachineBusy)
		res.Samples = append(res.Samples, s)
		runtime.GC()
		debug.FreeOSMemory()
	}
	if err := res.model(); err != nil {
		log.Fatal(err)
	}
	fmt.Print(res.tables())
	if err := res.write(*out); err != nil {
		log.Fatal(err)
	}
	fmt.Println("results:", filepath.Join(*out, "report.md"), filepath.Join(*out, "gossip.json"))
}

// parseRuns reads "50,100,200,300x3": each swarm re-announces at the
// pace its size gives, or at K times the interval.
func parseRuns(spec string, pace lender.PaceParams) ([]run, error) {
	var runs []run
	for _, s := range strings.Split(spec, ",") {
		size, times, scaled := strings.Cut(strings.TrimSpace(s), "x")
		n, err := strconv.Atoi(size)
		k := 1
		if scaled && err == nil {
			k, err = strconv.Atoi(times)
		}
		if err != nil || n < 2 || k < 1 {
			return nil, fmt.Errorf("-nodes %q: want sizes of 2 or more, each optionally xK, e.g. 50,100,200,300x3", spec)
		}
		p := lender.PaceFor(n, pace)
		if scaled {
			// Every offer lives as many intervals as at the node's pace.
			p = lender.Pace{Interval: time.Duration(k) * pace.Interval, TTL: time.Duration(k) * pace.TTL}
		}
		runs = append(runs, run{Nodes: n, Interval: p.Interval, TTL: p.TTL})
	}
	return runs, nil
}

// model fits each per-node figure against the market's announcement rate,
// from the runs the machine did not bound when there are two or more of
// them, and extrapolates to the default interval.
func (r *result) model() error {
	use := r.Samples
	var clean []sample
	for _, s := range r.Samples {
		if !s.Contended {
			clean = append(clean, s)
		}
	}
	if len(clean) >= 2 {
		use = clean
	} else {
		r.FitBound = true
	}
	var xs []float64
	pick := map[string][]float64{}
	for _, s := range use {
		r.FitFrom = append(r.FitFrom, s.Nodes)
		xs = append(xs, s.Announced)
		pick["sent"] = append(pick["sent"], s.SentBytes)
		pick["recv"] = append(pick["recv"], s.RecvBytes)
		pick["cpu"] = append(pick["cpu"], s.CPUSeconds)
		pick["validated"] = append(pick["validated"], s.Validated)
	}
	r.Fits = map[string]line{}
	for name, ys := range pick {
		l, err := fit(xs, ys)
		if err != nil {
			return fmt.Errorf("%s: %w (measure two announcement rates or more)", name, err)
		}
		r.Fits[name] = l
	}
	interval := time.Duration(r.IntervalS * float64(time.Second))
	def := node.DefaultConfig().P2P
	for _, n := range []int{100, 1_000, 10_000, 100_000} {
		r.Estimates = append(r.Estimates, r.estimate(n, lender.Pace{Interval: interval, TTL: def.OfferTTL.Duration}))
		r.Paced = append(r.Paced, r.estimate(n, lender.PaceFor(n, def.Pace())))
	}
	// The interval that brings 10,000 machines within both budgets.
	bytesPerMin := r.NetBudget * 1000 / 8 * 60
	for _, iv := range []time.Duration{
		r.Fits["cpu"].intervalFor(10_000, r.CPUBudget/100*60),
		r.Fits["sent"].intervalFor(10_000, bytesPerMin),
		r.Fits["recv"].intervalFor(10_000, bytesPerMin),
	} {
		if iv > interval {
			r.Suggested = max(r.Suggested, iv.Seconds())
		}
	}
	return nil
}

// estimate is the model for one of n machines re-announcing at pace.
func (r *result) estimate(n int, pace lender.Pace) estimate {
	at := func(name string) float64 { return r.Fits[name].at(rate(n, pace.Interval)) }
	return estimate{
		Nodes: n, IntervalS: pace.Interval.Seconds(), TTLS: pace.TTL.Seconds(),
		SentKbit:  at("sent") * 8 / 60 / 1000,
		RecvKbit:  at("recv") * 8 / 60 / 1000,
		CPUPct:    at("cpu") / 60 * 100,
		Validated: at("validated") / 60,
		SentMiB:   at("sent") * 60 * 24 / (1 << 20),
	}
}

func (r *result) write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "gossip.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "report.md"), []byte(r.report()), 0o644)
}
