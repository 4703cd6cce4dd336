package testnet

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node"
)

func TestInitRefusesBadParams(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		p    Params
		want string
	}{
		{Params{Validators: 0, Out: dir}, "--validators"},
		{Params{Validators: 2, Sites: 3, Out: dir}, "--sites 3"},
		{Params{Validators: 2, Nodes: -1, Out: dir}, "--nodes"},
		{Params{Validators: 2}, "--out"},
		{Params{Validators: 40, Nodes: 40, Out: dir}, "at most"},
		{Params{Validators: 2, Out: dir, BasePort: 65530}, "--base-port"},
	}
	for _, c := range cases {
		if _, err := Init(c.p); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Init(%+v) = %v, want an error about %s", c.p, err, c.want)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("a refused init left %d entries behind", len(entries))
	}
	os.WriteFile(filepath.Join(dir, "x"), nil, 0o644)
	if _, err := Init(Params{Validators: 1, Out: dir}); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Errorf("init into a non-empty dir: %v", err)
	}
}

func TestInitMakesGenesisAndHomes(t *testing.T) {
	out := filepath.Join(t.TempDir(), "tn")
	m, err := Init(Params{Validators: 4, Nodes: 3, Sites: 3, Out: out, BasePort: 30000})
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		ChainID    string `json:"chain_id"`
		Validators []struct {
			Name string `json:"name"`
		} `json:"validators"`
		AppState ledger.GenesisState `json:"app_state"`
	}
	b, err := os.ReadFile(filepath.Join(out, GenesisFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	if g.ChainID != m.ChainID || len(g.Validators) != 4 || len(g.AppState.Issuers) != 3 || len(g.AppState.Balances) != 7 {
		t.Fatalf("genesis: chain %q, %d validators, %d issuers, %d balances", g.ChainID, len(g.Validators), len(g.AppState.Issuers), len(g.AppState.Balances))
	}
	sites := map[string]int{}
	ports := map[int]bool{}
	for i, n := range m.Nodes {
		sites[n.Site]++
		for _, p := range []int{n.Ports.API, n.Ports.P2P, n.Ports.LedgerP2P, n.Ports.LedgerRPC} {
			if ports[p] {
				t.Errorf("port %d used twice", p)
			}
			ports[p] = true
		}
		h := node.Home{Dir: filepath.Join(out, n.Home)}
		cfg, err := node.LoadConfig(h.ConfigPath())
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Node.ChainID != m.ChainID || cfg.Node.Site != n.Site || cfg.Node.Moniker != n.Name || cfg.P2P.MDNS {
			t.Errorf("%s: config %+v", n.Name, cfg.Node)
		}
		wantPeers := 4
		if n.Validator {
			wantPeers = 3
		}
		if len(cfg.P2P.Bootstrap) != wantPeers || len(cfg.Ledger.Peers) != wantPeers {
			t.Errorf("%s: %d bootstrap peers and %d ledger peers, want %d", n.Name, len(cfg.P2P.Bootstrap), len(cfg.Ledger.Peers), wantPeers)
		}
		k, err := h.LoadKey()
		if err != nil || string(k.Address()) != n.Account {
			t.Errorf("%s: key %v, account %s", n.Name, err, n.Account)
		}
		if i < 3 != n.Issuer {
			t.Errorf("%s: issuer %v", n.Name, n.Issuer)
		}
	}
	if len(sites) != 3 {
		t.Errorf("sites: %v", sites)
	}
	var seeds Seeds
	b, _ = os.ReadFile(filepath.Join(out, SeedsFile))
	if err := json.Unmarshal(b, &seeds); err != nil || len(seeds.Bootstrap) != 4 || len(seeds.LedgerPeers) != 4 {
		t.Errorf("seeds: %+v %v", seeds, err)
	}
}

// TestTestnetRuns: four validators over two sites and a lab machine, as
// processes on loopback: the chain advances, transfers commit through
// any node, and every node audits the same chain.
func TestTestnetRuns(t *testing.T) {
	t.Parallel()
	n := startNet(t, Params{Validators: 4, Nodes: 1, Sites: 2}, RunOptions{})
	n.waitHeights(t, all(n), 2, time.Minute)
	sink := n.key(t, 4).Address()
	l := &transferLoad{net: n, senders: []int{0, 1, 2, 3}, sink: sink,
		via: func(k int) []int { return []int{(k + 1) % 5, (k + 2) % 5} }}
	l.run(t, t.Context(), 200)
	if l.committed.Load() != 200 {
		t.Fatalf("%d of 200 transfers committed (%s)", l.committed.Load(), l.failures())
	}
	n.waitBalances(t, all(n), sink, DefaultStarter+200)
	c := n.check(t, all(n), true)
	// Every node serves its metrics (the node's and CometBFT's registries
	// side by side, without duplicates).
	for i := range n.Manifest.Nodes {
		if v := metric(t, n, i, "deepmarket_exec_workers"); v != 0 {
			t.Errorf("%s runs %v workers", n.Manifest.Nodes[i].Name, v)
		}
	}
	rows, err := Status(t.Context(), n.Dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if !r.Up || r.Status.Height < c.Height || r.Status.ChainID != n.Manifest.ChainID {
			t.Errorf("status of %s: %+v", r.Name, r)
		}
	}
}
