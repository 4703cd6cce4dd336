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
	qs, _, arrived := b.watch("a", t0)
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
	qs, _, again := b.watch("a", t0)
	if len(qs) != 1 || qs[0].Total != 7 {
		t.Fatalf("quotes for a = %+v, want the one of total 7", qs)
	}
	select {
	case <-again:
		t.Fatal("a new wait is woken before another quote arrives")
	default:
	}
}

// TestQuoteBookKnowsWhoAnswers: a bid has all its answers once every
// scheduler heard from in the last ten minutes has answered it.
func TestQuoteBookKnowsWhoAnswers(t *testing.T) {
	b, t0 := NewQuoteBook(), time.Now()
	for _, j := range []string{"old", "x", "y"} {
		b.Expect(j, t0.Add(time.Hour))
	}
	if _, all, _ := b.watch("x", t0); all {
		t.Fatal("a bid nobody answered has all its answers")
	}
	b.Add(peer.ID("gone"), p2p.Quote{JobID: "old"}, t0.Add(-11*time.Minute))
	b.Add(peer.ID("s1"), p2p.Quote{JobID: "old"}, t0)
	b.Add(peer.ID("s2"), p2p.Quote{JobID: "old"}, t0)
	b.Add(peer.ID("s1"), p2p.Quote{JobID: "x"}, t0)
	if _, all, _ := b.watch("x", t0); all {
		t.Fatal("s2 has not answered x, yet x has all its answers")
	}
	b.Add(peer.ID("s2"), p2p.Quote{JobID: "x"}, t0)
	if _, all, _ := b.watch("x", t0); !all {
		t.Fatal("s1 and s2 answered x: a scheduler not heard from in 11 minutes still counts")
	}
	b.Add(peer.ID("s3"), p2p.Quote{JobID: "y"}, t0)
	if _, all, _ := b.watch("x", t0); all {
		t.Fatal("a newly heard scheduler s3 does not count for x")
	}
}
