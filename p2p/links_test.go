package p2p

import (
	"errors"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

func TestProbeMeasuresALink(t *testing.T) {
	a, b, c := rpcHost(t, 1), rpcHost(t, 2), rpcHost(t, 3)
	ServeProbes(b.Host, testChain, time.Hour)
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
