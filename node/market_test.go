package node

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/scheduler"
)

// TestPricesAndQuote: a node's scheduler prices the machines whose offers
// it holds and quotes a job over them, or says why not.
func TestPricesAndQuote(t *testing.T) {
	chain := testNet(t)
	s := startNode(t, initHome(t, filepath.Join(t.TempDir(), "sched"), chain))
	l1 := startNode(t, initHome(t, filepath.Join(t.TempDir(), "l1"), chain), withBootstrap(s.addr()))
	l2 := startNode(t, initHome(t, filepath.Join(t.TempDir(), "l2"), chain), withBootstrap(s.addr()))
	ctx := t.Context()
	if _, err := l1.client.SetLend(ctx, api.LendRequest{Cores: 2, MemBytes: 2 << 30}); err != nil {
		t.Fatal(err)
	}
	if _, err := l2.client.SetLend(ctx, api.LendRequest{Cores: 1, MemBytes: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	m1, m2 := l1.Host().ID().String(), l2.Host().ID().String()
	eventually(t, 15*time.Second, "both offers at the scheduler", func() bool { return hasOffer(s, m1) && hasOffer(s, m2) })

	pr, err := s.client.Prices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if pr.Subset != SubsetAll || len(pr.Machines) != 2 || pr.Lowest.Core == 0 {
		t.Fatalf("prices %+v", pr)
	}
	for _, m := range pr.Machines {
		if !m.Available || m.Unit.Core < scheduler.DefaultBase.CoreHour || m.Free.Cores == 0 {
			t.Errorf("machine prices %+v", m)
		}
	}

	q, err := s.client.Quote(ctx, api.QuoteRequest{Workers: 3, PerWorker: scheduler.Resources{Cores: 1, MemBytes: 512 << 20}, DurationS: 3600})
	if err != nil {
		t.Fatal(err)
	}
	if !q.OK || len(q.Workers) != 3 || q.Total == 0 || q.Machines != 2 {
		t.Fatalf("quote %+v", q)
	}
	on := map[string]int{}
	for _, w := range q.Workers {
		on[w.Machine]++
	}
	if on[m1] != 2 || on[m2] != 1 {
		t.Fatalf("3 one-core workers over 2+1 cores went %v", on)
	}

	q, err = s.client.Quote(ctx, api.QuoteRequest{Workers: 4, PerWorker: scheduler.Resources{Cores: 1, MemBytes: 512 << 20}, DurationS: 3600})
	if err != nil {
		t.Fatal(err)
	}
	if q.OK || q.Rejection == nil || q.Rejection.Resource != "cores" || !strings.Contains(q.Rejection.Reason, "3 of the 4") {
		t.Fatalf("4 workers on 3 cores: %+v %+v", q, q.Rejection)
	}
	q, err = s.client.Quote(ctx, api.QuoteRequest{Workers: 1, PerWorker: scheduler.Resources{Cores: 1}, DurationS: 3600, MaxPrice: 1})
	if err != nil || q.OK || q.Rejection.Resource != "price" {
		t.Fatalf("a 1 micro-credit job: %+v %v", q, err)
	}
	if _, err := s.client.Quote(ctx, api.QuoteRequest{Workers: 0, PerWorker: scheduler.Resources{Cores: 1}, DurationS: 60}); err == nil {
		t.Fatal("0 workers quoted")
	}
}
