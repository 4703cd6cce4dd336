package lender

import (
	"time"

	"github.com/deepmarket/deepmarket/p2p"
)

// Pace is how often this machine re-announces its offer and how long
// peers keep it without hearing it again.
//
// Every offer reaches every node, so a node's gossip cost grows with the
// offers announced in the whole market per minute: N machines each
// re-announcing every T make N/T. At a fixed T that is linear in N (the
// gossip benchmark measured about 30 % of a core per node at 10,000
// machines and 30 s). A pace budget caps the market's announcements at
// Budget a minute by stretching every machine's interval as the market
// grows, each machine judging the market's size from its own offer book.
// The TTL stretches with the interval, so an offer still survives the
// same number of lost announcements.
type Pace struct {
	Interval time.Duration
	TTL      time.Duration
}

// PaceParams are the node's [p2p] settings that set its pace.
type PaceParams struct {
	Interval time.Duration // announce_interval: the pace in a small market
	TTL      time.Duration // offer_ttl at that pace
	// Budget is the announcements a minute the whole market should make
	// (announce_budget); 0 keeps the interval fixed.
	Budget float64
	// MaxTTL bounds the stretched TTL, and so the interval: a machine
	// that vanishes without withdrawing stays on others' books until its
	// offer expires.
	MaxTTL time.Duration
}

// MaxOfferTTL is the longest TTL a stretched pace gives an offer.
const MaxOfferTTL = time.Hour

// PaceFor is the pace in a market of machines offers: announce_interval
// until the market's announcements would pass the budget, then the
// interval that keeps them at it, never past MaxTTL's share.
func PaceFor(machines int, p PaceParams) Pace {
	pace := Pace{Interval: p.Interval, TTL: p.TTL}
	if p.Budget <= 0 || p.Interval <= 0 || p.TTL <= p.Interval {
		return pace
	}
	want := time.Duration(float64(machines) * float64(time.Minute) / p.Budget)
	if want <= p.Interval {
		return pace
	}
	maxTTL := min(p.MaxTTL, p2p.MaxTTL)
	if maxTTL <= p.TTL {
		return pace
	}
	ratio := float64(p.TTL) / float64(p.Interval)
	if limit := time.Duration(float64(maxTTL) / ratio); want > limit {
		want = limit
	}
	pace.Interval = want.Round(time.Second)
	pace.TTL = time.Duration(float64(pace.Interval) * ratio).Round(time.Second)
	return pace
}
