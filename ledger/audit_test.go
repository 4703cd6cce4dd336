package ledger

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ctypes "github.com/cometbft/cometbft/rpc/core/types"
	cmttypes "github.com/cometbft/cometbft/types"

	"github.com/deepmarket/deepmarket/identity"
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
	// m1 lends: an issuer admits it, so it is a registered machine.
	if _, err := ca.OpenEscrow(ctx, OpenEscrow{Job: job(8), Amount: credit, Expiry: time.Now().Unix() + 3600, Payees: []string{string(m1.Address())}}); CodeOf(err) != CodeNotRegistered {
		t.Fatalf("escrow paying an unregistered machine: %v", err)
	}
	if _, err := ci.Admit(ctx, m1.Address()); err != nil {
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
	// The 13 unused stay in the escrow through its dispute window.
	for addr, want := range map[string]uint64{string(alice.Address()): 70 * credit, string(bob.Address()): 10 * credit, string(m1.Address()): 7 * credit} {
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

	rep, err := Audit(ctx, fmt.Sprintf("http://127.0.0.1:%d", rpcPort), AuditOptions{Genesis: doc, GenesisSource: "genesis.json"})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK || rep.Supply != 100*credit || rep.Balances != 87*credit || rep.Escrowed != 13*credit || rep.TxsOK != 5 || rep.Genesis != "genesis.json" ||
		rep.Commits != int(rep.Height) {
		t.Fatalf("audit: %+v", rep)
	}

	// A node that serves a doctored block is caught.
	liar := &tamperingRPC{AuditRPC: rpc, height: 3, swap: func(b *cmttypes.Block) {
		tx, _ := NewTx(issuer, testChain, TypeGrant, 1, &Grant{To: string(bob.Address()), Amount: credit})
		b.Txs = append(b.Txs, tx)
	}}
	rep, err = AuditWith(ctx, liar, AuditOptions{Genesis: doc})
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK || !hasProblem(rep, "height 3: the block does not hold what its header commits to") {
		t.Fatalf("audit of a doctored chain passed: %+v", rep.Problems)
	}

	// A node that serves a commit without the signatures is caught.
	unsigned := &unsignedCommitRPC{AuditRPC: rpc}
	rep, err = AuditWith(ctx, unsigned, AuditOptions{Genesis: doc})
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK || !hasProblem(rep, "not signed by more than 2/3 of the validator set") {
		t.Fatalf("audit of a chain whose last commit lacks its signatures: %+v", rep.Problems)
	}
}

func hasProblem(rep *AuditReport, s string) bool {
	for _, p := range rep.Problems {
		if strings.Contains(p, s) {
			return true
		}
	}
	return false
}

// unsignedCommitRPC serves the last block's commit with every signature
// marked absent.
type unsignedCommitRPC struct{ AuditRPC }

func (r *unsignedCommitRPC) Commit(ctx context.Context, h *int64) (*ctypes.ResultCommit, error) {
	res, err := r.AuditRPC.Commit(ctx, h)
	if err != nil {
		return nil, err
	}
	c := *res.Commit
	c.Signatures = make([]cmttypes.CommitSig, len(res.Commit.Signatures))
	for i := range c.Signatures {
		c.Signatures[i] = cmttypes.NewCommitSigAbsent()
	}
	out := *res
	out.Commit = &c
	return &out, nil
}

// TestAuditRefusesAFork runs a fork: a second chain with the same chain ID
// whose genesis grants 500,000 credits more, with its own validator. The
// audit pinned to the honest genesis refuses it (its commits are not
// signed by the honest validators, and its app hashes are not the
// honest genesis'); the same audit accepts the honest chain; an audit that
// takes the genesis the fork serves is not OK unless told to trust it,
// and says what it trusted: pinning is what protects.
func TestAuditRefusesAFork(t *testing.T) {
	issuer, mallory := key(t, 1), key(t, 66)
	g := genesis(issuer, map[*identity.Key]uint64{key(t, 2): 10 * credit})
	start := func(val *identity.Key, g GenesisState) (*cmttypes.GenesisDoc, string) {
		t.Helper()
		doc, err := NewGenesis(testChain, []GenesisValidator{{Name: "v", PubKey: val.Public(), Power: 10}}, g)
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		app, err := OpenApp(filepath.Join(dir, "app"), nil)
		if err != nil {
			t.Fatal(err)
		}
		rpcPort := freePort(t)
		chain, err := StartChain(ChainParams{Dir: dir, Key: val, Genesis: doc, App: app, P2PListen: fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t)),
			RPCListen: fmt.Sprintf("tcp://127.0.0.1:%d", rpcPort), Configure: fastBlocks})
		if err != nil {
			app.Close()
			t.Fatal(err)
		}
		t.Cleanup(func() {
			chain.Stop()
			app.Close()
		})
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		if err := chain.WaitHeight(ctx, 3); err != nil {
			t.Fatal(err)
		}
		return doc, fmt.Sprintf("http://127.0.0.1:%d", rpcPort)
	}
	honest, honestURL := start(key(t, 99), g)
	forked := g
	forked.Balances = append(append([]GenesisBalance(nil), g.Balances...), GenesisBalance{Address: string(mallory.Address()), Amount: 500_000 * credit})
	_, forkURL := start(key(t, 98), forked)

	ctx := t.Context()
	rep, err := Audit(ctx, honestURL, AuditOptions{Genesis: honest, GenesisSource: "honest.json"})
	if err != nil || !rep.OK || !rep.Pinned || rep.Supply != 10*credit {
		t.Fatalf("audit of the honest chain: %v %+v", err, rep)
	}
	rep, err = Audit(ctx, forkURL, AuditOptions{Genesis: honest, GenesisSource: "honest.json"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK || !hasProblem(rep, "height 1: the commit is not signed by more than 2/3 of the validator set the audit tracks") {
		t.Fatalf("audit of the fork pinned to the honest genesis: %+v", rep)
	}
	// Without a genesis of its own the audit replays the fork from the
	// genesis it serves, which proves nothing: not OK, and it says what
	// it trusted; accepting the served genesis passes, and still says so.
	rep, err = Audit(ctx, forkURL, AuditOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK || rep.Pinned || len(rep.Problems) != 1 || !hasProblem(rep, "genesis not pinned: the audit trusted the genesis as served by "+forkURL+" (sha256 "+rep.GenesisHash+")") {
		t.Fatalf("audit of the fork from the genesis it serves: %+v", rep)
	}
	rep, err = Audit(ctx, forkURL, AuditOptions{TrustServedGenesis: true})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK || rep.Pinned || rep.Supply != 500_010*credit || rep.Genesis != "as served by "+forkURL {
		t.Fatalf("audit of the fork, trusting the genesis it serves: %+v", rep)
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
