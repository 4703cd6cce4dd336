package node

import (
	"context"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/p2p"
)

// TestTwoNodesOfferAndWithdraw: B joins A with a bootstrap address; an
// offer made on A (through the API, as the CLI does) appears on B; lend
// --stop removes it from B at once, long before its TTL.
func TestTwoNodesOfferAndWithdraw(t *testing.T) {
	t.Parallel()
	chain := testNet(t)
	homes := initNetwork(t, t.TempDir(), chain, []string{"a", "b"})
	a := startNode(t, homes[0])
	b := startNode(t, homes[1], withBootstrap(a.addr()))
	eventually(t, 10*time.Second, "B connected to A", func() bool { return b.Status().Peers == 1 })

	ctx := t.Context()
	st, err := a.client.SetLend(ctx, api.LendRequest{Cores: 1, MemBytes: 512 << 20, Window: ""})
	if err != nil {
		t.Fatal(err)
	}
	if !st.Lending || !st.Offering {
		t.Fatalf("lend state %+v", st)
	}
	machine := a.Host().ID().String()
	eventually(t, 15*time.Second, "A's offer on B", func() bool { return hasOffer(b, machine) })
	offers, err := b.client.Offers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got *api.Offer
	for i := range offers {
		if offers[i].Machine == machine {
			got = &offers[i]
		}
	}
	if got == nil || got.Cores != 1 || got.MemBytes != 512<<20 || got.Owner != string(a.Key().Address()) || got.Self {
		t.Fatalf("B's view of A's offer: %+v", got)
	}
	if !got.ExpiresAt.After(time.Now()) {
		t.Fatalf("offer expires at %s", got.ExpiresAt)
	}

	if _, err := a.client.StopLend(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "A's offer gone from B after lend --stop", func() bool { return !hasOffer(b, machine) })
	if st := a.Lend(); st.Lending || st.Offering {
		t.Fatalf("after stop: %+v", st)
	}

	// Lending again, then stopping the node: peers drop the offer at once
	// rather than after its TTL.
	if _, err := a.client.SetLend(ctx, api.LendRequest{Cores: 1, MemBytes: 512 << 20}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "A's new offer on B", func() bool { return hasOffer(b, machine) })
	a.stop()
	eventually(t, 5*time.Second, "A's offer gone from B after A stopped", func() bool { return !hasOffer(b, machine) })
}

// TestSparseTopologyPropagation: 20 nodes, each connected to only 2-3
// others; one lends and every node holds its offer.
func TestSparseTopologyPropagation(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("20 nodes")
	}
	chain := testNet(t)
	const n = 20
	rng := rand.New(rand.NewPCG(1, 2))
	nodes := make([]*testNode, 0, n)
	var names []string
	for i := 0; i < n; i++ {
		names = append(names, "n"+string(rune('a'+i)))
	}
	homes := initNetwork(t, t.TempDir(), chain, names)
	for i := 0; i < n; i++ {
		var boot []string
		if i > 0 { // a chain keeps the graph connected; a random chord adds a second path
			boot = append(boot, nodes[i-1].addr())
			if i > 2 && rng.IntN(2) == 0 {
				boot = append(boot, nodes[rng.IntN(i-2)].addr())
			}
		}
		nodes = append(nodes, startNode(t, homes[i], withBootstrap(boot...)))
	}
	for i, nd := range nodes {
		if p := len(nd.PeerIDs()); p > 4 {
			t.Logf("node %d has %d peers", i, p)
		}
	}
	lender := nodes[n/2]
	if _, err := lender.SetLend(t.Context(), api.LendRequest{Cores: 1, MemBytes: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	machine := lender.Host().ID().String()
	eventually(t, 30*time.Second, "the offer on all 20 nodes", func() bool {
		for _, nd := range nodes {
			if !hasOffer(nd, machine) {
				return false
			}
		}
		return true
	})
}

// TestRestartKeepsIdentityAndLend: a restarted node has the same peer ID
// and lends what it lent before, announcing it again without being told.
func TestRestartKeepsIdentityAndLend(t *testing.T) {
	t.Parallel()
	chain := testNet(t)
	home := initHome(t, filepath.Join(t.TempDir(), "a"), chain)
	a := startNode(t, home)
	id := a.Host().ID()
	req := api.LendRequest{Cores: 1, MemBytes: 256 << 20, Window: "00:00-23:59"}
	if _, err := a.client.SetLend(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	a.stop()

	a2 := startNode(t, home)
	if a2.Host().ID() != id {
		t.Fatalf("peer ID changed: %s -> %s", id, a2.Host().ID())
	}
	st := a2.Lend()
	if !st.Lending || st.Settings.Cores != 1 || st.Settings.MemBytes != 256<<20 || st.Settings.Window != "00:00-23:59" {
		t.Fatalf("lend settings after restart: %+v", st.Settings)
	}
	eventually(t, 10*time.Second, "own offer re-announced after restart", func() bool { return hasOffer(a2, id.String()) })
}

// TestLendValidation: requests beyond the inventory are refused with the
// field named, and change nothing.
func TestLendValidation(t *testing.T) {
	t.Parallel()
	a := startNode(t, initHome(t, filepath.Join(t.TempDir(), "a"), testNet(t)))
	inv := a.Inventory()
	ctx := context.Background()
	for _, c := range []struct {
		req   api.LendRequest
		field string
	}{
		{api.LendRequest{Cores: inv.Cores + 1, MemBytes: 1 << 20}, "cores"},
		{api.LendRequest{Cores: 0, MemBytes: 1 << 20}, "cores"},
		{api.LendRequest{Cores: -1, MemBytes: 1 << 20}, "cores"},
		{api.LendRequest{Cores: 1, MemBytes: inv.MemBytes + 1}, "mem_bytes"},
		{api.LendRequest{Cores: 1, MemBytes: 0}, "mem_bytes"},
		{api.LendRequest{Cores: 1, MemBytes: 1 << 20, GPUs: len(inv.GPUs) + 1}, "gpus"},
		{api.LendRequest{Cores: 1, MemBytes: 1 << 20, GPUs: -1}, "gpus"},
		{api.LendRequest{Cores: 1, MemBytes: 1 << 20, Window: "7pm-7am"}, "window"},
	} {
		_, err := a.client.SetLend(ctx, c.req)
		var apiErr *api.Error
		if !errors.As(err, &apiErr) || apiErr.Field != c.field || apiErr.Status != 422 {
			t.Errorf("SetLend(%+v) = %v, want a 422 naming %q", c.req, err, c.field)
		}
	}
	if st := a.Lend(); st.Lending {
		t.Fatalf("a refused request changed the settings: %+v", st)
	}
	if hasOffer(a, a.Host().ID().String()) {
		t.Fatal("a refused request announced an offer")
	}
}

// TestOutsideWindowNoOffer: a machine lent only in a window that is not
// now announces nothing.
func TestOutsideWindowNoOffer(t *testing.T) {
	t.Parallel()
	a := startNode(t, initHome(t, filepath.Join(t.TempDir(), "a"), testNet(t)))
	now := time.Now()
	start := now.Add(2 * time.Hour)
	end := now.Add(3 * time.Hour)
	window := start.Format("15:04") + "-" + end.Format("15:04")
	st, err := a.client.SetLend(t.Context(), api.LendRequest{Cores: 1, MemBytes: 1 << 20, Window: window})
	if err != nil {
		t.Fatal(err)
	}
	if !st.Lending || st.Offering || st.NextChange == nil {
		t.Fatalf("state %+v", st)
	}
	time.Sleep(500 * time.Millisecond)
	if hasOffer(a, a.Host().ID().String()) {
		t.Fatal("offer announced outside the window")
	}
}

func TestAPIRequiresToken(t *testing.T) {
	t.Parallel()
	a := startNode(t, initHome(t, filepath.Join(t.TempDir(), "a"), testNet(t)))
	bad := api.NewClient(a.APIURL(), "wrong")
	_, err := bad.Status(t.Context())
	var apiErr *api.Error
	if !errors.As(err, &apiErr) || apiErr.Status != 401 {
		t.Fatalf("wrong token: %v", err)
	}
	if _, err := bad.SetLend(t.Context(), api.LendRequest{Cores: 1, MemBytes: 1}); err == nil {
		t.Fatal("lend accepted without token")
	}
	if a.Lend().Lending {
		t.Fatal("unauthenticated lend changed settings")
	}
	if _, err := a.client.Status(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// TestLendersMeasureTheirLinks: two lending machines probe each other
// (every 10 s here) and publish what they measured in their offers, which
// the other node holds: round trip and throughput on loopback.
func TestLendersMeasureTheirLinks(t *testing.T) {
	t.Parallel()
	chain := testNet(t)
	homes := initNetwork(t, t.TempDir(), chain, []string{"a", "b"})
	probe := func(c *Config) { c.P2P.ProbeInterval = Duration{10 * time.Second} }
	a := startNode(t, homes[0], probe)
	b := startNode(t, homes[1], probe, withBootstrap(a.addr()))
	for _, n := range []*testNode{a, b} {
		if _, err := n.client.SetLend(t.Context(), api.LendRequest{Cores: 1, MemBytes: 512 << 20}); err != nil {
			t.Fatal(err)
		}
	}
	linkOf := func(from, to *testNode) (p2p.LinkSample, bool) {
		for _, o := range to.Offers() {
			if o.Machine == from.Host().ID().String() {
				for _, l := range o.Links {
					if l.Machine == to.Host().ID().String() {
						return l, true
					}
				}
			}
		}
		return p2p.LinkSample{}, false
	}
	eventually(t, 3*time.Minute, "each machine's offer carries its link to the other", func() bool {
		_, ab := linkOf(a, b)
		_, ba := linkOf(b, a)
		return ab && ba
	})
	l, _ := linkOf(a, b)
	// Measured, and of loopback's order (beside make test's other
	// packages a round trip can take tens of milliseconds).
	if l.RTTMicros == 0 || l.RTTMicros > 1_000_000 || l.KBps < 100 {
		t.Errorf("A's link to B on loopback: %+v", l)
	}
}
