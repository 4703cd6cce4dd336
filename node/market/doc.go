// Package market is the market as this node sees it: the offer book (the
// latest offer of each machine, bounded, withdrawals remembered), the log
// of bids seen, the price history, and the scheduler's view built from the
// book: the configured subset of machines, less those that could not be
// reached lately, each with its ledger record of past jobs, and that view
// indexed for placements (Indexed, rebuilt when a second old). It also turns
// the wire's offers and bids into the scheduler's machines and jobs.
//
// It needs the offer book filled from gossip, the peers' measured
// round-trip times (Peers), the ledger's machine records (Records) and a
// store for the price history (Store). It imports p2p, scheduler, ledger
// (types only) and node/api, never node or node/quoter.
package market
