package node

// The node's side of the market (node/market) and of the quoter
// (node/quoter): what they need from the node, the API methods that answer
// from the market, and the bids topic's handler.

import (
	"context"
	"errors"
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
