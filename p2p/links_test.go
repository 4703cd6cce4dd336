package p2p

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/identity"
)

func TestProbeMeasuresALink(t *testing.T) {
	a, b, c := rpcHost(t, 1), rpcHost(t, 2), rpcHost(t, 3)
	ServeProbes(b.Host, testChain, time.Hour, nil)
	for _, from := range []*RPC{a, c} {
		if err := from.Host.Connect(t.Context(), peer.AddrInfo{ID: b.Host.ID(), Addrs: b.Host.Addrs()}); err != nil {
			t.Fatal(err)
		}
	}
	m := NewLinkMeter(a.Host, testChain)
	if got := m.Measure(t.Context(), []peer.ID{a.Host.ID(), b.Host.ID()}); got != 1 {
		t.Fatalf("%d probes answered, want 1 (itself left out)", got)
	}
	s := m.Samples()
	if len(s) != 1 || s[0].Machine != b.Host.ID().String() {
		t.Fatalf("samples %+v", s)
	}
	// Loopback: well under 10 ms, well over 10 MB/s.
	if s[0].RTTMicros == 0 || s[0].RTTMicros > 10_000 || s[0].KBps < 10_000 {
		t.Errorf("loopback sample %+v", s[0])
	}
	o := testOffer(testKey(t, 1))
	o.Links = s
	if err := o.Validate(a.Host.ID()); err != nil {
		t.Errorf("an offer with its measured links: %v", err)
	}

	// A second probe from the same peer within the period is refused, so a
	// stranger cannot use the machine as a bandwidth sink; another peer
	// still gets its answer.
	if _, err := Probe(t.Context(), a.Host, testChain, b.Host.ID()); err == nil {
		t.Error("a second probe within the period was answered")
	}
	if _, err := Probe(t.Context(), c.Host, testChain, b.Host.ID()); err != nil {
		t.Errorf("another peer's probe: %v", err)
	}
}

func TestOffersRefuseBadLinks(t *testing.T) {
	k := testKey(t, 1)
	other := testKey(t, 2).PeerID().String()
	many := make([]LinkSample, MaxLinks+1)
	for i := range many {
		many[i] = LinkSample{Machine: testKey(t, byte(10+i)).PeerID().String()}
	}
	for name, links := range map[string][]LinkSample{
		"too many":    many,
		"not a peer":  {{Machine: "nobody"}},
		"itself":      {{Machine: k.PeerID().String()}},
		"twice":       {{Machine: other}, {Machine: other}},
		"rtt too big": {{Machine: other, RTTMicros: maxRTTMicros + 1}},
	} {
		o := testOffer(k)
		o.Links = links
		if err := o.Validate(k.PeerID()); !errors.Is(err, ErrOutOfRange) {
			t.Errorf("%s: %v, want out of range", name, err)
		}
	}
}

// backs is the ledger's say in these tests: the machines of the keys it
// was made with are backed, each its own member; every other key is a
// stranger.
type backs map[string]identity.Address

func backing(keys ...*identity.Key) backs {
	b := backs{}
	for _, k := range keys {
		b[string(k.Public())] = k.Address()
	}
	return b
}

func (b backs) Machine(key []byte) (identity.Address, bool) {
	owner, ok := b[string(key)]
	return owner, ok
}

func (b backs) Bidder(key []byte, _ uint64) error {
	if _, ok := b[string(key)]; !ok {
		return ErrNotAdmitted
	}
	return nil
}

// stranger is a peer with a fresh key, connected to to: what an attacker
// gets for nothing.
func stranger(t *testing.T, to host.Host) *RPC {
	t.Helper()
	k, err := identity.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	h, err := NewHost(HostParams{Key: k, Listen: []string{"/ip4/127.0.0.1/tcp/0"}, Version: "evil"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	connect(t, h, to)
	return &RPC{Host: h, Key: k, ChainID: testChain}
}

func connect(t *testing.T, from, to host.Host) {
	t.Helper()
	if err := from.Connect(t.Context(), peer.AddrInfo{ID: to.ID(), Addrs: to.Addrs()}); err != nil {
		t.Fatal(err)
	}
}

// pingForever opens a probe to victim and sends pings without ever
// starting the bulk, up to max of them, each once the last came back; it
// returns how many came back and why the echo stopped.
func pingForever(ctx context.Context, from host.Host, victim peer.ID, max int) (int, error) {
	st, err := from.NewStream(ctx, victim, ProbeProtocol(testChain))
	if err != nil {
		return 0, err
	}
	defer st.Close()
	st.SetDeadline(time.Now().Add(2 * probeEchoTime))
	var b [1]byte
	for n := range max {
		if _, err := st.Write([]byte{'p'}); err != nil {
			return n, err
		}
		if _, err := io.ReadFull(st, b[:]); err != nil {
			return n, err
		}
	}
	return max, nil
}

// A probe that never ends its echo gets at most the pings a probe makes
// and is reset at once; a stranger's gets no echo at all; a machine that
// holds its stream idle is cut well before a probe's whole time.
func TestProbeEchoIsBounded(t *testing.T) {
	victim := rpcHost(t, 1)
	hostile, idle := rpcHost(t, 2), rpcHost(t, 3)
	ServeProbes(victim.Host, testChain, time.Hour, backing(hostile.Key, idle.Key))
	evil := stranger(t, victim.Host)
	connect(t, hostile.Host, victim.Host)
	connect(t, idle.Host, victim.Host)

	const pings = 100_000 // 100 kB echoed if nothing stops it
	n, err := pingForever(t.Context(), evil.Host, victim.Host.ID(), pings)
	if n != 0 || !errors.Is(err, network.ErrReset) {
		t.Errorf("a stranger's probe: %d bytes echoed, then %v; want none, a reset", n, err)
	}
	n, err = pingForever(t.Context(), hostile.Host, victim.Host.ID(), pings)
	if n > probePings || !errors.Is(err, network.ErrReset) {
		t.Errorf("a backed machine's endless echo: %d bytes echoed, then %v; want at most %d, a reset", n, err, probePings)
	}

	// Idle after one ping: the server cuts the stream (a reset), not the
	// prober's own deadline of twice the echo's time.
	st, err := idle.Host.NewStream(t.Context(), victim.Host.ID(), ProbeProtocol(testChain))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	st.SetDeadline(time.Now().Add(2 * probeEchoTime))
	var b [1]byte
	if _, err := st.Write([]byte{'p'}); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(st, b[:]); err != nil {
		t.Fatalf("the first ping: %v", err)
	}
	if _, err := st.Read(b[:]); !errors.Is(err, network.ErrReset) {
		t.Errorf("an idle probe: %v; want the server to reset it within %s", err, probeEchoTime)
	}
}

// Strangers' idle streams take no slot: a backed machine's probe is
// answered while three of them are open.
func TestIdleStrangersDoNotHoldProbeSlots(t *testing.T) {
	victim, honest := rpcHost(t, 1), rpcHost(t, 2)
	ServeProbes(victim.Host, testChain, time.Hour, backing(honest.Key))
	connect(t, honest.Host, victim.Host)
	for range probeSlots + 1 {
		evil := stranger(t, victim.Host)
		st, err := evil.Host.NewStream(t.Context(), victim.Host.ID(), ProbeProtocol(testChain))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Reset() })
		// One ping, to be sure the server took the stream up, then idle.
		var b [1]byte
		st.SetDeadline(time.Now().Add(probeEchoTime))
		st.Write([]byte{'p'})
		io.ReadFull(st, b[:])
	}
	if _, err := Probe(t.Context(), honest.Host, testChain, victim.Host.ID()); err != nil {
		t.Errorf("a backed machine's probe beside strangers' idle streams: %v", err)
	}
}

// Fresh keys cost nothing: thousands of them asking for probes fill no
// table, and a backed machine's probe is still answered.
func TestFreshKeysDoNotFillTheProbersTable(t *testing.T) {
	victim, honest := rpcHost(t, 1), rpcHost(t, 2)
	s, _ := ServeProbes(victim.Host, testChain, time.Minute, backing(honest.Key))
	connect(t, honest.Host, victim.Host)
	now := time.Now()
	pub := make([]byte, 32)
	for i := range maxProbers + 1000 {
		binary.BigEndian.PutUint32(pub, uint32(i))
		if release, ok := s.admit(identity.PeerIDOf(pub), now); ok {
			release()
		}
	}
	if n := len(s.last); n != 0 {
		t.Errorf("the probers' table holds %d strangers", n)
	}
	if _, err := Probe(t.Context(), honest.Host, testChain, victim.Host.ID()); err != nil {
		t.Errorf("a backed machine's probe after %d strangers': %v", maxProbers+1000, err)
	}
}

// One member's idle streams hold one slot at most: two of its machines
// each open a probe and hold it idle, and another member's probe is
// answered meanwhile. (Without the bound they held both slots.)
func TestOneMembersIdleStreamsDoNotBlockProbes(t *testing.T) {
	victim, honest, m1, m2 := rpcHost(t, 1), rpcHost(t, 2), rpcHost(t, 3), rpcHost(t, 4)
	b := backing(honest.Key)
	insider := identity.Address("dm1insider")
	b[string(m1.Key.Public())], b[string(m2.Key.Public())] = insider, insider
	ServeProbes(victim.Host, testChain, time.Hour, b)
	for _, m := range []*RPC{honest, m1, m2} {
		connect(t, m.Host, victim.Host)
	}
	for _, m := range []*RPC{m1, m2} {
		st, err := m.Host.NewStream(t.Context(), victim.Host.ID(), ProbeProtocol(testChain))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Reset() })
		var one [1]byte
		st.SetDeadline(time.Now().Add(probeEchoTime))
		st.Write([]byte{'p'})
		io.ReadFull(st, one[:]) // the first is answered and then held idle; the second is reset
	}
	if _, err := Probe(t.Context(), honest.Host, testChain, victim.Host.ID()); err != nil {
		t.Errorf("a member's probe beside another member's two idle streams: %v", err)
	}
}

// One account's machines are admitted probesPerAccountPeriod times a
// period between them, however many machines it links; another
// account's are not affected, and the next period admits them again.
func TestProbesPerAccountAreBounded(t *testing.T) {
	victim, honest := rpcHost(t, 1), rpcHost(t, 2)
	b := backing(honest.Key)
	var machines []peer.ID
	for i := range probesPerAccountPeriod + 1 {
		pub := make([]byte, 32)
		binary.BigEndian.PutUint32(pub, uint32(i+1))
		b[string(pub)] = "dm1insider"
		machines = append(machines, identity.PeerIDOf(pub))
	}
	s, _ := ServeProbes(victim.Host, testChain, time.Minute, b)
	now := time.Now()
	admitted := 0
	for _, m := range machines {
		if release, ok := s.admit(m, now); ok {
			admitted++
			release()
		}
	}
	if admitted != probesPerAccountPeriod {
		t.Errorf("one account's %d machines were admitted %d times in a period, want %d", len(machines), admitted, probesPerAccountPeriod)
	}
	if release, ok := s.admit(honest.Host.ID(), now); !ok {
		t.Error("another account's machine was refused")
	} else {
		release()
	}
	if release, ok := s.admit(machines[len(machines)-1], now.Add(time.Minute)); !ok {
		t.Error("the account's last machine was refused in the next period")
	} else {
		release()
	}
}
