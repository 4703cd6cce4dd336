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
	// checked again (its offers meanwhile are dropped): doubling with each
	// failure in a row, up to vetBackoffMax. A machine that was only slow
	// to answer once (a busy machine, a relay slot not yet held) is not
	// kept out long; one that never answers costs each node a dial every
	// few minutes.
	vetBackoff    = 5 * time.Second
	vetBackoffMax = 5 * time.Minute
	// maxVetting bounds the offers waiting for their machine's check, in
	// all; an owner's count against the book's per-owner bound too.
	maxVetting = 256
	// maxVetFailed bounds the failed checks remembered.
	maxVetFailed = 4096
	// vetTries is how many times a waiting offer's machine is checked,
	// vetBackoff apart and doubling, before the offer is dropped.
	vetTries = 3
)

// vetting is the book's side of the checks: a member that links many
// machine keys it does not run (a Sybil) had each of them offered into
// every node's book, each one cheaper, up to the per-owner bound, and
// quotes then spent their attempts on them. Now each new machine's offer
// waits, outside the book, for one check of the machine from this node;
// it enters when the machine answers and is dropped when it does not, and
// that machine's offers are then dropped for a while (vetBackoff,
// doubling). What a Sybil still gets: a few dials from each node per
// fake machine, then one every vetBackoffMax, and at most the per-owner
// bound of its machines waiting (the offers of machines it does run enter
// as any member's, up to the same bound).
type vetting struct {
	vet     Vet
	ctx     context.Context
	slots   chan struct{}
	pending map[peer.ID]*p2p.Received
	waiting map[string]int // pending offers per owner
	failed  map[peer.ID]vetFailure
	dropped uint64 // offers of machines that did not answer
	// backoff is vetBackoff; tests shorten it.
	backoff time.Duration
}

// vetFailure is a machine's last failed check and how many in a row.
type vetFailure struct {
	at    time.Time
	count int
}

// wait is how long after f the machine is not checked again: the
// doubling of its tries' spacing goes on.
func (f vetFailure) wait(backoff time.Duration) time.Duration {
	return min(backoff<<min(vetTries-1+f.count-1, 16), vetBackoffMax)
}

// SetVet has a new machine's offer enter the book only once vet says the
// machine answers, for as long as ctx lasts (the node's lifetime).
func (b *OfferBook) SetVet(ctx context.Context, vet Vet) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.vetting = vetting{vet: vet, ctx: ctx, slots: make(chan struct{}, vetParallel), pending: map[peer.ID]*p2p.Received{},
		waiting: map[string]int{}, failed: map[peer.ID]vetFailure{}, backoff: vetBackoff}
}

// awaitLocked holds rec, the offer of a machine not in the book, until
// its machine is checked; it reports false when there is no room for it
// (the book's bounds, counting the offers waiting). b.mu must be held.
func (b *OfferBook) awaitLocked(rec *p2p.Received, now time.Time) bool {
	id, o := rec.Signer, rec.Offer
	if f, ok := b.failed[id]; ok && now.Sub(f.at) < f.wait(b.backoff) {
		b.dropped++
		return true
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
	go b.check(id, o.Addrs, 1)
	return true
}

// check runs the vet of machine id (its try-th) and applies its offer
// when it passes; after a failure it tries again later, vetTries in all,
// before it drops the offer.
func (b *OfferBook) check(id peer.ID, addrs []string, try int) {
	b.mu.Lock()
	ctx, slots, vet, backoff := b.ctx, b.slots, b.vet, b.backoff
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
	if err != nil && try < vetTries && ctx.Err() == nil {
		time.AfterFunc(backoff<<(try-1), func() { b.check(id, addrs, try+1) })
		return
	}
	rec := b.pending[id]
	delete(b.pending, id)
	if b.waiting[rec.Offer.Owner]--; b.waiting[rec.Offer.Owner] <= 0 {
		delete(b.waiting, rec.Offer.Owner)
	}
	if err != nil {
		if len(b.failed) >= maxVetFailed {
			for m, f := range b.failed {
				if now.Sub(f.at) >= vetBackoffMax {
					delete(b.failed, m)
				}
			}
			if len(b.failed) >= maxVetFailed {
				clear(b.failed)
			}
		}
		f := b.failed[id]
		if now.Sub(f.at) > 2*vetBackoffMax {
			f.count = 0 // a failure long ago starts no streak
		}
		b.failed[id] = vetFailure{at: now, count: f.count + 1}
		b.dropped++
		return
	}
	delete(b.failed, id)
	if rec.Expiry.After(now) {
		b.applyLocked(rec, now)
	}
}

// Connected tells the book that machine connected to this node: a
// connection proves its key, so a failed check of it no longer keeps its
// offers out (a machine that was only unreachable for a while, behind a
// restart or a NAT's first punch, is back at its next announcement).
func (b *OfferBook) Connected(machine peer.ID) {
	b.mu.Lock()
	delete(b.failed, machine)
	b.mu.Unlock()
}

// Unanswered counts the offers dropped because their machine did not
// answer its check.
func (b *OfferBook) Unanswered() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.dropped
}
