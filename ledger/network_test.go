package ledger

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	cfg "github.com/cometbft/cometbft/config"
	"github.com/cometbft/cometbft/p2p"

	"github.com/deepmarket/deepmarket/identity"
)

// dropStalePeers disconnects the live validators from a stopped one that
// they still count as a peer.
//
// A peer that reconnects to a node while its Chain.Stop is under way can
// be accepted by the node's transport after its switch stopped: CometBFT
// v0.40.0's Switch.addPeer (p2p/switch.go, "Won't start a peer - switch
// is not running") then returns nil, so acceptRoutine neither starts nor
// closes the connection. In a process that exits the OS closes it; in this
// one it stays open, the peer keeps the stopped node in its peer set, and
// refuses the restarted node (same ID) as a duplicate until the stale
// connection dies some 30 s later.
func dropStalePeers(t *testing.T, live []*testValidator, stopped *testValidator) {
	t.Helper()
	id := p2p.ID(NodeIDOf(stopped.key))
	for _, v := range live {
		sw := v.chain.node.Switch()
		if p := sw.Peers().Get(id); p != nil {
			t.Logf("%s still had the stopped %s as a peer: disconnecting", v.dir, stopped.dir)
			sw.StopPeerForError(p, "the node was stopped")
		}
	}
}

// netConfig is fastBlocks, and keeps CometBFT's consensus reactor from
// reading a stopped node's block store. Its per-peer queryMaj23Routine
// (consensus/reactor.go) checks that the node runs, sleeps
// PeerQueryMaj23SleepDuration (2 s) between steps, then may call
// LoadCommit; if the node stopped meanwhile, the closed store panics
// ("leveldb: closed") and takes the whole test binary down. With the sleep
// an hour long it reads the store only right after a peer connects.
func netConfig(c *cfg.Config) {
	fastBlocks(c)
	c.Consensus.PeerQueryMaj23SleepDuration = time.Hour
}

// netAccount is a funded account that submits its transactions through
// one validator, so that its nonces reach that validator's mempool in order.
type netAccount struct {
	key   *identity.Key
	nonce uint64
}

// submit signs a transfer with the account's next nonce and broadcasts it
// through v; CheckTx must admit it. It returns the tx hash.
func (a *netAccount) submit(ctx context.Context, t *testing.T, v *testValidator, to identity.Address, amount uint64) []byte {
	t.Helper()
	tx, err := NewTx(a.key, testChain, TypeTransfer, a.nonce, &Transfer{To: string(to), Amount: amount, Memo: fmt.Sprintf("net %d", a.nonce)})
	if err != nil {
		t.Fatal(err)
	}
	res, err := v.chain.Client().BroadcastTxSync(ctx, tx)
	if err != nil || res.Code != CodeOK {
		t.Fatalf("broadcast nonce %d of %s: %v %+v", a.nonce, a.key.Address(), err, res)
	}
	a.nonce++
	h := TxHash(tx)
	return h[:]
}

// waitTxs waits until every tx is committed with code OK on every
// validator of vs, as its own tx index reports it.
func waitTxs(ctx context.Context, t *testing.T, vs []*testValidator, hashes [][]byte) {
	t.Helper()
	for _, v := range vs {
		cl := v.chain.Client()
		for _, h := range hashes {
			for {
				r, err := cl.Tx(ctx, h, false)
				if err == nil {
					if r.TxResult.Code != CodeOK {
						t.Fatalf("%s: tx %X committed at %d with code %d: %s", v.dir, h, r.Height, r.TxResult.Code, r.TxResult.Log)
					}
					break
				}
				select {
				case <-ctx.Done():
					t.Fatalf("%s: tx %X never committed (height %d): %v", v.dir, h, v.chain.Height(), err)
				case <-time.After(25 * time.Millisecond):
				}
			}
		}
	}
}

// waitAll waits until every validator of vs has committed height h.
func waitAll(ctx context.Context, t *testing.T, vs []*testValidator, h int64) {
	t.Helper()
	for _, v := range vs {
		if err := v.chain.WaitHeight(ctx, h); err != nil {
			t.Fatalf("%s: %v", v.dir, err)
		}
	}
}

func minHeight(vs []*testValidator) int64 {
	m := vs[0].chain.Height()
	for _, v := range vs[1:] {
		m = min(m, v.chain.Height())
	}
	return m
}

func heights(vs []*testValidator) []int64 {
	out := make([]int64, len(vs))
	for i, v := range vs {
		out[i] = v.chain.Height()
	}
	return out
}

// checkAgreement checks that every validator of vs has the same block at
// each height from 1 to upTo (no fork), and that each one's own app
// computed the same app hash for it, the one the next block's header
// carries.
func checkAgreement(ctx context.Context, t *testing.T, vs []*testValidator, upTo int64) {
	t.Helper()
	for h := int64(1); h <= upTo; h++ {
		var blockHash, appHash []byte
		for i, v := range vs {
			cl := v.chain.Client()
			b, err := cl.Block(ctx, &h)
			if err != nil || b.Block == nil {
				t.Fatalf("%s: block %d: %v", v.dir, h, err)
			}
			br, err := cl.BlockResults(ctx, &h)
			if err != nil {
				t.Fatalf("%s: block results %d: %v", v.dir, h, err)
			}
			if i == 0 {
				blockHash, appHash = b.BlockID.Hash, br.AppHash
				continue
			}
			if !bytes.Equal(b.BlockID.Hash, blockHash) {
				t.Fatalf("fork at height %d: %s has block %X, %s has %X", h, vs[0].dir, blockHash, v.dir, b.BlockID.Hash)
			}
			if !bytes.Equal(br.AppHash, appHash) {
				t.Fatalf("app hash after block %d: %s computed %X, %s computed %X", h, vs[0].dir, appHash, v.dir, br.AppHash)
			}
		}
		if h >= 2 {
			prev := h - 1
			pr, err := vs[0].chain.Client().BlockResults(ctx, &prev)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := vs[0].chain.Client().Block(ctx, &h)
			if !bytes.Equal(b.Block.Header.AppHash, pr.AppHash) {
				t.Fatalf("header %d carries app hash %X, the apps computed %X after block %d", h, b.Block.Header.AppHash, pr.AppHash, prev)
			}
		}
	}
}

// checkApps checks each validator's app against the chain and the
// expected balances: the app's committed state hashes to its AppHash, that
// is the hash the next block's header carries, the books balance, and
// every account holds what the committed transfers left it.
func checkApps(ctx context.Context, t *testing.T, vs []*testValidator, want map[identity.Address]uint64) {
	t.Helper()
	for _, v := range vs {
		st := v.app.Snapshot()
		if problems := v.app.Verify(); len(problems) > 0 {
			t.Fatalf("%s: state at %d: %v", v.dir, st.Height, problems)
		}
		next := st.Height + 1
		if err := v.chain.WaitHeight(ctx, next); err != nil {
			t.Fatalf("%s: %v", v.dir, err)
		}
		b, err := v.chain.Client().Block(ctx, &next)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b.Block.Header.AppHash, st.AppHash) {
			t.Fatalf("%s: app at height %d has hash %X, header %d says %X", v.dir, st.Height, st.AppHash, next, b.Block.Header.AppHash)
		}
		for a, bal := range want {
			got := uint64(0)
			if acct, ok := st.Accounts[string(a)]; ok {
				got = acct.Balance
			}
			if got != bal {
				t.Fatalf("%s: balance of %s at height %d is %d, want %d", v.dir, a, st.Height, got, bal)
			}
		}
	}
}

// TestNetworkFourValidatorsToleratesOneFailure runs four validators of
// equal power on loopback. Transactions commit everywhere and every app
// computes the same hashes; with one validator down the other three go on;
// with two down (half the power, under the 2/3 quorum) the chain halts
// without forking; when one comes back it catches up and the chain resumes.
func TestNetworkFourValidatorsToleratesOneFailure(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a four-validator network")
	}
	issuer := key(t, 1)
	accts := make([]*netAccount, 4)
	funds := map[*identity.Key]uint64{}
	want := map[identity.Address]uint64{}
	for i := range accts {
		accts[i] = &netAccount{key: key(t, byte(10+i))}
		funds[accts[i].key] = 1000 * credit
		want[accts[i].key.Address()] = 1000 * credit
	}
	vals, doc := startValidators(t, 4, genesis(issuer, funds))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	t0 := time.Now()
	phase := func(name string) {
		hs := make([]int64, len(vals))
		for i, v := range vals {
			if hs[i] = -1; v.chain != nil {
				hs[i] = v.chain.Height()
			}
		}
		t.Logf("%5.1fs %s: heights %v", time.Since(t0).Seconds(), name, hs)
	}

	// transfers has account i send rounds transfers to account i+1
	// through validator vs[i%len(vs)], and waits until all of them are
	// committed on every validator of vs.
	transfers := func(vs []*testValidator, rounds int) {
		t.Helper()
		var hashes [][]byte
		for r := 0; r < rounds; r++ {
			for i, a := range accts {
				to := accts[(i+1)%len(accts)].key.Address()
				amount := uint64(i+1) * credit
				hashes = append(hashes, a.submit(ctx, t, vs[i%len(vs)], to, amount))
				want[a.key.Address()] -= amount
				want[to] += amount
			}
		}
		waitTxs(ctx, t, vs, hashes)
	}

	// All four: transactions commit on every validator, with one history
	// and one state.
	waitAll(ctx, t, vals, 2)
	transfers(vals, 3)
	checkAgreement(ctx, t, vals, minHeight(vals)-1)
	checkApps(ctx, t, vals, want)
	phase("four validators agree")

	// One down: the other three hold 30 of 40 votes, over 2/3.
	vals[3].stop()
	live := vals[:3]
	h := minHeight(live)
	waitAll(ctx, t, live, h+5)
	phase("three go on")
	transfers(live, 3)
	checkAgreement(ctx, t, live, minHeight(live)-1)
	checkApps(ctx, t, live, want)
	phase("three agree")

	// Two down: 20 of 40 votes, no quorum. Whatever height was being
	// decided when the second one stopped settles within a second; then
	// no block is made, and a new transaction is admitted but not
	// committed.
	stoppedAt := vals[2].app.Snapshot().Height
	vals[2].stop()
	live = vals[:2]
	time.Sleep(time.Second)
	stalled := heights(live)
	pending := accts[0].submit(ctx, t, vals[0], accts[1].key.Address(), 7)
	want[accts[0].key.Address()] -= 7
	want[accts[1].key.Address()] += 7
	time.Sleep(3 * time.Second)
	if now := heights(live); fmt.Sprint(now) != fmt.Sprint(stalled) {
		t.Fatalf("blocks made without a quorum: heights %v, then %v", stalled, now)
	}
	if r, err := vals[0].chain.Client().Tx(ctx, pending, false); err == nil {
		t.Fatalf("tx committed without a quorum at height %d", r.Height)
	}
	checkAgreement(ctx, t, live, minHeight(live))
	phase("two halted")

	// One back: 30 of 40 again. It catches up from its own directories
	// and the others, and the chain goes on, pending tx included.
	dropStalePeers(t, live, vals[2])
	vals[2].start(t, doc, vals)
	if h := vals[2].app.Snapshot().Height; h < stoppedAt {
		t.Fatalf("restarted app is at height %d, it had committed %d", h, stoppedAt)
	}
	phase("restarted one")
	live = vals[:3]
	waitAll(ctx, t, live, max(stalled[0], stalled[1])+3)
	phase("three go on again")
	waitTxs(ctx, t, live, [][]byte{pending})
	transfers(live, 2)
	checkAgreement(ctx, t, live, minHeight(live)-1)
	checkApps(ctx, t, live, want)
	phase("three agree again")
	for _, v := range live {
		t.Logf("%s: height %d, app hash %s", v.dir, v.chain.Height(), hex.EncodeToString(v.app.Snapshot().AppHash)[:16])
	}
}
