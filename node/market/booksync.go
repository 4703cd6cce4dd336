package market

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/p2p"
)

// Books are the offer books of this node's peers (p2p.BookClient).
type Books interface {
	// Servers are the connected peers that serve their offer books.
	Servers() []peer.ID
	// Fetch pages through p's book, handing each signed offer to each,
	// until the book ends, max offers came or each returns false; it
	// reports how many came (p2p.FetchBook).
	Fetch(ctx context.Context, p peer.ID, max int, each func(raw []byte) bool) (int, error)
}

// OfferChecker checks a signed offer from a peer's book as the offers
// topic's validator checks a gossiped one (*p2p.Gossip, *p2p.Validator),
// without recording its sequence.
type OfferChecker interface {
	CheckOffer(raw []byte, now time.Time) (*p2p.Received, error)
}

var (
	_ Books        = p2p.BookClient{}
	_ OfferChecker = (*p2p.Gossip)(nil)
	_ OfferChecker = (*p2p.Validator)(nil)
)

// BookSyncParams configures a BookSync; every field but Logger is
// required.
type BookSyncParams struct {
	Book    *OfferBook
	Books   Books
	Checker OfferChecker
	// MaxOffers is the most offers taken from one peer's book: the
	// book's own bound ([market] max_offers).
	MaxOffers int
	// Again, when set, asks for one more copy each time it has a value:
	// this node's gossip lost a peer and may have missed offers
	// (p2p.Gossip.Rejoined).
	Again  <-chan struct{}
	Logger *slog.Logger
}

// BookSync fills the offer book of a node that just started from the
// books of up to two peers that serve theirs: in a big market machines
// re-announce only every few minutes (lender.PaceFor), so gossip alone
// would take that long to show the market. Each offer is checked as a
// gossiped one is; a peer may withhold offers, not forge them, and one
// whose book gave nothing valid does not count. It tries for two
// minutes, as peers connect.
type BookSync struct {
	p BookSyncParams
	// sources is how many peers' books it copies; first is when it
	// first looks for peers that serve one, every how often it looks
	// again, and within for how long (tests shorten them).
	sources              int
	first, every, within time.Duration
}

// NewBookSync returns a BookSync into p.Book; Run copies the books.
func NewBookSync(p BookSyncParams) *BookSync {
	if p.Logger == nil {
		p.Logger = slog.New(slog.DiscardHandler)
	}
	return &BookSync{p: p, sources: 2, first: time.Second, every: 3 * time.Second, within: 2 * time.Minute}
}

// Run copies peers' books, trying each peer once, until two have given
// valid offers, two minutes have passed, or ctx ends; then, with Again,
// one book more each time Again asks, until ctx ends.
func (s *BookSync) Run(ctx context.Context) error {
	s.start(ctx)
	var last time.Time
	for s.p.Again != nil {
		select {
		case <-ctx.Done():
			return nil
		case <-s.p.Again:
		}
		// At most one copy a minute: a peer that keeps getting itself
		// reconnected cannot make this node check whole books nonstop.
		if wait := time.Until(last.Add(againEvery)); wait > 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(wait):
			}
		}
		last = time.Now()
		s.p.Logger.Info("gossip lost a peer and reconnected: copying a peer's offer book again")
		s.copyOne(ctx)
	}
	return nil
}

// againEvery is the least time between two copies Again asks for.
var againEvery = time.Minute

// copyOne copies one peer's book once the reconnection had time to
// finish, trying the servers in turn for up to 30 s.
func (s *BookSync) copyOne(ctx context.Context) {
	tried := map[peer.ID]bool{}
	t := time.NewTimer(s.first)
	defer t.Stop()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); t.Reset(s.every) {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, p := range s.p.Books.Servers() {
			if !tried[p] {
				tried[p] = true
				if s.copyFrom(ctx, p) || ctx.Err() != nil {
					return
				}
			}
		}
	}
}

// start is Run's first copies: two peers' books.
func (s *BookSync) start(ctx context.Context) {
	tried := map[peer.ID]bool{}
	synced := 0
	t := time.NewTimer(s.first)
	defer t.Stop()
	for deadline := time.Now().Add(s.within); synced < s.sources && time.Now().Before(deadline); t.Reset(s.every) {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		servers := s.p.Books.Servers()
		rand.Shuffle(len(servers), func(i, j int) { servers[i], servers[j] = servers[j], servers[i] })
		for _, p := range servers {
			if synced >= s.sources || tried[p] {
				continue
			}
			tried[p] = true
			if s.copyFrom(ctx, p) {
				synced++
			}
			if ctx.Err() != nil {
				return
			}
		}
	}
}

// copyFrom applies p's book to this node's, and reports whether it gave
// valid offers to the end.
func (s *BookSync) copyFrom(ctx context.Context, p peer.ID) bool {
	added, bad := 0, 0
	got, err := s.p.Books.Fetch(ctx, p, s.p.MaxOffers, func(raw []byte) bool {
		now := time.Now()
		rec, err := s.p.Checker.CheckOffer(raw, now)
		if err != nil {
			bad++
			return bad < 64 || bad < added // a peer serving mostly junk is left
		}
		if s.p.Book.Apply(rec, now) {
			added++
		}
		return true
	})
	log := s.p.Logger.With("peer", p, "offers", got, "kept", added, "refused", bad)
	switch {
	case ctx.Err() != nil:
		return false // stopping: nothing to report
	case err != nil:
		log.Warn("copying a peer's offer book", "err", err)
		return false
	case added == 0:
		// An empty book, or one of junk: another peer may do better.
		log.Info("a peer's offer book gave nothing")
		return false
	}
	log.Info("copied a peer's offer book")
	return true
}
