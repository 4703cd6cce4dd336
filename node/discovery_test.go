package node

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/p2p"
)

// TestDHTFindsPeersBeyondBootstrap: B and C only know A; through the
// DeepMarket DHT (server mode on loopback, where auto mode would stay a
// client) they find and connect to each other.
func TestDHTFindsPeersBeyondBootstrap(t *testing.T) {
	t.Parallel()
	chain := testNet(t)
	dht := func(c *Config) {
		c.P2P.DHT = p2p.DHTServer
		c.P2P.DiscoverInterval = Duration{time.Second}
	}
	a := startNode(t, initHome(t, filepath.Join(t.TempDir(), "a"), chain), dht)
	b := startNode(t, initHome(t, filepath.Join(t.TempDir(), "b"), chain), dht, withBootstrap(a.addr()))
	c := startNode(t, initHome(t, filepath.Join(t.TempDir(), "c"), chain), dht, withBootstrap(a.addr()))
	eventually(t, 45*time.Second, "B and C connected through the DHT", func() bool {
		for _, p := range b.PeerIDs() {
			if p == c.Host().ID() {
				return true
			}
		}
		return false
	})
}

// TestMDNSFindsLANPeers: two nodes with no bootstrap peers find each other
// by mDNS, as machines of one lab do.
func TestMDNSFindsLANPeers(t *testing.T) {
	t.Parallel()
	if !multicastAvailable() {
		t.Skip("no multicast-capable interface on this machine")
	}
	chain := testNet(t)
	mdns := func(c *Config) { c.P2P.MDNS = true }
	a := startNode(t, initHome(t, filepath.Join(t.TempDir(), "a"), chain), mdns)
	b := startNode(t, initHome(t, filepath.Join(t.TempDir(), "b"), chain), mdns)
	// Usually within seconds; the browser's queries back off, and a first
	// one can be lost while other packages' tests add and remove
	// interfaces (netlab's veth pairs), so the next may come a minute on.
	eventually(t, 90*time.Second, "A and B connected by mDNS", func() bool { return len(b.PeerIDs()) > 0 && len(a.PeerIDs()) > 0 })
	if b.PeerIDs()[0] != a.Host().ID() {
		t.Fatalf("B connected to %s, not A", b.PeerIDs()[0])
	}
}

// TestBidsTravel: a bid published through A's API arrives, validated, in
// B's bid list.
func TestBidsTravel(t *testing.T) {
	t.Parallel()
	chain := testNet(t)
	homes := initNetwork(t, t.TempDir(), chain, []string{"a", "b"})
	a := startNode(t, homes[0])
	b := startNode(t, homes[1], withBootstrap(a.addr()))
	eventually(t, 10*time.Second, "B connected to A", func() bool { return len(b.PeerIDs()) == 1 })
	// Gossip goes to peers known to be on the topic: wait until A knows.
	eventually(t, 10*time.Second, "A to see B on the bids topic", func() bool { return len(a.gossip.Bids().ListPeers()) == 1 })
	bid := p2p.Bid{
		JobID: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", Workers: 2,
		PerWorker: p2p.Resources{Cores: 1, MemBytes: 1 << 30}, MaxPrice: 3_000_000, Duration: 600, Framework: "tensorflow",
	}
	if _, err := a.client.PublishBid(t.Context(), api.PublishBidRequest{Bid: bid, TTL: "5m"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the bid on B", func() bool {
		bids, err := b.client.Bids(t.Context())
		if err != nil || len(bids) != 1 {
			return false
		}
		got := bids[0]
		return got.JobID == bid.JobID && got.Submitter == string(a.Key().Address()) && got.From == a.Host().ID().String() && got.Workers == 2
	})
	// Its own node lists it too, once.
	if bids, err := a.client.Bids(t.Context()); err != nil || len(bids) != 1 || bids[0].JobID != bid.JobID {
		t.Errorf("the bidder's own bids: %+v (%v)", bids, err)
	}
	bad := bid
	bad.Workers = 0
	if _, err := a.client.PublishBid(t.Context(), api.PublishBidRequest{Bid: bad}); err == nil {
		t.Fatal("a bid with zero workers was published")
	}
}
