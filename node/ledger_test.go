package node

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/api"
)

// TestJoinWithGenesisSyncsLedger: B joins A's network with A's genesis
// and A as ledger peer; it replicates the chain as a full node and sees
// what A's account sends.
func TestJoinWithGenesisSyncsLedger(t *testing.T) {
	t.Parallel()
	chain := testNet(t)
	dir := t.TempDir()
	ah := initHome(t, filepath.Join(dir, "a"), chain)
	a := startNode(t, ah)
	st := a.Status()
	ledgerPort := a.cfg.Ledger.P2PListen[len("tcp://127.0.0.1:"):]

	bh := Home{Dir: filepath.Join(dir, "b")}
	if _, err := Init(bh, InitOptions{
		Moniker: "b", Genesis: ah.GenesisPath(), Listen: []string{"/ip4/127.0.0.1/tcp/0"}, API: "127.0.0.1:0",
		LedgerP2P: "tcp://127.0.0.1:" + freePort(t), LedgerRPC: "tcp://127.0.0.1:" + freePort(t),
		LedgerPeers: []string{st.LedgerNodeID + "@127.0.0.1:" + ledgerPort},
	}); err != nil {
		t.Fatal(err)
	}
	b := startNode(t, bh, withBootstrap(a.addr()))
	if b.Status().ChainID != st.ChainID {
		t.Fatalf("B is on %q, A on %q", b.Status().ChainID, st.ChainID)
	}
	k, _ := identity.GenerateKey()
	to := string(k.Address())
	// A transfer that opens an account moves at least a credit.
	if _, err := a.client.Send(t.Context(), api.SendRequest{To: to, Amount: 42}); err == nil {
		t.Fatal("a transfer of 42 micro-credits opened an account")
	}
	if _, err := a.client.Send(t.Context(), api.SendRequest{To: to, Amount: 42_000_000}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "B to replicate A's transfer", func() bool {
		bal, err := b.client.Balance(t.Context(), to)
		return err == nil && bal.Balance == 42_000_000
	})
	// B holds no credits and no issuer admitted it: its transfer is
	// refused, not lost.
	var apiErr *api.Error
	if _, err := b.client.Send(t.Context(), api.SendRequest{To: to, Amount: 1}); !errors.As(err, &apiErr) || apiErr.Code != ledger.CodeNotMember {
		t.Fatalf("B is no member, yet its transfer: %v", err)
	}
	rep, err := b.client.Audit(t.Context())
	if err != nil || !rep.OK || rep.Supply != LocalStarterCredit {
		t.Fatalf("audit on B: %+v %v", rep, err)
	}
}
