package node

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/lender"
	"github.com/deepmarket/deepmarket/p2p"
)

// announcement is one of the lender's offers as a peer received it.
type announcement struct {
	at, expires time.Time
}

// watchOffers records the offers machine announces, as a peer subscribed
// to the offers topic receives them.
func watchOffers(ctx context.Context, t *testing.T, sub *pubsub.Subscription, chain, machine string) func(since time.Time) []announcement {
	var mu sync.Mutex
	var seen []announcement
	go func() {
		for {
			msg, err := sub.Next(ctx)
			if err != nil {
				return
			}
			now := time.Now()
			env, err := p2p.Open(msg.Data, chain, now)
			if err != nil || env.Type != p2p.TypeOffer || env.SignerID().String() != machine {
				continue
			}
			mu.Lock()
			seen = append(seen, announcement{at: now, expires: env.ExpiresAt()})
			mu.Unlock()
		}
	}()
	return func(since time.Time) []announcement {
		mu.Lock()
		defer mu.Unlock()
		var out []announcement
		for _, a := range seen {
			if !a.at.Before(since) {
				out = append(out, a)
			}
		}
		return out
	}
}

// A lending machine in a market too big for its announce_interval
// stretches it, and its offer's TTL with it, to keep the market's
// announcements within announce_budget. The market here is real: forty
// machines the ledger backs (genesis made their keys members) announce
// signed offers from a real libp2p peer; a second peer counts the
// lender's own announcements before and after, and a second node keeps
// its offer past the configured TTL.
func TestAnnouncePaceStretchesWithTheMarket(t *testing.T) {
	if testing.Short() {
		t.Skip("30 s of gossip")
	}
	chain := testNet(t)
	ctx := t.Context()
	const machines = 40
	keys, members := memberKeys(t, machines)
	homes := initNetwork(t, t.TempDir(), chain, []string{"lender", "peer"}, members...)
	pace := func(c *Config) {
		c.P2P.AnnounceInterval = Duration{2 * time.Second}
		c.P2P.OfferTTL = Duration{10 * time.Second}
		c.P2P.AnnounceBudget = 60        // a minute: stretched past 2 s from 3 machines on
		c.P2P.ProbeInterval = Duration{} // a measured link re-announces at once
	}
	node := startNode(t, homes[0], pace)
	me := node.Host().ID().String()
	peerNode := startNode(t, homes[1], pace, withBootstrap(node.addr()))
	observer := newRawPeer(t, ctx, chain, node)
	topic, sub := observer.join(t, p2p.OffersTopic(chain))
	eventually(t, 30*time.Second, "the observer on the lender's offers topic", func() bool { return len(topic.ListPeers()) > 0 })
	// The TensorFlow probe's end re-announces at once too (on a busy
	// machine it ends tens of seconds after start); count from after it.
	eventually(t, 100*time.Second, "the lender's inventory probe", func() bool { return !node.Inventory().Probing })
	heard := watchOffers(ctx, t, sub, chain, me)
	if _, err := node.client.SetLend(ctx, api.LendRequest{Cores: 1, MemBytes: 1 << 30}); err != nil {
		t.Fatal(err)
	}

	// Alone, it announces every 2 s, each offer kept 10 s.
	start := time.Now()
	time.Sleep(9 * time.Second)
	alone := heard(start)
	if len(alone) < 3 {
		t.Fatalf("alone, the lender announced %d times in 9 s; want every 2 s", len(alone))
	}
	for _, a := range alone {
		if ttl := a.expires.Sub(a.at); ttl > 11*time.Second {
			t.Fatalf("alone, an offer lives %s; want offer_ttl, 10 s", ttl)
		}
	}
	st, err := node.client.Lend(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.AnnounceEveryS != 2 || st.OfferTTLS != 10 {
		t.Fatalf("alone, lend reports every %d s, TTL %d s; want 2 and 10", st.AnnounceEveryS, st.OfferTTLS)
	}

	// Forty more machines come: 41 announcing every 2 s would make 1,230
	// a minute; at 60 a minute each announces every 41 s.
	flood := time.Now()
	exp := flood.Add(time.Hour)
	for i, k := range keys {
		announceAs(t, topic, k, sealedOffer(t, k, chain, fmt.Sprint("lab", i), 1, exp))
	}
	eventually(t, 20*time.Second, "the lender's book to hold the forty machines", func() bool { return node.book.Len() >= machines })
	want := lender.PaceFor(node.book.Len(), node.cfg.P2P.Pace())
	if want.Interval < 40*time.Second {
		t.Fatalf("PaceFor(%d machines) = %s: the test's market is too small to stretch the pace", node.book.Len(), want.Interval)
	}
	// The pace follows the book, which may still change by one (the
	// lender's own offer, re-announced late on a busy machine): compare
	// with the book as it is when lend reports.
	eventually(t, time.Minute, "lend to report the stretched pace", func() bool {
		st, err := node.client.Lend(ctx)
		want = lender.PaceFor(node.book.Len(), node.cfg.P2P.Pace())
		return err == nil && time.Duration(st.AnnounceEveryS)*time.Second == want.Interval && time.Duration(st.OfferTTLS)*time.Second == want.TTL
	})
	// The announcement that took the new pace carries its stretched TTL;
	// the quiet starts once it is heard (on a busy machine it may come
	// seconds after lend reports the pace).
	var quiet time.Time
	eventually(t, 10*time.Second, "the announcement that took the new pace", func() bool {
		for _, a := range heard(flood) {
			if a.expires.Sub(a.at) > 11*time.Second {
				quiet = a.at.Add(time.Millisecond)
				return true
			}
		}
		return false
	})
	// Every 2 s would be 7 in 15 s; one more (a late refresh on a busy
	// machine) still shows the stretch.
	time.Sleep(15*time.Second - time.Since(quiet))
	refreshed := len(heard(quiet)) == 1
	if got := heard(quiet); len(got) > 1 {
		t.Fatalf("the lender announced %d times in 15 s with %d machines in its book; want every %s", len(got), node.book.Len(), want.Interval)
	}
	// The announcement that took the new pace carries the stretched TTL,
	// so peers keep the offer between announcements.
	var last *announcement
	for _, a := range heard(flood) {
		if a.expires.Sub(a.at) > 11*time.Second {
			last = &a
		}
	}
	if last == nil {
		t.Fatal("no announcement since the market grew carries a stretched TTL")
	}
	if ttl := last.expires.Sub(last.at); ttl < want.TTL-2*time.Second || ttl > want.TTL+time.Second {
		t.Fatalf("the stretched offer lives %s; want %s", ttl, want.TTL)
	}
	// Peers keep the offer 12 s after the announcement at least (the
	// default pace's TTL would have dropped it). After a late refresh, the
	// offer they hold says nothing of that: its carried TTL is checked
	// above.
	if !hasOffer(peerNode, me) || (!refreshed && time.Since(last.at) < 12*time.Second) {
		t.Fatalf("a peer dropped the lender's offer %s after its last announcement", time.Since(last.at).Round(time.Second))
	}
}

// A node that joins a market whose machines announce slowly copies the
// offer book of the peers it meets, instead of waiting for each machine's
// next announcement. Thirty machines the ledger backs announced once,
// before it started, and never again; a hostile peer serves a book of
// forged, altered, expired and foreign offers whose pages never end. The
// newcomer holds the thirty, and nothing of the hostile book.
func TestNewNodeCopiesTheOfferBook(t *testing.T) {
	t.Parallel()
	chain := testNet(t)
	ctx := t.Context()
	const machines = 30
	keys, members := memberKeys(t, machines)
	homes := initNetwork(t, t.TempDir(), chain, []string{"first", "newcomer"}, members...)
	first := startNode(t, homes[0])
	pub := newRawPeer(t, ctx, chain, first)
	topic, _ := pub.join(t, p2p.OffersTopic(chain))
	eventually(t, 30*time.Second, "the machines' peer on the first node's offers topic", func() bool { return len(topic.ListPeers()) > 0 })
	for i, k := range keys {
		announceAs(t, topic, k, sealedOffer(t, k, chain, fmt.Sprint("lab", i), 1, time.Now().Add(time.Hour)))
	}
	eventually(t, 20*time.Second, "the first node to hold the thirty machines", func() bool { return first.book.Len() == machines })

	// The hostile peer's book: a machine the ledger does not back, a
	// backed machine's offer altered after signing, one expired, one
	// signed for another network; page after page, never past "1".
	evil := newRawPeer(t, ctx, chain)
	stranger, _ := identity.GenerateKey()
	altered := bytes.Replace(sealedOffer(t, keys[0], chain, "forged-moniker", 9, time.Now().Add(time.Hour)), []byte("forged-moniker"), []byte("FORGED-moniker"), 1)
	hostile := [][]byte{
		sealedOffer(t, stranger, chain, "forged-stranger", 1, time.Now().Add(time.Hour)),
		altered,
		sealedOffer(t, keys[1], chain, "forged-expired", 9, time.Now().Add(-time.Minute)),
		sealedOffer(t, keys[2], "another-network", "forged-foreign", 9, time.Now().Add(time.Hour)),
	}
	var served atomic.Int32
	evil.rpc.Handle(p2p.BookProtocol(chain), func(context.Context, peer.ID, *p2p.Envelope) (string, any, error) {
		served.Add(1)
		return p2p.TypeBookPage, p2p.BookPage{Offers: hostile, Next: "1"}, nil
	})

	late := startNode(t, homes[1], withBootstrap(first.addr()))
	if err := evil.rpc.Host.Connect(ctx, peer.AddrInfo{ID: late.Host().ID(), Addrs: late.Host().Addrs()}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the newcomer to copy the thirty machines", func() bool { return late.book.Len() >= machines })
	eventually(t, 30*time.Second, "the newcomer to ask the hostile peer too", func() bool { return served.Load() > 0 })
	time.Sleep(time.Second)
	if n := served.Load(); n > 2 {
		t.Errorf("the newcomer fetched %d pages of a book that made no progress; want it to stop after the second", n)
	}
	held := late.Offers()
	if len(held) != machines {
		t.Errorf("the newcomer holds %d offers, want the %d machines'", len(held), machines)
	}
	for _, o := range held {
		if strings.HasPrefix(o.Moniker, "forged") || strings.HasPrefix(o.Moniker, "FORGED") {
			t.Errorf("the newcomer holds the hostile book's %+v", o)
		}
	}
	// Gossip still works after the copy: a machine's next announcement
	// (a later sequence) replaces the copied one, and is not taken for a
	// replay.
	k := keys[3]
	announceAs(t, topic, k, sealedOffer(t, k, chain, "lab3-renamed", 2, time.Now().Add(time.Hour)))
	eventually(t, 20*time.Second, "the newcomer to take the machine's next announcement", func() bool {
		for _, o := range late.Offers() {
			if o.Moniker == "lab3-renamed" {
				return true
			}
		}
		return false
	})
}

// memberKeys are n machine keys whose accounts genesis makes members, so
// the ledger backs their machines. Each runs a bare libp2p host, so that
// the machine answers a node's check before its offer enters the book
// (market.Vet); sealedOffer gives its address.
func memberKeys(t *testing.T, n int) ([]*identity.Key, []identity.Address) {
	t.Helper()
	keys := make([]*identity.Key, n)
	members := make([]identity.Address, n)
	for i := range keys {
		k, err := identity.GenerateKey()
		if err != nil {
			t.Fatal(err)
		}
		keys[i], members[i] = k, k.Address()
		h, err := p2p.NewHost(p2p.HostParams{Key: k, Listen: []string{"/ip4/127.0.0.1/tcp/0"}, Version: "machine", NAT: p2p.NATParams{Off: true}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		machineAddrs.Store(k.PeerID(), p2p.FullAddrs(h))
	}
	return keys, members
}

// machineAddrs are the addresses of memberKeys' machines, by peer ID.
var machineAddrs sync.Map

// sealedOffer is machine k's offer signed for chainID.
func sealedOffer(t *testing.T, k *identity.Key, chainID, moniker string, seq uint64, exp time.Time) []byte {
	t.Helper()
	addrs := []string{"/ip4/127.0.0.1/tcp/9/p2p/" + k.PeerID().String()}
	if a, ok := machineAddrs.Load(k.PeerID()); ok {
		addrs = a.([]string)
	}
	o := &p2p.Offer{Machine: k.PeerID().String(), Owner: string(k.Address()), Moniker: moniker, Site: "lab-a",
		Lent: p2p.Resources{Cores: 4, MemBytes: 8 << 30}, Addrs: addrs, Software: p2p.Software{OS: "linux"}}
	data, err := p2p.Seal(k, chainID, p2p.TypeOffer, o, seq, exp)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// announceAs publishes data on topic as machine k's own message.
func announceAs(t *testing.T, topic *pubsub.Topic, k *identity.Key, data []byte) {
	t.Helper()
	if err := topic.Publish(t.Context(), data, pubsub.WithSecretKeyAndPeerId(k.PrivKey(), k.PeerID())); err != nil {
		t.Fatal(err)
	}
}
