package submitter

// The quotes schedulers send back for this node's own bids.

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/node/fault"
	"github.com/deepmarket/deepmarket/p2p"
)

// ReceivedQuote is a scheduler's quote for one of this node's bids, as
// the QuoteBook keeps it (one entry of `quotes --json`).
type ReceivedQuote struct {
	Scheduler string `json:"scheduler"`
	p2p.Quote
	ReceivedAt time.Time `json:"received_at"`
}

// QuoteBook holds the quotes schedulers sent for this node's bids, and
// tells whoever waits on a bid when a quote for it arrives.
type QuoteBook struct {
	mu      sync.Mutex
	mine    map[string]time.Time // job -> when its bid expires
	quotes  map[string][]ReceivedQuote
	arrived map[string]chan struct{} // job -> closed at its next quote
	heard   map[string]time.Time     // scheduler -> when it last sent a quote
	// closed are bids whose bidder has chosen: quotes for them that come
	// late are refused, so their schedulers release what they hold.
	closed map[string]bool
}

// heardWithin is how recently a scheduler must have quoted to count
// among those a bid waits for.
const heardWithin = 10 * time.Minute

// NewQuoteBook makes an empty book.
func NewQuoteBook() *QuoteBook {
	return &QuoteBook{mine: map[string]time.Time{}, quotes: map[string][]ReceivedQuote{}, arrived: map[string]chan struct{}{},
		heard: map[string]time.Time{}, closed: map[string]bool{}}
}

// Handle takes a scheduler's quote for one of this node's bids (the quote
// protocol's handler).
func (b *QuoteBook) Handle(_ context.Context, from peer.ID, env *p2p.Envelope) (string, any, error) {
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
	if !b.expecting(q.JobID) || !b.Add(from, q, time.Now()) {
		return p2p.TypeQuoteAck, p2p.QuoteAck{}, nil
	}
	return p2p.TypeQuoteAck, p2p.QuoteAck{OK: true}, nil
}

// Expect records a bid of this node's for job, open until until: quotes
// for it are taken until an hour after.
func (b *QuoteBook) Expect(job string, until time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	for j, exp := range b.mine {
		if now.After(exp.Add(time.Hour)) {
			delete(b.mine, j)
			delete(b.quotes, j)
			delete(b.arrived, j)
			delete(b.closed, j)
		}
	}
	b.mine[job] = until
	delete(b.closed, job)
}

// close refuses the quotes for job that come from now on: its bidder has
// chosen, and their schedulers are to release what they hold for it.
func (b *QuoteBook) close(job string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed[job] = true
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

// Add records a quote from a scheduler (this node's own scheduler hands
// its quotes here directly), and wakes whoever waits for the job's
// quotes. It reports false, recording nothing, for a bid whose bidder has
// chosen already: the scheduler is to release its holds.
func (b *QuoteBook) Add(from peer.ID, q p2p.Quote, now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed[q.JobID] {
		return false
	}
	if len(b.quotes[q.JobID]) < 64 {
		b.quotes[q.JobID] = append(b.quotes[q.JobID], ReceivedQuote{Scheduler: from.String(), Quote: q, ReceivedAt: now.UTC()})
	}
	if _, ok := b.heard[from.String()]; ok || len(b.heard) < 1024 {
		b.heard[from.String()] = now
	}
	if ch, ok := b.arrived[q.JobID]; ok {
		close(ch)
		delete(b.arrived, q.JobID)
	}
	return true
}

// known lists the schedulers that sent this node a quote within
// heardWithin of now: those a bid published now may expect answers from.
func (b *QuoteBook) known(now time.Time) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for s, at := range b.heard {
		if now.Sub(at) > heardWithin {
			delete(b.heard, s)
		} else {
			out = append(out, s)
		}
	}
	return out
}

func (b *QuoteBook) list(job string) []ReceivedQuote {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.quotes[job])
}

// watch returns the quotes received for job so far, and a channel closed
// when the next one arrives.
func (b *QuoteBook) watch(job string) ([]ReceivedQuote, <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	ch, ok := b.arrived[job]
	if !ok {
		ch = make(chan struct{})
		b.arrived[job] = ch
	}
	return slices.Clone(b.quotes[job]), ch
}

// answeredBy reports whether every scheduler of known sent one of qs
// (false when known is empty: nothing to go by).
func answeredBy(qs []ReceivedQuote, known []string) bool {
	if len(known) == 0 {
		return false
	}
	from := map[string]bool{}
	for _, q := range qs {
		from[q.Scheduler] = true
	}
	for _, s := range known {
		if !from[s] {
			return false
		}
	}
	return true
}

// Quotes lists the quotes received for a job this node bid, cheapest
// first, then those without a placement (the API's /jobs/{id}/quotes).
func (b *QuoteBook) Quotes(ctx context.Context, job string) ([]ReceivedQuote, error) {
	if !b.expecting(job) {
		return nil, fault.New(fault.NotFound, "job", "this node has not bid for job %q", job)
	}
	qs := b.list(job)
	slices.SortStableFunc(qs, func(a, b ReceivedQuote) int {
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
