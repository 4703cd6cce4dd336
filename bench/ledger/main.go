// Command ledger is `make bench-ledger`: the credit ledger's throughput and
// commit latency under CometBFT, side by side with CometBFT's own kvstore
// example app under the same CometBFT configuration and the same load
// generator, on one validator and on four validators on loopback (all in
// one machine), then the audit's replay speed. It prints a table and writes
// JSON (-out, bench/results/ledger.json from make).
//
// Every app gets fresh chains (persistent apps, CometBFT defaults but for
// the mempool's limits, which are raised so that they never bind), each in
// a process of its own, and two phases of load:
//
//   - saturation: a closed loop. Workers send pre-made transactions with
//     BroadcastTxSync as fast as it returns while fewer than -inflight
//     (-inflight-multi on several validators) are uncommitted. tx/s counts
//     the transactions committed with code 0 in the blocks validator 0
//     committed during the window (-duration, after -warmup), over whole
//     block intervals.
//   - equal load: every app of a network is offered the same rate
//     (-rate-frac of the ledger's saturated tx/s on that network, on a
//     fresh chain), so that latencies compare like with like; at
//     saturation they mostly reflect how much each app lets queue up.
//
// Latency is from just before BroadcastTxSync to validator 0 answering
// BlockResults for the transaction's block, for the transactions sent
// during the window (at most -drain after it for the last ones).
//
// kvstore runs twice: with 1 KiB "key=value" transactions (its customary
// benchmark) and with transactions as long as the ledger's signed transfers
// (~175 B), which is the fair comparison; ratios are given to both.
//
// The ledger's load is transfers between -accounts funded accounts, signed
// beforehand, each account's in nonce order from one worker. On several
// validators a mempool can hold an account's transactions out of order;
// the ledger's PrepareProposal puts them back in nonce order. Any that
// still fail in a block are counted and the account's stream goes on from
// its committed nonce, as a client would (see load.go).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// caseResult is one app on one network: its saturation phase, and its
// phase at the offered load every app of that network gets.
type caseResult struct {
	Case       string       `json:"case"`
	Validators int          `json:"validators"`
	App        string       `json:"app"`
	TxBytes    float64      `json:"tx_bytes"`
	Saturation phaseResult  `json:"saturation"`
	EqualLoad  *phaseResult `json:"equal_load,omitempty"`
	Error      string       `json:"error,omitempty"`
}

// goal is one of the ratios the ledger is held to.
type goal struct {
	Name      string  `json:"name"`
	Reference string  `json:"reference"`
	Value     float64 `json:"value"`
	Goal      string  `json:"goal"`
	Pass      bool    `json:"pass"`
}

// settings are the command's flags; a case's process gets the same.
type settings struct {
	duration, warmup, latDuration, latWarmup, drain time.Duration
	rate, rateFrac                                  float64
	workers, accounts, ledgerTxs                    int
	mempool, inflight, inflightMulti                int
	indexer, vals, apps, out, cpuprofile            string
	keep                                            bool
	child                                           string
	stateSizes                                      string
	stateChild                                      int
	childDir, childOut                              string
}

// childSpec is what one case's process runs (see runChild).
type childSpec struct {
	Validators int     `json:"validators"`
	Kind       appKind `json:"kind"`
	Rate       float64 `json:"rate"`   // of the equal-load phase
	Phases     string  `json:"phases"` // "eq", "sat" or "eq,sat", in order
	TxFile     string  `json:"tx_file"`
	SameSize   int     `json:"same_size"`
	Dir        string  `json:"dir"`
	Out        string  `json:"out"`
}

// childOut is what it hands back.
type childOut struct {
	Result caseResult     `json:"result"`
	Audit  map[string]any `json:"audit,omitempty"`
}

func main() {
	var st settings
	flag.DurationVar(&st.duration, "duration", 12*time.Second, "measured window of each saturation phase")
	flag.DurationVar(&st.warmup, "warmup", 3*time.Second, "load before each measured window")
	flag.DurationVar(&st.latDuration, "latency-duration", 6*time.Second, "measured window of each equal-load phase")
	flag.DurationVar(&st.latWarmup, "latency-warmup", 2*time.Second, "load before each equal-load window")
	flag.DurationVar(&st.drain, "drain", 8*time.Second, "how long after a window its last txs may take to commit")
	flag.Float64Var(&st.rate, "rate", 0, "offered tx/s of the equal-load phases (0: -rate-frac times the ledger's saturated tx/s on that network)")
	flag.Float64Var(&st.rateFrac, "rate-frac", 0.5, "see -rate")
	flag.IntVar(&st.workers, "workers", 16, "load goroutines (spread over the validators)")
	flag.IntVar(&st.accounts, "accounts", 512, "funded ledger accounts = independent tx streams (kvstore gets as many streams)")
	flag.IntVar(&st.ledgerTxs, "ledger-txs", 0, "transfers to pre-sign (0: enough for 26,000 tx/s)")
	flag.IntVar(&st.mempool, "mempool", 200_000, "CometBFT mempool size (txs), for every app")
	flag.IntVar(&st.inflight, "inflight", 30_000, "most txs the load generator keeps broadcast and not yet committed, one validator (0: no limit)")
	flag.IntVar(&st.inflightMulti, "inflight-multi", 10_000, "the same for networks of several validators")
	flag.StringVar(&st.indexer, "indexer", "kv", "CometBFT tx indexer for every app: kv (ledger.StartChain's) or null")
	flag.StringVar(&st.vals, "validators", "1,4", "network sizes to run")
	flag.StringVar(&st.apps, "apps", "ledger,kv1k,kvsame", "apps to run, in order: ledger, kv1k, kvsame (ledger first: it sets the equal load)")
	flag.StringVar(&st.out, "out", "bench/results/ledger.json", "where to write JSON results")
	flag.StringVar(&st.cpuprofile, "cpuprofile", "", "write CPU profiles of each case's process to this prefix")
	flag.BoolVar(&st.keep, "keep", false, "keep the chains' directories")
	flag.BoolVar(&verbose, "v", false, "print every block the watcher sees")
	flag.StringVar(&st.child, "child", "", "internal: run one case (JSON spec) in this process")
	flag.StringVar(&st.stateSizes, "state-sizes", "10000,100000,1000000", "accounts in the state for the per-block cases (empty: none)")
	flag.StringVar(&statePprof, "state-cpuprofile", "", "write CPU profiles of each state-size case's blocks to this prefix (-N-same.prof, -N-cold.prof)")
	flag.IntVar(&st.stateChild, "state-child", 0, "internal: run one state-size case in this process")
	flag.StringVar(&st.childDir, "child-dir", "", "internal: the state-size case's directory")
	flag.StringVar(&st.childOut, "child-out", "", "internal: where the state-size case writes its result")
	flag.Parse()
	if st.child != "" {
		runChild(st)
		return
	}
	if st.stateChild > 0 {
		runStateChild(st.stateChild, st.childDir, st.childOut)
		return
	}

	var sizes []int
	for _, s := range strings.Split(st.vals, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			log.Fatalf("-validators: bad size %q", s)
		}
		sizes = append(sizes, n)
	}
	var kinds []appKind
	for _, a := range strings.Split(st.apps, ",") {
		switch strings.TrimSpace(a) {
		case "":
		case "kv1k":
			kinds = append(kinds, appKV1K)
		case "kvsame":
			kinds = append(kinds, appKVSame)
		case "ledger":
			kinds = append(kinds, appLedger)
		default:
			log.Fatalf("-apps: unknown app %q", a)
		}
	}
	if st.ledgerTxs == 0 {
		// The saturation phase uses the most (the equal-load phase runs on
		// a chain of its own and sends the same transactions again).
		const peak = 26_000
		st.ledgerTxs = int(peak * (st.warmup + st.duration).Seconds())
	}

	root, err := os.MkdirTemp("", "bench-ledger-")
	if err != nil {
		log.Fatal(err)
	}
	if !st.keep {
		defer os.RemoveAll(root)
	} else {
		fmt.Println("chains in", root)
	}
	self, err := os.Executable()
	if err != nil {
		log.Fatal(err)
	}

	t0 := time.Now()
	ls := newLedgerSource(st.accounts, st.ledgerTxs)
	sameSize := int(ls.meanSize() + 0.5)
	txFile := filepath.Join(root, "ledger-txs.bin")
	if err := ls.save(txFile); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("signed %d transfers over %d accounts in %v (mean %.1f B); each case runs in its own process\n",
		ls.count, st.accounts, time.Since(t0).Round(time.Millisecond), ls.meanSize())
	ledgerBytes := ls.meanSize()
	ls = nil

	var results []caseResult
	var auditRes map[string]any
	for _, n := range sizes {
		rate := st.rate
		for _, k := range kinds {
			run := func(phases string) *childOut {
				name := fmt.Sprintf("%d-%d-%s", n, k, strings.ReplaceAll(phases, ",", "-"))
				spec := childSpec{Validators: n, Kind: k, Rate: rate, Phases: phases, TxFile: txFile, SameSize: sameSize,
					Dir: filepath.Join(root, name), Out: filepath.Join(root, name+".json")}
				out, err := runCase(self, spec)
				if err != nil {
					fmt.Println("  failed:", err)
					out = &childOut{Result: caseResult{Case: caseName(n), Validators: n, App: k.String(), Error: err.Error()}}
				}
				return out
			}
			var out *childOut
			if k == appLedger {
				// Saturation first: it sets the equal load of this
				// network, which then runs on a fresh chain, as for the
				// others.
				out = run("sat")
				if st.rate == 0 && out.Result.Error == "" {
					rate = st.rateFrac * out.Result.Saturation.TPS
				}
				if rate > 0 && out.Result.Error == "" {
					eq := run("eq")
					out.Result.EqualLoad = eq.Result.EqualLoad
				}
			} else {
				out = run("eq,sat")
			}
			results = append(results, out.Result)
			if out.Audit != nil {
				auditRes = out.Audit
			}
		}
	}

	var states []stateResult
	for _, f := range strings.Split(st.stateSizes, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= stateSenders {
			log.Fatalf("-state-sizes: bad size %q (more than %d)", f, stateSenders)
		}
		fmt.Printf("state of %d accounts: genesis, then %d blocks of %d transfers of the same load, %d of cold ones:\n", n, stateBlocks, stateTxs, stateBlocks)
		r := runStateCase(self, n, filepath.Join(root, fmt.Sprintf("state-%d", n)))
		if r.Error != "" {
			fmt.Println("  failed:", r.Error)
		} else {
			for _, l := range []struct {
				name string
				b    stateBlock
			}{{"same load", r.Same}, {"cold", r.Cold}} {
				fmt.Printf("  %-9s block %.1f ms median (p90 %.1f; FinalizeBlock %.1f + Commit %.1f), %.0f tx/s\n",
					l.name+":", l.b.BlockMs, l.b.BlockP90Ms, l.b.FinalizeMs, l.b.CommitMs, l.b.TPS)
			}
			fmt.Printf("  genesis %.1fs; %d MiB on disk\n", r.GenesisS, r.Disk>>20)
		}
		states = append(states, r)
	}

	goals := printTable(results)
	goals = append(goals, printStateTable(states)...)
	fmt.Println()
	if auditRes != nil {
		fmt.Println("audit:", auditRes["summary"])
	} else {
		fmt.Println("audit: not run (it runs after the 1-validator ledger case)")
	}
	cc := chainConfig{mempool: st.mempool, indexer: st.indexer}
	res := map[string]any{
		"when": time.Now().UTC().Format(time.RFC3339), "go": runtime.Version(), "cpus": runtime.NumCPU(),
		"config": describeConfig(cc),
		"load": map[string]any{
			"workers": st.workers, "streams": st.accounts, "inflight_1_validator": st.inflight, "inflight_more_validators": st.inflightMulti,
			"warmup_s": st.warmup.Seconds(), "duration_s": st.duration.Seconds(),
			"equal_load_warmup_s": st.latWarmup.Seconds(), "equal_load_duration_s": st.latDuration.Seconds(),
			"drain_s": st.drain.Seconds(), "ledger_txs_signed": st.ledgerTxs, "ledger_tx_bytes": ledgerBytes,
			"broadcast":  "BroadcastTxSync through the nodes' local RPC clients; mempool-full answers retried after 5 ms",
			"saturation": "closed loop: workers send as fast as BroadcastTxSync returns while fewer than inflight txs are uncommitted",
			"equal_load": "every app of a network gets the same offered rate (rate-frac of the ledger's saturated tx/s), paced per worker",
			"isolation":  "each case runs in a fresh process, on a fresh chain, one after the other",
		},
		"cases": results, "goals": goals, "audit": auditRes,
		"state_size": map[string]any{
			"method": fmt.Sprintf("ledger.OpenApp on disk; the accounts come from genesis (all funded, so members); per load %d blocks "+
				"of %d pre-signed transfers from %d senders after %d warm-up blocks; same load: each sender pays the next (the same leaves "+
				"whatever the state's size); cold: each pays an account drawn at random from the whole state; CheckTx admits each block's "+
				"transactions first (signatures are checked there, as a validator's mempool does), then FinalizeBlock + Commit are timed; "+
				"no consensus or network", stateBlocks, stateTxs, stateSenders, stateWarmup),
			"cases": states,
		},
	}
	if err := os.MkdirAll(filepath.Dir(st.out), 0o755); err == nil {
		b, _ := json.MarshalIndent(res, "", "  ")
		if err := os.WriteFile(st.out, b, 0o644); err != nil {
			log.Printf("write %s: %v", st.out, err)
		} else {
			fmt.Println("results:", st.out)
		}
	}
}

// runStateCase runs one state size in a child process (the same binary).
func runStateCase(self string, n int, dir string) stateResult {
	out := dir + ".json"
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return stateResult{Accounts: n, Error: err.Error()}
	}
	defer os.RemoveAll(dir)
	cmd := exec.Command(self, "-state-child", strconv.Itoa(n), "-child-dir", dir, "-child-out", out, "-state-cpuprofile", statePprof)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	runErr := cmd.Run()
	raw, err := os.ReadFile(out)
	if err != nil {
		if runErr != nil {
			err = runErr
		}
		return stateResult{Accounts: n, Error: err.Error()}
	}
	var r stateResult
	if err := json.Unmarshal(raw, &r); err != nil {
		return stateResult{Accounts: n, Error: err.Error()}
	}
	return r
}

// printStateTable prints the state-size cases with their ratios to the
// smallest, and returns the goal: the same load's block time flat within
// 20 % (the cold load's ratio is information).
func printStateTable(states []stateResult) []goal {
	if len(states) == 0 {
		return nil
	}
	fmt.Println()
	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "accounts\tload\tblock ms\tp90 ms\tFinalizeBlock ms\tCommit ms\ttx/s\tblock ms / smallest state\ttx/s / smallest state\tgenesis s\tdisk MiB\t")
	base := states[0]
	for _, r := range states {
		if r.Error != "" {
			fmt.Fprintf(tw, "%d\tfailed: %s\t\t\t\t\t\t\t\t\t\t\n", r.Accounts, r.Error)
			continue
		}
		for _, l := range []struct {
			name    string
			b, base stateBlock
		}{{"same load", r.Same, base.Same}, {"cold", r.Cold, base.Cold}} {
			fmt.Fprintf(tw, "%d\t%s\t%.1f\t%.1f\t%.1f\t%.1f\t%.0f\t%s\t%s\t%.1f\t%d\t\n", r.Accounts, l.name, l.b.BlockMs, l.b.BlockP90Ms,
				l.b.FinalizeMs, l.b.CommitMs, l.b.TPS, f2(ratio(l.b.BlockMs, l.base.BlockMs)), f2(ratio(l.b.TPS, l.base.TPS)), r.GenesisS, r.Disk>>20)
		}
	}
	tw.Flush()
	last := states[len(states)-1]
	if base.Error != "" || last.Error != "" || len(states) < 2 {
		return nil
	}
	name := fmt.Sprintf("per-block time, %d accounts / %d accounts", last.Accounts, base.Accounts)
	ref := fmt.Sprintf("%d accounts", base.Accounts)
	v, c := ratio(last.Same.BlockMs, base.Same.BlockMs), ratio(last.Cold.BlockMs, base.Cold.BlockMs)
	return []goal{
		{Name: name + ", same load", Reference: ref, Value: v, Goal: "<= 1.2 (flat within 20 %)", Pass: v <= 1.2},
		{Name: name + ", cold accounts", Reference: ref, Value: c, Goal: "(information)", Pass: true},
	}
}

func caseName(n int) string {
	if n == 1 {
		return "1 validator"
	}
	return fmt.Sprintf("%d validators", n)
}

// runCase runs one case in a child process: the same binary and flags plus
// -child. A process per case keeps cases from sharing heaps and goroutines,
// and lets the child exit without stopping its nodes: stopping validators
// can trip a CometBFT race (a consensus reactor goroutine reading the closed
// block store) that panics the whole process.
func runCase(self string, spec childSpec) (*childOut, error) {
	b, _ := json.Marshal(spec)
	args := append(slices.Clone(os.Args[1:]), "-child", string(b))
	cmd := exec.Command(self, args...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	runErr := cmd.Run()
	raw, err := os.ReadFile(spec.Out)
	if err != nil {
		if runErr != nil {
			return nil, fmt.Errorf("case process: %v", runErr)
		}
		return nil, err
	}
	var out childOut
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// runChild runs one case, writes its result and exits without stopping the
// nodes (see runCase).
func runChild(st settings) {
	var spec childSpec
	if err := json.Unmarshal([]byte(st.child), &spec); err != nil {
		log.Fatal(err)
	}
	if st.cpuprofile != "" {
		f, err := os.Create(fmt.Sprintf("%s-%d-%s-%s.prof", st.cpuprofile, spec.Validators, strings.ReplaceAll(spec.Kind.String(), " ", "-"), strings.ReplaceAll(spec.Phases, ",", "-")))
		if err != nil {
			log.Fatal(err)
		}
		pprof.StartCPUProfile(f)
	}
	ctx := context.Background()
	n, k := spec.Validators, spec.Kind
	var src source
	var size float64
	accounts := ledgerAccounts(st.accounts)
	switch k {
	case appKV1K:
		src, size = newKVSource(st.accounts, 1024), 1024
	case appKVSame:
		src, size = newKVSource(st.accounts, spec.SameSize), float64(spec.SameSize)
	case appLedger:
		ls, err := loadLedgerSource(spec.TxFile, st.accounts)
		if err != nil {
			log.Fatal(err)
		}
		src, size = ls, ls.meanSize()
	}
	inflight := st.inflight
	if n > 1 {
		inflight = st.inflightMulti
	}
	sat := loadOpts{workers: st.workers, inflight: inflight, warmup: st.warmup, duration: st.duration, drain: st.drain}
	eq := loadOpts{workers: st.workers, inflight: inflight, rate: spec.Rate, warmup: st.latWarmup, duration: st.latDuration, drain: st.drain}
	cc := chainConfig{mempool: st.mempool, indexer: st.indexer}

	out := childOut{Result: caseResult{Case: caseName(n), Validators: n, App: k.String(), TxBytes: size}}
	r := &out.Result
	write := func() {
		if st.cpuprofile != "" {
			pprof.StopCPUProfile()
		}
		b, _ := json.Marshal(out)
		if err := os.WriteFile(spec.Out, b, 0o600); err != nil {
			log.Fatal(err)
		}
		os.Exit(0)
	}
	what := "saturation"
	if spec.Phases == "eq" {
		what = "equal load"
	} else if spec.Phases != "sat" {
		what = "equal load, then saturation"
	}
	fmt.Printf("%s, %s (%.0f B txs), %s:\n", r.Case, k, size, what)
	nw, err := startNetwork(ctx, spec.Dir, n, k, genesisOf(accounts), cc)
	if err != nil {
		fmt.Println("  failed:", err)
		r.Error = err.Error()
		write()
	}
	// The equal load comes first, on an empty mempool: saturation leaves a
	// backlog behind.
	for _, phase := range strings.Split(spec.Phases, ",") {
		switch phase {
		case "eq":
			if eq.rate > 0 {
				p := runLoad(ctx, nw, src, eq)
				r.EqualLoad = &p
				report("at "+strconv.FormatFloat(eq.rate, 'f', 0, 64)+" tx/s", p)
			}
		case "sat":
			r.Saturation = runLoad(ctx, nw, src, sat)
			report("saturation", r.Saturation)
			if k == appLedger && n == 1 {
				if st.cpuprofile != "" { // the audit's own profile
					pprof.StopCPUProfile()
					f, err := os.Create(st.cpuprofile + "-audit.prof")
					if err != nil {
						log.Fatal(err)
					}
					pprof.StartCPUProfile(f)
				}
				out.Audit = audit(ctx, nw)
			}
		}
	}
	write()
}

func report(what string, p phaseResult) {
	fmt.Printf("  %-18s %6.0f tx/s committed, p50 %5.0f ms, p99 %5.0f ms (%d blocks, %.0f tx/block, %.0f ms/block, %.2f cores busy)\n",
		what+":", p.TPS, p.P50ms, p.P99ms, p.Blocks, p.TxsPerBlock, p.BlockMs, p.CPUCores)
	if p.Error != "" {
		fmt.Println("    first error:", p.Error)
	}
}

func find(results []caseResult, n int, app appKind) *caseResult {
	for i := range results {
		if results[i].Validators == n && results[i].App == app.String() && results[i].Error == "" {
			return &results[i]
		}
	}
	return nil
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func printTable(results []caseResult) []goal {
	fmt.Println()
	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "case\tapp\ttx B\ttx/s sat.\tp50 ms sat.\tp99 ms sat.\ttx/block\tcores\tequal load tx/s\tp50 ms\tp99 ms\ttx/s ours/kv same\ttx/s ours/kv 1KiB\tp50 ours/kv same\t")
	for _, r := range results {
		if r.Error != "" {
			fmt.Fprintf(tw, "%s\t%s\t%.0f\tfailed: %s\t\t\t\t\t\t\t\t\t\t\t\n", r.Case, r.App, r.TxBytes, r.Error)
			continue
		}
		s := r.Saturation
		eqRate, eq50, eq99 := "-", "-", "-"
		if e := r.EqualLoad; e != nil {
			eqRate, eq50, eq99 = f0(e.Rate), f0(e.P50ms), f0(e.P99ms)
		}
		r1, r2, r3 := "-", "-", "-"
		if r.App == appLedger.String() {
			if kv := find(results, r.Validators, appKVSame); kv != nil {
				r1 = f2(ratio(s.TPS, kv.Saturation.TPS))
				if r.EqualLoad != nil && kv.EqualLoad != nil {
					r3 = f2(ratio(r.EqualLoad.P50ms, kv.EqualLoad.P50ms))
				}
			}
			if kv := find(results, r.Validators, appKV1K); kv != nil {
				r2 = f2(ratio(s.TPS, kv.Saturation.TPS))
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.2f\t%s\t%s\t%s\t%s\t%s\t%s\t\n",
			r.Case, r.App, r.TxBytes, s.TPS, s.P50ms, s.P99ms, s.TxsPerBlock, s.CPUCores, eqRate, eq50, eq99, r1, r2, r3)
	}
	tw.Flush()

	var goals []goal
	add := func(n int, ref appKind, what string, ours, kv float64, g string, pass func(float64) bool) {
		v := ratio(ours, kv)
		goals = append(goals, goal{
			Name:      fmt.Sprintf("%d validator(s): %s, ours / kvstore", n, what),
			Reference: ref.String(), Value: v, Goal: g, Pass: kv > 0 && pass(v),
		})
	}
	for _, n := range []int{1, 4} {
		ours := find(results, n, appLedger)
		if ours == nil {
			continue
		}
		for _, ref := range []appKind{appKVSame, appKV1K} {
			kv := find(results, n, ref)
			if kv == nil {
				continue
			}
			if n == 1 {
				add(n, ref, "tx/s at saturation", ours.Saturation.TPS, kv.Saturation.TPS, ">= 0.8 (stretch 0.9)", func(v float64) bool { return v >= 0.8 })
			} else {
				add(n, ref, "tx/s at saturation", ours.Saturation.TPS, kv.Saturation.TPS, ">= 0.9", func(v float64) bool { return v >= 0.9 })
				if ours.EqualLoad != nil && kv.EqualLoad != nil {
					add(n, ref, "p50 latency at equal load", ours.EqualLoad.P50ms, kv.EqualLoad.P50ms, "<= 1.2", func(v float64) bool { return v <= 1.2 })
				}
				add(n, ref, "p50 latency at saturation", ours.Saturation.P50ms, kv.Saturation.P50ms, "(information)", func(float64) bool { return true })
			}
		}
	}
	if len(goals) > 0 {
		fmt.Println()
		tw = tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "goal\treference\tratio\tgoal\tpass\t")
		for _, g := range goals {
			fmt.Fprintf(tw, "%s\t%s\t%.2f\t%s\t%v\t\n", g.Name, g.Reference, g.Value, g.Goal, g.Pass)
		}
		tw.Flush()
	}
	for _, r := range results {
		phases := []struct {
			name string
			p    *phaseResult
		}{{"saturation", &r.Saturation}, {"equal load", r.EqualLoad}}
		for _, ph := range phases {
			p := ph.p
			if p == nil {
				continue
			}
			var notes []string
			if p.Exhausted {
				notes = append(notes, "the pre-signed workload ran out (raise -ledger-txs): tx/s is a lower bound")
			}
			if p.Uncommitted > 0 {
				notes = append(notes, fmt.Sprintf("%d txs of the window not committed within the drain (missing from the latencies)", p.Uncommitted))
			}
			if p.Rejected > 0 || p.FailedExec > 0 || p.Resyncs > 0 {
				notes = append(notes, fmt.Sprintf("%d failed in blocks, %d streams resent from the committed nonce, %d rejected for good; first: %s",
					p.FailedExec, p.Resyncs, p.Rejected, p.Error))
			}
			if p.MempoolFull > 0 {
				notes = append(notes, fmt.Sprintf("%d mempool-full retries", p.MempoolFull))
			}
			if p.Rate > 0 && p.Behind > 1000 {
				notes = append(notes, fmt.Sprintf("the generator fell up to %.0f ms behind its schedule", p.Behind))
			}
			if len(notes) > 0 {
				fmt.Printf("  %s, %s, %s: %s\n", r.Case, r.App, ph.name, strings.Join(notes, "; "))
			}
		}
	}
	return goals
}

func f0(v float64) string { return strconv.FormatFloat(v, 'f', 0, 64) }
func f2(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }

func cometVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, m := range bi.Deps {
			if m.Path == "github.com/cometbft/cometbft" {
				return m.Version
			}
		}
	}
	return "unknown"
}
