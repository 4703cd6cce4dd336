package node

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/node/market"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/scheduler"
	"github.com/deepmarket/deepmarket/units"
)

// insiderStrategy is one thing an insider does to the market while an
// honest job bids: start begins it and returns what stops it and says
// what it got.
type insiderStrategy struct {
	name  string
	start func(t testing.TB, m *insiderMarket) (stop func() string)
}

// holdLoop has the insider ask each lender, every 200 ms, to hold its
// whole core for a bid of its own with the max price given (0: its whole
// balance), and commit each hold it gets, as its bidder, when commit is
// set. With split, each lender is asked for a bid (a job) of its own, each
// for that price: one balance behind a bid on every machine. It counts
// the holds granted on each lender.
func holdLoop(maxPrice uint64, commit, split bool) func(t testing.TB, m *insiderMarket) func() string {
	return func(t testing.TB, m *insiderMarket) func() string {
		done := make(chan struct{})
		var wg sync.WaitGroup
		granted := make([]atomic.Int64, len(m.lenders))
		var asked atomic.Int64
		var lastReason atomic.Value
		if maxPrice == 0 {
			maxPrice, _ = m.ledger.Balance(t.Context(), m.insider.Address())
		}
		res := p2p.Resources{Cores: 1, MemBytes: 1 << 30}
		jobOf := func(i int) string {
			if !split {
				i = 0
			}
			return jobIDOf(m.chain + fmt.Sprint("insider", maxPrice, commit, i))
		}
		// Its bids, gossiped (machines hold only for bids seen on the
		// market) and sealed afresh every 20 s.
		var mu sync.Mutex
		sealed := map[string][]byte{}
		sealedAt := map[string]time.Time{}
		current := func(job string) ([]byte, error) {
			mu.Lock()
			defer mu.Unlock()
			if time.Since(sealedAt[job]) < 20*time.Second {
				return sealed[job], nil
			}
			bid := p2p.Bid{JobID: job, Submitter: string(m.insider.Address()), Workers: 1, PerWorker: res, MaxPrice: maxPrice,
				Duration: 60, Framework: "generic", Floor: p2p.DefaultFloor}
			s, err := p2p.Seal(m.insider, m.chain, p2p.TypeBid, &bid, uint64(time.Now().UnixNano()), time.Now().Add(time.Minute))
			if err == nil {
				err = m.raw.publishBid(t.Context(), s)
			}
			if err != nil {
				return nil, err
			}
			sealed[job], sealedAt[job] = s, time.Now()
			return s, nil
		}
		for i, l := range m.lenders {
			job := jobOf(i)
			wg.Go(func() {
				for {
					select {
					case <-done:
						return
					case <-time.After(200 * time.Millisecond):
					}
					sealed, err := current(job)
					if err != nil {
						t.Error(err)
						return
					}
					var id [8]byte
					rand.Read(id[:])
					r, err := m.raw.reserve(t.Context(), l.Host().ID(), p2p.Reserve{Op: p2p.OpReserve, ID: hex.EncodeToString(id[:]), JobID: job,
						Res: res, TTL: int64(p2p.MaxHoldTTL / time.Second), Bidder: m.insider.PeerID().String(), Bid: sealed})
					asked.Add(1)
					if err == nil && r.OK {
						granted[i].Add(1)
						if commit {
							// Its receipt for the launch window: a credit, more than the machine asks.
							payee := string(l.key.Address())
							rc := ledger.SignReceipt(m.insider, m.chain, ledger.Receipt{Job: job, Payee: payee, Amount: units.MicroPerCredit})
							m.raw.reserve(t.Context(), l.Host().ID(), p2p.Reserve{Op: p2p.OpCommit, ID: hex.EncodeToString(id[:]), JobID: job,
								Receipt: &p2p.Receipt{Payee: payee, Amount: rc.Amount, Sig: rc.Sig}})
						}
					} else if err == nil {
						lastReason.Store(r.Reason)
					}
				}
			})
		}
		// The insider is in place before the honest job bids: the lenders
		// have answered it (granted or refused) twice each.
		eventually(t, 30*time.Second, "the insider's first hold requests answered", func() bool {
			return asked.Load() >= int64(2*len(m.lenders))
		})
		return func() string {
			close(done)
			wg.Wait()
			why, _ := lastReason.Load().(string)
			var each []string
			for i := range granted {
				each = append(each, fmt.Sprint(granted[i].Load()))
			}
			return fmt.Sprintf("%s of %d holds granted, per lender (bid max %s credits); last refusal: %s", strings.Join(each, "+"), asked.Load(),
				units.FormatCredits(maxPrice), p2p.Clip(why, 80))
		}
	}
}

// BenchmarkInsider measures an honest 2-worker job (two lenders of one
// core each, emulated on this machine: in-process nodes, one sandbox per
// worker) under each insider strategy beside none: whether it runs, and
// how long from its submission to its launch. It also measures what 10
// failed marks on one lender do to its price in quotes. DM_BENCH_OUT
// names a JSON file for the results.
func BenchmarkInsider(b *testing.B) {
	type row struct {
		Strategy string  `json:"strategy"`
		State    string  `json:"honest_job"`
		Launch   float64 `json:"launch_s"` // from submission; 0: never launched
		Honest   bool    `json:"on_honest_lenders"`
		Insider  string  `json:"insider"`
	}
	strategies := []insiderStrategy{
		{"none", func(testing.TB, *insiderMarket) func() string { return func() string { return "-" } }},
		{"1-micro-credit bids holding every core", holdLoop(1, false, false)},
		{"funded bids holding every core, again as each lapses", holdLoop(10*units.MicroPerCredit, false, false)},
		{"funded bids holding and committing every core, no escrow", holdLoop(10*units.MicroPerCredit, true, false)},
		{"its whole balance bid once per machine, holding every core", holdLoop(0, false, true)},
		{fmt.Sprintf("%d linked fake machines", insiderFakes), func(t testing.TB, m *insiderMarket) func() string {
			before, _ := m.ledger.Balance(t.Context(), m.insider.Address())
			keys := m.linkFakes(t, insiderFakes)
			after, _ := m.ledger.Balance(t.Context(), m.insider.Address())
			hole := newBlackhole(t)
			most := m.offerFakes(t, keys, hole)
			return func() string {
				return fmt.Sprintf("%s credits staked; at most %d in a book (bound %d); %d dials of the fakes", units.FormatCredits(before-after),
					most, perOwnerBound, hole.accepted.Load())
			}
		}},
	}
	var rows []row
	for _, s := range strategies {
		b.Run(strings.ReplaceAll(s.name, " ", "_"), func(b *testing.B) {
			for range b.N {
				m := startInsiderMarket(b)
				stop := s.start(b, m)
				r := m.honestJob(b, "2m")
				rows = append(rows, row{Strategy: s.name, State: string(r.job.State), Launch: r.launched.Seconds(), Honest: m.onHonestLenders(r),
					Insider: stop()})
			}
		})
	}
	marks := insiderMarks(b)

	fmt.Printf("\nan honest 2-worker job (1 core each) on two lenders of one core, in-process nodes on this machine (%d CPUs), beside an insider\n", runtime.NumCPU())
	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "strategy\thonest job\tlaunch\tvs none\tinsider\n")
	base := 0.0
	for _, r := range rows {
		if r.Strategy == "none" {
			base = r.Launch
		}
	}
	for _, r := range rows {
		launch, vs := "-", "-"
		if r.Launch > 0 {
			launch = fmt.Sprintf("%.1fs", r.Launch)
			if base > 0 {
				vs = fmt.Sprintf("%+.1fs", r.Launch-base)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Strategy, r.State, launch, vs, r.Insider)
	}
	tw.Flush()
	fmt.Printf("10 failed marks on a lender, from one payer at %s credits each: its record counts %d failed; its 1-core price in quotes %.3fx (cap: %d marks a payer)\n",
		units.FormatCredits(marks.cost), marks.failed, marks.ratio, ledger.MaxMarksPerPayer)
	fmt.Printf("goals: the honest job succeeds under every strategy, launched at most 10 s later than with none; at most 1 fake machine per credit staked\n")
	if out := os.Getenv("DM_BENCH_OUT"); out != "" {
		doc := map[string]any{"date": time.Now().UTC().Format(time.RFC3339), "cpus": runtime.NumCPU(), "rows": rows,
			"marks": map[string]any{"marks": 10, "failed_counted": marks.failed, "price_ratio": marks.ratio, "cost_each": marks.cost}}
		data, _ := json.MarshalIndent(doc, "", "  ")
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			b.Error(err)
		}
		if err := os.WriteFile(out, append(data, '\n'), 0o644); err != nil {
			b.Error(err)
		}
	}
}

// markRun is what an insider's failed marks did to a lender.
type markRun struct {
	failed uint64  // failed jobs the lender's record counts
	ratio  float64 // its 1-core price in a quote, after / before
	cost   uint64  // what each mark cost the insider
}

// insiderMarks has the insider pay lender 0 the least an escrow may for
// 10 jobs it never ran, marking it failed in each, and measures, once the
// escrows closed, the lender's record and its price for one core in the
// submitter's quotes.
func insiderMarks(t testing.TB) markRun {
	m := startInsiderMarket(t)
	ctx := t.Context()
	victim := m.lenders[0]
	payee := string(victim.key.Address())
	price := func() float64 {
		now := time.Now()
		_, v, offers := m.sub.market.Indexed(now, "")
		for i, o := range offers {
			if o.Machine == victim.Host().ID().String() {
				cv, _ := market.Restrict(v, offers, []int{i})
				job := market.SchedulerJob(p2p.Bid{Workers: 1, PerWorker: p2p.Resources{Cores: 1, MemBytes: 128 << 20},
					MaxPrice: 100 * units.MicroPerCredit, Duration: 3600, Framework: "generic"})
				pl, err := scheduler.Quote(cv, job, now, scheduler.Params{})
				if err != nil {
					t.Fatal(err)
				}
				return float64(pl.PerHour)
			}
		}
		t.Fatal("the submitter does not hold the victim's offer")
		return 0
	}
	before := price()
	least := m.sub.ledgerApp.Params().MinPayment
	var jobsRun []jobs.Run
	for i := range 10 {
		job := jobIDOf(fmt.Sprint(m.chain, "mark", i))
		if _, err := m.ledger.OpenEscrow(ctx, ledger.OpenEscrow{Job: job, Amount: least, Expiry: time.Now().Add(time.Hour).Unix(),
			Payees: []string{payee}}); err != nil {
			t.Fatal(err)
		}
		if _, err := m.ledger.Settle(ctx, ledger.Settle{Job: job, Payments: []ledger.Payment{{Machine: payee, Amount: least, Failed: true}}}); err != nil {
			t.Fatal(err)
		}
		jobsRun = append(jobsRun, jobs.Run{ID: job})
	}
	waitRefunded(t, m.sub, &jobs.Job{Runs: jobsRun})
	rec, err := m.ledger.MachineRecord(ctx, payee)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Failed > 0 {
		// The market reads the records from its replica every few seconds.
		eventually(t, time.Minute, "the submitter's quotes to weigh the lender's record", func() bool { return price() != before })
	}
	return markRun{failed: rec.Failed, ratio: price() / before, cost: least}
}
