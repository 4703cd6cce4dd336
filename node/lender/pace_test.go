package lender

import (
	"testing"
	"time"
)

func TestPaceFor(t *testing.T) {
	def := PaceParams{Interval: 30 * time.Second, TTL: 90 * time.Second, Budget: 600, MaxTTL: MaxOfferTTL}
	for _, c := range []struct {
		name     string
		machines int
		p        PaceParams
		interval time.Duration
		ttl      time.Duration
	}{
		{"an empty book keeps the configured pace", 0, def, 30 * time.Second, 90 * time.Second},
		{"a small market keeps it", 100, def, 30 * time.Second, 90 * time.Second},
		{"the budget is reached at 300 machines", 300, def, 30 * time.Second, 90 * time.Second},
		{"past it the interval stretches", 600, def, time.Minute, 3 * time.Minute},
		{"10,000 machines: 600 a minute", 10_000, def, 1000 * time.Second, 3000 * time.Second},
		{"100,000 machines: the TTL stops at an hour", 100_000, def, 20 * time.Minute, time.Hour},
		{"budget 0 never stretches", 100_000, PaceParams{Interval: 30 * time.Second, TTL: 90 * time.Second}, 30 * time.Second, 90 * time.Second},
		{"the TTL keeps its ratio to the interval", 1000,
			PaceParams{Interval: 10 * time.Second, TTL: time.Minute, Budget: 100, MaxTTL: MaxOfferTTL}, 10 * time.Minute, time.Hour},
		{"a configured TTL past the cap is kept, not shortened", 10_000,
			PaceParams{Interval: 30 * time.Minute, TTL: 2 * time.Hour, Budget: 600, MaxTTL: MaxOfferTTL}, 30 * time.Minute, 2 * time.Hour},
	} {
		got := PaceFor(c.machines, c.p)
		if got.Interval != c.interval || got.TTL != c.ttl {
			t.Errorf("%s: PaceFor(%d) = every %s, TTL %s; want every %s, TTL %s", c.name, c.machines, got.Interval, got.TTL, c.interval, c.ttl)
		}
		if got.Interval*2 > got.TTL {
			t.Errorf("%s: an offer announced every %s lapses between announcements with TTL %s", c.name, got.Interval, got.TTL)
		}
	}
}
