package p2p

import (
	"context"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/identity"
)

// TestStrangersAreLimitedPerAddress: one address cycling fresh keys at a
// node (a new libp2p host for each, real TCP connections) has its first
// strangerConns connections a minute taken, the next refused after its
// handshake, and every one after that refused at accept, before any
// handshake: what each costs the node is a lookup. Meanwhile a stranger
// from another address connects, a member from anywhere does, and an
// address a member connected from lately is not blocked for its
// strangers (a campus NAT shared with an attacker does not lock the lab
// out).
func TestStrangersAreLimitedPerAddress(t *testing.T) {
	members := map[peer.ID]bool{}
	member := testKey(t, 2)
	members[member.PeerID()] = true
	h, err := NewHost(HostParams{Key: testKey(t, 1), Listen: []string{"/ip4/127.0.0.1/tcp/0"}, Version: "test",
		NAT: NATParams{Off: true}, Member: func(p peer.ID) bool { return members[p] }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	node := h.(*Host)
	dialFrom := func(ip string, k *identity.Key) error {
		t.Helper()
		if k == nil {
			if k, err = identity.GenerateKey(); err != nil {
				t.Fatal(err)
			}
		}
		h, err := NewHost(HostParams{Key: k, Listen: []string{"/ip4/" + ip + "/tcp/0"}, Version: "test", NAT: NATParams{Off: true}})
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		if err := h.Connect(ctx, peer.AddrInfo{ID: node.ID(), Addrs: node.Addrs()}); err != nil {
			return err
		}
		// The node may refuse it once secured: the dialler learns of it
		// when its first stream fails or the connection closes.
		time.Sleep(20 * time.Millisecond)
		if len(h.Network().ConnsToPeer(node.ID())) == 0 {
			return context.Canceled
		}
		return nil
	}
	// A member shields its address: 127.0.0.4.
	if err := dialFrom("127.0.0.4", member); err != nil {
		t.Fatalf("the member from 127.0.0.4: %v", err)
	}
	took, tries, start := 0, strangerConns+20, time.Now()
	for range tries {
		if dialFrom("127.0.0.2", nil) == nil {
			took++
		}
	}
	// The budget refills meanwhile, a connection every 0.5 s.
	most := strangerConns + int(time.Since(start)/(time.Minute/strangerConns)) + 1
	accept, handshake := node.StrangersRefused()
	if took > most || took < strangerConns || handshake != 1 || accept != uint64(tries-took-1) {
		t.Fatalf("one address's strangers: %d connections taken of %d, %d refused after their handshake, %d at accept; want %d to %d, then 1, then the rest",
			took, tries, handshake, accept, strangerConns, most)
	}
	if err := dialFrom("127.0.0.3", nil); err != nil {
		t.Errorf("a stranger from another address: %v", err)
	}
	if err := dialFrom("127.0.0.1", member); err != nil {
		t.Errorf("the member from 127.0.0.1: %v", err)
	}
	// Strangers from the member's address go over its budget too, but
	// the address is not blocked at accept: the member still connects.
	for range strangerConns + 5 {
		_ = dialFrom("127.0.0.4", nil)
	}
	before, _ := node.StrangersRefused()
	if err := dialFrom("127.0.0.4", member); err != nil {
		t.Errorf("the member from its address after its strangers went over: %v", err)
	}
	if after, _ := node.StrangersRefused(); after != before {
		t.Errorf("the member's address was refused at accept %d times", after-before)
	}
}
