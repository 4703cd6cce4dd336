package p2p

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/identity"
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
	srv.Serve(server)
	calls := 0
	loop.Handle(BookProtocol(testChain), func(context.Context, peer.ID, *Envelope) (string, any, error) {
		calls++
		return TypeBookPage, BookPage{Offers: [][]byte{book[0].Raw}, Next: "1"}, nil // never past "1"
	})
	for _, p := range []*RPC{server, loop} {
		connect(t, client.Host, p.Host)
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
	// A member's machines share its budget, and all members together
	// may fetch bookMembersShare members' budgets.
	machine := rpcHost(t, 9)
	members := []*RPC{rpcHost(t, 4), rpcHost(t, 5), rpcHost(t, 6), rpcHost(t, 7)}
	adm := backing(client.Key, members[0].Key, members[1].Key, members[2].Key, members[3].Key)
	adm[string(machine.Key.Public())] = client.Key.Address()
	small := &BookServer{Entries: func(time.Time) []BookEntry { return book[:1] }, PagesPerMinute: 1, Admission: adm}
	small.Serve(server)
	for i, c := range append([]*RPC{client, machine}, members...) {
		connect(t, c.Host, server.Host)
		_, err := FetchBook(t.Context(), c, server.Host.ID(), 1000, func([]byte) bool { return true })
		if want := i != 1 && i <= bookMembersShare; (err == nil) != want {
			t.Fatalf("peer %d of 6 (the second a machine of the first's member) with one page a minute each, %d in all: %v", i+1, bookMembersShare, err)
		}
	}
	// max bounds what one peer may hand over.
	srv.Serve(server)
	srv.PagesPerMinute, srv.members, srv.all = 100, nil, nil
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

// Strangers hammering a node's book get a few pages between them and are
// then reset before their requests are read; a member that just started
// still copies the whole book meanwhile, and thousands of fresh keys
// leave no trace in the server's tables.
func TestStrangersCannotSpendTheBookBudget(t *testing.T) {
	server, newcomer := rpcHost(t, 1), rpcHost(t, 2)
	book := bookOf(t, 200)
	pages := 1
	for p := PageAfter(book, ""); p.Next != ""; p = PageAfter(book, p.Next) {
		pages++
	}
	// Each member may copy the book once a minute.
	srv := &BookServer{Entries: func(time.Time) []BookEntry { return book }, PagesPerMinute: pages, Admission: backing(newcomer.Key)}
	srv.Serve(server)
	connect(t, newcomer.Host, server.Host)

	ctx, stop := context.WithCancel(t.Context())
	var served, refused atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		evil := stranger(t, server.Host)
		wg.Go(func() {
			for ctx.Err() == nil {
				var page BookPage
				if err := evil.Call(ctx, server.Host.ID(), BookProtocol(testChain), TypeBookRequest, &BookRequest{}, TypeBookPage, &page); err != nil {
					refused.Add(1)
				} else {
					served.Add(1)
				}
			}
		})
	}
	for refused.Load() < 64 && t.Context().Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	n, err := FetchBook(t.Context(), newcomer, server.Host.ID(), 1000, func([]byte) bool { return true })
	stop()
	wg.Wait()
	if err != nil || n != len(book) {
		t.Errorf("a member copied %d offers of %d while strangers hammered the book: %v", n, len(book), err)
	}
	if got, most := served.Load(), int64(max(pages/bookStrangersShare, 1)); got > most {
		t.Errorf("strangers were served %d pages (%d refused), more than their %d", got, refused.Load(), most)
	}

	// A stranger over the budget is reset before its request is read:
	// one that sends half a request is not waited for.
	evil := stranger(t, server.Host)
	st, err := evil.Host.NewStream(t.Context(), server.Host.ID(), BookProtocol(testChain))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	st.SetDeadline(time.Now().Add(2 * time.Second))
	st.Write(binary.AppendUvarint(nil, 1000)) // a frame of 1000 bytes, none sent
	if _, err := st.Read(make([]byte, 1)); !errors.Is(err, network.ErrReset) {
		t.Errorf("half a stranger's request: %v; want a reset before it is read", err)
	}

	// Fresh keys are remembered nowhere.
	pub := make([]byte, 32)
	for i := range maxBookMembers + 1000 {
		binary.BigEndian.PutUint32(pub, uint32(i))
		srv.allow(identity.PeerIDOf(pub), time.Now())
	}
	if got := len(srv.members); got != 1 {
		t.Errorf("the server keeps %d budgets after %d strangers; want the member's alone", got, maxBookMembers+1000)
	}
}
