package market

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/p2p"
)

// TestNewMachinesAreCheckedFirst: with a check set, a new machine's offer
// enters the book only once the machine answered it; one that does not
// answer is checked vetTries times, then its offer is dropped, and its
// offers are not checked again for a while (backoff, shortened here);
// while checks are under way, one owner's waiting offers count against
// its per-owner bound; a machine already in the book is not checked
// again for its next offer.
func TestNewMachinesAreCheckedFirst(t *testing.T) {
	now := time.Now()
	real, fake := newPeerID(t), newPeerID(t)
	var checks atomic.Int32
	book := NewOfferBook(100, 3)
	book.SetVet(t.Context(), func(_ context.Context, id peer.ID, _ []string) error {
		checks.Add(1)
		if id == fake {
			return errors.New("no answer")
		}
		return nil
	})
	book.backoff = 50 * time.Millisecond // tries 50 and 100 ms apart, then none for 200 ms
	offer := func(id peer.ID, owner string, seq uint64) *p2p.Received {
		return &p2p.Received{Signer: id, Seq: seq, Expiry: now.Add(time.Hour),
			Offer: &p2p.Offer{Machine: id.String(), Owner: owner, Lent: p2p.Resources{Cores: 1}}}
	}
	held := func(id peer.ID) bool {
		for _, o := range book.List(time.Now()) {
			if o.Offer.Machine == id.String() {
				return true
			}
		}
		return false
	}
	book.Apply(offer(real, "a", 1), now)
	book.Apply(offer(fake, "b", 1), now)
	deadline := time.Now().Add(5 * time.Second)
	for (!held(real) || book.Unanswered() == 0) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !held(real) || held(fake) || book.Unanswered() != 1 {
		t.Fatalf("after the checks: real held %v, fake held %v, %d unanswered; want the real machine only", held(real), held(fake), book.Unanswered())
	}
	if n := checks.Load(); n != 1+vetTries {
		t.Errorf("%d checks: want the real machine's and %d of the fake's", n, vetTries)
	}
	book.Apply(offer(fake, "b", 2), time.Now())
	book.Apply(offer(real, "a", 2), time.Now())
	time.Sleep(10 * time.Millisecond)
	if n := checks.Load(); n != 1+vetTries || held(fake) || book.Unanswered() != 2 {
		t.Errorf("%d checks, fake held %v, %d unanswered: want the fake's next offer dropped unchecked, the real one's applied", n, held(fake), book.Unanswered())
	}
	// The machine connects after all (it was only unreachable for a
	// while): its next offer is checked at once, not after the backoff.
	book.Connected(fake)
	book.Apply(offer(fake, "b", 3), time.Now())
	time.Sleep(10 * time.Millisecond)
	if n := checks.Load(); n != 2+vetTries {
		t.Errorf("%d checks: want the offer after the machine connected checked at once", n)
	}

	// Checks that hang: one owner's waiting offers fill its bound.
	slow := NewOfferBook(100, 3)
	release := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	slow.SetVet(t.Context(), func(ctx context.Context, _ peer.ID, _ []string) error {
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	took := 0
	for range 10 {
		if slow.Apply(offer(newPeerID(t), "sybil", 1), now) {
			took++
		}
	}
	if took != 3 || slow.Refused() != 7 {
		t.Errorf("one owner's offers waiting: %d taken, %d refused; want 3 and 7", took, slow.Refused())
	}
	once.Do(func() { close(release) })
	deadline = time.Now().Add(5 * time.Second)
	for slow.Len() < 3 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if slow.Len() != 3 {
		t.Errorf("%d offers held once the checks answered, want 3", slow.Len())
	}
}
