package lender

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/p2p"
)

// LinkProber measures this machine's links to targets, one at a time,
// and says how many it measured (p2p.LinkMeter); the offer carries its
// samples.
type LinkProber interface {
	Measure(ctx context.Context, targets []peer.ID) int
}

// OfferBook lists the machines (peer IDs) whose offers this node holds
// now: the machines this one may share a job with.
type OfferBook interface {
	Machines(now time.Time) []string
}

// OfferBookFunc makes a func an OfferBook.
type OfferBookFunc func(now time.Time) []string

// Machines calls f.
func (f OfferBookFunc) Machines(now time.Time) []string { return f(now) }

// Offering is this machine's offer, which announces the links measured:
// whether it lends, and a re-announcement (Lender).
type Offering interface {
	State(now time.Time) LendState
	Refresh()
}

var (
	_ LinkProber = (*p2p.LinkMeter)(nil)
	_ Offering   = (*Lender)(nil)
)

// linkFirstWait is the longest a LinkMeter waits before its first round:
// the offer book fills first.
const linkFirstWait = 30 * time.Second

// LinkMeter measures, while this machine lends, its links to the machines
// of the offer book every interval, and re-announces the offer with what
// it measured. Each round probes up to p2p.MaxLinks of them in random
// order: over rounds, the machine measures its links to all those it may
// share a job with.
type LinkMeter struct {
	probe LinkProber
	book  OfferBook
	offer Offering
	self  peer.ID
	every time.Duration
}

// NewLinkMeter measures with probe, from self, the links to the machines
// of book every interval ([p2p] probe_interval; 0 measures none), and
// re-announces offer when it measured any.
func NewLinkMeter(probe LinkProber, book OfferBook, offer Offering, self peer.ID, every time.Duration) *LinkMeter {
	return &LinkMeter{probe: probe, book: book, offer: offer, self: self, every: every}
}

// Run measures a round every interval until ctx ends.
func (m *LinkMeter) Run(ctx context.Context) error {
	if m.every == 0 {
		return nil
	}
	t := time.NewTimer(min(m.every, linkFirstWait))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		now := time.Now()
		if m.offer.State(now).Lending && m.probe.Measure(ctx, m.targets(now)) > 0 {
			m.offer.Refresh()
		}
		t.Reset(m.every)
	}
}

// targets are up to p2p.MaxLinks machines of the offer book, other than
// this one, in random order.
func (m *LinkMeter) targets(now time.Time) []peer.ID {
	var out []peer.ID
	for _, s := range m.book.Machines(now) {
		if id, err := peer.Decode(s); err == nil && id != m.self {
			out = append(out, id)
		}
	}
	rand.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out[:min(len(out), p2p.MaxLinks)]
}
