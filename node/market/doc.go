// Package market is the market as this node sees it: the offer book (the
// latest offer of each machine, bounded, withdrawals remembered), filled
// from gossip and, as the node starts, from copies of peers' books
// (BookSync); the log of bids seen; the price history; and the
// scheduler's view built from the book: the configured subset of
// machines, less those that could not be reached lately, each with its
// ledger record of past jobs, and that view indexed for placements
// (Indexed, rebuilt when a second old). It also turns the wire's offers
// and bids into the scheduler's machines and jobs, and answers in its own
// types (Prices, QuoteRequest and QuoteResult, PriceSample), which
// node/api serves as they are; a request it refuses is a *fault.Error.
//
// It needs the peers' measured round-trip times (Peers), the ledger's
// machine records (Records), a store for the price history (Store), and,
// to copy books, the peers' books (Books) and a check of each offer
// (OfferChecker). It imports p2p, scheduler, ledger (types only) and
// node/fault, never node, node/api or node/quoter.
package market
