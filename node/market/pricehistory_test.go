package market

import (
	"context"
	"encoding/json"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/scheduler"
)

// memStore is the node store as the price history uses it: JSON
// documents, visited in key order. (The node store's own tests cover
// keeping them on disk.)
type memStore map[string][]byte

func (m memStore) Put(key string, v any) error {
	b, err := json.Marshal(v)
	m[key] = b
	return err
}

func (m memStore) Each(prefix string, fn func(key string, doc []byte) error) error {
	keys := slices.Sorted(maps.Keys(m))
	for _, k := range keys {
		if strings.HasPrefix(k, prefix) {
			if err := fn(k, m[k]); err != nil {
				return err
			}
		}
	}
	return nil
}

func (m memStore) Delete(key string) error {
	delete(m, key)
	return nil
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s", within, what)
}

// TestPriceHistoryKeepsADayAcrossRestarts: samples go to the store, a
// reopened history has them, and what has left the window is forgotten
// there too.
func TestPriceHistoryKeepsADayAcrossRestarts(t *testing.T) {
	store := memStore{}
	log := slog.New(slog.DiscardHandler)
	var n atomic.Int64
	sample := func(context.Context) (PriceSample, error) {
		k := n.Add(1)
		return PriceSample{Time: time.Now().UTC(), Median: scheduler.UnitPrices{Core: uint64(k)}, Machines: 1}, nil
	}
	h, err := NewPriceHistory(PriceHistoryParams{Store: store, Sample: sample, Every: 10 * time.Millisecond, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	// An old sample (a day and more ago) and the recorder running.
	now := time.Now().UTC()
	if err := h.add(PriceSample{Time: now.Add(-25 * time.Hour), Machines: 9}); err != nil {
		t.Fatal(err)
	}
	if all := h.Since(time.Time{}); len(all) != 1 {
		t.Fatalf("after one sample: %+v", all)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	eventually(t, 5*time.Second, "five samples", func() bool { return n.Load() >= 5 })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	got := h.Since(now.Add(-24 * time.Hour))
	if len(got) < 5 || got[0].Median.Core != 1 {
		t.Fatalf("since a day ago: %+v", got)
	}
	for i := 1; i < len(got); i++ {
		if got[i].Time.Before(got[i-1].Time) || got[i].Median.Core != got[i-1].Median.Core+1 {
			t.Fatalf("out of order: %+v", got)
		}
	}
	if all := h.Since(time.Time{}); len(all) != len(got) {
		t.Errorf("the sample from more than a day ago is kept: %d samples in all, %d in the day", len(all), len(got))
	}
	// One more from long ago, as a node stopped for a day left it.
	if err := store.Put(priceKey(now.Add(-30*time.Hour)), &PriceSample{Time: now.Add(-30 * time.Hour)}); err != nil {
		t.Fatal(err)
	}

	// Restarted: the day is there, the older samples gone for good.
	h2, err := NewPriceHistory(PriceHistoryParams{Store: store, Sample: sample, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	again := h2.Since(time.Time{})
	if len(again) != len(got) || again[len(again)-1].Median.Core != got[len(got)-1].Median.Core {
		t.Errorf("after reopening: %d samples, want the %d of the last day", len(again), len(got))
	}
	keys := 0
	store.Each(pricesKey, func(string, []byte) error { keys++; return nil })
	if keys != len(got) {
		t.Errorf("%d samples in the store, want %d", keys, len(got))
	}
}
