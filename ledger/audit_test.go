package ledger

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	ctypes "github.com/cometbft/cometbft/rpc/core/types"
	cmttypes "github.com/cometbft/cometbft/types"
)

// TestClientAndAudit: the Go client moves credits through a real chain
// (grant, transfer, escrow settled), history finds what moved, and the
// audit over HTTP RPC replays the chain from genesis and balances.
func TestClientAndAudit(t *testing.T) {
	issuer, alice, bob, m1 := key(t, 1), key(t, 2), key(t, 3), key(t, 4)
	k := key(t, 99)
	dir := t.TempDir()
	doc, err := NewGenesis(testChain, []GenesisValidator{{Name: "v", PubKey: k.Public(), Power: 1}}, genesis(issuer, nil))
	if err != nil {
		t.Fatal(err)
	}
	app, err := OpenApp(filepath.Join(dir, "app"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	rpcPort := freePort(t)
	chain, err := StartChain(ChainParams{Dir: dir, Key: k, Genesis: doc, App: app, P2PListen: fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t)),
		RPCListen: fmt.Sprintf("tcp://127.0.0.1:%d", rpcPort), Logger: slog.New(slog.DiscardHandler), Configure: fastBlocks})
	if err != nil {
		t.Fatal(err)
	}
	defer chain.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rpc := chain.Client()
	ci, ca := NewClient(rpc, issuer, testChain), NewClient(rpc, alice, testChain)
	if _, err := ci.Grant(ctx, alice.Address(), 100*credit); err != nil {
		t.Fatal(err)
	}
	if _, err := ca.Transfer(ctx, bob.Address(), 10*credit, "lunch"); err != nil {
		t.Fatal(err)
	}
	_, err = ca.Transfer(ctx, bob.Address(), 1000*credit, "")
	var lerr *Error
	if !errors.As(err, &lerr) || lerr.Code != CodeInsufficientFunds {
		t.Fatalf("overdraft: %v", err)
	}
	job := job(7)
	if _, err := ca.OpenEscrow(ctx, OpenEscrow{Job: job, Amount: 20 * credit, Expiry: time.Now().Unix() + 3600, Payees: []string{string(m1.Address())}}); err != nil {
		t.Fatal(err)
	}
	if e, err := ca.Escrow(ctx, job); err != nil || e.Amount != 20*credit {
		t.Fatalf("escrow %+v %v", e, err)
	}
	if _, err := ca.Settle(ctx, Settle{Job: job, Payments: []Payment{{Machine: string(m1.Address()), Amount: 7 * credit}}}); err != nil {
		t.Fatal(err)
	}
	for addr, want := range map[string]uint64{string(alice.Address()): 83 * credit, string(bob.Address()): 10 * credit, string(m1.Address()): 7 * credit} {
		a, err := ca.Account(ctx, Address(addr))
		if err != nil || a.Balance != want {
			t.Fatalf("%s: %+v %v, want %d", addr, a, err, want)
		}
	}
	hist, err := ca.History(ctx, alice.Address(), 10)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, h := range hist {
		types = append(types, h.Type)
	}
	if fmt.Sprint(types) != "[settle open_escrow transfer grant]" || hist[2].Attrs["memo"] != "lunch" || hist[2].Amount("amount") != 10*credit {
		t.Fatalf("history %v: %+v", types, hist)
	}

	rep, err := Audit(ctx, fmt.Sprintf("http://127.0.0.1:%d", rpcPort), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK || rep.Supply != 100*credit || rep.Balances != 100*credit || rep.Escrowed != 0 || rep.TxsOK != 4 {
		t.Fatalf("audit: %+v", rep)
	}

	// A node that serves a doctored block is caught.
	liar := &tamperingRPC{AuditRPC: rpc, height: 3, swap: func(b *cmttypes.Block) {
		tx, _ := NewTx(issuer, testChain, TypeGrant, 1, &Grant{To: string(bob.Address()), Amount: credit})
		b.Txs = append(b.Txs, tx)
	}}
	rep, err = AuditWith(ctx, liar, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK || len(rep.Problems) == 0 {
		t.Fatalf("audit of a doctored chain passed: %+v", rep)
	}
}

type tamperingRPC struct {
	AuditRPC
	height int64
	swap   func(*cmttypes.Block)
}

func (r *tamperingRPC) Block(ctx context.Context, h *int64) (*ctypes.ResultBlock, error) {
	res, err := r.AuditRPC.Block(ctx, h)
	if err == nil && *h == r.height {
		cp := &cmttypes.Block{Header: res.Block.Header, Data: cmttypes.Data{Txs: append(cmttypes.Txs(nil), res.Block.Txs...)}, LastCommit: res.Block.LastCommit}
		r.swap(cp)
		res = &ctypes.ResultBlock{BlockID: res.BlockID, Block: cp}
	}
	return res, err
}
