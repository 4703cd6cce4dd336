package market

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/scheduler"
)

// Scheduler subsets: which of the offers a node holds its scheduler uses.
const (
	SubsetAll     = "all"     // every offer held
	SubsetSite    = "site"    // machines of this node's site
	SubsetNearest = "nearest" // the k machines nearest by measured RTT
	SubsetList    = "list"    // the machines named in [scheduler] machines
)

// Peers measures the connected peers' round-trip times (the nearest
// subset sorts by them).
type Peers interface {
	Peers() []p2p.PeerInfo
}

// Records reads a machine's record of past jobs from the ledger.
type Records interface {
	MachineRecord(ctx context.Context, machine string) (ledger.MachineRecord, error)
}

// Params configures a Market. Book is required; Peers is needed for
// SubsetNearest, Records for Run.
type Params struct {
	Book     *OfferBook
	Peers    Peers
	Records  Records
	Self     string   // this machine's peer ID: the nearest of all
	Site     string   // this node's site, for SubsetSite
	Subset   string   // one of the Subset constants
	Machines []string // for SubsetList
	Nearest  int      // for SubsetNearest
}

// Market is the market as this node's scheduler sees it: the offers held,
// less the machines that could not be reached lately, limited to the
// configured subset, with each machine's record of past jobs.
type Market struct {
	p           Params
	unreachable unreachable

	mu      sync.Mutex
	records map[string]ledger.MachineRecord // by machine peer ID
}

// New returns a market over p.Book.
func New(p Params) *Market {
	return &Market{p: p}
}

// runs reports whether a machine's offer says it can run framework: a
// TensorFlow job goes only where TensorFlow imports.
func runs(o p2p.Offer, framework string) bool {
	return framework != "tensorflow" || o.Software.TensorFlow != ""
}

// View turns the offers held into the scheduler's view, limited to the
// configured subset and to the machines that run framework ("" for any).
// The offers are those of the view's machines, index for index.
func (m *Market) View(now time.Time, framework string) (scheduler.View, []p2p.Offer) {
	held := m.p.Book.List(now)
	offers := make([]p2p.Offer, 0, len(held))
	for _, h := range held {
		if !m.unreachable.skip(h.Offer.Machine, now) && runs(h.Offer, framework) {
			offers = append(offers, h.Offer)
		}
	}
	offers = m.subset(offers)
	slices.SortFunc(offers, func(a, b p2p.Offer) int {
		switch {
		case a.Machine < b.Machine:
			return -1
		case a.Machine > b.Machine:
			return 1
		}
		return 0
	})
	v := scheduler.View{Machines: make([]scheduler.Machine, len(offers))}
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, o := range offers {
		sm := SchedulerMachine(o)
		// The ledger's record of the machine's past jobs prices its risk.
		if r, ok := m.records[o.Machine]; ok {
			sm.Completed, sm.Failed = r.Completed, r.Failed
		}
		v.Machines[i] = sm
	}
	return v, offers
}

// subset keeps the offers of the configured subset.
func (m *Market) subset(offers []p2p.Offer) []p2p.Offer {
	switch m.p.Subset {
	case SubsetSite:
		return slices.DeleteFunc(offers, func(o p2p.Offer) bool { return o.Site != m.p.Site })
	case SubsetList:
		return slices.DeleteFunc(offers, func(o p2p.Offer) bool { return !slices.Contains(m.p.Machines, o.Machine) })
	case SubsetNearest:
		rtt := map[string]time.Duration{m.p.Self: 0}
		for _, p := range m.p.Peers.Peers() {
			if p.Latency > 0 {
				rtt[p.ID.String()] = p.Latency
			}
		}
		// Unmeasured machines sort last.
		dist := func(o p2p.Offer) time.Duration {
			if d, ok := rtt[o.Machine]; ok {
				return d
			}
			return time.Hour
		}
		slices.SortStableFunc(offers, func(a, b p2p.Offer) int { return int(dist(a) - dist(b)) })
		return offers[:min(len(offers), m.p.Nearest)]
	}
	return offers
}

// Prices is what the machines in view charge now, and their lowest and
// median unit prices.
func (m *Market) Prices(now time.Time) api.MarketPrices {
	v, offers := m.View(now, "")
	mk := scheduler.MarketPrices(v, now, scheduler.Params{})
	out := api.MarketPrices{Subset: m.p.Subset, Lowest: mk.Lowest, Median: mk.Median,
		Machines: make([]api.MachinePrices, len(mk.Machines))}
	for i, mp := range mk.Machines {
		out.Machines[i] = api.MachinePrices{MachinePrices: mp, Moniker: offers[i].Moniker,
			Free: scheduler.Resources(v.Machines[i].Free())}
	}
	return out
}

// Sample is the market's prices now, as the price history records them.
func (m *Market) Sample(context.Context) (api.PriceSample, error) {
	mk := m.Prices(time.Now())
	s := api.PriceSample{Time: time.Now().UTC(), Lowest: mk.Lowest, Median: mk.Median, Machines: len(mk.Machines)}
	for _, mp := range mk.Machines {
		if mp.Available {
			s.Available++
		}
	}
	return s, nil
}

// Quote is the price and placement the scheduler gives a job shape now,
// or why it would not run; a malformed request is an *api.Error.
func (m *Market) Quote(now time.Time, req api.QuoteRequest) (api.QuoteResult, error) {
	if req.Workers < 1 || req.Workers > p2p.MaxWorkers {
		return api.QuoteResult{}, &api.Error{Status: http.StatusUnprocessableEntity, Field: "workers", Message: fmt.Sprintf("workers %d: want 1 to %d", req.Workers, p2p.MaxWorkers)}
	}
	if req.PerWorker == (scheduler.Resources{}) {
		return api.QuoteResult{}, &api.Error{Status: http.StatusUnprocessableEntity, Field: "per_worker", Message: "a worker must ask for some cores, memory or GPUs"}
	}
	if req.DurationS <= 0 || req.DurationS > int64(p2p.MaxJobDuration/time.Second) {
		return api.QuoteResult{}, &api.Error{Status: http.StatusUnprocessableEntity, Field: "duration_s", Message: fmt.Sprintf("duration %ds: want 1 s to %s", req.DurationS, p2p.MaxJobDuration)}
	}
	v, offers := m.View(now, "")
	job := scheduler.Job{ID: "quote", Workers: req.Workers, Per: req.PerWorker, Duration: time.Duration(req.DurationS) * time.Second,
		Benefit: scheduler.Benefit{Kind: scheduler.FixedPrice, Max: req.MaxPrice}}
	if req.MaxPrice == 0 {
		job.Benefit.Max = p2p.MaxJobPrice
	}
	if req.Deadline > 0 {
		job.Benefit = scheduler.Benefit{Kind: scheduler.ByDeadline, Max: job.Benefit.Max, Deadline: time.Unix(req.Deadline, 0)}
	}
	pl, err := scheduler.Quote(v, job, now, scheduler.Params{})
	var rej *scheduler.Rejection
	if errors.As(err, &rej) {
		return api.QuoteResult{Machines: len(v.Machines), Rejection: rej}, nil
	}
	if err != nil {
		return api.QuoteResult{}, err
	}
	res := api.QuoteResult{OK: true, Machines: len(v.Machines), PerHour: pl.PerHour, Total: pl.Total, DoneAt: pl.Done.UTC()}
	for w, i := range pl.Machines {
		res.Workers = append(res.Workers, api.QuotedWorker{Machine: offers[i].Machine, Moniker: offers[i].Moniker,
			Site: offers[i].Site, PerHour: pl.Worker[w]})
	}
	return res, nil
}

// Run reads the record of every machine in the offer book from the ledger
// each minute until ctx ends: the view is built per bid, and the records
// change only at settlement.
func (m *Market) Run(ctx context.Context) error {
	for {
		recs := map[string]ledger.MachineRecord{}
		for _, h := range m.p.Book.List(time.Now()) {
			if rec, err := m.p.Records.MachineRecord(ctx, h.Offer.Machine); err == nil {
				recs[h.Offer.Machine] = rec
			}
		}
		m.mu.Lock()
		m.records = recs
		m.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Minute):
		}
	}
}

// MarkUnreachable leaves machine out of the view for a while: it could
// not be reached (see unreachable).
func (m *Market) MarkUnreachable(machine string, now time.Time) { m.unreachable.mark(machine, now) }

// Reachable puts back a machine that answered again.
func (m *Market) Reachable(machine string) { m.unreachable.forget(machine) }

// Unreachable reports whether machine is left out for now.
func (m *Market) Unreachable(machine string, now time.Time) bool {
	return m.unreachable.skip(machine, now)
}
