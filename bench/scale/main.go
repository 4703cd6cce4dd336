// Command scale is `make bench-scale`: a network of real node processes,
// 100 by default, on this one machine, each in a network namespace of its
// own under the lan profile (testnet with netlab), with its own ledger
// replica, gossip and book, as a member's lab machine runs it. For each
// validator count (-validators, default 4 and 7) it starts a fresh
// network and measures, in this order:
//
//   - start: from the first process launched to the last one answering;
//   - offer propagation: -probes machines start lending one after
//     another; every other node's book records when it received each
//     offer (its received_at), and the delay from the lend call is one
//     sample per (machine, receiver): p50, p99, max;
//   - the market at rest: every full node lends; then, over -idle, each
//     node's CPU (utime+stime from /proc) and RSS, validators and full
//     nodes apart;
//   - a newcomer's book: one more full node, kept off until now, starts;
//     the time until its book holds 90% of the offers and every offer
//     (each new machine is dialled before it enters a book), and until
//     its ledger replica reaches the validators' height;
//   - ledger load: every node's account sends -txs-per-node transfers, in
//     nonce order, through one validator's ledger RPC (an account's
//     transactions sent through several nodes could reach a proposer out
//     of order, and be refused for it); committed transactions per second
//     from the first send to the block holding the last, and the block
//     time meanwhile, header to header (the ledger makes no empty
//     blocks: at rest there are none to time).
//
// Every process shares this machine's cores: a figure is what 100 nodes
// cost together here, not what one machine of a university costs alone.
// The full nodes run at nice 19 (-nice), so that the validators, on
// machines of their own in a real network, get the CPU they need for
// consensus first; at equal shares, 100 processes on 2 cores left each
// validator 2% of a core, and a load of 4,000 transfers made 8 blocks
// in 3 minutes.
// Needs root (network namespaces). It prints a table and writes JSON:
//
//	go run ./bench/scale -bin bin/deepmarket -out bench/results/scale.json
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	cmttypes "github.com/cometbft/cometbft/types"

	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/testnet"
	"github.com/deepmarket/deepmarket/testnet/netlab"
)

// result is one network's figures.
type result struct {
	Validators int     `json:"validators"`
	Nodes      int     `json:"nodes"` // node processes at the end, the newcomer included
	Profile    string  `json:"profile"`
	Shaper     string  `json:"shaper"`
	StartS     float64 `json:"start_s"`

	Propagation struct {
		Probes   int     `json:"probes"`
		Samples  int     `json:"samples"`
		Missing  int     `json:"missing"` // (machine, receiver) pairs never seen within the wait
		P50Ms    float64 `json:"p50_ms"`
		P99Ms    float64 `json:"p99_ms"`
		MaxMs    float64 `json:"max_ms"`
		AllInS   float64 `json:"all_in_s"` // until every receiver held every probe's offer
		WaitedS  float64 `json:"waited_s"`
		Complete bool    `json:"complete"`
	} `json:"offer_propagation"`

	Idle struct {
		WindowS   float64 `json:"window_s"`
		Offers    int     `json:"offers"` // machines lending during the window
		Validator stats   `json:"validator"`
		Full      stats   `json:"full_node"`
		// TotalCores is every node's CPU together, in cores of this
		// machine; BenchCores this process's (the lab's userspace
		// shaper and API proxies), apart.
		TotalCores float64 `json:"total_cores"`
		TotalRSSMB float64 `json:"total_rss_mb"`
		BenchCores float64 `json:"bench_cores"`
		// Blocks made in the window: the ledger makes none without
		// transactions.
		Blocks int `json:"blocks"`
	} `json:"idle"`

	// Blocks is the block time under the ledger load: header to header.
	Blocks struct {
		Count int     `json:"count"`
		MeanS float64 `json:"mean_s"`
		P50S  float64 `json:"p50_s"`
		P99S  float64 `json:"p99_s"`
	} `json:"block_time"`

	Newcomer struct {
		Offers    int     `json:"offers"`
		Held      int     `json:"held"`        // offers held at the end
		UpS       float64 `json:"up_s"`        // launch to answering
		Book90S   float64 `json:"book_90_s"`   // launch to holding 90% of the offers
		BookS     float64 `json:"book_s"`      // launch to holding every offer; 0 for either: not within 3 minutes
		LedgerS   float64 `json:"ledger_s"`    // launch to the validators' height
		HeightGap int64   `json:"height_then"` // the height it caught up to
	} `json:"newcomer"`

	Ledger struct {
		Senders   int     `json:"senders"`
		Sent      int     `json:"sent"`
		Refused   int     `json:"refused"`
		Committed int     `json:"committed"`
		WindowS   float64 `json:"window_s"`
		TxPerS    float64 `json:"tx_per_s"`
		Blocks    int     `json:"blocks"`
		MeanBlock float64 `json:"mean_block_s"`
	} `json:"ledger_load"`
}

// stats are per-node figures of one kind of node.
type stats struct {
	Nodes    int     `json:"nodes"`
	CPUP50   float64 `json:"cpu_pct_p50"` // percent of one core
	CPUP90   float64 `json:"cpu_pct_p90"`
	CPUMax   float64 `json:"cpu_pct_max"`
	RSSP50MB float64 `json:"rss_mb_p50"`
	RSSMaxMB float64 `json:"rss_mb_max"`
}

type config struct {
	bin, profile   string
	nodes, probes  int
	txsPerNode     int
	idle           time.Duration
	basePort       int
	keep           bool
	startParallel  int
	shaper         netlab.Shaper
	nice           int
	propagationMax time.Duration
}

func main() {
	var c config
	vals := flag.String("validators", "4,7", "validator counts, one network each (comma-separated)")
	flag.IntVar(&c.nodes, "nodes", 100, "node processes in each network, validators and the newcomer included")
	flag.StringVar(&c.bin, "bin", "bin/deepmarket", "the deepmarket binary the nodes run")
	flag.StringVar(&c.profile, "profile", "lan", "network profile (each node in a namespace of its own)")
	flag.IntVar(&c.probes, "probes", 20, "machines whose first offer's propagation is measured")
	flag.IntVar(&c.txsPerNode, "txs-per-node", 40, "transfers each node's account sends in the ledger load")
	flag.DurationVar(&c.idle, "idle", 60*time.Second, "how long the market at rest is measured")
	flag.IntVar(&c.basePort, "base-port", 31000, "first port of the testnet (4 per node)")
	flag.IntVar(&c.startParallel, "start-parallel", 8, "node processes started at once")
	flag.BoolVar(&c.keep, "keep", false, "keep each network's directory (its nodes' logs)")
	flag.IntVar(&c.nice, "nice", 19, "niceness of the full nodes' threads: the validators' CPU comes first, as if on machines of their own (0: all alike)")
	shaped := flag.Bool("shaped", false, "shape the links as the profile says (netem, else one userspace shaper for every link: the bottleneck at 100 nodes); default bare veth pairs")
	out := flag.String("out", "bench/results/scale.json", "where to write JSON results")
	flag.Parse()
	c.propagationMax = 90 * time.Second
	if !*shaped {
		c.shaper = netlab.ShaperNone
	}
	log.SetFlags(log.Ltime)
	if os.Geteuid() != 0 {
		log.Fatal("bench-scale needs root: every node runs in a network namespace of its own")
	}
	bin, err := filepath.Abs(c.bin)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := os.Stat(bin); err != nil {
		log.Fatalf("%v: build it first (make build)", err)
	}
	c.bin = bin
	var counts []int
	for _, s := range strings.Split(*vals, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || v < 1 || v >= c.nodes-c.probes-1 {
			log.Fatalf("-validators %q: want counts from 1 to fewer than the nodes less the probes", *vals)
		}
		counts = append(counts, v)
	}
	// Ctrl-C or a kill stops the nodes and removes the namespaces
	// (runNetwork's deferred Close) rather than leaving 100 processes.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var results []result
	for _, v := range counts {
		r, err := runNetwork(ctx, c, v)
		if err != nil {
			log.Printf("%d validators: %v", v, err)
			os.Exit(1)
		}
		results = append(results, r)
		printTable(results)
	}
	report := map[string]any{
		"what":    fmt.Sprintf("%d real node processes on one %d-core machine, each in a network namespace of its own (%s profile); every figure is the whole network's on this machine", c.nodes, runtime.NumCPU(), c.profile),
		"cpus":    runtime.NumCPU(),
		"results": results,
	}
	b, _ := json.MarshalIndent(report, "", "  ")
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(*out, append(b, '\n'), 0o644); err != nil {
		log.Fatal(err)
	}
	log.Printf("wrote %s", *out)
}

// runNetwork starts a network with v validators and measures it.
func runNetwork(ctx context.Context, c config, v int) (r result, err error) {
	r.Validators, r.Nodes, r.Profile = v, c.nodes, c.profile
	dir, err := os.MkdirTemp("", "dm-scale-")
	if err != nil {
		return r, err
	}
	if !c.keep {
		defer os.RemoveAll(dir)
	} else {
		log.Printf("keeping %s", dir)
	}
	tn := filepath.Join(dir, "tn")
	log.Printf("== %d validators, %d full nodes: init", v, c.nodes-v)
	m, err := testnet.Init(testnet.Params{Validators: v, Nodes: c.nodes - v, Out: tn, BasePort: c.basePort})
	if err != nil {
		return r, err
	}
	net, err := testnet.Start(ctx, tn, testnet.RunOptions{Binary: c.bin, Profile: c.profile, Lazy: true,
		Shaper: c.shaper, StartTimeout: 5 * time.Minute})
	if err != nil {
		return r, err
	}
	defer net.Close()
	if net.Lab != nil {
		r.Shaper = net.Lab.Shaper().String()
	}
	newcomer := len(m.Nodes) - 1
	all := make([]int, 0, len(m.Nodes))
	for i := range m.Nodes {
		all = append(all, i)
	}
	early := all[:newcomer]

	// Start: the validators first (the others dial them), then the rest,
	// a few at a time.
	t0 := time.Now()
	if err := launchAll(ctx, net, early[:v], c.startParallel, c.nice); err != nil {
		return r, err
	}
	if err := launchAll(ctx, net, early[v:], c.startParallel, c.nice); err != nil {
		return r, err
	}
	r.StartS = time.Since(t0).Seconds()
	log.Printf("   %d nodes up in %.0f s; waiting for every ledger replica", len(early), r.StartS)
	if err := waitSynced(ctx, net, early, 3*time.Minute); err != nil {
		return r, err
	}

	clients := make([]*api.Client, len(m.Nodes))
	for i := range m.Nodes {
		if clients[i], err = net.Client(i); err != nil && i != newcomer {
			return r, err
		}
	}

	// Offer propagation: the probes lend one after another.
	probes := early[v : v+c.probes]
	if err := propagation(ctx, &r, net, clients, early, probes, c.propagationMax); err != nil {
		return r, err
	}

	// The market at rest: every full node lends.
	lenders := early[v:]
	for _, i := range lenders[c.probes:] {
		if _, err := clients[i].SetLend(ctx, api.LendRequest{Cores: 1, MemBytes: 1 << 30}); err != nil {
			return r, fmt.Errorf("lend on %s: %w", m.Nodes[i].Name, err)
		}
	}
	if err := waitOffers(ctx, clients[0], len(lenders), 2*time.Minute); err != nil {
		return r, fmt.Errorf("%s: %w", m.Nodes[0].Name, err)
	}
	time.Sleep(10 * time.Second) // the lend calls' own work done
	if err := idle(ctx, &r, net, early, v, c.idle); err != nil {
		return r, err
	}
	r.Idle.Offers = len(lenders)

	// A newcomer's book.
	if err := newcomerBook(ctx, &r, net, newcomer, len(lenders), c.nice); err != nil {
		return r, err
	}

	// Ledger load through every node.
	if err := ledgerLoad(ctx, &r, net, all, v, c.txsPerNode); err != nil {
		return r, err
	}
	return r, nil
}

// launchAll starts the listed nodes, at most par at once, each waited for;
// a full node's threads are set to nice (see renice).
func launchAll(ctx context.Context, net *testnet.Network, nodes []int, par, nice int) error {
	sem := make(chan struct{}, par)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	var up atomic.Int32
	for _, i := range nodes {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			err := net.Launch(ctx, i)
			if err == nil && !net.Manifest.Nodes[i].Validator {
				err = renice(net.PID(i), nice)
			}
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
				return
			}
			if n := up.Add(1); n%20 == 0 {
				log.Printf("   %d of %d up", n, len(nodes))
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// waitSynced waits until every listed node's ledger is within a block of
// the highest.
func waitSynced(ctx context.Context, net *testnet.Network, nodes []int, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		hs := heights(ctx, net, nodes)
		top, behind := slices.Max(hs), 0
		for _, h := range hs {
			if h < 1 || h < top-1 {
				behind++
			}
		}
		if behind == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d ledger replicas still behind height %d after %s", behind, len(nodes), top, within)
		}
		time.Sleep(time.Second)
	}
}

// heights is each node's ledger height (-1 when it does not answer),
// asked of 16 nodes at a time: one by one, 100 busy nodes take minutes.
func heights(ctx context.Context, net *testnet.Network, nodes []int) []int64 {
	out := make([]int64, len(nodes))
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for k, i := range nodes {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			out[k] = net.Heights(ctx, []int{i})[0]
		})
	}
	wg.Wait()
	return out
}

// propagation has the probes lend, one every 300 ms, and collects when
// every other node received each probe's offer.
func propagation(ctx context.Context, r *result, net *testnet.Network, clients []*api.Client, receivers, probes []int, maxWait time.Duration) error {
	m := net.Manifest
	sentAt := map[string]time.Time{} // moniker → just before its lend call
	for _, i := range probes {
		sentAt[m.Nodes[i].Name] = time.Now()
		if _, err := clients[i].SetLend(ctx, api.LendRequest{Cores: 1, MemBytes: 1 << 30}); err != nil {
			return fmt.Errorf("lend on %s: %w", m.Nodes[i].Name, err)
		}
		time.Sleep(300 * time.Millisecond)
	}
	start := time.Now()
	type pair struct{ recv, machine string }
	first := map[pair]time.Time{}
	want := len(receivers)*len(probes) - len(probes) // a probe's own offer is not received
	var mu sync.Mutex
	for time.Since(start) < maxWait && len(first) < want {
		var wg sync.WaitGroup
		sem := make(chan struct{}, 16)
		for _, i := range receivers {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				offers, err := clients[i].Offers(qctx)
				if err != nil {
					return
				}
				mu.Lock()
				defer mu.Unlock()
				for _, o := range offers {
					if _, ok := sentAt[o.Moniker]; !ok || o.Self {
						continue
					}
					k := pair{m.Nodes[i].Name, o.Moniker}
					if _, ok := first[k]; !ok {
						first[k] = o.ReceivedAt
					}
				}
			})
		}
		wg.Wait()
		if len(first) < want {
			time.Sleep(time.Second)
		}
	}
	p := &r.Propagation
	p.Probes, p.WaitedS, p.Complete = len(probes), time.Since(start).Seconds(), len(first) == want
	p.Missing = want - len(first)
	var ds []float64
	var last time.Time
	for k, at := range first {
		ds = append(ds, float64(at.Sub(sentAt[k.machine]).Microseconds())/1000)
		if at.After(last) {
			last = at
		}
	}
	p.Samples = len(ds)
	p.P50Ms, p.P99Ms, p.MaxMs = quantile(ds, 0.5), quantile(ds, 0.99), quantile(ds, 1)
	if p.Complete {
		p.AllInS = last.Sub(sentAt[m.Nodes[probes[len(probes)-1]].Name]).Seconds()
	}
	log.Printf("   offer propagation: %d samples, p50 %.0f ms, p99 %.0f ms, max %.0f ms, %d missing", p.Samples, p.P50Ms, p.P99Ms, p.MaxMs, p.Missing)
	return nil
}

// waitOffers waits until c's book holds at least n offers.
func waitOffers(ctx context.Context, c *api.Client, n int, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		offers, err := c.Offers(ctx)
		if err == nil && len(offers) >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the book holds %d offers after %s, want %d", len(offers), within, n)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// idle measures every node's CPU and RSS over the window, and the block
// time over it.
func idle(ctx context.Context, r *result, net *testnet.Network, nodes []int, validators int, window time.Duration) error {
	rpc, err := net.RPC(0)
	if err != nil {
		return err
	}
	st, err := rpc.Status(ctx)
	if err != nil {
		return err
	}
	h0 := st.SyncInfo.LatestBlockHeight
	cpu0 := make([]time.Duration, len(nodes))
	for k, i := range nodes {
		cpu0[k] = procCPU(net.PID(i))
	}
	self0 := procCPU(os.Getpid())
	t0 := time.Now()
	log.Printf("   the market at rest: measuring %s", window)
	select {
	case <-time.After(window):
	case <-ctx.Done():
		return ctx.Err()
	}
	el := time.Since(t0)
	var vCPU, fCPU, vRSS, fRSS []float64
	var total, totalRSS float64
	for k, i := range nodes {
		pid := net.PID(i)
		if pid == 0 {
			return fmt.Errorf("%s exited: %s", net.Manifest.Nodes[i].Name, net.LogTail(i, 10))
		}
		pct := 100 * (procCPU(pid) - cpu0[k]).Seconds() / el.Seconds()
		rss := float64(procRSS(pid)) / (1 << 20)
		total += pct / 100
		totalRSS += rss
		if i < validators {
			vCPU, vRSS = append(vCPU, pct), append(vRSS, rss)
		} else {
			fCPU, fRSS = append(fCPU, pct), append(fRSS, rss)
		}
	}
	r.Idle.WindowS = el.Seconds()
	r.Idle.Validator = statsOf(vCPU, vRSS)
	r.Idle.Full = statsOf(fCPU, fRSS)
	r.Idle.TotalCores, r.Idle.TotalRSSMB = total, totalRSS
	r.Idle.BenchCores = (procCPU(os.Getpid()) - self0).Seconds() / el.Seconds()
	st, err = rpc.Status(ctx)
	if err != nil {
		return err
	}
	r.Idle.Blocks = int(st.SyncInfo.LatestBlockHeight - h0)
	log.Printf("   at rest: full node cpu p50 %.2f%% rss p50 %.0f MB; all nodes %.2f cores, %.1f GB; %d blocks",
		r.Idle.Full.CPUP50, r.Idle.Full.RSSP50MB, total, totalRSS/1024, r.Idle.Blocks)
	return nil
}

// newcomerBook starts node i and times its book and ledger catching up:
// to 90% of the offers, and to all of them, within newcomerWait.
func newcomerBook(ctx context.Context, r *result, net *testnet.Network, i, offers, nice int) error {
	t0 := time.Now()
	if err := net.Launch(ctx, i); err != nil {
		return err
	}
	r.Newcomer.UpS = time.Since(t0).Seconds()
	if err := renice(net.PID(i), nice); err != nil {
		return err
	}
	c, err := net.Client(i)
	if err != nil {
		return err
	}
	r.Newcomer.Offers = offers
	var ledger bool
	for time.Since(t0) < newcomerWait && (r.Newcomer.BookS == 0 || !ledger) && ctx.Err() == nil {
		if o, err := c.Offers(ctx); err == nil {
			r.Newcomer.Held = len(o)
			if r.Newcomer.Book90S == 0 && len(o)*10 >= offers*9 {
				r.Newcomer.Book90S = time.Since(t0).Seconds()
			}
			if r.Newcomer.BookS == 0 && len(o) >= offers {
				r.Newcomer.BookS = time.Since(t0).Seconds()
			}
		}
		if !ledger {
			hs := heights(ctx, net, []int{0, i})
			if hs[1] > 0 && hs[1] >= hs[0]-1 {
				ledger, r.Newcomer.LedgerS, r.Newcomer.HeightGap = true, time.Since(t0).Seconds(), hs[1]
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !ledger {
		return fmt.Errorf("the newcomer's ledger did not catch up in %s", newcomerWait)
	}
	log.Printf("   newcomer: up in %.1f s, 90%% of the offers in %s s, all in %s s (holds %d of %d), ledger at height %d in %.1f s",
		r.Newcomer.UpS, secs(r.Newcomer.Book90S), secs(r.Newcomer.BookS), r.Newcomer.Held, offers, r.Newcomer.HeightGap, r.Newcomer.LedgerS)
	return nil
}

// secs prints a time in seconds, or "-" for one not reached (0).
func secs(s float64) string {
	if s == 0 {
		return "-"
	}
	return strconv.FormatFloat(s, 'f', 1, 64)
}

// newcomerWait bounds the newcomer's catching up.
const newcomerWait = 3 * time.Minute

// ledgerLoad has every node's account send per transfers, in nonce order,
// through one validator's ledger RPC (account k through validator k mod
// validators, so that no gossip path reorders an account's nonces), and
// counts what committed: every node replicates every block.
func ledgerLoad(ctx context.Context, r *result, net *testnet.Network, nodes []int, validators, per int) error {
	m := net.Manifest
	type stream struct {
		via int
		txs [][]byte
	}
	streams := make([]stream, len(nodes))
	for k, i := range nodes {
		key, err := net.Home(i).LoadKey()
		if err != nil {
			return err
		}
		rpc, err := net.RPC(i)
		if err != nil {
			return err
		}
		q, err := rpc.ABCIQuery(ctx, "/account/"+string(key.Address()), nil)
		if err != nil {
			return fmt.Errorf("%s: account: %w", m.Nodes[i].Name, err)
		}
		var a ledger.Account
		if q.Response.Code == 0 {
			if err := json.Unmarshal(q.Response.Value, &a); err != nil {
				return err
			}
		}
		to := m.Nodes[nodes[(k+1)%len(nodes)]].Account
		s := stream{via: k % validators}
		for n := range per {
			tx, err := ledger.NewTx(key, m.ChainID, ledger.TypeTransfer, a.Nonce+uint64(n), &ledger.Transfer{To: to, Amount: 1, Memo: "scale"})
			if err != nil {
				return err
			}
			s.txs = append(s.txs, tx)
		}
		streams[k] = s
	}
	rpc0, err := net.RPC(0)
	if err != nil {
		return err
	}
	st, err := rpc0.Status(ctx)
	if err != nil {
		return err
	}
	h0 := st.SyncInfo.LatestBlockHeight
	var sent, refused atomic.Int64
	log.Printf("   ledger load: %d transfers from %d accounts through the %d validators", per*len(nodes), len(nodes), validators)
	t0 := time.Now()
	sendCtx, cancel := context.WithTimeout(ctx, loadSendMax)
	defer cancel()
	var wg sync.WaitGroup
	for _, s := range streams {
		wg.Go(func() {
			rpc, err := net.RPC(s.via)
			if err != nil {
				refused.Add(int64(len(s.txs)))
				return
			}
			for _, tx := range s.txs {
				for try := 0; ; try++ {
					if sendCtx.Err() != nil {
						refused.Add(1) // not sent within loadSendMax
						break
					}
					res, err := rpc.BroadcastTxSync(sendCtx, tx)
					if err == nil && res.Code == 0 {
						sent.Add(1)
						break
					}
					full := err != nil && strings.Contains(err.Error(), "full") || res != nil && strings.Contains(res.Log, "full")
					if !full || try == 50 {
						refused.Add(1)
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	want := int(sent.Load())
	// Count the load's transfers block by block until all are in, or no
	// block has added one for 30 s.
	committed, last, lastGrew := 0, h0, time.Now()
	var lastAt time.Time
	var blocks []time.Time
	for committed < want && time.Since(lastGrew) < 30*time.Second {
		st, err := rpc0.Status(ctx)
		if err != nil {
			return err
		}
		top := st.SyncInfo.LatestBlockHeight
		if top > last {
			times, txs, err := blockTimes(ctx, net, last+1, top)
			if err != nil {
				return err
			}
			for k, n := range txs {
				if n > 0 {
					committed += n
					lastAt = time.Now() // seen here: block times are the validators' clocks
					lastGrew = lastAt
				}
				if n > 0 { // blocks of the load: an empty one before it may be 30 s old
					blocks = append(blocks, times[k])
				}
			}
			last = top
		}
		time.Sleep(200 * time.Millisecond)
	}
	l := &r.Ledger
	l.Senders, l.Sent, l.Refused, l.Committed = len(nodes), want, int(refused.Load()), committed
	if !lastAt.IsZero() {
		l.WindowS = lastAt.Sub(t0).Seconds()
		l.TxPerS = float64(committed) / l.WindowS
	}
	l.Blocks = len(blocks)
	// A header's time is when its predecessor was committed (BFT time):
	// the first block of the load bears the time of the idle block
	// before it, so its interval is left out.
	iv := intervals(blocks)
	if len(iv) > 0 {
		iv = iv[1:]
	}
	l.MeanBlock = mean(iv)
	r.Blocks.Count = len(iv)
	r.Blocks.MeanS, r.Blocks.P50S, r.Blocks.P99S = mean(iv), quantile(iv, 0.5), quantile(iv, 0.99)
	log.Printf("   ledger: %d of %d committed in %.1f s: %.0f tx/s (%d refused)", committed, want, l.WindowS, l.TxPerS, l.Refused)
	return nil
}

// loadSendMax bounds the sending of the ledger load; what is not sent by
// then counts as refused.
const loadSendMax = 4 * time.Minute

// blockTimes are the header times and transaction counts of blocks from
// to to, from node 0's ledger.
func blockTimes(ctx context.Context, net *testnet.Network, from, to int64) ([]time.Time, []int, error) {
	rpc, err := net.RPC(0)
	if err != nil {
		return nil, nil, err
	}
	var times []time.Time
	var txs []int
	for lo := from; lo <= to; lo += 20 {
		hi := min(lo+19, to)
		res, err := rpc.BlockchainInfo(ctx, lo, hi)
		if err != nil {
			return nil, nil, err
		}
		metas := res.BlockMetas
		slices.SortFunc(metas, func(a, b *cmttypes.BlockMeta) int { return int(a.Header.Height - b.Header.Height) })
		for _, bm := range metas {
			times = append(times, bm.Header.Time)
			txs = append(txs, bm.NumTxs)
		}
	}
	return times, txs, nil
}

// renice sets every thread of process pid to nice. Threads the process
// makes later inherit it from the thread that makes them.
func renice(pid, nice int) error {
	if nice == 0 || pid == 0 {
		return nil
	}
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return err
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := syscall.Setpriority(syscall.PRIO_PROCESS, tid, nice); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("renice %d: %w", tid, err)
		}
	}
	return nil
}

// procCPU is a process's user and system time.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

// procRSS is a process's resident set in bytes.
func procRSS(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

func statsOf(cpu, rss []float64) stats {
	return stats{Nodes: len(cpu), CPUP50: quantile(cpu, 0.5), CPUP90: quantile(cpu, 0.9), CPUMax: quantile(cpu, 1),
		RSSP50MB: quantile(rss, 0.5), RSSMaxMB: quantile(rss, 1)}
}

func intervals(ts []time.Time) []float64 {
	var out []float64
	for k := 1; k < len(ts); k++ {
		out = append(out, ts[k].Sub(ts[k-1]).Seconds())
	}
	return out
}

func mean(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

// quantile is the q-quantile of v (nearest rank); 0 for none.
func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	k := int(q*float64(len(s))+0.999999) - 1
	return s[max(0, min(k, len(s)-1))]
}

func printTable(rs []result) {
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "validators\tnodes\tstart s\toffer p50 ms\tp99 ms\tmissing\tfull cpu% p50\tp90\tval cpu% p50\trss MB p50\tall cores\tall GB\tblock s\tnewcomer 90% s\tall s\tledger s\ttx/s\t")
	for _, r := range rs {
		fmt.Fprintf(w, "%d\t%d\t%.0f\t%.0f\t%.0f\t%d\t%.2f\t%.2f\t%.2f\t%.0f\t%.2f\t%.1f\t%.2f\t%s\t%s\t%.1f\t%.0f\t\n",
			r.Validators, r.Nodes, r.StartS, r.Propagation.P50Ms, r.Propagation.P99Ms, r.Propagation.Missing,
			r.Idle.Full.CPUP50, r.Idle.Full.CPUP90, r.Idle.Validator.CPUP50, r.Idle.Full.RSSP50MB,
			r.Idle.TotalCores, r.Idle.TotalRSSMB/1024, r.Blocks.MeanS, secs(r.Newcomer.Book90S), secs(r.Newcomer.BookS), r.Newcomer.LedgerS, r.Ledger.TxPerS)
	}
	w.Flush()
}
