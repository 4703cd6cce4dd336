package node

// The quotes schedulers send back for this node's own bids.

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/libp2p/go-libp2p/core/peer"
)

// handleQuote takes a scheduler's quote for one of this node's bids.
func (n *Node) handleQuote(_ context.Context, from peer.ID, env *p2p.Envelope) (string, any, error) {
	if env.Type != p2p.TypeQuote {
		return "", nil, fmt.Errorf("%w %q", p2p.ErrUnknownType, env.Type)
	}
	var q p2p.Quote
	if err := p2p.Unmarshal(env.Payload, &q); err != nil {
		return "", nil, err
	}
	if err := q.Validate(); err != nil {
		return "", nil, err
	}
	if !n.quotes.expecting(q.JobID) {
		return p2p.TypeQuoteAck, p2p.QuoteAck{}, nil
	}
	n.quotes.add(from, q, time.Now())
	return p2p.TypeQuoteAck, p2p.QuoteAck{OK: true}, nil
}

// QuoteBook holds the quotes schedulers sent for this node's bids.
type QuoteBook struct {
	mu     sync.Mutex
	mine   map[string]time.Time // job -> when its bid expires
	quotes map[string][]api.ReceivedQuote
}

func newQuoteBook() *QuoteBook {
	return &QuoteBook{mine: map[string]time.Time{}, quotes: map[string][]api.ReceivedQuote{}}
}

func (b *QuoteBook) expect(job string, until time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	for j, exp := range b.mine {
		if now.After(exp.Add(time.Hour)) {
			delete(b.mine, j)
			delete(b.quotes, j)
		}
	}
	b.mine[job] = until
}

// forget drops the quotes received for job.
func (b *QuoteBook) forget(job string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.quotes, job)
}

func (b *QuoteBook) expecting(job string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, ok := b.mine[job]
	return ok
}

func (b *QuoteBook) add(from peer.ID, q p2p.Quote, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.quotes[q.JobID]) < 64 {
		b.quotes[q.JobID] = append(b.quotes[q.JobID], api.ReceivedQuote{Scheduler: from.String(), Quote: q, ReceivedAt: now.UTC()})
	}
}

func (b *QuoteBook) list(job string) []api.ReceivedQuote {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.quotes[job])
}

// Quotes implements api.Scheduling: the quotes received for a job this
// node bid, cheapest first, then those without a placement.
func (n *Node) Quotes(ctx context.Context, job string) ([]api.ReceivedQuote, error) {
	if !n.quotes.expecting(job) {
		return nil, &api.Error{Status: http.StatusNotFound, Field: "job", Message: fmt.Sprintf("this node has not bid for job %q", job)}
	}
	qs := n.quotes.list(job)
	slices.SortStableFunc(qs, func(a, b api.ReceivedQuote) int {
		switch {
		case len(a.Workers) > 0 && len(b.Workers) == 0:
			return -1
		case len(a.Workers) == 0 && len(b.Workers) > 0:
			return 1
		case a.Total < b.Total:
			return -1
		case a.Total > b.Total:
			return 1
		}
		return 0
	})
	return qs, nil
}
