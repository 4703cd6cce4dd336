package main

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"sync"
	"time"

	abci "github.com/cometbft/cometbft/abci/types"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/ledger"
)

// The state-size cases: the ledger's cost per block with 10k, 100k and 1M
// accounts in its state. Each size runs in a process of its own:
//
//   - the accounts come from genesis (every one funded, so every one a
//     member), through InitChain into a persistent app on disk
//     (ledger.OpenApp: the IAVL tree on goleveldb, synced commits), as a
//     real network's would; stateSenders of them have keys and send;
//   - each block is stateTxs pre-signed transfers;
//   - before each block CheckTx admits its transactions, as the mempool
//     would (that is where a validator checks signatures); then the block
//     runs through FinalizeBlock and Commit, and that time is the block's.
//
// Two loads run on each state, one after the other: "same load", each
// sender paying the next (the blocks change the same leaves whatever the
// state's size: the per-block cost must not grow with the state), then
// "cold", each transfer paying an account drawn at random from the whole
// state (every one a leaf no recent block touched: the cost grows with
// the tree's depth and with what no longer fits the caches).
//
// tx/s is stateTxs over the median block time: the app's own rate, with
// no consensus or network around it.

const (
	stateSenders = 256
	stateTxs     = 4000 // per block
	stateWarmup  = 3
	stateBlocks  = 20
)

// stateResult is one state size.
type stateResult struct {
	Accounts int        `json:"accounts"`
	GenesisS float64    `json:"genesis_s"` // InitChain and the first commit
	Same     stateBlock `json:"same_load"`
	Cold     stateBlock `json:"cold"`
	Disk     int64      `json:"disk_bytes"`
	Error    string     `json:"error,omitempty"`
}

// stateBlock is one load's blocks.
type stateBlock struct {
	BlockMs    float64 `json:"block_ms_median"`
	BlockP90Ms float64 `json:"block_ms_p90"`
	FinalizeMs float64 `json:"finalize_ms_median"`
	CommitMs   float64 `json:"commit_ms_median"`
	TPS        float64 `json:"tx_per_s"`
	Txs        int     `json:"txs_per_block"`
	Blocks     int     `json:"blocks"`
}

// fillerAddress is the address of filler account i: a hash, so fillers
// spread over the whole key space like real accounts.
func fillerAddress(i int) identity.Address {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(i))
	h := sha256.Sum256(b[:])
	return identity.AddressOf(h[:])
}

func stateSender(i int) *identity.Key { return seedKey(fmt.Sprintf("bench-state-sender-%d", i)) }

// runStateChild measures one state size in this process and writes its
// result to out.
func runStateChild(n int, dir, out string) {
	res := measureState(n, dir)
	b, _ := json.Marshal(res)
	if err := os.WriteFile(out, b, 0o600); err != nil {
		log.Fatal(err)
	}
}

func measureState(n int, dir string) stateResult {
	res := stateResult{Accounts: n}
	ctx := context.Background()
	senders := make([]*identity.Key, stateSenders)
	var g ledger.GenesisState
	for i := range senders {
		senders[i] = stateSender(i)
		g.Balances = append(g.Balances, ledger.GenesisBalance{Address: string(senders[i].Address()), Amount: genesisBalance})
	}
	for i := len(senders); i < n; i++ {
		g.Balances = append(g.Balances, ledger.GenesisBalance{Address: string(fillerAddress(i)), Amount: 1_000_000})
	}
	appState, err := json.Marshal(g)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	g = ledger.GenesisState{}
	// The blocks' transactions, signed before anything is timed: the same
	// load's, then the cold ones'.
	rng := rand.New(rand.NewPCG(uint64(n), 7))
	per := stateWarmup + stateBlocks
	blocks := make([][][]byte, 2*per)
	type job struct {
		b, i  int
		from  int
		to    identity.Address
		nonce uint64
	}
	var jobs []job
	nonces := make([]uint64, stateSenders)
	for b := range blocks {
		blocks[b] = make([][]byte, stateTxs)
		for i := 0; i < stateTxs; i++ {
			from := i % stateSenders
			to := senders[(from+1)%stateSenders].Address()
			if b >= per {
				to = fillerAddress(stateSenders + rng.IntN(n-stateSenders))
			}
			jobs = append(jobs, job{b: b, i: i, from: from, to: to, nonce: nonces[from]})
			nonces[from]++
		}
	}
	var wg sync.WaitGroup
	work := make(chan job, 1024)
	for w := 0; w < runtime.GOMAXPROCS(0); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range work {
				tx, err := ledger.NewTx(senders[j.from], chainID, ledger.TypeTransfer, j.nonce, &ledger.Transfer{To: string(j.to), Amount: 1})
				if err != nil {
					panic(err)
				}
				blocks[j.b][j.i] = tx
			}
		}()
	}
	for _, j := range jobs {
		work <- j
	}
	close(work)
	wg.Wait()

	appDir := filepath.Join(dir, "app")
	app, err := ledger.OpenApp(appDir, nil)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	defer app.Close()
	t0 := time.Now()
	val := validatorKey(0)
	if _, err := app.InitChain(ctx, &abci.RequestInitChain{ChainId: chainID, InitialHeight: 1, AppStateBytes: appState,
		Validators: []abci.ValidatorUpdate{abci.Ed25519ValidatorUpdate(val.Public(), 10)}}); err != nil {
		res.Error = err.Error()
		return res
	}
	appState = nil
	now := time.Unix(1_800_000_000, 0)
	height := int64(1)
	block := func(txs [][]byte) (fin, commit time.Duration, err error) {
		for _, tx := range txs {
			if r, err := app.CheckTx(ctx, &abci.RequestCheckTx{Tx: tx, Type: abci.CheckTxType_New}); err != nil || r.Code != 0 {
				return 0, 0, fmt.Errorf("CheckTx at height %d: %v %v", height, err, r.GetLog())
			}
		}
		start := time.Now()
		resp, err := app.FinalizeBlock(ctx, &abci.RequestFinalizeBlock{Txs: txs, Height: height, Time: now})
		if err != nil {
			return 0, 0, err
		}
		fin = time.Since(start)
		for _, r := range resp.TxResults {
			if r.Code != 0 {
				return 0, 0, fmt.Errorf("height %d: code %d: %s", height, r.Code, r.Log)
			}
		}
		start = time.Now()
		if _, err := app.Commit(ctx, &abci.RequestCommit{}); err != nil {
			return 0, 0, err
		}
		commit = time.Since(start)
		height++
		now = now.Add(time.Second)
		return fin, commit, nil
	}
	if _, _, err := block(nil); err != nil { // genesis is saved with the first block
		res.Error = err.Error()
		return res
	}
	res.GenesisS = time.Since(t0).Seconds()
	// Genesis wrote the whole state at once; goleveldb compacts it in the
	// background for a while, which no block of a running chain meets.
	time.Sleep(stateSettle(n))
	run := func(blocks [][][]byte) (stateBlock, error) {
		var total, fins, commits []float64
		for b, txs := range blocks {
			fin, commit, err := block(txs)
			if err != nil {
				return stateBlock{}, err
			}
			if b >= stateWarmup {
				fins = append(fins, ms(fin))
				commits = append(commits, ms(commit))
				total = append(total, ms(fin+commit))
			}
		}
		r := stateBlock{Txs: stateTxs, Blocks: len(total), BlockMs: quantile(total, 0.5), BlockP90Ms: quantile(total, 0.9),
			FinalizeMs: quantile(fins, 0.5), CommitMs: quantile(commits, 0.5)}
		r.TPS = float64(stateTxs) / (r.BlockMs / 1000)
		return r, nil
	}
	if res.Same, err = profiled(statePprof, n, "same", func() (stateBlock, error) { return run(blocks[:per]) }); err == nil {
		res.Cold, err = profiled(statePprof, n, "cold", func() (stateBlock, error) { return run(blocks[per:]) })
	}
	if err != nil {
		res.Error = err.Error()
		return res
	}
	if p := app.Verify(); len(p) > 0 {
		res.Error = fmt.Sprintf("state after the blocks: %v", p[0])
		return res
	}
	res.Disk = dirSize(appDir)
	return res
}

// statePprof, when set (-state-cpuprofile), is where each state-size
// case writes a CPU profile of each load's blocks: PREFIX-N-LOAD.prof.
var statePprof string

// profiled runs f under a CPU profile written to prefix-n-load.prof (none
// when prefix is empty).
func profiled(prefix string, n int, load string, f func() (stateBlock, error)) (stateBlock, error) {
	if prefix == "" {
		return f()
	}
	out, err := os.Create(fmt.Sprintf("%s-%d-%s.prof", prefix, n, load))
	if err != nil {
		return stateBlock{}, err
	}
	defer out.Close()
	if err := pprof.StartCPUProfile(out); err != nil {
		return stateBlock{}, err
	}
	defer pprof.StopCPUProfile()
	return f()
}

// stateSettle is how long the state-size case lets the store settle after
// genesis: a second per 20,000 accounts, at least 2 s.
func stateSettle(n int) time.Duration { return max(2*time.Second, time.Duration(n/20_000)*time.Second) }

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1))]
}

func dirSize(dir string) int64 {
	var n int64
	filepath.Walk(dir, func(_ string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			n += info.Size()
		}
		return nil
	})
	return n
}
