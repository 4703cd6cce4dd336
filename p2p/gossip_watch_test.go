package p2p

import (
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
)

// TestDeafPeerIsReconnected: a real peer that says it speaks gossipsub
// but resets every gossipsub stream (as a busy peer whose stream open
// timed out looks to the router: given up on, still connected) is
// disconnected; a healthy gossip peer stays.
func TestDeafPeerIsReconnected(t *testing.T) {
	oldAfter, oldCheck := deafAfter, deafCheck
	deafAfter, deafCheck = 300*time.Millisecond, 100*time.Millisecond
	t.Cleanup(func() { deafAfter, deafCheck = oldAfter, oldCheck })
	ctx := t.Context()

	ka, kb, kc := testKey(t, 1), testKey(t, 2), testKey(t, 3)
	a, broken, healthy := newTestHost(t, ka), newTestHost(t, kb), newTestHost(t, kc)
	for _, proto := range gossipProtocols {
		broken.SetStreamHandler(proto, func(s network.Stream) { s.Reset() })
	}
	if _, err := NewGossip(ctx, GossipParams{Host: a, Key: ka, ChainID: testChain}); err != nil {
		t.Fatal(err)
	}
	if _, err := NewGossip(ctx, GossipParams{Host: healthy, Key: kc, ChainID: testChain}); err != nil {
		t.Fatal(err)
	}
	for _, h := range []peer.AddrInfo{{ID: broken.ID(), Addrs: broken.Addrs()}, {ID: healthy.ID(), Addrs: healthy.Addrs()}} {
		if err := a.Connect(ctx, h); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(15 * time.Second)
	for a.Network().Connectedness(broken.ID()) == network.Connected {
		if time.Now().After(deadline) {
			t.Fatal("still connected to a peer that speaks gossipsub and resets every stream, after 15 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if a.Network().Connectedness(healthy.ID()) != network.Connected {
		t.Fatal("the healthy gossip peer was disconnected too")
	}
}
