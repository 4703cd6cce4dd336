package market

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/fault"
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

	// changes counts the changes to the view that the offer book does not
	// see: machines marked unreachable or reachable again, and records
	// read. An index built before the latest is not served.
	changes atomic.Uint64
	// build serializes index builds, so that callers who find the index
	// stale wait for one build rather than each making their own; indexes
	// holds the latest of each framework class (see frameworkClass), read
	// without it.
	build   sync.Mutex
	indexes [2]atomic.Pointer[indexed]
}

// indexMaxAge is how long Indexed serves one index. Offers change
// constantly at scale (allocations move with every hold), so an index kept
// in step with the book would be rebuilt for nearly every bid; the holds
// on the machines are the authority on what is free, so a view a second
// old costs at most a refused hold and a re-quote.
const indexMaxAge = time.Second

// indexed is a view and its index, as Indexed serves them.
type indexed struct {
	built   time.Time
	changes uint64 // Market.changes when built
	x       *scheduler.Index
	v       scheduler.View
	offers  []p2p.Offer
}

// New returns a market over p.Book.
func New(p Params) *Market {
	return &Market{p: p}
}

// runs reports whether a machine's offer says it can run framework: a
// TensorFlow job goes only where TensorFlow imports.
func runs(o p2p.Offer, framework string) bool {
	return frameworkClass(framework) == 0 || o.Software.TensorFlow != ""
}

// frameworkClass is 1 for the frameworks that need TensorFlow on the
// machine and 0 for the rest: the frameworks of one class have the same
// view (runs), and share an index. Two classes, not one per name, because
// the name comes from the bid.
func frameworkClass(framework string) int {
	if framework == "tensorflow" {
		return 1
	}
	return 0
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

// Indexed is View(now, framework) prepared for placements: an index of
// the view (priced with scheduler.Params{}), and the view and offers it
// was built from, which its placements' machine indexes point into. One
// index serves every caller until it is indexMaxAge old, or a machine was
// marked unreachable or reachable again, or the ledger records were read
// anew; then the next caller builds another (a served index is never
// changed). The three are shared: callers only read them, and copy the
// view to change it. Other changes to the view (offers, their expiry, an
// unreachable machine's time running out, the nearest subset's RTTs) show
// within indexMaxAge.
func (m *Market) Indexed(now time.Time, framework string) (*scheduler.Index, scheduler.View, []p2p.Offer) {
	slot := &m.indexes[frameworkClass(framework)]
	if c := slot.Load(); m.fresh(c, now) {
		return c.x, c.v, c.offers
	}
	m.build.Lock()
	defer m.build.Unlock()
	if c := slot.Load(); m.fresh(c, now) {
		return c.x, c.v, c.offers // another caller built it meanwhile
	}
	// Read before the view: a change while it is built makes the next
	// caller build again rather than keep a view that missed it.
	changes := m.changes.Load()
	v, offers := m.View(now, framework)
	c := &indexed{built: now, changes: changes, x: scheduler.NewIndex(v, scheduler.Params{}), v: v, offers: offers}
	slot.Store(c)
	return c.x, c.v, c.offers
}

// fresh reports whether c may be served at now. Callers' clocks are read
// a moment apart, so an index built just after now is fresh too.
func (m *Market) fresh(c *indexed, now time.Time) bool {
	if c == nil || c.changes != m.changes.Load() {
		return false
	}
	age := now.Sub(c.built)
	return age < indexMaxAge && age > -indexMaxAge
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

// MachinePrices is one machine's current prices, load and free capacity.
type MachinePrices struct {
	scheduler.MachinePrices
	Moniker string              `json:"moniker,omitempty"`
	Free    scheduler.Resources `json:"free"`
}

// Prices is what this node's scheduler charges now, per machine and
// market-wide (micro-credits per unit-hour; memory per GiB-hour): the
// answer to `deepmarket prices`.
type Prices struct {
	Subset   string               `json:"subset"`
	Lowest   scheduler.UnitPrices `json:"lowest"`
	Median   scheduler.UnitPrices `json:"median"`
	Machines []MachinePrices      `json:"machines"`
}

// Prices is what the machines in view charge now, and their lowest and
// median unit prices.
func (m *Market) Prices(now time.Time) Prices {
	v, offers := m.View(now, "")
	mk := scheduler.MarketPrices(v, now, scheduler.Params{})
	out := Prices{Subset: m.p.Subset, Lowest: mk.Lowest, Median: mk.Median,
		Machines: make([]MachinePrices, len(mk.Machines))}
	for i, mp := range mk.Machines {
		out.Machines[i] = MachinePrices{MachinePrices: mp, Moniker: offers[i].Moniker,
			Free: scheduler.Resources(v.Machines[i].Free())}
	}
	return out
}

// Sample is the market's prices now, as the price history records them.
func (m *Market) Sample(context.Context) (PriceSample, error) {
	mk := m.Prices(time.Now())
	s := PriceSample{Time: time.Now().UTC(), Lowest: mk.Lowest, Median: mk.Median, Machines: len(mk.Machines)}
	for _, mp := range mk.Machines {
		if mp.Available {
			s.Available++
		}
	}
	return s, nil
}

// QuoteRequest is a job shape to price.
type QuoteRequest struct {
	Workers   int                 `json:"workers"`
	PerWorker scheduler.Resources `json:"per_worker"`
	DurationS int64               `json:"duration_s"`
	MaxPrice  uint64              `json:"max_price,omitempty"` // micro-credits; 0: no limit
	Deadline  int64               `json:"deadline,omitempty"`  // unix seconds
}

// QuotedWorker is where one worker would run, at what hourly price.
type QuotedWorker struct {
	Machine string `json:"machine"`
	Moniker string `json:"moniker,omitempty"`
	Site    string `json:"site,omitempty"`
	PerHour uint64 `json:"per_hour"`
}

// QuoteResult is a quote, or the reason there is none.
type QuoteResult struct {
	OK        bool                 `json:"ok"`
	Machines  int                  `json:"machines_in_view"`
	Workers   []QuotedWorker       `json:"workers,omitempty"`
	PerHour   uint64               `json:"per_hour,omitempty"`
	Total     uint64               `json:"total,omitempty"`
	DoneAt    time.Time            `json:"done_at,omitzero"`
	Rejection *scheduler.Rejection `json:"rejection,omitempty"`
}

// Quote is the price and placement the scheduler gives a job shape now,
// or why it would not run; a malformed request is a *fault.Error of kind
// fault.Invalid naming the field at fault.
func (m *Market) Quote(now time.Time, req QuoteRequest) (QuoteResult, error) {
	if req.Workers < 1 || req.Workers > p2p.MaxWorkers {
		return QuoteResult{}, fault.New(fault.Invalid, "workers", "workers %d: want 1 to %d", req.Workers, p2p.MaxWorkers)
	}
	if req.PerWorker == (scheduler.Resources{}) {
		return QuoteResult{}, fault.New(fault.Invalid, "per_worker", "a worker must ask for some cores, memory or GPUs")
	}
	if req.DurationS <= 0 || req.DurationS > int64(p2p.MaxJobDuration/time.Second) {
		return QuoteResult{}, fault.New(fault.Invalid, "duration_s", "duration %ds: want 1 s to %s", req.DurationS, p2p.MaxJobDuration)
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
		return QuoteResult{Machines: len(v.Machines), Rejection: rej}, nil
	}
	if err != nil {
		return QuoteResult{}, err
	}
	res := QuoteResult{OK: true, Machines: len(v.Machines), PerHour: pl.PerHour, Total: pl.Total, DoneAt: pl.Done.UTC()}
	for w, i := range pl.Machines {
		res.Workers = append(res.Workers, QuotedWorker{Machine: offers[i].Machine, Moniker: offers[i].Moniker,
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
		m.changes.Add(1)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Minute):
		}
	}
}

// MarkUnreachable leaves machine out of the view for a while: it could
// not be reached (see unreachable).
func (m *Market) MarkUnreachable(machine string, now time.Time) {
	m.unreachable.mark(machine, now)
	m.changes.Add(1)
}

// Reachable puts back a machine that answered again.
func (m *Market) Reachable(machine string) {
	if m.unreachable.forget(machine) {
		m.changes.Add(1)
	}
}

// Unreachable reports whether machine is left out for now.
func (m *Market) Unreachable(machine string, now time.Time) bool {
	return m.unreachable.skip(machine, now)
}
