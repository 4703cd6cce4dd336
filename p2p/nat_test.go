package p2p

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	"github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/client"
	"github.com/libp2p/go-libp2p/p2p/protocol/holepunch"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
)

func natHost(t *testing.T, b byte, nat NATParams) host.Host {
	t.Helper()
	h, err := NewHost(HostParams{Key: testKey(t, b), Listen: []string{"/ip4/127.0.0.1/tcp/0"}, Version: "test", NAT: nat})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// TestRelayServesMembersOnly: a real stranger (a fresh key) can neither
// reserve a slot on a node's relay nor reach a member through it; a
// member can, and a relayed connection is cut at the relay's data limit,
// so the relay is no free bandwidth sink.
func TestRelayServesMembersOnly(t *testing.T) {
	memberA, memberB := testKey(t, 2).PeerID(), testKey(t, 3).PeerID()
	res := DefaultRelayResources()
	res.Limit.Data = 64 << 10
	relay := natHost(t, 1, NATParams{RelayService: RelayOn, Resources: &res,
		Member: func(p peer.ID) bool { return p == memberA || p == memberB }})
	a := natHost(t, 2, NATParams{RelayService: RelayOff})
	b := natHost(t, 3, NATParams{RelayService: RelayOff})
	stranger := natHost(t, 9, NATParams{RelayService: RelayOff})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	ri := peer.AddrInfo{ID: relay.ID(), Addrs: relay.Addrs()}
	for _, h := range []host.Host{a, b, stranger} {
		if err := h.Connect(ctx, ri); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := client.Reserve(ctx, stranger, ri); err == nil {
		t.Fatal("a stranger reserved a slot on the relay")
	}
	if _, err := client.Reserve(ctx, b, ri); err != nil {
		t.Fatalf("a member could not reserve a slot: %v", err)
	}
	if !NATOf(relay).Relaying {
		t.Fatal("the relay does not say it relays")
	}
	circuit := ma.StringCast("/p2p/" + relay.ID().String() + "/p2p-circuit")
	var via []ma.Multiaddr
	for _, ad := range relay.Addrs() {
		via = append(via, ad.Encapsulate(circuit))
	}

	// The stranger cannot reach member b through the relay.
	stranger.Peerstore().AddAddrs(b.ID(), via, peerstore.TempAddrTTL)
	if err := stranger.Connect(network.WithAllowLimitedConn(ctx, "test"), peer.AddrInfo{ID: b.ID()}); err == nil {
		t.Fatal("a stranger reached a member through the relay")
	}

	// Member a reaches member b through it, within the data limit.
	const proto = "/deepmarket-test/sink/1"
	got := make(chan int64, 1)
	b.SetStreamHandler(proto, func(s network.Stream) {
		// The relay's cut reaches b as a reset, or not at all when the
		// relayed connection is torn down first: a deadline ends either.
		s.SetDeadline(time.Now().Add(8 * time.Second))
		var one [1]byte
		if _, err := io.ReadFull(s, one[:]); err != nil {
			got <- -1
			return
		}
		s.Write(one[:])
		n, _ := io.Copy(io.Discard, s)
		got <- n + 1
	})
	a.Peerstore().AddAddrs(b.ID(), via, peerstore.TempAddrTTL)
	s, err := a.NewStream(network.WithAllowLimitedConn(ctx, "test"), b.ID(), proto)
	if err != nil {
		t.Fatalf("a member could not reach another through the relay: %v", err)
	}
	if !Relayed(s.Conn()) {
		t.Fatalf("the stream went over %s, not the relay", s.Conn().RemoteMultiaddr())
	}
	s.SetDeadline(time.Now().Add(5 * time.Second))
	var echo [1]byte
	if _, err := s.Write([]byte{1}); err != nil {
		t.Fatalf("write through the relay: %v", err)
	}
	if _, err := io.ReadFull(s, echo[:]); err != nil {
		t.Fatalf("no echo through the relay: %v", err)
	}
	buf := make([]byte, 8<<10)
	var sent int64
	for sent < 1<<20 {
		s.SetWriteDeadline(time.Now().Add(5 * time.Second))
		n, err := s.Write(buf)
		sent += int64(n)
		if err != nil {
			break
		}
	}
	s.Reset()
	select {
	case n := <-got:
		if n < 0 {
			t.Fatal("the sink got nothing through the relay")
		}
		if n > res.Limit.Data {
			t.Fatalf("the relay carried %d bytes, over its limit of %d", n, res.Limit.Data)
		}
		t.Logf("sent %d bytes, the relay carried %d before cutting the connection", sent, n)
	case <-ctx.Done():
		t.Fatal("the relayed stream never ended")
	}

	// A bulk stream (not allowed over a limited connection) is refused.
	c, cancel2 := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel2()
	if _, err := a.NewStream(c, b.ID(), proto); err == nil && !Direct(a, b.ID()) {
		t.Fatal("a bulk stream opened over the relay")
	}
}

func TestTreatAsPublic(t *testing.T) {
	saved := manet.Private4
	t.Cleanup(func() { manet.Private4 = saved })
	_, lab, _ := net.ParseCIDR("10.77.254.0/24")
	if err := TreatAsPublic([]*net.IPNet{lab}); err != nil {
		t.Fatal(err)
	}
	for addr, public := range map[string]bool{
		"/ip4/10.77.254.6/tcp/1": true, "/ip4/10.77.253.6/tcp/1": false, "/ip4/10.1.2.3/tcp/1": false,
		"/ip4/127.0.0.1/tcp/1": false, "/ip4/192.168.1.1/tcp/1": false, "/ip4/8.8.8.8/tcp/1": true,
	} {
		if got := manet.IsPublicAddr(ma.StringCast(addr)); got != public {
			t.Errorf("%s: public %v, want %v", addr, got, public)
		}
	}
	for _, bad := range []string{"127.0.0.0/8", "8.8.8.0/24", "169.254.0.0/16"} {
		_, n, _ := net.ParseCIDR(bad)
		if err := TreatAsPublic([]*net.IPNet{n}); err == nil {
			t.Errorf("TreatAsPublic(%s) was taken", bad)
		}
	}
}

func TestAdvertisedDropsLoopback(t *testing.T) {
	lo, lan := ma.StringCast("/ip4/127.0.0.1/tcp/1"), ma.StringCast("/ip4/10.0.0.2/tcp/1")
	if got := advertised([]ma.Multiaddr{lo, lan}); len(got) != 1 || !got[0].Equal(lan) {
		t.Errorf("advertised(loopback, lan) = %v, want the LAN address only", got)
	}
	if got := advertised([]ma.Multiaddr{lo}); len(got) != 1 {
		t.Errorf("a host on loopback only advertises %v", got)
	}
}

// TestCampusBehindOneAddress: a university's lab machines reach its public
// node from one NAT address; the resource manager takes a lab's worth of
// connections from it at once (libp2p's default: 8).
func TestCampusBehindOneAddress(t *testing.T) {
	rm, err := newResourceManager()
	if err != nil {
		t.Fatal(err)
	}
	defer rm.Close()
	campus := ma.StringCast("/ip4/203.0.113.7/tcp/7701")
	for i := range 60 { // within the transient scope's limit, as handshakes are
		s, err := rm.OpenConnection(network.DirInbound, true, campus)
		if err != nil {
			t.Fatalf("connection %d from the campus address refused: %v", i+1, err)
		}
		defer s.Done()
	}
}

// TestRelayServesACampusBehindOneAddress: a university's lab machines all
// reserve their relay slots from its NAT's one address (here 127.0.0.1);
// the relay serves more of them than libp2p's default of 8 per address.
func TestRelayServesACampusBehindOneAddress(t *testing.T) {
	relay := natHost(t, 1, NATParams{RelayService: RelayOn, Member: func(peer.ID) bool { return true }})
	ri := peer.AddrInfo{ID: relay.ID(), Addrs: relay.Addrs()}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	for i := range 12 {
		lab := natHost(t, byte(10+i), NATParams{RelayService: RelayOff})
		if err := lab.Connect(ctx, ri); err != nil {
			t.Fatal(err)
		}
		if _, err := client.Reserve(ctx, lab, ri); err != nil {
			t.Fatalf("lab machine %d of one address could not reserve a slot: %v", i+1, err)
		}
	}
}

// TestPunchOutcomesAreKept: a hole punch's outcome is kept per peer, with
// its attempts and error, and said in words; the peers kept are bounded.
func TestPunchOutcomesAreKept(t *testing.T) {
	c := &punchCounter{}
	a, b := peer.ID("lab-a"), peer.ID("lab-b")
	c.Trace(&holepunch.Event{Remote: a, Evt: &holepunch.HolePunchAttemptEvt{Attempt: 1}})
	c.Trace(&holepunch.Event{Remote: a, Evt: &holepunch.HolePunchAttemptEvt{Attempt: 2}})
	c.Trace(&holepunch.Event{Remote: a, Evt: &holepunch.EndHolePunchEvt{Error: "all retries for hole punch with peer failed"}})
	pu, ok := c.lastWith(a)
	if !ok || pu.Success || pu.Attempts != 2 || pu.String() != "hole punch failed after 2 attempts: all retries for hole punch with peer failed" {
		t.Fatalf("a failed punch: %+v %v (%q)", pu, ok, pu.String())
	}
	c.Trace(&holepunch.Event{Remote: b, Evt: &holepunch.HolePunchAttemptEvt{Attempt: 1}})
	c.Trace(&holepunch.Event{Remote: b, Evt: &holepunch.EndHolePunchEvt{Success: true}})
	if pu, _ := c.lastWith(b); !pu.Success || pu.String() != "hole punched after 1 attempt" || c.tried.Load() != 2 || c.won.Load() != 1 {
		t.Errorf("a won punch: %+v, %d tried, %d won", pu, c.tried.Load(), c.won.Load())
	}
	if c.latest == nil || c.latest.Peer != b.String() {
		t.Errorf("latest %+v, want b's", c.latest)
	}
	for i := range maxPunchPeers + 10 {
		c.Trace(&holepunch.Event{Remote: peer.ID(fmt.Sprint("p", i)), Evt: &holepunch.ProtocolErrorEvt{Error: "stream reset"}})
	}
	if len(c.last) > maxPunchPeers {
		t.Errorf("%d peers' punches kept, want at most %d", len(c.last), maxPunchPeers)
	}
}

// confirmed is a confirmer whose AutoNAT v2 found reachable what it lists.
type confirmed []ma.Multiaddr

func (c confirmed) ConfirmedAddrs() (reachable, unreachable, unknown []ma.Multiaddr) {
	return c, nil, nil
}

// TestUnconfirmedMappingsAreNotAdvertised: a host advertises its NAT's
// mapping only once AutoNAT v2 found it reachable (a peer that dials an
// unconfirmed one waits out the dial before the hole punch begins: 5 s in
// make bench-nat); its own interfaces' addresses, private and relay
// addresses are advertised as before. The host's own hole punch still
// gets the mapping (libp2p adds observed addresses to it after this
// filter), as TestOnePublicValidatorIsEnough shows end to end.
func TestUnconfirmedMappingsAreNotAdvertised(t *testing.T) {
	m := func(s string) ma.Multiaddr { return ma.StringCast(s) }
	mapping, forwarded := m("/ip4/1.2.3.4/udp/4001/quic-v1"), m("/ip4/1.2.3.4/tcp/4001")
	own, private := m("/ip4/5.6.7.8/tcp/4001"), m("/ip4/10.1.2.3/tcp/4001")
	relay := m("/ip4/9.9.9.9/tcp/4001/p2p/12D3KooWEBBqpfB6ce3GrcRMCUyDKjcYwe9YnYaPvipnFhvgazmp/p2p-circuit")
	in := []ma.Multiaddr{mapping, forwarded, own, private, relay}

	f := &mappingFilter{local: map[netip.Addr]bool{netip.MustParseAddr("5.6.7.8"): true}, at: time.Now()}
	want := func(got []ma.Multiaddr, w ...ma.Multiaddr) {
		t.Helper()
		if fmt.Sprint(got) != fmt.Sprint(w) {
			t.Errorf("advertised %v, want %v", got, w)
		}
	}
	want(f.apply(slices.Clone(in)), own, private, relay) // libp2p's host not set yet: nothing confirmed
	var c confirmer = confirmed{forwarded}
	f.host.Store(&c)
	want(f.apply(slices.Clone(in)), forwarded, own, private, relay)
	if len(in) != 5 || !in[0].Equal(mapping) {
		t.Errorf("apply changed its argument: %v", in)
	}
}

// TestPreservedMapping: a host whose only connection out to a public
// peer left from an ephemeral port (its listener's port was taken for
// that peer, a connection lingering in TIME_WAIT) still learns its
// listener's mapping from it when the NAT kept the port: the observed
// address at the listener's port. A NAT that changed the port says
// nothing of the listener's mapping.
func TestPreservedMapping(t *testing.T) {
	m := ma.StringCast
	listens := []ma.Multiaddr{m("/ip4/0.0.0.0/udp/4001/quic-v1"), m("/ip6/::/tcp/4002"), m("/ip4/0.0.0.0/tcp/4001")}
	for _, c := range []struct{ observed, local, want string }{
		{"/ip4/1.2.3.4/tcp/37856", "/ip4/10.0.0.2/tcp/37856", "/ip4/1.2.3.4/tcp/4001"},
		{"/ip4/1.2.3.4/tcp/50000", "/ip4/10.0.0.2/tcp/37856", ""}, // the NAT changed the port
		{"/ip6/2001:db8::1/tcp/37856", "/ip6/fd00::2/tcp/37856", "/ip6/2001:db8::1/tcp/4002"},
		{"/ip4/1.2.3.4/udp/37856/quic-v1", "/ip4/10.0.0.2/udp/37856/quic-v1", ""}, // QUIC dials from its listener
	} {
		got := preservedMapping(m(c.observed), m(c.local), listens)
		if (got == nil) != (c.want == "") || got != nil && got.String() != c.want {
			t.Errorf("observed %s from %s: inferred %v, want %q", c.observed, c.local, got, c.want)
		}
	}
}
