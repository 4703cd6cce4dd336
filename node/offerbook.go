package node

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
}

// OfferBook is the market as this node sees it: the latest valid offer of
// each machine, until it expires or is withdrawn.
type OfferBook struct {
	mu     sync.Mutex
	offers map[peer.ID]HeldOffer
	// withdrawn remembers the sequence of each withdrawal, so an older
	// offer arriving late cannot resurrect a withdrawn machine.
	withdrawn map[peer.ID]uint64
}

// NewOfferBook returns an empty book.
func NewOfferBook() *OfferBook {
	return &OfferBook{offers: map[peer.ID]HeldOffer{}, withdrawn: map[peer.ID]uint64{}}
}

// Apply records a validated offer or withdrawal.
func (b *OfferBook) Apply(rec *p2p.Received, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch m := rec.Payload.(type) {
	case *p2p.Offer:
		if cur, ok := b.offers[rec.Signer]; ok && cur.Seq >= rec.Seq {
			return
		}
		if w, ok := b.withdrawn[rec.Signer]; ok && w >= rec.Seq {
			return
		}
		delete(b.withdrawn, rec.Signer)
		b.offers[rec.Signer] = HeldOffer{Offer: *m, Seq: rec.Seq, Expires: rec.Expiry, Received: now}
	case *p2p.Withdrawal:
		if cur, ok := b.offers[rec.Signer]; ok && cur.Seq < rec.Seq {
			delete(b.offers, rec.Signer)
		}
		b.withdrawn[rec.Signer] = rec.Seq
	}
}

// List returns the live offers, sorted by machine, dropping expired ones.
func (b *OfferBook) List(now time.Time) []HeldOffer {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]HeldOffer, 0, len(b.offers))
	for id, o := range b.offers {
		if !o.Expires.After(now) {
			delete(b.offers, id)
			continue
		}
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
	bid, ok := rec.Payload.(*p2p.Bid)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.bids = append(l.bids, SeenBid{Bid: *bid, From: rec.Signer, Received: now, Expires: rec.Expiry})
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
