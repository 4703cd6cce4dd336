package p2p

import (
	"context"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"go.uber.org/goleak"

	"github.com/deepmarket/deepmarket/identity"
)

func newTestHost(t *testing.T, k *identity.Key) host.Host {
	t.Helper()
	h, err := NewHost(HostParams{Key: k, Listen: []string{"/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.1/udp/0/quic-v1"}, Version: "test", Site: "lab a", Moniker: "m"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// TestGossipBetweenTwoHosts: an offer published on one real libp2p host
// arrives, validated and decoded, on the other.
func TestGossipBetweenTwoHosts(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreAnyFunction("github.com/ipfs/go-log/v2/writer.(*MirrorWriter).logRoutine"),
		goleak.IgnoreTopFunction("github.com/libp2p/go-libp2p/p2p/net/swarm.(*Swarm).dialWorkerLoop"),
		goleak.IgnoreAnyFunction("github.com/quic-go/quic-go.(*Transport).listen"),
		goleak.IgnoreTopFunction("github.com/libp2p/go-libp2p/p2p/transport/quicreuse.(*reuse).gc"),
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"))
	ctx, cancel := context.WithCancel(context.Background())
	ka, kb := testKey(t, 1), testKey(t, 2)
	ha, hb := newTestHost(t, ka), newTestHost(t, kb)
	if err := hb.Connect(ctx, peer.AddrInfo{ID: ha.ID(), Addrs: ha.Addrs()}); err != nil {
		t.Fatal(err)
	}
	ga, err := NewGossip(ctx, GossipParams{Host: ha, Key: ka, ChainID: testChain})
	if err != nil {
		t.Fatal(err)
	}
	gb, err := NewGossip(ctx, GossipParams{Host: hb, Key: kb, ChainID: testChain})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *Received, 8)
	done := make(chan struct{})
	go func() { gb.Offers().Run(ctx, func(r *Received) { got <- r }); close(done) }()
	go ga.Offers().Run(ctx, func(*Received) {})

	deadline := time.After(20 * time.Second)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		if err := ga.Offers().PublishOffer(ctx, testOffer(ka), time.Minute); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-got:
			if r.Signer != ka.PeerID() {
				continue // our own echo is not delivered to b; anything else is a's
			}
			o := r.Offer
			if o == nil || o.Machine != ka.PeerID().String() || o.Lent.Cores != 4 {
				t.Fatalf("received %+v", o)
			}
			cancel()
			<-done
			ha.Close()
			hb.Close()
			return
		case <-deadline:
			t.Fatal("offer never arrived")
		case <-tick.C:
		}
	}
}

func TestUserAgentRoundTrip(t *testing.T) {
	v, site, moniker, ok := ParseUserAgent(UserAgent("1.2.3", "PSU fab lab", "pc&12"))
	if !ok || v != "1.2.3" || site != "PSU fab lab" || moniker != "pc&12" {
		t.Fatalf("got %q %q %q %v", v, site, moniker, ok)
	}
	if _, _, _, ok := ParseUserAgent("kubo/0.30"); ok {
		t.Fatal("kubo taken for a DeepMarket node")
	}
}

func TestAddrInfos(t *testing.T) {
	k := testKey(t, 1)
	id := k.PeerID().String()
	ais, err := AddrInfos([]string{"/ip4/127.0.0.1/tcp/1/p2p/" + id, "/ip4/127.0.0.1/udp/1/quic-v1/p2p/" + id})
	if err != nil || len(ais) != 1 || len(ais[0].Addrs) != 2 {
		t.Fatalf("%v %v", ais, err)
	}
	if _, err := AddrInfos([]string{"/ip4/127.0.0.1/tcp/1"}); err == nil {
		t.Fatal("address without /p2p accepted")
	}
}

// TestUnbackedDeliveriesCostScore: a peer relaying a few messages the
// ledger does not back keeps its score (a replica may lag); one that keeps
// doing it falls below the graylist threshold, and recovers as the count
// decays.
func TestUnbackedDeliveriesCostScore(t *testing.T) {
	d := newDeliveries(time.Minute)
	honest, flooder := testKey(t, 1).PeerID(), testKey(t, 2).PeerID()
	now := time.Now()
	for range 20 {
		d.add(honest, now)
	}
	for range 5000 {
		d.add(flooder, now)
	}
	if s := d.score(honest); s != 0 {
		t.Fatalf("a relay of 20 unbacked messages scores %v", s)
	}
	if s := d.score(flooder); s > graylistThreshold {
		t.Fatalf("a flooder of 5,000 scores %v, above the graylist threshold %v", s, float64(graylistThreshold))
	}
	later := &decaying{v: 5000, at: now.Add(-20 * time.Minute)}
	if v := d.decayed(later, now); v > 1 {
		t.Fatalf("after 20 half-lives the count is %v", v)
	}
}
