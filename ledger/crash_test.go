package ledger

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	abci "github.com/cometbft/cometbft/abci/types"
	cfg "github.com/cometbft/cometbft/config"
	rpclocal "github.com/cometbft/cometbft/rpc/client/local"
	sm "github.com/cometbft/cometbft/state"
	"github.com/cometbft/cometbft/store"
	cmttypes "github.com/cometbft/cometbft/types"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/wire"
)

// The crash test runs a single validator in a child process (this test
// binary, re-executed to run TestCrashChild only) and kills it with SIGKILL
// while it commits under load, several times, then restarts the node in
// this process from the same directories and checks that nothing
// committed was lost and that the app and CometBFT agree.

const (
	crashAccounts = 4
	crashFunds    = 1_000_000 // each account's genesis balance
	crashRecord   = "committed.txt"
	crashMarker   = "DMCRASH "
)

func crashKeys(t testing.TB) (validator *identity.Key, accounts []*identity.Key) {
	for i := 0; i < crashAccounts; i++ {
		accounts = append(accounts, key(t, byte(210+i)))
	}
	return key(t, 200), accounts
}

func crashGenesis(t testing.TB) *cmttypes.GenesisDoc {
	val, accts := crashKeys(t)
	funds := map[*identity.Key]uint64{}
	for _, k := range accts {
		funds[k] = crashFunds
	}
	doc, err := NewGenesis(testChain, []GenesisValidator{{Name: "v0", PubKey: val.Public(), Power: 10}}, genesis(key(t, 1), funds))
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

// selfKillingApp kills its own process with SIGKILL at a chosen moment,
// once armed: "finalize" after FinalizeBlock executed the block (the block
// is stored, the app has not committed it), "commit" right after the app's
// Commit persisted it (CometBFT has not yet saved its state for it).
type selfKillingApp struct {
	*App
	mode string
	at   atomic.Int64 // height from which to kill; 0: disarmed
}

func (a *selfKillingApp) FinalizeBlock(ctx context.Context, req *abci.RequestFinalizeBlock) (*abci.ResponseFinalizeBlock, error) {
	resp, err := a.App.FinalizeBlock(ctx, req)
	if at := a.at.Load(); a.mode == "finalize" && at > 0 && req.Height >= at {
		selfKill(a.mode, req.Height)
	}
	return resp, err
}

func (a *selfKillingApp) Commit(ctx context.Context, req *abci.RequestCommit) (*abci.ResponseCommit, error) {
	resp, err := a.App.Commit(ctx, req)
	if at := a.at.Load(); a.mode == "commit" && at > 0 {
		if h := a.App.Snapshot().Height; h >= at {
			selfKill(a.mode, h)
		}
	}
	return resp, err
}

func selfKill(mode string, height int64) {
	fmt.Printf(crashMarker+"selfkill mode=%s height=%d\n", mode, height)
	p, err := os.FindProcess(os.Getpid())
	if err == nil {
		p.Kill() // SIGKILL
	}
	select {} // never return into CometBFT
}

// TestCrashChild is the validator process of TestKillNineResumesAtSameAppHash;
// it does nothing unless that test runs it.
func TestCrashChild(t *testing.T) {
	if os.Getenv("DM_CRASH_CHILD") != "1" {
		t.Skip("helper process of TestKillNineResumesAtSameAppHash")
	}
	dir := os.Getenv("DM_CRASH_DIR")
	doc, err := cmttypes.GenesisDocFromFile(filepath.Join(dir, "config", "genesis.json"))
	if err != nil {
		t.Fatal(err)
	}
	app, err := OpenApp(filepath.Join(dir, "app"), nil)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf(crashMarker+"open app=%d\n", app.Snapshot().Height)
	wrapped := &selfKillingApp{App: app, mode: os.Getenv("DM_CRASH_MODE")}
	val, accts := crashKeys(t)
	chain, err := StartChain(ChainParams{
		Dir: dir, Key: val, Genesis: doc, App: wrapped, P2PListen: os.Getenv("DM_CRASH_P2P"), Configure: fastBlocks,
	})
	if err != nil {
		t.Fatal(err)
	}
	start := chain.Height()
	fmt.Printf(crashMarker+"ready app=%d store=%d\n", app.Snapshot().Height, start)
	if wrapped.mode != "" {
		wrapped.at.Store(start + 5)
	}
	rec, err := os.OpenFile(filepath.Join(dir, crashRecord), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i, k := range accts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			crashLoad(ctx, chain.Client(), k, accts[(i+1)%len(accts)].Address(), os.Getenv("DM_CRASH_RUN"), func(hash string) {
				mu.Lock()
				defer mu.Unlock()
				if _, err := rec.WriteString(hash + "\n"); err != nil {
					panic(err)
				}
			})
		}()
	}
	wg.Wait()
	// The parent kills this process long before: returning is a failure.
	t.Fatal("not killed")
}

// crashLoad sends transfers of 1 from one account to another, keeping up
// to 8 in the mempool, and records each hash once the node's tx index has
// it committed with code OK. Whenever something goes wrong (a rejection, a
// tx that takes too long) it forgets its pending txs and starts again from
// the account's committed nonce.
func crashLoad(ctx context.Context, cl *rpclocal.Local, from *identity.Key, to identity.Address, run string, record func(string)) {
	type pend struct {
		hash []byte
		sent time.Time
	}
	var pending []pend
	var nonce uint64
	synced := false
	for ctx.Err() == nil {
		if !synced {
			pending = nil
			time.Sleep(100 * time.Millisecond)
			q, err := cl.ABCIQuery(ctx, "/account/"+string(from.Address()), nil)
			var a Account
			if err != nil || json.Unmarshal(q.Response.Value, &a) != nil {
				continue
			}
			nonce, synced = a.Nonce, true
		}
		for synced && len(pending) < 8 {
			tx, err := NewTx(from, testChain, TypeTransfer, nonce, &Transfer{To: string(to), Amount: 1, Memo: fmt.Sprintf("run %s nonce %d", run, nonce)})
			if err != nil {
				panic(err)
			}
			res, err := cl.BroadcastTxSync(ctx, tx)
			if err != nil || res.Code != CodeOK {
				synced = false
				break
			}
			h := TxHash(tx)
			pending = append(pending, pend{h[:], time.Now()})
			nonce++
		}
		time.Sleep(20 * time.Millisecond)
		for synced && len(pending) > 0 {
			r, err := cl.Tx(ctx, pending[0].hash, false)
			if err != nil {
				if time.Since(pending[0].sent) > 5*time.Second {
					synced = false
				}
				break
			}
			if r.TxResult.Code != CodeOK {
				fmt.Printf(crashMarker+"rejected %X code %d: %s\n", pending[0].hash, r.TxResult.Code, r.TxResult.Log)
				synced = false
				break
			}
			record(fmt.Sprintf("%X", pending[0].hash))
			pending = pending[1:]
		}
	}
}

// crashChild is one run of the child process.
type crashChild struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  []string
	mark chan string // lines with crashMarker, marker stripped
	done chan struct{}
}

func startCrashChild(ctx context.Context, t *testing.T, dir string, run int, mode string) *crashChild {
	t.Helper()
	c := &crashChild{mark: make(chan string, 100), done: make(chan struct{})}
	c.cmd = exec.CommandContext(ctx, os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1", "-test.timeout=2m")
	c.cmd.Env = append(os.Environ(), "DM_CRASH_CHILD=1", "DM_CRASH_DIR="+dir, "DM_CRASH_MODE="+mode,
		fmt.Sprintf("DM_CRASH_RUN=%d", run), fmt.Sprintf("DM_CRASH_P2P=tcp://127.0.0.1:%d", freePort(t)))
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	c.cmd.Stdout, c.cmd.Stderr = w, w
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	go func() {
		defer close(c.done)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			line := sc.Text()
			c.mu.Lock()
			c.out = append(c.out, line)
			c.mu.Unlock()
			if m, ok := strings.CutPrefix(line, crashMarker); ok {
				select {
				case c.mark <- m:
				default:
				}
			}
		}
		io.Copy(io.Discard, r)
		r.Close()
		c.cmd.Wait()
	}()
	return c
}

func (c *crashChild) output() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.out, "\n")
}

// expect waits for the next marker line, which must start with prefix.
func (c *crashChild) expect(t *testing.T, prefix string, timeout time.Duration) string {
	t.Helper()
	deadline := time.After(timeout)
	exited := false
	for {
		var m string
		select {
		case m = <-c.mark:
		case <-c.done:
			// Every line is in c.mark once the child's output ended.
			select {
			case m = <-c.mark:
			default:
				exited = true
			}
		case <-deadline:
			c.cmd.Process.Kill()
			<-c.done
			t.Fatalf("child did not say %q within %v; output:\n%s", prefix, timeout, c.output())
		}
		switch {
		case exited:
			t.Fatalf("child ended (%v) before saying %q; output:\n%s", c.cmd.ProcessState, prefix, c.output())
		case strings.HasPrefix(m, "rejected "):
			t.Logf("child: %s", m)
		case strings.HasPrefix(m, prefix):
			return m
		default:
			c.cmd.Process.Kill()
			<-c.done
			t.Fatalf("child said %q, want %q; output:\n%s", m, prefix, c.output())
		}
	}
}

// killed waits for the child to end and checks that a signal ended it.
func (c *crashChild) killed(t *testing.T) {
	t.Helper()
	<-c.done
	if ps := c.cmd.ProcessState; ps == nil || ps.Exited() {
		t.Fatalf("child was not killed: %v; output:\n%s", ps, c.output())
	}
}

// storeHeights reads CometBFT's block store height and its state (the
// last height it saved state for, and the app hash after it) from dir.
func storeHeights(t *testing.T, dir string) (block, state int64, appHash []byte) {
	t.Helper()
	c := cfg.DefaultConfig()
	c.SetRoot(dir)
	bdb, err := cfg.DefaultDBProvider(&cfg.DBContext{ID: "blockstore", Config: c})
	if err != nil {
		t.Fatal(err)
	}
	bs := store.NewBlockStore(bdb)
	block = bs.Height()
	bs.Close()
	sdb, err := cfg.DefaultDBProvider(&cfg.DBContext{ID: "state", Config: c})
	if err != nil {
		t.Fatal(err)
	}
	ss := sm.NewStore(sdb, sm.StoreOptions{})
	defer ss.Close()
	st, err := ss.Load()
	if err != nil {
		t.Fatal(err)
	}
	return block, st.LastBlockHeight, st.AppHash
}

// TestKillNineResumesAtSameAppHash kills a validator process with SIGKILL
// while it commits transfers, at varied moments and, deterministically,
// just before the app commits a block and just after (before CometBFT saves
// its state), then restarts it: it must start, its app and CometBFT must
// agree on height and app hash, every transaction it reported committed
// must still be committed, and the books must balance.
func TestKillNineResumesAtSameAppHash(t *testing.T) {
	if testing.Short() {
		t.Skip("kills and restarts a validator process several times")
	}
	dir := t.TempDir()
	doc := crashGenesis(t)
	if err := os.MkdirAll(filepath.Join(dir, "config"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := doc.SaveAs(filepath.Join(dir, "config", "genesis.json")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	t0 := time.Now()

	// Each run: the child starts (replaying what the last crash left),
	// then dies: the parent kills it delay after it is ready (or, early,
	// after it opened its app: while it starts and replays), or it kills
	// itself in mode at the fifth block after it started.
	runs := []struct {
		delay time.Duration
		early bool
		mode  string
	}{
		{0, false, ""},
		{0, false, "commit"},
		{700 * time.Millisecond, false, ""},
		{0, false, "finalize"},
		{50 * time.Millisecond, true, ""},
		{1300 * time.Millisecond, false, ""},
		{0, false, "commit"},
		{150 * time.Millisecond, true, ""},
		{2 * time.Second, false, ""},
		{0, false, "finalize"},
		{400 * time.Millisecond, false, ""},
		{1000 * time.Millisecond, false, ""},
		{250 * time.Millisecond, false, ""},
	}
	var appAtOpen int64
	type after struct {
		mode         string
		block, state int64
	}
	var prev *after
	// checkCrash checks what a crash left against the app's height
	// when it is next opened: the app commits a block after CometBFT
	// stored it and before CometBFT saves its state for it.
	checkCrash := func(app int64) {
		t.Helper()
		if prev == nil {
			return
		}
		b, s := prev.block, prev.state
		if !(s <= app && app <= b && b <= s+1) {
			t.Fatalf("after a crash (mode %q): block store %d, CometBFT state %d, app %d", prev.mode, b, s, app)
		}
		switch {
		case prev.mode == "commit" && !(app == b && b == s+1):
			t.Fatalf("killed right after the app's Commit: block store %d, state %d, app %d; want app = store = state+1", b, s, app)
		case prev.mode == "finalize" && !(app == s && b == s+1):
			t.Fatalf("killed before the app's Commit: block store %d, state %d, app %d; want app = state = store-1", b, s, app)
		}
		t.Logf("crash (mode %q) left block store %d, state %d, app %d", prev.mode, b, s, app)
	}
	for i, r := range runs {
		c := startCrashChild(ctx, t, dir, i, r.mode)
		open := c.expect(t, "open ", 20*time.Second)
		if _, err := fmt.Sscanf(open, "open app=%d", &appAtOpen); err != nil {
			t.Fatalf("%q: %v", open, err)
		}
		checkCrash(appAtOpen)
		if r.early {
			time.Sleep(r.delay)
			c.cmd.Process.Kill()
		} else if c.expect(t, "ready ", 20*time.Second); r.mode != "" {
			c.expect(t, "selfkill ", 20*time.Second)
		} else {
			time.Sleep(r.delay)
			c.cmd.Process.Kill()
		}
		c.killed(t)
		b, s, _ := storeHeights(t, dir)
		prev = &after{mode: r.mode, block: b, state: s}
		if r.early {
			prev.mode = "early"
		}
	}
	t.Logf("%.1fs: %d runs killed", time.Since(t0).Seconds(), len(runs))

	// Restart in this process from the same directories.
	app, err := OpenApp(filepath.Join(dir, "app"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	checkCrash(app.Snapshot().Height)
	val, accts := crashKeys(t)
	chain, err := StartChain(ChainParams{
		Dir: dir, Key: val, Genesis: doc, App: app, P2PListen: fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t)), Configure: fastBlocks,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer chain.Stop()
	cl := chain.Client()
	if h := app.Snapshot().Height; h < prev.block {
		t.Fatalf("after the handshake the app is at %d, the block store was at %d", h, prev.block)
	}
	if err := chain.WaitHeight(ctx, prev.block+3); err != nil {
		t.Fatal(err)
	}

	// Every tx a child saw committed is still committed.
	raw, err := os.ReadFile(filepath.Join(dir, crashRecord))
	if err != nil {
		t.Fatal(err)
	}
	recorded := 0
	last := map[string]uint64{} // the highest recorded nonce of each account, plus one
	for _, line := range strings.Split(string(raw), "\n") {
		h, err := hex.DecodeString(line)
		if err != nil || len(h) != 32 {
			continue // a line cut by a kill
		}
		r, err := cl.Tx(ctx, h, false)
		if err != nil {
			t.Fatalf("tx %s was reported committed before a crash, now: %v", line, err)
		}
		if r.TxResult.Code != CodeOK || r.Height > chain.Height() {
			t.Fatalf("tx %s was reported committed before a crash, now at height %d with code %d", line, r.Height, r.TxResult.Code)
		}
		var tx Tx
		if err := wire.Unmarshal(r.Tx, &tx); err != nil {
			t.Fatal(err)
		}
		signer := string(identity.AddressOf(tx.Signer))
		last[signer] = max(last[signer], tx.Nonce+1)
		recorded++
	}
	if recorded == 0 {
		t.Fatal("no transaction was committed in any run")
	}

	// The app's state is the one the chain committed to, and balances.
	st := app.Snapshot()
	if problems := app.Verify(); len(problems) > 0 {
		t.Fatalf("state at %d: %v", st.Height, problems)
	}
	next := st.Height + 1
	if err := chain.WaitHeight(ctx, next); err != nil {
		t.Fatal(err)
	}
	b, err := cl.Block(ctx, &next)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b.Block.Header.AppHash, st.AppHash) {
		t.Fatalf("app at %d has hash %X, header %d carries %X", st.Height, st.AppHash, next, b.Block.Header.AppHash)
	}
	// Every transfer moved 1 and used one nonce, so the nonces tell the
	// balances; and no recorded nonce is above the account's.
	for i, k := range accts {
		a, from := st.Accounts[string(k.Address())], st.Accounts[string(accts[(i+crashAccounts-1)%crashAccounts].Address())]
		if a.Nonce < last[string(k.Address())] {
			t.Fatalf("%s: nonce %d, but a tx with nonce %d was committed", k.Address(), a.Nonce, last[string(k.Address())]-1)
		}
		if want := crashFunds - a.Nonce + from.Nonce; a.Balance != want {
			t.Fatalf("%s: balance %d, want %d (sent %d, received %d)", k.Address(), a.Balance, want, a.Nonce, from.Nonce)
		}
	}
	// Observation only: committed txs missing from CometBFT's tx index
	// (it indexes after saving its state, so a crash in between loses
	// the index of that block's txs for good).
	unindexed := map[int64]int{}
	for h := int64(1); h <= st.Height; h++ {
		blk, err := cl.Block(ctx, &h)
		if err != nil {
			t.Fatal(err)
		}
		res, err := cl.BlockResults(ctx, &h)
		if err != nil {
			t.Fatal(err)
		}
		for j, tx := range blk.Block.Txs {
			if res.TxsResults[j].Code != CodeOK {
				continue
			}
			if _, err := cl.Tx(ctx, tx.Hash(), false); err != nil {
				unindexed[h]++
			}
		}
	}

	// Stopped, CometBFT's stores and the app are at the same height and
	// hash.
	if err := chain.Stop(); err != nil {
		t.Fatal(err)
	}
	final := app.Snapshot()
	blockH, stateH, stateHash := storeHeights(t, dir)
	if blockH != final.Height || stateH != final.Height || !bytes.Equal(stateHash, final.AppHash) {
		t.Fatalf("stopped: block store %d, state %d with app hash %X; app %d with %X", blockH, stateH, stateHash, final.Height, final.AppHash)
	}
	t.Logf("%.1fs: %d recorded txs committed; height %d; committed txs missing from the tx index (height: count) %v; nonces %v",
		time.Since(t0).Seconds(), recorded, final.Height, unindexed, func() []uint64 {
			var n []uint64
			for _, k := range accts {
				n = append(n, final.Accounts[string(k.Address())].Nonce)
			}
			return n
		}())
}
