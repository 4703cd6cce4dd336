// Package quoter answers other nodes' bids: each bid is priced by the
// scheduler over the market's view, its placement held on the machines
// (every hold or none, re-quoting when another scheduler took capacity
// first), and the quote, or the reason there is none, sent to the bidder.
//
// It needs the market's view and its memory of unreachable machines
// (Market, node/market's Market), a way to send hold requests to machines
// (Holds) and to deliver quotes to bidders (Quotes). It imports p2p,
// scheduler and node/market, never node.
package quoter
