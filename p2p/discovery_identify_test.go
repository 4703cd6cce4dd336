package p2p

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/protocol/identify"
)

// TestFailedIdentifyReconnects: a bootstrap peer that does not answer
// identify (a validator too busy while a hundred machines start; here, a
// real host with no identify handler) leaves a connection gossipsub never
// uses. The node closes it and dials the peer again, rather than staying
// connected and deaf.
func TestFailedIdentifyReconnects(t *testing.T) {
	old := reidentifyDelay
	reidentifyDelay = 100 * time.Millisecond
	t.Cleanup(func() { reidentifyDelay = old })

	busy, err := NewHost(HostParams{Key: testKey(t, 2), Listen: []string{"/ip4/127.0.0.1/tcp/0"}, Version: "test", Site: "lab b", Moniker: "busy"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { busy.Close() })
	busy.RemoveStreamHandler(identify.ID)
	var inbound atomic.Int32
	busy.Network().Notify(&network.NotifyBundle{ConnectedF: func(_ network.Network, c network.Conn) {
		if c.Stat().Direction == network.DirInbound {
			inbound.Add(1)
		}
	}})

	node := newTestHost(t, testKey(t, 1))
	d, err := NewDiscovery(DiscoveryParams{Host: node, ChainID: testChain, DHT: DHTOff, Interval: time.Hour,
		Bootstrap: []peer.AddrInfo{{ID: busy.ID(), Addrs: busy.Addrs()}}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- d.Run(t.Context()) }()
	t.Cleanup(func() {
		if err := <-done; err != nil {
			t.Error(err)
		}
	})

	// Without the reconnect the first connection would stay up, alone,
	// for the hour until the next bootstrap round.
	deadline := time.Now().Add(20 * time.Second)
	for inbound.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("the busy peer saw %d connections from the node in 20 s; want it closed and dialled again, more than once", inbound.Load())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
