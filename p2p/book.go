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

// BookServer answers book requests from a node's offer book. Each member
// the ledger backs has a budget of pages, which its machines share (a
// key costs nothing, a member an issuer's admission), and all members
// together a larger one, so nobody makes the node page through its book
// without end. Everyone else shares one small budget: a stranger's
// request beyond it is reset before a byte of it is read (Serve), and no
// stranger is remembered, so fresh keys can neither use up the members'
// budgets nor grow the server's tables.
type BookServer struct {
	// Entries is the book now, sorted by machine.
	Entries func(now time.Time) []BookEntry
	// PagesPerMinute each member may fetch (with a burst of as many); a
	// whole book of 20,000 offers is about 300 pages. All members
	// together may fetch bookMembersShare times as many, all strangers
	// together a bookStrangersShare-th.
	PagesPerMinute int
	// Admission is the ledger's say on who is a member (a machine it
	// backs answers for its owner); nil backs every peer, each for
	// itself (tests and benchmarks of this package).
	Admission Admission

	mu        sync.Mutex
	members   map[string]*rate.Limiter // by member account
	all       *rate.Limiter            // members together
	strangers *rate.Limiter            // everyone else together
	entries   []BookEntry              // the book as of built, for a second
	built     time.Time
}

// Shares of the book's budget, in PagesPerMinute.
const (
	bookMembersShare   = 4
	bookStrangersShare = 16
)

// maxBookMembers bounds the budgets remembered.
const maxBookMembers = 4096

// Serve answers book requests on r's host. Unlike r.Handle, it charges
// the peer's budget before reading its request: a refusal is a stream
// reset, cheaper than the request it refuses.
func (b *BookServer) Serve(r *RPC) {
	r.HandleGated(BookProtocol(r.ChainID), func(p peer.ID) bool {
		_, ok := b.allow(p, time.Now())
		return ok
	}, func(_ context.Context, _ peer.ID, env *Envelope) (string, any, error) {
		b.mu.Lock()
		entries := b.book(time.Now())
		b.mu.Unlock()
		page, err := pageFor(env, entries)
		if err != nil {
			return "", nil, err
		}
		return TypeBookPage, page, nil
	})
}

// Handle is the RPC handler (RPC.Handle): the same budgets as Serve, but
// charged once the request is read and its signature checked.
func (b *BookServer) Handle(_ context.Context, from peer.ID, env *Envelope) (string, any, error) {
	entries, ok := b.allow(from, time.Now())
	if !ok {
		return "", nil, errors.New("book pages over budget")
	}
	page, err := pageFor(env, entries)
	if err != nil {
		return "", nil, err
	}
	return TypeBookPage, page, nil
}

// pageFor answers the book request env with a page of entries.
func pageFor(env *Envelope, entries []BookEntry) (BookPage, error) {
	if env.Type != TypeBookRequest {
		return BookPage{}, fmt.Errorf("%w: %q", ErrUnknownType, env.Type)
	}
	var req BookRequest
	if err := Unmarshal(env.Payload, &req); err != nil {
		return BookPage{}, err
	}
	return PageAfter(entries, req.After), nil
}

// allow spends a page of the budget p draws on (its member's and all
// members', or the strangers'), and returns the book: a copy at most a
// second old, so paging through it does not sort the book for every
// page.
func (b *BookServer) allow(p peer.ID, now time.Time) ([]BookEntry, bool) {
	member, backed := backer(b.Admission, p)
	b.mu.Lock()
	defer b.mu.Unlock()
	per := max(b.PagesPerMinute, 1)
	if b.all == nil {
		b.all = rate.NewLimiter(rate.Limit(float64(bookMembersShare*per)/60), bookMembersShare*per)
		strangers := max(per/bookStrangersShare, 1)
		b.strangers = rate.NewLimiter(rate.Limit(float64(strangers)/60), strangers)
		b.members = map[string]*rate.Limiter{}
	}
	if !backed {
		if !b.strangers.AllowN(now, 1) {
			return nil, false
		}
		return b.book(now), true
	}
	l, ok := b.members[member]
	if !ok {
		if len(b.members) >= maxBookMembers {
			// A budget that has filled up again is a new one: forget it.
			for m, l := range b.members {
				if l.TokensAt(now) >= float64(l.Burst()) {
					delete(b.members, m)
				}
			}
		}
		if len(b.members) >= maxBookMembers {
			return nil, false
		}
		l = rate.NewLimiter(rate.Limit(float64(per)/60), per)
		b.members[member] = l
	}
	// The member's own budget first: a member over it spends nothing of
	// the others'.
	if !l.AllowN(now, 1) || !b.all.AllowN(now, 1) {
		return nil, false
	}
	return b.book(now), true
}

// book is the book as of now, at most a second old; b.mu is held.
func (b *BookServer) book(now time.Time) []BookEntry {
	if b.entries == nil || now.Sub(b.built) > time.Second {
		b.entries, b.built = b.Entries(now), now
	}
	return b.entries
}

// BookClient fetches the offer books of the peers connected to its RPC's
// host (a node's market copies them when it starts).
type BookClient struct{ RPC *RPC }

// Servers returns the connected peers that identified themselves as
// serving an offer book on this network.
func (c BookClient) Servers() []peer.ID {
	h, proto := c.RPC.Host, BookProtocol(c.RPC.ChainID)
	var out []peer.ID
	for _, p := range h.Network().Peers() {
		if ok, _ := h.Peerstore().SupportsProtocols(p, proto); len(ok) > 0 {
			out = append(out, p)
		}
	}
	return out
}

// Fetch pages through p's offer book: FetchBook over c's RPC.
func (c BookClient) Fetch(ctx context.Context, p peer.ID, max int, each func(raw []byte) bool) (int, error) {
	return FetchBook(ctx, c.RPC, p, max, each)
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
