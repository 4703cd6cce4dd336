package market

import (
	"slices"
	"testing"

	"github.com/deepmarket/deepmarket/p2p"
)

func TestReachable(t *testing.T) {
	off := func(reach string, addrs ...string) p2p.Offer { return p2p.Offer{Reach: reach, Addrs: addrs} }
	pub := off(p2p.ReachPublic, "/ip4/10.77.0.10/tcp/7701")
	natA := off(p2p.ReachNAT, "/ip4/10.77.1.10/tcp/7701")
	natB := off(p2p.ReachNAT, "/ip4/10.77.2.10/tcp/7701")
	symA := off(p2p.ReachRelay, "/ip4/10.77.1.11/tcp/7701")
	symA2 := off(p2p.ReachRelay, "/ip4/10.77.1.12/tcp/7701", "/ip4/127.0.0.1/tcp/7701")
	// Both hold a slot on one relay: its address is no LAN of theirs.
	via := "/ip4/10.77.0.10/tcp/7701/p2p/12D3KooWD2hEUFdLdWjT6pu87yDEcVf8biXS6iVSdgcqVWvKAuuY/p2p-circuit"
	symA.Addrs = append(symA.Addrs, via)
	symB := off(p2p.ReachRelay, via, "/ip4/10.77.2.11/tcp/7701")
	unknown := off("", "/ip4/127.0.0.1/tcp/7701")
	for _, c := range []struct {
		name string
		a, b p2p.Offer
		want bool
	}{
		{"public and symmetric", pub, symA, true},
		{"unknown counts as public", unknown, symB, true},
		{"two hole-punchable NATs", natA, natB, true},
		{"a symmetric NAT and a cone NAT", symA, natB, false},
		{"two symmetric NATs", symA, symB, false},
		{"two machines of one symmetric NAT's LAN", symA, symA2, true},
	} {
		if got := Reachable(c.a, c.b); got != c.want {
			t.Errorf("%s: Reachable = %v, want %v", c.name, got, c.want)
		}
		if got := Reachable(c.b, c.a); got != c.want {
			t.Errorf("%s (swapped): Reachable = %v, want %v", c.name, got, c.want)
		}
	}

	offers := []p2p.Offer{pub, natA, symA, symB, symA2, natB}
	classes := ReachClasses(offers)
	want := [][]int{{0, 1, 5}, {0, 2, 4}, {0, 3}}
	if !slices.EqualFunc(classes, want, slices.Equal[[]int]) {
		t.Fatalf("ReachClasses = %v, want %v", classes, want)
	}
	for _, c := range classes {
		if !AllReachable(offers, c) {
			t.Errorf("class %v: not all reachable", c)
		}
	}
	if AllReachable(offers, []int{2, 3}) || !AllReachable(offers, []int{2, 2}) {
		t.Error("AllReachable: two symmetric NATs reach each other, or one machine twice does not")
	}
}
