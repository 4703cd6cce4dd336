package market

import (
	"sort"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/p2p"
)

// HeldOffer is an offer this node holds, with when it lapses.
type HeldOffer struct {
	Offer    p2p.Offer
	Seq      uint64
	Expires  time.Time
	Received time.Time
	Raw      []byte // the signed offer as it came, for peers syncing their books
}

// OfferBook is the market as this node sees it: the latest valid offer of
// each machine, until it expires or is withdrawn. It is bounded: at most
// max offers in all and perOwner of one owner account's machines (gossip
// admits only machines the ledger backs; the bounds keep a member with
// many machines from crowding out the rest). A new machine past a bound
// is refused until an offer lapses; machines already held keep their
// place. With a check set (SetVet), a new machine's offer enters only
// once the machine has answered it (vet.go).
type OfferBook struct {
	mu       sync.Mutex
	max      int
	perOwner int
	offers   map[peer.ID]HeldOffer
	owners   map[string]int // offers held per owner
	// withdrawn remembers the sequence of each withdrawal, so an older
	// offer arriving late cannot resurrect a withdrawn machine.
	withdrawn map[peer.ID]uint64
	refused   uint64
	vetting
}

// NewOfferBook returns an empty book of at most max offers, perOwner of
// one owner.
func NewOfferBook(max, perOwner int) *OfferBook {
	return &OfferBook{max: max, perOwner: perOwner, offers: map[peer.ID]HeldOffer{}, owners: map[string]int{},
		withdrawn: map[peer.ID]uint64{}}
}

// Apply records a validated offer or withdrawal; it reports false when
// the book refused an offer for lack of room.
func (b *OfferBook) Apply(rec *p2p.Received, now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if rec.Offer != nil && b.vet != nil {
		if _, held := b.offers[rec.Signer]; !held {
			return b.awaitLocked(rec, now)
		}
	}
	return b.applyLocked(rec, now)
}

// applyLocked is Apply once the machine is checked; b.mu must be held.
func (b *OfferBook) applyLocked(rec *p2p.Received, now time.Time) bool {
	switch {
	case rec.Offer != nil:
		o := rec.Offer
		cur, held := b.offers[rec.Signer]
		if held && cur.Seq >= rec.Seq {
			return true
		}
		if w, ok := b.withdrawn[rec.Signer]; ok && w >= rec.Seq {
			return true
		}
		if !held || cur.Offer.Owner != o.Owner {
			if !held && len(b.offers) >= b.max {
				b.dropExpiredLocked(now)
			}
			if (!held && len(b.offers) >= b.max) || b.owners[o.Owner] >= b.perOwner {
				b.refused++
				return false
			}
		}
		delete(b.withdrawn, rec.Signer)
		b.removeLocked(rec.Signer)
		b.offers[rec.Signer] = HeldOffer{Offer: *o, Seq: rec.Seq, Expires: rec.Expiry, Received: now, Raw: rec.Raw}
		b.owners[o.Owner]++
	case rec.Withdrawal != nil:
		if cur, ok := b.offers[rec.Signer]; ok && cur.Seq < rec.Seq {
			b.removeLocked(rec.Signer)
		}
		b.withdrawn[rec.Signer] = rec.Seq
	}
	return true
}

func (b *OfferBook) removeLocked(id peer.ID) {
	o, ok := b.offers[id]
	if !ok {
		return
	}
	delete(b.offers, id)
	if b.owners[o.Offer.Owner]--; b.owners[o.Offer.Owner] <= 0 {
		delete(b.owners, o.Offer.Owner)
	}
}

func (b *OfferBook) dropExpiredLocked(now time.Time) {
	for id, o := range b.offers {
		if !o.Expires.After(now) {
			b.removeLocked(id)
		}
	}
}

// Len is how many offers the book holds (expired ones included until the
// next List).
func (b *OfferBook) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.offers)
}

// Entries are the live offers as signed, sorted by machine: what a peer
// syncing its book is served (p2p.BookServer).
func (b *OfferBook) Entries(now time.Time) []p2p.BookEntry {
	held := b.List(now)
	out := make([]p2p.BookEntry, 0, len(held))
	for _, o := range held {
		if len(o.Raw) > 0 {
			out = append(out, p2p.BookEntry{Machine: o.Offer.Machine, Raw: o.Raw})
		}
	}
	return out
}

// Refused counts the offers refused for lack of room.
func (b *OfferBook) Refused() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.refused
}

// List returns the live offers, sorted by machine, dropping expired ones.
func (b *OfferBook) List(now time.Time) []HeldOffer {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.dropExpiredLocked(now)
	out := make([]HeldOffer, 0, len(b.offers))
	for _, o := range b.offers {
		out = append(out, o)
	}
	if len(b.withdrawn) > 10_000 {
		clear(b.withdrawn) // withdrawals older than any live offer are moot
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Offer.Machine < out[j].Offer.Machine })
	return out
}

// BidLog keeps the most recent bids seen, for `bids` and, later, the
// scheduler.
type BidLog struct {
	mu   sync.Mutex
	bids []SeenBid
	max  int
}

// SeenBid is a validated bid and who sent it.
type SeenBid struct {
	Bid      p2p.Bid
	From     peer.ID
	Received time.Time
	Expires  time.Time
}

// NewBidLog keeps up to max bids.
func NewBidLog(max int) *BidLog { return &BidLog{max: max} }

// Add records a validated bid.
func (l *BidLog) Add(rec *p2p.Received, now time.Time) {
	bid := rec.Bid
	if bid == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	seen := SeenBid{Bid: *bid, From: rec.Signer, Received: now, Expires: rec.Expiry}
	for i := range l.bids { // the same job again (its own node's copy, a re-bid): the latest
		if b := &l.bids[i]; b.From == seen.From && b.Bid.JobID == seen.Bid.JobID {
			*b = seen
			return
		}
	}
	l.bids = append(l.bids, seen)
	if len(l.bids) > l.max {
		l.bids = append(l.bids[:0], l.bids[len(l.bids)-l.max:]...)
	}
}

// List returns unexpired bids, oldest first.
func (l *BidLog) List(now time.Time) []SeenBid {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []SeenBid
	for _, b := range l.bids {
		if b.Expires.After(now) {
			out = append(out, b)
		}
	}
	return out
}

// WasWithdrawn reports whether the machine's last word was a withdrawal.
func (b *OfferBook) WasWithdrawn(id string) bool {
	pid, err := peer.Decode(id)
	if err != nil {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	_, ok := b.withdrawn[pid]
	return ok
}
