package node

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

// schedulerView turns the offers this node holds into the scheduler's
// view, limited to the configured subset.
func (n *Node) schedulerView(now time.Time) (scheduler.View, []p2p.Offer) {
	return n.schedulerViewFor(now, "")
}

// runs reports whether a machine's offer says it can run framework: a
// TensorFlow job goes only where TensorFlow imports.
func runs(o p2p.Offer, framework string) bool {
	return framework != "tensorflow" || o.Software.TensorFlow != ""
}

// schedulerViewFor is schedulerView limited to the machines that run
// framework ("" for any).
func (n *Node) schedulerViewFor(now time.Time, framework string) (scheduler.View, []p2p.Offer) {
	held := n.book.List(now)
	offers := make([]p2p.Offer, 0, len(held))
	for _, h := range held {
		if !n.failures.skip(h.Offer.Machine, now) && runs(h.Offer, framework) {
			offers = append(offers, h.Offer)
		}
	}
	cfg := n.cfg.Scheduler
	switch cfg.Subset {
	case SubsetSite:
		offers = slices.DeleteFunc(offers, func(o p2p.Offer) bool { return o.Site != n.cfg.Node.Site })
	case SubsetList:
		offers = slices.DeleteFunc(offers, func(o p2p.Offer) bool { return !slices.Contains(cfg.Machines, o.Machine) })
	case SubsetNearest:
		rtt := map[string]time.Duration{n.host.ID().String(): 0}
		for _, p := range n.peers.Peers() {
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
		offers = offers[:min(len(offers), cfg.Nearest)]
	}
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
	for i, o := range offers {
		m := schedulerMachine(o)
		// The ledger's record of the machine's past jobs prices its risk.
		if r, ok := n.records.get(o.Machine); ok {
			m.Completed, m.Failed = r.Completed, r.Failed
		}
		v.Machines[i] = m
	}
	return v, offers
}

// MarketPrices implements api.Scheduling.
func (n *Node) MarketPrices(ctx context.Context) (api.MarketPrices, error) {
	now := time.Now()
	v, offers := n.schedulerView(now)
	mk := scheduler.MarketPrices(v, now, scheduler.Params{})
	out := api.MarketPrices{Subset: n.cfg.Scheduler.Subset, Lowest: mk.Lowest, Median: mk.Median,
		Machines: make([]api.MachinePrices, len(mk.Machines))}
	for i, m := range mk.Machines {
		out.Machines[i] = api.MachinePrices{MachinePrices: m, Moniker: offers[i].Moniker,
			Free: scheduler.Resources(v.Machines[i].Free())}
	}
	return out, nil
}

// QuoteJob implements api.Scheduling: the price and placement this node's
// scheduler gives a job shape now, or why it would not run.
func (n *Node) QuoteJob(ctx context.Context, req api.QuoteRequest) (api.QuoteResult, error) {
	if req.Workers < 1 || req.Workers > p2p.MaxWorkers {
		return api.QuoteResult{}, &api.Error{Status: http.StatusUnprocessableEntity, Field: "workers", Message: fmt.Sprintf("workers %d: want 1 to %d", req.Workers, p2p.MaxWorkers)}
	}
	if req.PerWorker == (scheduler.Resources{}) {
		return api.QuoteResult{}, &api.Error{Status: http.StatusUnprocessableEntity, Field: "per_worker", Message: "a worker must ask for some cores, memory or GPUs"}
	}
	if req.DurationS <= 0 || req.DurationS > int64(p2p.MaxJobDuration/time.Second) {
		return api.QuoteResult{}, &api.Error{Status: http.StatusUnprocessableEntity, Field: "duration_s", Message: fmt.Sprintf("duration %ds: want 1 s to %s", req.DurationS, p2p.MaxJobDuration)}
	}
	now := time.Now()
	v, offers := n.schedulerView(now)
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

var _ api.Scheduling = (*Node)(nil)

// machineRecords caches the ledger's machine records for the scheduler:
// the view is built per bid, and the records change only at settlement.
type machineRecords struct {
	mu   sync.Mutex
	recs map[string]ledger.MachineRecord // by machine peer ID
}

func (r *machineRecords) get(machine string) (ledger.MachineRecord, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec, ok := r.recs[machine]
	return rec, ok
}

// refreshRecords reads the record of every machine in the offer book from
// the ledger each minute until ctx ends.
func (n *Node) refreshRecords(ctx context.Context) error {
	for {
		recs := map[string]ledger.MachineRecord{}
		for _, h := range n.book.List(time.Now()) {
			if rec, err := n.ledger.MachineRecord(ctx, payeeOf(h.Offer.Machine)); err == nil {
				recs[h.Offer.Machine] = rec
			}
		}
		n.records.mu.Lock()
		n.records.recs = recs
		n.records.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Minute):
		}
	}
}
