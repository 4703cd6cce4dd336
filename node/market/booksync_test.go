package market

import (
	"bytes"
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/p2p"
)

const syncChain = "deepmarket-booksync-test"

func seededKey(t *testing.T, b byte) *identity.Key {
	t.Helper()
	k, err := identity.KeyFromSeed(bytes.Repeat([]byte{b}, 32))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// signedOffer is k's machine's offer, signed for chain.
func signedOffer(t *testing.T, k *identity.Key, chain string) []byte {
	t.Helper()
	o := &p2p.Offer{Machine: k.PeerID().String(), Owner: string(k.Address()), Moniker: "pc", Site: "lab",
		Lent: p2p.Resources{Cores: 4, MemBytes: 8 << 30}, Price: p2p.Prices{CoreHour: 100_000}}
	raw, err := p2p.Seal(k, chain, p2p.TypeOffer, o, 1, time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// bookServer is a real libp2p host on loopback that serves entries as
// its offer book; served is closed once it has served a page.
func bookServer(t *testing.T, k *identity.Key, entries []p2p.BookEntry) (h host.Host, served <-chan struct{}) {
	t.Helper()
	h = syncHost(t, k)
	slices.SortFunc(entries, func(a, b p2p.BookEntry) int { return bytes.Compare([]byte(a.Machine), []byte(b.Machine)) })
	done := make(chan struct{})
	var once sync.Once
	srv := &p2p.BookServer{PagesPerMinute: 600, Entries: func(time.Time) []p2p.BookEntry {
		once.Do(func() { close(done) })
		return entries
	}}
	srv.Serve(&p2p.RPC{Host: h, Key: k, ChainID: syncChain})
	return h, done
}

func syncHost(t *testing.T, k *identity.Key) host.Host {
	t.Helper()
	h, err := p2p.NewHost(p2p.HostParams{Key: k, Listen: []string{"/ip4/127.0.0.1/tcp/0"}, Version: "test", NAT: p2p.NATParams{Off: true}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// TestBookSyncCopiesAPeersBook: a starting node copies the offers of a
// peer's book that check out, refusing forged ones; a peer whose book
// gives nothing valid does not count as a source, so the node goes on
// to the next peer that connects.
func TestBookSyncCopiesAPeersBook(t *testing.T) {
	ctx := t.Context()
	var good []p2p.BookEntry
	var want []string
	for i := range 5 {
		k := seededKey(t, byte(20+i))
		good = append(good, p2p.BookEntry{Machine: k.PeerID().String(), Raw: signedOffer(t, k, syncChain)})
		want = append(want, k.PeerID().String())
	}
	forger, other := seededKey(t, 30), seededKey(t, 31)
	var env p2p.Envelope
	if err := p2p.Unmarshal(signedOffer(t, forger, syncChain), &env); err != nil {
		t.Fatal(err)
	}
	env.Sig[0] ^= 0xff
	forged, err := p2p.Marshal(&env)
	if err != nil {
		t.Fatal(err)
	}
	junk := []p2p.BookEntry{
		{Machine: forger.PeerID().String(), Raw: forged},
		{Machine: other.PeerID().String(), Raw: signedOffer(t, other, "deepmarket-other")},
	}
	hJunk, junkServed := bookServer(t, seededKey(t, 1), junk)
	hGood, _ := bookServer(t, seededKey(t, 2), append(slices.Clone(good), junk[0]))

	k := seededKey(t, 3)
	h := syncHost(t, k)
	book := NewOfferBook(100, 100)
	s := NewBookSync(BookSyncParams{Book: book, Books: p2p.BookClient{RPC: &p2p.RPC{Host: h, Key: k, ChainID: syncChain}},
		Checker: p2p.NewValidator(syncChain, nil), MaxOffers: 100})
	s.sources, s.first, s.every = 1, 0, 50*time.Millisecond

	// The junk peer alone is connected when the sync starts: it is tried
	// first. The good one connects once the junk one has served its book.
	connect := func(to host.Host) {
		if err := h.Connect(ctx, peer.AddrInfo{ID: to.ID(), Addrs: to.Addrs()}); err != nil {
			t.Fatal(err)
		}
	}
	connect(hJunk)
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	select {
	case <-junkServed:
	case <-time.After(30 * time.Second):
		t.Fatal("the junk peer's book was never asked for")
	}
	connect(hGood)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(s.within):
		t.Fatal("the sync did not end after copying a good book")
	}
	var got []string
	for _, o := range book.List(time.Now()) {
		got = append(got, o.Offer.Machine)
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("the book holds %v, want the good peer's valid offers %v", got, want)
	}
}

// TestBookSyncCopiesAgainWhenGossipRejoins: once its first copies are
// done, the sync copies nothing more until the gossip says it lost a peer
// and reconnected it (Again); then it copies a peer's book once more, and
// the offers gossip missed meanwhile are in the book.
func TestBookSyncCopiesAgainWhenGossipRejoins(t *testing.T) {
	ctx := t.Context()
	var mu sync.Mutex
	var served []p2p.BookEntry
	for i := range 2 {
		k := seededKey(t, byte(40+i))
		served = append(served, p2p.BookEntry{Machine: k.PeerID().String(), Raw: signedOffer(t, k, syncChain)})
	}
	sk := seededKey(t, 5)
	hs := syncHost(t, sk)
	srv := &p2p.BookServer{PagesPerMinute: 600, Entries: func(time.Time) []p2p.BookEntry {
		mu.Lock()
		defer mu.Unlock()
		out := slices.Clone(served)
		slices.SortFunc(out, func(a, b p2p.BookEntry) int { return bytes.Compare([]byte(a.Machine), []byte(b.Machine)) })
		return out
	}}
	srv.Serve(&p2p.RPC{Host: hs, Key: sk, ChainID: syncChain})

	k := seededKey(t, 6)
	h := syncHost(t, k)
	if err := h.Connect(ctx, peer.AddrInfo{ID: hs.ID(), Addrs: hs.Addrs()}); err != nil {
		t.Fatal(err)
	}
	book := NewOfferBook(100, 100)
	again := make(chan struct{}, 1)
	s := NewBookSync(BookSyncParams{Book: book, Books: p2p.BookClient{RPC: &p2p.RPC{Host: h, Key: k, ChainID: syncChain}},
		Checker: p2p.NewValidator(syncChain, nil), MaxOffers: 100, Again: again})
	s.sources, s.first, s.every = 1, 0, 50*time.Millisecond
	go s.Run(ctx)

	count := func() int { return len(book.List(time.Now())) }
	waitFor := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(15 * time.Second); count() != n; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the book holds %d offers, want %d", count(), n)
			}
		}
	}
	waitFor(2)
	mu.Lock()
	for i := 2; i < 5; i++ {
		k := seededKey(t, byte(40+i))
		served = append(served, p2p.BookEntry{Machine: k.PeerID().String(), Raw: signedOffer(t, k, syncChain)})
	}
	mu.Unlock()
	// Twenty of the sync's looks, and past the server's one-second copy
	// of its book: the sync is done, and copies nothing unasked.
	time.Sleep(1100 * time.Millisecond)
	if n := count(); n != 2 {
		t.Fatalf("the book holds %d offers before the gossip asked again, want the first copy's 2", n)
	}
	again <- struct{}{}
	waitFor(5)
}

// countingBooks is one peer's book that records when it is copied; each
// copy holds one offer no earlier copy held.
type countingBooks struct {
	t      *testing.T
	mu     sync.Mutex
	copies []time.Time
}

func (c *countingBooks) Servers() []peer.ID { return []peer.ID{"server"} }

func (c *countingBooks) Fetch(ctx context.Context, p peer.ID, max int, each func(raw []byte) bool) (int, error) {
	c.mu.Lock()
	c.copies = append(c.copies, time.Now())
	n := len(c.copies)
	c.mu.Unlock()
	each(signedOffer(c.t, seededKey(c.t, byte(100+n)), syncChain))
	return 1, nil
}

func (c *countingBooks) times() []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.copies)
}

// TestBookSyncAgainIsBounded: a peer that keeps getting itself
// reconnected asks for copy after copy; the sync copies at most one book
// each againEvery, however often it is asked.
func TestBookSyncAgainIsBounded(t *testing.T) {
	defer func(d time.Duration) { againEvery = d }(againEvery)
	againEvery = 400 * time.Millisecond
	books := &countingBooks{t: t}
	again := make(chan struct{}, 1)
	s := NewBookSync(BookSyncParams{Book: NewOfferBook(10, 10), Books: books, Checker: p2p.NewValidator(syncChain, nil),
		MaxOffers: 10, Again: again})
	s.sources, s.first, s.every, s.within = 1, 0, 10*time.Millisecond, 50*time.Millisecond
	go s.Run(t.Context())
	time.Sleep(100 * time.Millisecond) // the first copy is done
	start := len(books.times())
	end := time.Now().Add(1100 * time.Millisecond)
	for time.Now().Before(end) { // asked again and again
		select {
		case again <- struct{}{}:
		default:
		}
		time.Sleep(5 * time.Millisecond)
	}
	got := books.times()[start:]
	if len(got) < 2 || len(got) > 4 {
		t.Fatalf("%d copies in 1.1 s of asking, want 2 to 4 (one each %s at most)", len(got), againEvery)
	}
	for i := 1; i < len(got); i++ {
		if d := got[i].Sub(got[i-1]); d < againEvery-20*time.Millisecond {
			t.Errorf("copies %s apart, want %s at least", d, againEvery)
		}
	}
}
