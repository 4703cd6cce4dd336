package node

// The node's side of the market (node/market) and of the quoter
// (node/quoter): what they need from the node, the API methods that answer
// from the market, and the bids topic's handler.

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/market"
	"github.com/deepmarket/deepmarket/node/quoter"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/libp2p/go-libp2p/core/peer"
)

// newMarket builds the scheduler's view over the offer book, limited to
// the [scheduler] subset.
func (n *Node) newMarket() *market.Market {
	return market.New(market.Params{
		Book: n.book, Peers: n.peers, Records: machineRecords{n.ledger},
		Self: n.host.ID().String(), Site: n.cfg.Node.Site,
		Subset: n.cfg.Scheduler.Subset, Machines: n.cfg.Scheduler.Machines, Nearest: n.cfg.Scheduler.Nearest,
	})
}

// machineRecords reads a machine's record from the ledger, which keeps it
// under the account the machine is paid at.
type machineRecords struct{ ledger *ledger.Client }

// MachineRecord implements market.Records.
func (r machineRecords) MachineRecord(ctx context.Context, machine string) (ledger.MachineRecord, error) {
	return r.ledger.MachineRecord(ctx, payeeOf(machine))
}

// MarketPrices implements api.Scheduling.
func (n *Node) MarketPrices(ctx context.Context) (api.MarketPrices, error) {
	return n.market.Prices(time.Now()), nil
}

// QuoteJob implements api.Scheduling: the price and placement this node's
// scheduler gives a job shape now, or why it would not run.
func (n *Node) QuoteJob(ctx context.Context, req api.QuoteRequest) (api.QuoteResult, error) {
	return n.market.Quote(time.Now(), req)
}

// PriceHistory implements api.Dashboard: the recorded samples since t,
// and the market now as the last one.
func (n *Node) PriceHistory(ctx context.Context, since time.Time) ([]api.PriceSample, error) {
	out := n.prices.Since(since)
	now, err := n.market.Sample(ctx)
	if err != nil {
		return nil, err
	}
	return append(out, now), nil
}

// newQuoter builds the quoter that answers other nodes' bids over the
// market's view.
func (n *Node) newQuoter() *quoter.Quoter {
	return quoter.New(quoter.Params{Self: n.host.ID(), Market: n.market, Holds: quoter.ReserveFunc(n.reserve),
		Quotes: quoter.SendFunc(n.sendQuote), Logger: n.log.With("module", "quoter")})
}

// onBid is the bids topic's handler: the quoter prices the bid, unless
// this node does not answer bids ([scheduler] quote = false).
func (n *Node) onBid(rec *p2p.Received) {
	if n.cfg.Scheduler.Quote {
		n.quoter.Queue(rec)
	}
}

// sendQuote delivers a quote to its bidder: over a stream, or into this
// node's own quote book when it bid itself.
func (n *Node) sendQuote(ctx context.Context, bidder peer.ID, q p2p.Quote) error {
	if bidder == n.host.ID() {
		if !n.quotes.Add(n.host.ID(), q, time.Now()) {
			return errors.New("the bid is closed: its bidder has chosen")
		}
		return nil
	}
	var ack p2p.QuoteAck
	if err := n.rpc.Call(ctx, bidder, p2p.QuoteProtocol(n.cfg.Node.ChainID), p2p.TypeQuote, &q, p2p.TypeQuoteAck, &ack); err != nil {
		return err
	}
	if !ack.OK {
		return errors.New("the bidder refused the quote")
	}
	return nil
}

var _ api.Scheduling = (*Node)(nil)

// bookPagesPerMinute is what one member (with its machines) may fetch of
// this node's offer book: a book of 20,000 offers is about 300 pages.
const bookPagesPerMinute = 600

// serveBook answers peers' book requests (p2p.BookServer).
func (n *Node) serveBook() {
	srv := &p2p.BookServer{Entries: n.book.Entries, PagesPerMinute: bookPagesPerMinute, Admission: n.admission}
	srv.Serve(n.rpc)
}

// bookSources is how many peers' books a starting node copies.
const bookSources = 2

// syncBook fills the offer book of a node that just started from the
// books of up to two peers that serve theirs: in a big market machines
// re-announce only every few minutes (lender.PaceFor), so gossip alone
// would take that long to show the market. Each offer is checked as a
// gossiped one is; a peer may withhold offers, not forge them, and one
// whose book gave nothing valid does not count. It tries for two
// minutes, as peers connect.
func (n *Node) syncBook(ctx context.Context) error {
	proto := p2p.BookProtocol(n.cfg.Node.ChainID)
	tried := map[peer.ID]bool{}
	synced := 0
	t := time.NewTimer(time.Second)
	defer t.Stop()
	for deadline := time.Now().Add(2 * time.Minute); synced < bookSources && time.Now().Before(deadline); t.Reset(3 * time.Second) {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		peers := n.host.Network().Peers()
		rand.Shuffle(len(peers), func(i, j int) { peers[i], peers[j] = peers[j], peers[i] })
		for _, p := range peers {
			if synced >= bookSources || tried[p] {
				continue
			}
			if ok, _ := n.host.Peerstore().SupportsProtocols(p, proto); len(ok) == 0 {
				continue // not (yet) identified as a node
			}
			tried[p] = true
			added, bad := 0, 0
			got, err := p2p.FetchBook(ctx, n.rpc, p, n.cfg.Market.MaxOffers, func(raw []byte) bool {
				now := time.Now()
				rec, err := n.gossip.CheckOffer(raw, now)
				if err != nil {
					bad++
					return bad < 64 || bad < added // a peer serving mostly junk is left
				}
				if n.book.Apply(rec, now) {
					added++
				}
				return true
			})
			log := n.log.With("module", "market", "peer", p, "offers", got, "kept", added, "refused", bad)
			switch {
			case err != nil:
				log.Warn("copying a peer's offer book", "err", err)
			case added == 0:
				// An empty book, or one of junk: another peer may do better.
				log.Info("a peer's offer book gave nothing")
			default:
				log.Info("copied a peer's offer book")
				synced++
			}
		}
	}
	return nil
}
