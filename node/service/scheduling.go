package service

import (
	"context"
	"time"

	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/market"
	"github.com/deepmarket/deepmarket/node/submitter"
)

// Scheduling answers /prices and /quote: this node's scheduler's prices
// and placements, and the quotes this node's bids received.
type Scheduling struct {
	Market *market.Market
	Book   *submitter.QuoteBook
}

// MarketPrices is what this node's scheduler charges now.
func (s *Scheduling) MarketPrices(ctx context.Context) (api.MarketPrices, error) {
	return s.Market.Prices(time.Now()), nil
}

// QuoteJob is the price and placement this node's scheduler gives a job
// shape now, or why it would not run.
func (s *Scheduling) QuoteJob(ctx context.Context, req api.QuoteRequest) (api.QuoteResult, error) {
	return s.Market.Quote(time.Now(), req)
}

// Quotes lists the quotes received for one of this node's bids.
func (s *Scheduling) Quotes(ctx context.Context, job string) ([]api.ReceivedQuote, error) {
	return s.Book.Quotes(ctx, job)
}

var _ api.Scheduling = (*Scheduling)(nil)
