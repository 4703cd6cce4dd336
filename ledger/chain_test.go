package ledger

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"time"

	cfg "github.com/cometbft/cometbft/config"
	cmttypes "github.com/cometbft/cometbft/types"

	"github.com/deepmarket/deepmarket/identity"
)

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// fastBlocks shortens CometBFT's timeouts for tests on loopback.
func fastBlocks(c *cfg.Config) {
	c.Consensus.TimeoutCommit = 100 * time.Millisecond
	c.Consensus.TimeoutPropose = 500 * time.Millisecond
	c.Consensus.TimeoutPrevote = 200 * time.Millisecond
	c.Consensus.TimeoutPrecommit = 200 * time.Millisecond
}

type testValidator struct {
	key   *identity.Key
	dir   string
	p2p   int
	app   *App
	chain *Chain
}

// startValidators makes n validators of one network on loopback, each with
// a persistent app in its own directory, and starts them.
func startValidators(t testing.TB, n int, g GenesisState) ([]*testValidator, *cmttypes.GenesisDoc) {
	t.Helper()
	vals := make([]*testValidator, n)
	var gv []GenesisValidator
	root := t.TempDir()
	for i := range vals {
		k := key(t, byte(100+i))
		vals[i] = &testValidator{key: k, dir: filepath.Join(root, fmt.Sprintf("v%d", i)), p2p: freePort(t)}
		gv = append(gv, GenesisValidator{Name: fmt.Sprintf("v%d", i), PubKey: k.Public(), Power: 10})
	}
	doc, err := NewGenesis(testChain, gv, g)
	if err != nil {
		t.Fatal(err)
	}
	for i := range vals {
		vals[i].start(t, doc, vals)
	}
	t.Cleanup(func() {
		for _, v := range vals {
			v.stop()
		}
	})
	return vals, doc
}

func (v *testValidator) start(t testing.TB, doc *cmttypes.GenesisDoc, all []*testValidator) {
	t.Helper()
	app, err := OpenApp(filepath.Join(v.dir, "app"), nil)
	if err != nil {
		t.Fatal(err)
	}
	var peers []string
	for _, o := range all {
		if o != v {
			peers = append(peers, fmt.Sprintf("%s@127.0.0.1:%d", NodeIDOf(o.key), o.p2p))
		}
	}
	chain, err := StartChain(ChainParams{
		Dir: v.dir, Key: v.key, Genesis: doc, App: app, P2PListen: fmt.Sprintf("tcp://127.0.0.1:%d", v.p2p),
		Peers: peers, Logger: slog.New(slog.DiscardHandler), Configure: netConfig,
	})
	if err != nil {
		app.Close()
		t.Fatal(err)
	}
	v.app, v.chain = app, chain
}

func (v *testValidator) stop() {
	if v.chain != nil {
		v.chain.Stop()
		v.app.Close()
		v.chain, v.app = nil, nil
	}
}

// TestChainCommitsSignedTransfers: one validator with the real CometBFT
// consensus, mempool and RPC; transactions broadcast over RPC commit and
// the balances are readable by ABCI query.
func TestChainCommitsSignedTransfers(t *testing.T) {
	issuer, alice := key(t, 1), key(t, 2)
	vals, _ := startValidators(t, 1, genesis(issuer, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl := vals[0].chain.Client()
	for i := 0; i < 5; i++ {
		tx, _ := NewTx(issuer, testChain, TypeGrant, uint64(i), &Grant{To: string(alice.Address()), Amount: credit})
		res, err := cl.BroadcastTxSync(ctx, tx)
		if err != nil || res.Code != CodeOK {
			t.Fatalf("broadcast %d: %v %+v", i, err, res)
		}
	}
	// The issuer holds no credits (its grants are pending after its
	// nonces 0-4): an overdraft is refused before the mempool.
	bad, _ := NewTx(issuer, testChain, TypeTransfer, 5, &Transfer{To: string(alice.Address()), Amount: 100 * credit})
	if res, err := cl.BroadcastTxSync(ctx, bad); err != nil || res.Code != CodeInsufficientFunds {
		t.Fatalf("overdraft admitted to the mempool: %v %+v", err, res)
	}
	for {
		q, err := cl.ABCIQuery(ctx, "/account/"+string(alice.Address()), nil)
		if err != nil {
			t.Fatal(err)
		}
		var a Account
		json.Unmarshal(q.Response.Value, &a)
		if a.Balance == 5*credit {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("grants never committed: balance %d", a.Balance)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
