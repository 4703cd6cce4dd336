package main

import (
	"reflect"
	"slices"
	"testing"

	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/p2p"
)

// A machine that lends already changes only what the flags name.
func TestKeepLend(t *testing.T) {
	half := 0.5
	prev := &api.LendRequest{Cores: 4, MemBytes: 8 << 30, GPUs: 1, Window: "19:00-07:00",
		Price: &p2p.Prices{CoreHour: 1, MemGiBHour: 2, GPUHour: 3}, SuspendAbove: &half}
	changed := func(flags ...string) func(string) bool {
		return func(f string) bool { return slices.Contains(flags, f) }
	}

	req := api.LendRequest{Price: &p2p.Prices{GPUHour: 9}, PriceGiven: []string{"gpu"}}
	kept, err := keepLend(&req, prev, changed("price"))
	if err != nil {
		t.Fatal(err)
	}
	want := api.LendRequest{Cores: 4, MemBytes: 8 << 30, GPUs: 1, Window: "19:00-07:00", Price: &p2p.Prices{GPUHour: 9},
		PriceGiven: []string{"gpu"}, SuspendAbove: &half}
	if !reflect.DeepEqual(req, want) || !slices.Equal(kept, []string{"cores", "memory", "GPUs", "window", "suspend-above", "the prices not given"}) {
		t.Errorf("--price gpu=9: %+v, kept %v", req, kept)
	}
	req = api.LendRequest{Cores: 2, Window: ""}
	if kept, _ := keepLend(&req, prev, changed("cores", "window")); req.Window != "" || req.Cores != 2 || req.MemBytes != 8<<30 ||
		slices.Contains(kept, "window") || req.Price != prev.Price {
		t.Errorf("--cores 2 --window all: %+v, kept %v", req, kept)
	}
	if _, err := keepLend(&api.LendRequest{}, nil, changed("cores")); err == nil {
		t.Error("a first lend without --mem: no error")
	}
}

// A signed history: what came in, what went out, for whom.
func TestHistorySign(t *testing.T) {
	e := func(typ string, attrs map[string]string) ledger.HistoryEntry {
		return ledger.HistoryEntry{Type: typ, Attrs: attrs}
	}
	for _, tt := range []struct {
		e    ledger.HistoryEntry
		want string
	}{
		{e(ledger.TypeTransfer, map[string]string{"from": "me", "to": "you"}), "-"},
		{e(ledger.TypeTransfer, map[string]string{"from": "you", "to": "me"}), "+"},
		{e(ledger.TypeGrant, map[string]string{"from": "me", "to": "you"}), ""},
		{e(ledger.TypeGrant, map[string]string{"from": "issuer", "to": "me"}), "+"},
		{e(ledger.TypeOpenEscrow, map[string]string{"from": "me"}), "-"},
		{e(ledger.TypeSettle, map[string]string{"from": "me"}), "+"},
		{e(ledger.TypeClaim, map[string]string{"to": "me"}), "+"},
	} {
		if got := historySign(tt.e, "me"); got != tt.want {
			t.Errorf("%s %v: %q, want %q", tt.e.Type, tt.e.Attrs, got, tt.want)
		}
	}
}
