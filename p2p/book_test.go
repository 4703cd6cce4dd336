package p2p

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// bookOf is a book of n distinct signed offers, sorted by machine.
func bookOf(t *testing.T, n int) []BookEntry {
	t.Helper()
	var out []BookEntry
	for i := range n {
		k := testKey(t, byte(10+i))
		out = append(out, BookEntry{Machine: k.PeerID().String(), Raw: seal(t, k, testChain, TypeOffer, testOffer(k), 1, time.Now().Add(time.Hour))})
	}
	for i := range out { // sort by machine
		for j := i + 1; j < len(out); j++ {
			if out[j].Machine < out[i].Machine {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

func TestBookPagesCoverTheBookOnce(t *testing.T) {
	book := bookOf(t, 200)
	var got [][]byte
	after, pages := "", 0
	for {
		p := PageAfter(book, after)
		pages++
		size := 0
		for _, o := range p.Offers {
			size += len(o)
		}
		if size > bookPageBytes {
			t.Fatalf("page %d holds %d bytes, more than %d", pages, size, bookPageBytes)
		}
		got = append(got, p.Offers...)
		if p.Next == "" {
			break
		}
		if p.Next <= after {
			t.Fatalf("page %d: next %q is not past %q", pages, p.Next, after)
		}
		after = p.Next
	}
	if len(got) != len(book) || pages < 2 {
		t.Fatalf("%d pages gave %d offers of %d", pages, len(got), len(book))
	}
	for i := range got {
		if !bytes.Equal(got[i], book[i].Raw) {
			t.Fatalf("offer %d differs from the book's", i)
		}
	}
}

// A real peer serves its book over the book protocol, within a budget of
// pages; a peer whose pages make no progress is left after one page.
func TestFetchBook(t *testing.T) {
	server, client, loop := rpcHost(t, 1), rpcHost(t, 2), rpcHost(t, 3)
	book := bookOf(t, 200)
	pages := 1
	for p := PageAfter(book, ""); p.Next != ""; p = PageAfter(book, p.Next) {
		pages++
	}
	srv := &BookServer{Entries: func(time.Time) []BookEntry { return book }, PagesPerMinute: pages}
	server.Handle(BookProtocol(testChain), srv.Handle)
	calls := 0
	loop.Handle(BookProtocol(testChain), func(context.Context, peer.ID, *Envelope) (string, any, error) {
		calls++
		return TypeBookPage, BookPage{Offers: [][]byte{book[0].Raw}, Next: "1"}, nil // never past "1"
	})
	for _, p := range []*RPC{server, loop} {
		if err := client.Host.Connect(t.Context(), peer.AddrInfo{ID: p.Host.ID(), Addrs: p.Host.Addrs()}); err != nil {
			t.Fatal(err)
		}
	}
	var got [][]byte
	n, err := FetchBook(t.Context(), client, server.Host.ID(), 1000, func(raw []byte) bool { got = append(got, raw); return true })
	if err != nil || n != len(book) || len(got) != len(book) {
		t.Fatalf("fetched %d offers (%d handed on), %v; want %d", n, len(got), err, len(book))
	}
	// The budget: as many pages a minute as the book has, spent above.
	if _, err := FetchBook(t.Context(), client, server.Host.ID(), 1000, func([]byte) bool { return true }); err == nil {
		t.Fatal("a peer fetched more pages than its budget")
	}
	// All peers together may fetch twice one peer's budget: fresh keys
	// cost nothing.
	small := &BookServer{Entries: func(time.Time) []BookEntry { return book[:1] }, PagesPerMinute: 1}
	server.Handle(BookProtocol(testChain), small.Handle)
	for i, c := range []*RPC{client, rpcHost(t, 4), rpcHost(t, 5)} {
		if err := c.Host.Connect(t.Context(), peer.AddrInfo{ID: server.Host.ID(), Addrs: server.Host.Addrs()}); err != nil {
			t.Fatal(err)
		}
		_, err := FetchBook(t.Context(), c, server.Host.ID(), 1000, func([]byte) bool { return true })
		if (err == nil) != (i < 2) {
			t.Fatalf("peer %d of 3 with one page a minute each, two in all: %v", i+1, err)
		}
	}
	// max bounds what one peer may hand over.
	server.Handle(BookProtocol(testChain), srv.Handle)
	srv.PagesPerMinute, srv.peers, srv.all = 100, nil, nil
	if n, err := FetchBook(t.Context(), client, server.Host.ID(), 10, func([]byte) bool { return true }); err != nil || n != 10 {
		t.Fatalf("fetched %d offers with max 10: %v", n, err)
	}
	n, err = FetchBook(t.Context(), client, loop.Host.ID(), 1000, func([]byte) bool { return true })
	if !errors.Is(err, ErrOutOfRange) || calls != 2 || n != 2 {
		t.Fatalf("a peer that makes no progress: %d offers in %d calls, %v", n, calls, err)
	}
}

// CheckOffer checks a synced offer like a gossiped one, and records
// nothing: the same offer may still come by gossip.
func TestCheckOfferRecordsNothing(t *testing.T) {
	k := testKey(t, 1)
	v := NewValidator(testChain, nil)
	data := seal(t, k, testChain, TypeOffer, testOffer(k), 1, time.Now().Add(time.Hour))
	for range 2 {
		if _, err := v.CheckOffer(data, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := v.Validate(OffersTopic(testChain), data, k.PeerID(), time.Now()); err != nil {
		t.Fatalf("gossiped after a sync: %v", err)
	}
	w := seal(t, k, testChain, TypeWithdrawal, &Withdrawal{Machine: k.PeerID().String()}, 2, time.Now().Add(time.Hour))
	if _, err := v.CheckOffer(w, time.Now()); !errors.Is(err, ErrUnknownType) {
		t.Fatalf("a withdrawal in a book: %v", err)
	}
	bad := bytes.Clone(data)
	bad[len(bad)-3] ^= 1
	if _, err := v.CheckOffer(bad, time.Now()); err == nil {
		t.Fatal("an altered offer passed")
	}
	other := seal(t, k, "another-chain", TypeOffer, testOffer(k), 3, time.Now().Add(time.Hour))
	if _, err := v.CheckOffer(other, time.Now()); err == nil {
		t.Fatal("another network's offer passed")
	}
	old := seal(t, k, testChain, TypeOffer, testOffer(k), 4, time.Now().Add(-time.Minute))
	if _, err := v.CheckOffer(old, time.Now()); err == nil {
		t.Fatal("an expired offer passed")
	}
}
