package p2p

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"golang.org/x/time/rate"
)

// Offer book sync. Gossip carries each offer once per announcement, and a
// big market announces slowly (a machine re-announces every few minutes
// there), so a node that just joined would take that long to see the
// market. Instead it asks a peer or two for their offer books: the signed
// offers, page by page, each checked like a gossiped one (signature,
// expiry, ledger admission), so a peer can withhold offers but not forge
// or alter one.
const (
	TypeBookRequest = "book-request/1"
	TypeBookPage    = "book-page/1"
)

// BookProtocol carries offer-book pages.
func BookProtocol(chainID string) protocol.ID {
	return protocol.ID("/deepmarket/" + chainID + "/book/1")
}

// BookRequest asks for the offers of the machines after After (a peer
// ID; "" for the first page), in order.
type BookRequest struct {
	After string `cbor:"after,omitempty" json:"after,omitempty"`
}

// BookPage is a page of signed offers as gossiped; Next is the request's
// After for the next page, "" at the end.
type BookPage struct {
	Offers [][]byte `cbor:"offers" json:"offers"`
	Next   string   `cbor:"next,omitempty" json:"next,omitempty"`
}

// BookEntry is one offer a node holds, for serving its book.
type BookEntry struct {
	Machine string
	Raw     []byte
}

// bookPageBytes bounds a page's offers so the page fits an envelope.
const bookPageBytes = MaxEnvelopeSize - 4<<10

// PageAfter is the page of entries (sorted by machine) after after.
func PageAfter(entries []BookEntry, after string) BookPage {
	var page BookPage
	size, last := 0, ""
	from := sort.Search(len(entries), func(i int) bool { return entries[i].Machine > after })
	for _, e := range entries[from:] {
		if len(e.Raw)+8 > bookPageBytes {
			continue
		}
		if size+len(e.Raw)+8 > bookPageBytes {
			page.Next = last
			break
		}
		page.Offers = append(page.Offers, e.Raw)
		size += len(e.Raw) + 8
		last = e.Machine
	}
	return page
}

// BookServer answers book requests from a node's offer book, with a
// budget per peer and one for all peers together, so nobody makes the
// node page through its book without end (peer IDs cost nothing).
type BookServer struct {
	// Entries is the book now, sorted by machine.
	Entries func(now time.Time) []BookEntry
	// PagesPerMinute each peer may fetch (with a burst of as many); a
	// whole book of 20,000 offers is about 300 pages. All peers together
	// may fetch twice as many.
	PagesPerMinute int

	mu      sync.Mutex
	peers   map[peer.ID]*rate.Limiter
	all     *rate.Limiter
	entries []BookEntry // the book as of built, for a second
	built   time.Time
}

// maxBookPeers bounds the per-peer budgets remembered.
const maxBookPeers = 4096

// Handle is the RPC handler.
func (b *BookServer) Handle(_ context.Context, from peer.ID, env *Envelope) (string, any, error) {
	if env.Type != TypeBookRequest {
		return "", nil, fmt.Errorf("%w: %q", ErrUnknownType, env.Type)
	}
	var req BookRequest
	if err := Unmarshal(env.Payload, &req); err != nil {
		return "", nil, err
	}
	entries, ok := b.allow(from, time.Now())
	if !ok {
		return "", nil, errors.New("book pages over budget")
	}
	return TypeBookPage, PageAfter(entries, req.After), nil
}

// allow spends a page of p's budget and of everyone's, and returns the
// book: a copy at most a second old, so paging through it does not sort
// the book for every page.
func (b *BookServer) allow(p peer.ID, now time.Time) ([]BookEntry, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	per := max(b.PagesPerMinute, 1)
	if b.peers == nil || len(b.peers) >= maxBookPeers {
		b.peers = map[peer.ID]*rate.Limiter{}
	}
	if b.all == nil {
		b.all = rate.NewLimiter(rate.Limit(float64(2*per)/60), 2*per)
	}
	l, ok := b.peers[p]
	if !ok {
		l = rate.NewLimiter(rate.Limit(float64(per)/60), per)
		b.peers[p] = l
	}
	if !l.AllowN(now, 1) || !b.all.AllowN(now, 1) {
		return nil, false
	}
	if b.entries == nil || now.Sub(b.built) > time.Second {
		b.entries, b.built = b.Entries(now), now
	}
	return b.entries, true
}

// FetchBook pages through p's offer book, handing each signed offer to
// each, until the book ends, max offers came, each returns false, or p
// stops making progress (a page whose Next is not past its After). It
// reports how many offers came.
func FetchBook(ctx context.Context, rpc *RPC, p peer.ID, max int, each func(raw []byte) bool) (int, error) {
	after, got := "", 0
	for {
		var page BookPage
		if err := rpc.Call(ctx, p, BookProtocol(rpc.ChainID), TypeBookRequest, &BookRequest{After: after}, TypeBookPage, &page); err != nil {
			return got, err
		}
		for _, raw := range page.Offers {
			if got >= max {
				return got, nil
			}
			got++
			if !each(raw) {
				return got, nil
			}
		}
		if page.Next == "" {
			return got, nil
		}
		if page.Next <= after || len(page.Offers) == 0 {
			return got, fmt.Errorf("%w: book page after %q names next %q", ErrOutOfRange, after, page.Next)
		}
		after = page.Next
	}
}
