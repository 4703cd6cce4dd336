package quoter

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/node/market"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/scheduler"
)

// Market is the market as this node's scheduler sees it, and its memory
// of machines that could not be reached (*market.Market). Indexed's index,
// view and offers are shared with other callers, to read only; its index
// may be nil, and then every placement is exhaustive (scheduler.Quote on
// the view).
type Market interface {
	Indexed(now time.Time, framework string) (*scheduler.Index, scheduler.View, []p2p.Offer)
	MarkUnreachable(machine string, now time.Time)
	Reachable(machine string)
}

var _ Market = (*market.Market)(nil)

// Holds asks a machine (this node itself, or a peer at addrs) to apply a
// hold request.
type Holds interface {
	Reserve(ctx context.Context, machine peer.ID, addrs []string, r p2p.Reserve) (p2p.ReserveReply, error)
}

// Quotes delivers a quote to its bidder.
type Quotes interface {
	SendQuote(ctx context.Context, bidder peer.ID, q p2p.Quote) error
}

// ReserveFunc adapts a function to Holds.
type ReserveFunc func(ctx context.Context, machine peer.ID, addrs []string, r p2p.Reserve) (p2p.ReserveReply, error)

// Reserve calls f.
func (f ReserveFunc) Reserve(ctx context.Context, machine peer.ID, addrs []string, r p2p.Reserve) (p2p.ReserveReply, error) {
	return f(ctx, machine, addrs, r)
}

// SendFunc adapts a function to Quotes.
type SendFunc func(ctx context.Context, bidder peer.ID, q p2p.Quote) error

// SendQuote calls f.
func (f SendFunc) SendQuote(ctx context.Context, bidder peer.ID, q p2p.Quote) error {
	return f(ctx, bidder, q)
}

// Params configures a Quoter; every field is required.
type Params struct {
	Self   peer.ID // this node, the scheduler that names its holds
	Market Market
	Holds  Holds
	Quotes Quotes
	Logger *slog.Logger
}

// Quoter answers other nodes' bids: it prices each over the market's view,
// holds the placement on its machines, and sends the bidder the quote.
type Quoter struct {
	p     Params
	queue chan bidWork
	// bg are the releases a quote left behind, of holds on machines that
	// did not answer (answerBid): Run returns once they are done.
	bg sync.WaitGroup
}

// New returns a Quoter; Run answers the bids Queue takes.
func New(p Params) *Quoter {
	return &Quoter{p: p, queue: make(chan bidWork, bidQueue)}
}

// bidQueue bounds the bids waiting to be priced; past it a node under a
// flood of bids drops the newest (their bidders get no quote from it).
const bidQueue = 1024

type bidWork struct {
	bid    p2p.Bid
	bidder peer.ID
	raw    []byte // the bid's signed envelope, for the machines asked to hold it
}

// Queue is the bids topic's handler: it queues the bid for the pricing
// workers, off the gossip loop.
func (q *Quoter) Queue(rec *p2p.Received) {
	b := rec.Bid
	if b == nil {
		return
	}
	select {
	case q.queue <- bidWork{*b, rec.Signer, rec.Raw}:
	default:
		q.p.Logger.Warn("too many bids waiting to be priced; dropped one", "job", b.JobID)
	}
}

// Run answers queued bids, answerBids at once, until ctx ends.
func (q *Quoter) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for range answerBids {
		wg.Go(func() { q.priceBids(ctx) })
	}
	wg.Wait()
	q.bg.Wait()
	return nil
}

// priceBids answers queued bids until ctx ends.
func (q *Quoter) priceBids(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case w := <-q.queue:
			q.answer(ctx, w)
		}
	}
}

// answer prices a bid and sends its bidder the quote. A quote that does
// not reach the bidder (it cannot be dialled, it refused the quote, the
// send timed out, the node is stopping) has its holds released before
// answer returns: nobody will commit them, and until they lapse the
// machines would refuse everyone else.
func (q *Quoter) answer(ctx context.Context, w bidWork) {
	quote, held := q.answerBid(ctx, w)
	if err := q.p.Quotes.SendQuote(ctx, w.bidder, quote); err != nil {
		q.p.Logger.Debug("quote not delivered", "job", w.bid.JobID, "bidder", w.bidder, "holds", len(held), "err", err)
		q.release(ctx, quote.JobID, held)
	}
}

// holdRef is a hold this scheduler asked a machine for: the machine, where
// its offer says it listens, and the hold's ID. Unsure: the machine's
// reply never came, so the hold may or may not exist.
type holdRef struct {
	machine string
	addrs   []string
	id      string
	unsure  bool
}

// Releasing: each hold is asked releaseTries times at most, releasePause
// apart, each try bounded by reserveTimeout.
const (
	releaseTries = 3
	releasePause = 250 * time.Millisecond
)

// release gives back holds of job, all at once, and returns when each is
// released or given up on. A release is sent even when ctx has ended (the
// node is stopping: what it holds must not block the machines until it
// lapses) and at the machine's offered addresses, since the connection
// that carried the hold may be gone and the machine's addresses with it
// (identify drops the ones learnt from its offer). A failed release is
// tried again while ctx lasts, then logged: the hold lapses by itself.
// An unsure hold is tried once (its machine did not answer the first
// time).
func (q *Quoter) release(ctx context.Context, job string, holds []holdRef) {
	var wg sync.WaitGroup
	for _, h := range holds {
		wg.Go(func() {
			err := q.releaseOne(ctx, job, h)
			switch {
			case err == nil:
			case h.unsure:
				q.p.Logger.Debug("a hold whose grant was not heard of could not be released", "job", job, "machine", h.machine, "hold", h.id, "err", err)
			default:
				q.p.Logger.Warn("could not release a hold: it lapses by itself", "job", job, "machine", h.machine, "hold", h.id,
					"lapses_in", holdTTL, "err", err)
			}
		})
	}
	wg.Wait()
}

// releaseOne releases one hold, trying again (see release) until the
// machine answers.
func (q *Quoter) releaseOne(ctx context.Context, job string, h holdRef) error {
	machine, err := peer.Decode(h.machine)
	if err != nil {
		return err
	}
	tries := releaseTries
	if h.unsure {
		tries = 1
	}
	for try := 1; ; try++ {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reserveTimeout)
		reply, err := q.p.Holds.Reserve(rctx, machine, h.addrs, p2p.Reserve{Op: p2p.OpRelease, ID: h.id, JobID: job})
		cancel()
		switch {
		case err == nil && reply.OK:
			return nil
		case err == nil:
			return errors.New(reply.Reason) // refused: asking again changes nothing
		case try == tries || ctx.Err() != nil:
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(releasePause):
		}
	}
}
