package lender

import (
	"context"
	"crypto/rand"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/p2p"
)

// probeLog is a LinkProber that records each round's targets and measures
// them all.
type probeLog struct {
	mu     sync.Mutex
	rounds [][]peer.ID
	round  chan struct{}
}

func (p *probeLog) Measure(ctx context.Context, targets []peer.ID) int {
	p.mu.Lock()
	p.rounds = append(p.rounds, targets)
	p.mu.Unlock()
	select {
	case p.round <- struct{}{}:
	case <-ctx.Done():
	}
	return len(targets)
}

// offerState is an Offering that lends as told and counts its
// re-announcements.
type offerState struct {
	mu        sync.Mutex
	lending   bool
	refreshed int
}

func (o *offerState) State(time.Time) LendState {
	o.mu.Lock()
	defer o.mu.Unlock()
	return LendState{Lending: o.lending}
}

func (o *offerState) Refresh() {
	o.mu.Lock()
	o.refreshed++
	o.mu.Unlock()
}

func newPeerID(t *testing.T) peer.ID {
	t.Helper()
	_, pub, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestLinkMeterRounds: each round measures up to p2p.MaxLinks machines of
// the offer book, never this one nor a name that is no peer ID, over rounds
// all of them, and re-announces the offer with what it measured.
func TestLinkMeterRounds(t *testing.T) {
	self := newPeerID(t)
	others := map[peer.ID]bool{}
	book := []string{self.String(), "not-a-peer"}
	for range p2p.MaxLinks + 3 {
		id := newPeerID(t)
		others[id] = true
		book = append(book, id.String())
	}
	probe := &probeLog{round: make(chan struct{})}
	offer := &offerState{lending: true}
	m := NewLinkMeter(probe, OfferBookFunc(func(time.Time) []string { return book }), offer, self, time.Millisecond)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()

	seen := map[peer.ID]bool{}
	for round := 0; len(seen) < len(others); round++ {
		if round == 200 {
			t.Fatalf("after 200 rounds, %d of %d machines measured", len(seen), len(others))
		}
		select {
		case <-probe.round:
		case <-time.After(20 * time.Second):
			t.Fatal("no round measured")
		}
		probe.mu.Lock()
		targets := probe.rounds[len(probe.rounds)-1]
		probe.mu.Unlock()
		if len(targets) != p2p.MaxLinks {
			t.Fatalf("a round measured %d machines, want %d", len(targets), p2p.MaxLinks)
		}
		for _, id := range targets {
			if !others[id] {
				t.Fatalf("measured %s, not another machine of the book", id)
			}
			seen[id] = true
		}
	}
	offer.mu.Lock()
	offer.lending = false
	offer.mu.Unlock()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	probe.mu.Lock()
	rounds := len(probe.rounds)
	probe.mu.Unlock()
	offer.mu.Lock()
	defer offer.mu.Unlock()
	if offer.refreshed != rounds {
		t.Errorf("%d rounds measured, the offer re-announced %d times", rounds, offer.refreshed)
	}
}

// TestLinkMeterOff: an interval of 0 ([p2p] probe_interval = 0) measures
// nothing and returns at once.
func TestLinkMeterOff(t *testing.T) {
	probe := &probeLog{round: make(chan struct{})}
	m := NewLinkMeter(probe, OfferBookFunc(func(time.Time) []string { return []string{newPeerID(t).String()} }),
		&offerState{lending: true}, newPeerID(t), 0)
	if err := m.Run(t.Context()); err != nil || len(probe.rounds) > 0 {
		t.Fatalf("run: %v, %d rounds", err, len(probe.rounds))
	}
}

// TestLinkTargetsNotLending: a machine that does not lend measures no
// link.
func TestLinkTargetsNotLending(t *testing.T) {
	probe := &probeLog{round: make(chan struct{}, 1)}
	offer := &offerState{}
	m := NewLinkMeter(probe, OfferBookFunc(func(time.Time) []string { return []string{newPeerID(t).String()} }),
		offer, newPeerID(t), time.Millisecond)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	m.Run(ctx)
	if len(probe.rounds) > 0 || offer.refreshed > 0 {
		t.Fatalf("a machine that does not lend measured %d rounds, re-announced %d times", len(probe.rounds), offer.refreshed)
	}
}
