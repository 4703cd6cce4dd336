package market

import (
	"context"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/p2p"
)

// Vet checks that machine, which offers itself at addrs, is real: that it
// answers at its peer ID (a libp2p connection proves the key). The node's
// check dials it (node/wire_market.go).
type Vet func(ctx context.Context, machine peer.ID, addrs []string) error

// Checks of new machines.
const (
	// vetTimeout bounds one check.
	vetTimeout = 10 * time.Second
	// vetParallel is how many checks run at once.
	vetParallel = 8
	// vetBackoff is how long a machine that failed its check is not
	// checked again: its offers meanwhile are dropped.
	vetBackoff = 30 * time.Second
	// maxVetting bounds the offers waiting for their machine's check, in
	// all; an owner's count against the book's per-owner bound too.
	maxVetting = 256
	// maxVetFailed bounds the failed checks remembered.
	maxVetFailed = 4096
)

// vetting is the book's side of the checks: a member that links many
// machine keys it does not run (a Sybil) had each of them offered into
// every node's book, each one cheaper, up to the per-owner bound, and
// quotes then spent their attempts on them. Now each new machine's offer
// waits, outside the book, for one check of the machine from this node;
// it enters when the machine answers and is dropped when it does not, and
// that machine's offers are then dropped for vetBackoff. What a Sybil
// still gets: one dial from each node per fake machine per vetBackoff,
// and at most the per-owner bound of its machines waiting (the offers of
// machines it does run enter as any member's, up to the same bound).
type vetting struct {
	vet     Vet
	ctx     context.Context
	slots   chan struct{}
	pending map[peer.ID]*p2p.Received
	waiting map[string]int // pending offers per owner
	failed  map[peer.ID]time.Time
	dropped uint64 // offers of machines that did not answer
}

// SetVet has a new machine's offer enter the book only once vet says the
// machine answers, for as long as ctx lasts (the node's lifetime).
func (b *OfferBook) SetVet(ctx context.Context, vet Vet) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.vetting = vetting{vet: vet, ctx: ctx, slots: make(chan struct{}, vetParallel), pending: map[peer.ID]*p2p.Received{},
		waiting: map[string]int{}, failed: map[peer.ID]time.Time{}}
}

// awaitLocked holds rec, the offer of a machine not in the book, until
// its machine is checked; it reports false when there is no room for it
// (the book's bounds, counting the offers waiting). b.mu must be held.
func (b *OfferBook) awaitLocked(rec *p2p.Received, now time.Time) bool {
	id, o := rec.Signer, rec.Offer
	if at, ok := b.failed[id]; ok {
		if now.Sub(at) < vetBackoff {
			b.dropped++
			return true
		}
		delete(b.failed, id)
	}
	if w, ok := b.withdrawn[id]; ok && w >= rec.Seq {
		return true
	}
	if cur, ok := b.pending[id]; ok {
		if cur.Offer.Owner == o.Owner && rec.Seq > cur.Seq {
			b.pending[id] = rec // the check's outcome applies the latest
		}
		return true
	}
	if len(b.offers)+len(b.pending) >= b.max {
		b.dropExpiredLocked(now)
	}
	if len(b.pending) >= maxVetting || len(b.offers)+len(b.pending) >= b.max ||
		b.owners[o.Owner]+b.waiting[o.Owner] >= b.perOwner {
		b.refused++
		return false
	}
	b.pending[id] = rec
	b.waiting[o.Owner]++
	go b.check(id, o.Addrs)
	return true
}

// check runs the vet of machine id and applies its offer when it passes.
func (b *OfferBook) check(id peer.ID, addrs []string) {
	b.mu.Lock()
	ctx, slots, vet := b.ctx, b.slots, b.vet
	b.mu.Unlock()
	var err error
	select {
	case slots <- struct{}{}:
		cctx, cancel := context.WithTimeout(ctx, vetTimeout)
		err = vet(cctx, id, addrs)
		cancel()
		<-slots
	case <-ctx.Done():
		err = ctx.Err()
	}
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	rec := b.pending[id]
	delete(b.pending, id)
	if b.waiting[rec.Offer.Owner]--; b.waiting[rec.Offer.Owner] <= 0 {
		delete(b.waiting, rec.Offer.Owner)
	}
	if err != nil {
		if len(b.failed) >= maxVetFailed {
			for f, at := range b.failed {
				if now.Sub(at) >= vetBackoff {
					delete(b.failed, f)
				}
			}
			if len(b.failed) >= maxVetFailed {
				clear(b.failed)
			}
		}
		b.failed[id] = now
		b.dropped++
		return
	}
	if rec.Expiry.After(now) {
		b.applyLocked(rec, now)
	}
}

// Unanswered counts the offers dropped because their machine did not
// answer its check.
func (b *OfferBook) Unanswered() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.dropped
}
