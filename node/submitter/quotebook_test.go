package submitter

import (
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/p2p"
)

// TestQuoteBookWakesOnArrival: a wait on a bid's quotes ends when one
// for that bid arrives, not for another bid's.
func TestQuoteBookWakesOnArrival(t *testing.T) {
	b, t0 := NewQuoteBook(), time.Now()
	b.Expect("a", t0.Add(time.Minute))
	b.Expect("b", t0.Add(time.Minute))
	qs, arrived := b.watch("a")
	if len(qs) != 0 {
		t.Fatalf("quotes before any arrived: %v", qs)
	}
	b.Add(peer.ID("s"), p2p.Quote{JobID: "b"}, t0)
	select {
	case <-arrived:
		t.Fatal("a quote for bid b woke the wait on bid a")
	default:
	}
	b.Add(peer.ID("s"), p2p.Quote{JobID: "a", Total: 7}, t0)
	select {
	case <-arrived:
	default:
		t.Fatal("a quote for bid a did not wake the wait on it")
	}
	qs, again := b.watch("a")
	if len(qs) != 1 || qs[0].Total != 7 {
		t.Fatalf("quotes for a = %+v, want the one of total 7", qs)
	}
	select {
	case <-again:
		t.Fatal("a new wait is woken before another quote arrives")
	default:
	}
}
