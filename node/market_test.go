package node

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/market"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/scheduler"
)

// TestPricesAndQuote: a node's scheduler prices the machines whose offers
// it holds and quotes a job over them, or says why not.
func TestPricesAndQuote(t *testing.T) {
	t.Parallel()
	chain := testNet(t)
	homes := initNetwork(t, t.TempDir(), chain, []string{"sched", "l1", "l2"})
	s := startNode(t, homes[0])
	l1 := startNode(t, homes[1], withBootstrap(s.addr()))
	l2 := startNode(t, homes[2], withBootstrap(s.addr()))
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
	if pr.Subset != market.SubsetAll || len(pr.Machines) != 2 || pr.Lowest.Core == 0 {
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

// TestOverlappingSchedulersNeverOverCommit: three schedulers whose views
// overlap (each sees four of six lending machines) answer 200 concurrent
// bids. Every bid ends with quotes, each either holding its placement on
// the machines or saying why not, and no machine ever holds more than it
// lends, whichever schedulers ask.
func TestOverlappingSchedulersNeverOverCommit(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("10 nodes")
	}
	chain := testNet(t)
	noQuotes := func(c *Config) { c.Scheduler.Quote = false }
	names := []string{"bidder"}
	for i := range 6 {
		names = append(names, fmt.Sprintf("lender%d", i))
	}
	for s := range 3 {
		names = append(names, fmt.Sprintf("sched%d", s))
	}
	homes := initNetwork(t, t.TempDir(), chain, names)
	bidder := startNode(t, homes[0], noQuotes)
	var lenders []*testNode
	for i := range 6 {
		l := startNode(t, homes[1+i], withBootstrap(bidder.addr()), noQuotes,
			func(c *Config) { c.P2P.AnnounceInterval = Duration{time.Second} })
		if _, err := l.client.SetLend(t.Context(), api.LendRequest{Cores: 2, MemBytes: 1 << 30}); err != nil {
			t.Fatal(err)
		}
		lenders = append(lenders, l)
	}
	id := func(i int) string { return lenders[i%6].Host().ID().String() }
	var scheds []*testNode
	for s := range 3 {
		subset := []string{id(2 * s), id(2*s + 1), id(2*s + 2), id(2*s + 3)}
		sch := startNode(t, homes[7+s], withBootstrap(bidder.addr()),
			func(c *Config) { c.Scheduler.Subset, c.Scheduler.Machines = market.SubsetList, subset })
		scheds = append(scheds, sch)
	}
	for _, s := range scheds {
		eventually(t, 20*time.Second, "each scheduler sees its four machines", func() bool {
			v, _ := s.market.View(time.Now(), "")
			return len(v.Machines) == 4
		})
	}
	eventually(t, 10*time.Second, "the bidder to see every node on the bids topic", func() bool { return len(bidder.gossip.Bids().ListPeers()) == 9 })

	// Watch the machines' own books while the bids are answered.
	stop := make(chan struct{})
	overs := make(chan string, 1)
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			for _, l := range lenders {
				if a := l.holds.Allocated(time.Now()); a.Cores > 2 || a.MemBytes > 1<<30 {
					select {
					case overs <- fmt.Sprintf("%s holds %+v of 2 cores, 1 GiB", l.home.Dir, a):
					default:
					}
				}
			}
		}
	}()

	const bids = 200
	jobs := make([]string, bids)
	for i := range jobs {
		sum := sha256.Sum256([]byte(fmt.Sprintf("%s job %d", chain, i)))
		jobs[i] = hex.EncodeToString(sum[:])
	}
	publish := func(js []string) {
		var wg sync.WaitGroup
		for _, j := range js {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := bidder.client.PublishBid(t.Context(), api.PublishBidRequest{Bid: p2p.Bid{
					JobID: j, Workers: 1, PerWorker: p2p.Resources{Cores: 1, MemBytes: 128 << 20},
					// 4 credits: the bidder's 1000 back all 200 bids (machines
					// count an account's live bids against its balance).
					MaxPrice: 4_000_000, Duration: 600, Framework: "generic"}})
				if err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
	}
	// answered counts the distinct schedulers that answered a job.
	answered := func(j string) int {
		qs, _ := bidder.quotes.Quotes(t.Context(), j)
		from := map[string]bool{}
		for _, q := range qs {
			from[q.Scheduler] = true
		}
		return len(from)
	}
	publish(jobs)
	// Gossip is best effort: like any bidder, re-bid what got no answer
	// from some scheduler after a while (answers are idempotent: the same
	// holds, by ID).
	for retry := 0; retry < 3; retry++ {
		var missing []string
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			missing = missing[:0]
			for _, j := range jobs {
				if answered(j) < 3 {
					missing = append(missing, j)
				}
			}
			if len(missing) == 0 {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if len(missing) == 0 {
			break
		}
		t.Logf("re-bidding %d jobs short of three answers", len(missing))
		publish(missing)
	}

	defer func() {
		if t.Failed() {
			hist := map[int]int{}
			for _, j := range jobs {
				hist[answered(j)]++
			}
			t.Logf("answers per bid: %v", hist)
			for i, s := range scheds {
				t.Logf("scheduler %d saw %d bids", i, len(s.bids.List(time.Now())))
			}
		}
	}()
	eventually(t, 20*time.Second, "three answers to every bid", func() bool {
		for _, j := range jobs {
			if answered(j) < 3 {
				return false
			}
		}
		return true
	})
	close(stop)
	select {
	case over := <-overs:
		t.Fatal("over-committed: " + over)
	default:
	}

	held := map[string]int{} // machine -> workers held by quotes
	holds := map[string]bool{}
	quoted, rejected := 0, 0
	for _, j := range jobs {
		qs, _ := bidder.quotes.Quotes(t.Context(), j)
		placed := false
		for _, q := range qs {
			switch {
			case len(q.Workers) > 0:
				placed = true
				for _, w := range q.Workers {
					if !holds[w.Hold] { // a re-bid's answer repeats its holds
						holds[w.Hold] = true
						held[w.Machine]++
					}
				}
			case q.Reason == "":
				t.Fatalf("job %s: a quote with neither placement nor reason: %+v", j, q)
			}
		}
		if placed {
			quoted++
		} else {
			rejected++
		}
	}
	for m, n := range held {
		if n > 2 {
			t.Fatalf("quotes hold %d one-core workers on %s, which lends 2 cores", n, m)
		}
	}
	total := 0
	for _, n := range held {
		total += n
	}
	if total == 0 || total > 12 {
		qs, _ := bidder.quotes.Quotes(t.Context(), jobs[0])
		t.Fatalf("quotes hold %d workers on 6 machines of 2 cores; the first bid's quotes: %+v", total, qs)
	}
	t.Logf("%d bids: %d quoted and held (%d workers held on %d machines), %d rejected with reasons", bids, quoted, total, len(held), rejected)
	qs, _ := bidder.quotes.Quotes(t.Context(), jobs[bids-1])
	t.Logf("e.g. %+v", qs[len(qs)-1].Reason)
}

// TestSchedulerSkipsUnreachableMachines: the cheapest machine in the view
// stops answering hold requests (its offer lingers, as a machine that
// vanished without withdrawing leaves it). A bid is still quoted, on the
// next machine, and the next bid does not try the silent one again.
func TestSchedulerSkipsUnreachableMachines(t *testing.T) {
	t.Parallel()
	chain := testNet(t)
	homes := initNetwork(t, t.TempDir(), chain, []string{"sched", "silent", "l2"})
	s := startNode(t, homes[0])
	noQuotes := func(c *Config) { c.Scheduler.Quote = false }
	silent := startNode(t, homes[1], withBootstrap(s.addr()), noQuotes)
	l2 := startNode(t, homes[2], withBootstrap(s.addr()), noQuotes)
	ctx := t.Context()
	if _, err := silent.client.SetLend(ctx, api.LendRequest{Cores: 2, MemBytes: 2 << 30}); err != nil {
		t.Fatal(err)
	}
	dear := p2p.Prices{CoreHour: 2_000_000, MemGiBHour: 100_000}
	if _, err := l2.client.SetLend(ctx, api.LendRequest{Cores: 2, MemBytes: 2 << 30, Price: &dear}); err != nil {
		t.Fatal(err)
	}
	m1, m2 := silent.Host().ID().String(), l2.Host().ID().String()
	eventually(t, 15*time.Second, "both offers at the scheduler", func() bool { return hasOffer(s, m1) && hasOffer(s, m2) })
	silent.Host().RemoveStreamHandler(p2p.ReserveProtocol(chain))

	quoted := func(job string) api.ReceivedQuote {
		t.Helper()
		if _, err := s.client.PublishBid(ctx, api.PublishBidRequest{Bid: p2p.Bid{JobID: job, Workers: 1,
			PerWorker: p2p.Resources{Cores: 1, MemBytes: 128 << 20}, MaxPrice: 10_000_000, Duration: 600, Framework: "generic"}}); err != nil {
			t.Fatal(err)
		}
		var got api.ReceivedQuote
		eventually(t, 20*time.Second, "a quote", func() bool {
			qs, _ := s.quotes.Quotes(ctx, job)
			if len(qs) > 0 {
				got = qs[0]
			}
			return len(qs) > 0
		})
		return got
	}
	q := quoted(jobIDOf(chain + "first"))
	if len(q.Workers) != 1 || q.Workers[0].Machine != m2 {
		t.Fatalf("with the cheapest machine silent, the quote is %+v", q)
	}
	if !s.market.Unreachable(m1, time.Now()) {
		t.Fatal("the silent machine is not remembered")
	}
	start := time.Now()
	q = quoted(jobIDOf(chain + "second"))
	if len(q.Workers) != 1 || q.Workers[0].Machine != m2 {
		t.Fatalf("second quote %+v", q)
	}
	t.Logf("second quote in %s", time.Since(start).Round(time.Millisecond))
}
