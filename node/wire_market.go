package node

// The node's side of the market room (node/market): what the market needs
// from the node, and the API methods that answer from the market.

import (
	"context"
	"time"

	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/market"
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

var _ api.Scheduling = (*Node)(nil)
