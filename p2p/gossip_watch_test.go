package p2p

import (
	"testing"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
)

// TestDeafPeerIsReconnected: a real peer that says it speaks gossipsub
// but resets every gossipsub stream (as a busy peer whose stream open
// timed out looks to the router: given up on, still connected) is
// disconnected; a healthy gossip peer stays, and so does a plain
// gossipsub peer that joins no topic at all.
func TestDeafPeerIsReconnected(t *testing.T) {
	oldAfter, oldCheck := deafAfter, deafCheck
	deafAfter, deafCheck = 300*time.Millisecond, 100*time.Millisecond
	t.Cleanup(func() { deafAfter, deafCheck = oldAfter, oldCheck })
	ctx := t.Context()

	ka, kb, kc := testKey(t, 1), testKey(t, 2), testKey(t, 3)
	a, broken, healthy, quiet := newTestHost(t, ka), newTestHost(t, kb), newTestHost(t, kc), newTestHost(t, testKey(t, 4))
	if _, err := pubsub.NewGossipSub(ctx, quiet); err != nil {
		t.Fatal(err)
	}
	for _, proto := range gossipProtocols {
		broken.SetStreamHandler(proto, func(s network.Stream) { s.Reset() })
	}
	ga, err := NewGossip(ctx, GossipParams{Host: a, Key: ka, ChainID: testChain})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-ga.Rejoined():
		t.Fatal("the gossip says it rejoined before any peer was reconnected")
	default:
	}
	if _, err := NewGossip(ctx, GossipParams{Host: healthy, Key: kc, ChainID: testChain}); err != nil {
		t.Fatal(err)
	}
	for _, h := range []peer.AddrInfo{{ID: broken.ID(), Addrs: broken.Addrs()}, {ID: healthy.ID(), Addrs: healthy.Addrs()},
		{ID: quiet.ID(), Addrs: quiet.Addrs()}} {
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
	select { // the book is copied again (market.BookSync)
	case <-ga.Rejoined():
	case <-time.After(time.Second):
		t.Fatal("the broken peer was reconnected and Rejoined has no value")
	}
	time.Sleep(deafAfter + 2*deafCheck) // as long again as the broken peer was given
	if a.Network().Connectedness(healthy.ID()) != network.Connected {
		t.Fatal("the healthy gossip peer was disconnected too")
	}
	if a.Network().Connectedness(quiet.ID()) != network.Connected {
		t.Fatal("a gossipsub peer on no topic was disconnected: the router talks to it")
	}
}
