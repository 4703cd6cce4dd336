package market

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/deepmarket/deepmarket/scheduler"
)

// PriceSample is the market's prices at one moment (micro-credits per
// unit-hour; memory per GiB-hour).
type PriceSample struct {
	Time      time.Time            `json:"time"`
	Lowest    scheduler.UnitPrices `json:"lowest"`
	Median    scheduler.UnitPrices `json:"median"`
	Machines  int                  `json:"machines"`
	Available int                  `json:"available"`
}

// PriceSampleEvery is how often the node records the market's prices for
// the dashboard's price history (tests shorten it).
var PriceSampleEvery = time.Minute

// priceWindow is how far back the price history reaches.
const priceWindow = 24 * time.Hour

// pricesKey prefixes the price samples in the node store:
// "prices/<unix nanoseconds, zero-padded>" -> PriceSample, so that
// keys sort by time.
const pricesKey = "prices/"

// Store is where the price history keeps its samples: the node store,
// whose Each visits keys in order.
type Store interface {
	Put(key string, v any) error
	Each(prefix string, fn func(key string, doc []byte) error) error
	Delete(key string) error
}

// PriceHistoryParams configures a PriceHistory.
type PriceHistoryParams struct {
	Store  Store
	Sample func(context.Context) (PriceSample, error) // the market now
	Every  time.Duration                              // default PriceSampleEvery
	Window time.Duration                              // default 24 h
	Logger *slog.Logger
}

// PriceHistory records the market's prices every minute into a ring that
// covers the last 24 hours, kept in the node store so a restart does not
// blank the dashboard's chart.
type PriceHistory struct {
	p PriceHistoryParams

	mu   sync.Mutex
	ring []PriceSample // oldest first
}

// NewPriceHistory loads the samples kept in the store, dropping those
// older than the window.
func NewPriceHistory(p PriceHistoryParams) (*PriceHistory, error) {
	if p.Every <= 0 {
		p.Every = PriceSampleEvery
	}
	if p.Window <= 0 {
		p.Window = priceWindow
	}
	h := &PriceHistory{p: p}
	cutoff := time.Now().Add(-p.Window)
	var stale []string
	err := p.Store.Each(pricesKey, func(key string, doc []byte) error {
		var s PriceSample
		if err := json.Unmarshal(doc, &s); err != nil || s.Time.Before(cutoff) {
			stale = append(stale, key)
			return nil
		}
		h.ring = append(h.ring, s)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("load price history: %w", err)
	}
	for _, k := range stale {
		if err := p.Store.Delete(k); err != nil {
			return nil, err
		}
	}
	return h, nil
}

// Run samples every p.Every until ctx ends.
func (h *PriceHistory) Run(ctx context.Context) error {
	tick := time.NewTicker(h.p.Every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		s, err := h.p.Sample(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			h.p.Logger.Warn("sample market prices", "err", err)
			continue
		}
		if err := h.add(s); err != nil {
			h.p.Logger.Warn("record market prices", "err", err)
		}
	}
}

func priceKey(t time.Time) string {
	return fmt.Sprintf("%s%020s", pricesKey, strconv.FormatInt(t.UnixNano(), 10))
}

// add records s and forgets what has left the window.
func (h *PriceHistory) add(s PriceSample) error {
	if err := h.p.Store.Put(priceKey(s.Time), &s); err != nil {
		return err
	}
	cutoff := s.Time.Add(-h.p.Window)
	h.mu.Lock()
	h.ring = append(h.ring, s)
	drop := 0
	for drop < len(h.ring) && h.ring[drop].Time.Before(cutoff) {
		drop++
	}
	old := append([]PriceSample(nil), h.ring[:drop]...)
	h.ring = append(h.ring[:0], h.ring[drop:]...)
	h.mu.Unlock()
	for _, o := range old {
		if err := h.p.Store.Delete(priceKey(o.Time)); err != nil {
			return err
		}
	}
	return nil
}

// Since returns the samples taken at or after t, oldest first.
func (h *PriceHistory) Since(t time.Time) []PriceSample {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := []PriceSample{}
	for _, s := range h.ring {
		if !s.Time.Before(t) {
			out = append(out, s)
		}
	}
	return out
}
