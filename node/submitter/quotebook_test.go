package submitter

import (
	"strings"
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

// TestQuoteBookKnowsWhoAnswers: a bid has all its answers once every
// scheduler heard from in the ten minutes before it has answered; one not
// heard from before does not count, nor does one heard from long ago.
func TestQuoteBookKnowsWhoAnswers(t *testing.T) {
	b, t0 := NewQuoteBook(), time.Now()
	for _, j := range []string{"old", "x"} {
		b.Expect(j, t0.Add(time.Hour))
	}
	if known := b.known(t0); len(known) != 0 {
		t.Fatalf("schedulers known before any quote: %v", known)
	}
	b.Add(peer.ID("gone"), p2p.Quote{JobID: "old"}, t0.Add(-11*time.Minute))
	b.Add(peer.ID("s1"), p2p.Quote{JobID: "old"}, t0)
	b.Add(peer.ID("s2"), p2p.Quote{JobID: "old"}, t0)
	known := b.known(t0)
	if len(known) != 2 {
		t.Fatalf("known = %v, want s1 and s2 (gone was heard from 11 minutes ago)", known)
	}
	b.Add(peer.ID("s1"), p2p.Quote{JobID: "x"}, t0)
	b.Add(peer.ID("s3"), p2p.Quote{JobID: "x"}, t0)
	if qs, _ := b.watch("x"); answeredBy(qs, known) {
		t.Fatal("s2 has not answered x, yet x has all its answers")
	}
	b.Add(peer.ID("s2"), p2p.Quote{JobID: "x"}, t0)
	if qs, _ := b.watch("x"); !answeredBy(qs, known) {
		t.Fatal("s1 and s2 answered x, yet x waits for more")
	}
	if answeredBy(nil, nil) {
		t.Fatal("a first bid, with no scheduler known, has all its answers")
	}
}

// TestQuoteBookRefusesLateQuotes: once the bidder has chosen, a quote
// that comes late is refused (its scheduler then releases its holds),
// until the job bids again.
func TestQuoteBookRefusesLateQuotes(t *testing.T) {
	b, t0 := NewQuoteBook(), time.Now()
	job := "ab" + strings.Repeat("0", 62)
	b.Expect(job, t0.Add(time.Minute))
	if !b.Add(peer.ID("s1"), p2p.Quote{JobID: job}, t0) {
		t.Fatal("a quote for an open bid was refused")
	}
	b.close(job)
	if b.Add(peer.ID("s2"), p2p.Quote{JobID: job}, t0) {
		t.Fatal("a quote after the bidder chose was taken")
	}
	if qs, _ := b.watch(job); len(qs) != 1 {
		t.Fatalf("quotes after a late one: %d, want the 1 before", len(qs))
	}
	b.Expect(job, t0.Add(time.Minute)) // it bids again
	if !b.Add(peer.ID("s2"), p2p.Quote{JobID: job}, t0) {
		t.Fatal("a quote for the job's new bid was refused")
	}
}
