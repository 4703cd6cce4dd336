package ledger

import (
	"bytes"
	"context"
	"testing"
	"time"

	abci "github.com/cometbft/cometbft/abci/types"

	"github.com/deepmarket/deepmarket/identity"
)

const testChain = "deepmarket-ledger-test"

func key(t testing.TB, b byte) *identity.Key {
	t.Helper()
	k, err := identity.KeyFromSeed(bytes.Repeat([]byte{b}, 32))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// harness drives an app with whole blocks, as CometBFT does, and checks
// every invariant after each.
type harness struct {
	t      testing.TB
	app    *App
	height int64
	now    time.Time
	nonces map[identity.Address]uint64
	// updates are the validator updates the last block returned.
	updates []abci.ValidatorUpdate
}

func newHarness(t testing.TB, app *App, g GenesisState) *harness {
	t.Helper()
	return newHarnessWith(t, app, g, nil)
}

// newHarnessWith starts the chain with genesis validators.
func newHarnessWith(t testing.TB, app *App, g GenesisState, vals []abci.ValidatorUpdate) *harness {
	t.Helper()
	if app == nil {
		app = NewMemoryApp(nil)
	}
	raw, _ := jsonMarshal(g)
	if _, err := app.InitChain(context.Background(), &abci.RequestInitChain{ChainId: testChain, InitialHeight: 1, AppStateBytes: raw, Validators: vals}); err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, app: app, now: time.Unix(1_800_000_000, 0), nonces: map[identity.Address]uint64{}}
}

// tx signs msg with k's next nonce (as far as this harness knows).
func (h *harness) tx(k *identity.Key, typ string, msg any) []byte {
	h.t.Helper()
	n := h.nonces[k.Address()]
	b, err := NewTx(k, testChain, typ, n, msg)
	if err != nil {
		h.t.Fatal(err)
	}
	h.nonces[k.Address()] = n + 1
	return b
}

// block runs one block through FinalizeBlock and Commit and checks the
// invariants and the returned app hash.
func (h *harness) block(txs ...[]byte) []*abci.ExecTxResult {
	h.t.Helper()
	h.height++
	h.now = h.now.Add(5 * time.Second)
	resp, err := h.app.FinalizeBlock(context.Background(), &abci.RequestFinalizeBlock{Txs: txs, Height: h.height, Time: h.now})
	if err != nil {
		h.t.Fatal(err)
	}
	h.updates = resp.ValidatorUpdates
	if _, err := h.app.Commit(context.Background(), &abci.RequestCommit{}); err != nil {
		h.t.Fatal(err)
	}
	// The full check: every invariant, the books kept block by block,
	// and every leaf of the store against the state.
	if problems := h.app.Verify(); len(problems) > 0 {
		h.t.Fatalf("invariants broken after block %d: %v", h.height, problems)
	}
	info, err := h.app.Info(context.Background(), &abci.RequestInfo{})
	if err != nil {
		h.t.Fatal(err)
	}
	if info.LastBlockHeight != h.height || !bytes.Equal(resp.AppHash, info.LastBlockAppHash) {
		h.t.Fatalf("block %d: the app committed height %d with hash %X, FinalizeBlock returned %X", h.height, info.LastBlockHeight, info.LastBlockAppHash, resp.AppHash)
	}
	st := h.app.Snapshot()
	// Next transactions use the committed nonces (rejected ones used none).
	for a := range h.nonces {
		h.nonces[a] = 0
		if acct, ok := st.Accounts[string(a)]; ok {
			h.nonces[a] = acct.Nonce
		}
	}
	return resp.TxResults
}

// closeWindows runs an empty block one dispute window after the last: the
// escrows settled until then close in it.
func (h *harness) closeWindows() {
	h.t.Helper()
	h.now = h.now.Add(time.Duration(h.app.Snapshot().Params.DisputeWindow) * time.Second)
	h.block()
}

// must runs a block and fails unless every tx succeeded.
func (h *harness) must(txs ...[]byte) {
	h.t.Helper()
	for i, r := range h.block(txs...) {
		if r.Code != CodeOK {
			h.t.Fatalf("tx %d rejected: code %d: %s", i, r.Code, r.Log)
		}
	}
}

func (h *harness) balance(a identity.Address) uint64 {
	if acct, ok := h.app.Snapshot().Accounts[string(a)]; ok {
		return acct.Balance
	}
	return 0
}

// hash is the app hash after the last block.
func (h *harness) hash() []byte { return h.app.Snapshot().AppHash }

// consent signs machine's consent to earn for owner, as its link is now.
func (h *harness) consent(machine *identity.Key, owner identity.Address) LinkConsent {
	h.t.Helper()
	st := h.app.Snapshot()
	l := st.link(string(machine.Address()))
	return SignLinkConsent(machine, testChain, owner, Registration{Owner: l.Owner, Changed: l.Changed, Height: st.Height}, h.now.Unix()+600)
}
