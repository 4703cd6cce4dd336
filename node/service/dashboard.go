package service

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/fault"
	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/node/lender"
	"github.com/deepmarket/deepmarket/node/market"
	"github.com/deepmarket/deepmarket/node/submitter"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/units"
	"github.com/libp2p/go-libp2p/core/peer"
)

// Dashboard answers what the dashboard (package node/web) reads that the
// CLI does not: the account's overview with estimates and problems, its
// ledger activity with block times, the validators and the price history.
type Dashboard struct {
	Account identity.Address
	// This machine: its peer ID, name, and the prices it lends at when
	// the owner set none.
	Machine       peer.ID
	Moniker, Site string
	Prices        p2p.Prices
	Ledger        *ledger.Client
	Chain         *ledger.Chain // block times
	Lender        *lender.Lender
	Exec          *lender.Executor
	Holds         *lender.Holds
	Book          *market.OfferBook
	Own           *market.OwnMachines // the account's machines seen on the market
	Market        *market.Market
	History       *market.PriceHistory
	Jobs          interface {
		Jobs(ctx context.Context) ([]jobs.Job, error)
	}
	times blockTimes
}

// lostFor is how long a machine of ours stays "lost" on the dashboard
// after its offer lapsed without a withdrawal.
const lostFor = 24 * time.Hour

// offeredFor is how long in the next d a machine lending in window w (""
// always) is offered.
func offeredFor(window string, now time.Time, d time.Duration) time.Duration {
	if window == "" {
		return d
	}
	w, err := p2p.ParseWindow(window)
	if err != nil {
		return 0
	}
	var in time.Duration
	for t, end := now, now.Add(d); t.Before(end); {
		inside, change := w.Next(t)
		if !change.After(t) || change.After(end) {
			change = end
		}
		if inside {
			in += change.Sub(t)
		}
		t = change
	}
	return in
}

// Overview implements api.Dashboard.
func (d *Dashboard) Overview(ctx context.Context) (api.Overview, error) {
	now := time.Now()
	out := api.Overview{Account: string(d.Account), Machines: []api.MyMachine{}, Problems: []api.Problem{}}
	acct, err := d.Ledger.Account(ctx, d.Account)
	if err != nil {
		return api.Overview{}, err
	}
	out.Balance = acct.Balance
	out.Machines = append(out.Machines, d.thisMachine(ctx, now, &out.Estimate))
	d.otherMachines(ctx, now, &out)
	list, err := d.Jobs.Jobs(ctx)
	if err != nil {
		return api.Overview{}, err
	}
	jobProblems(list, now, &out)
	return out, nil
}

// thisMachine is this machine's line of the overview, with what it earns.
func (d *Dashboard) thisMachine(ctx context.Context, now time.Time, est *api.Estimate) api.MyMachine {
	lend := d.Lender.State(now)
	earn, running := d.Exec.Earnings(now, 24*time.Hour)
	est.Earnings = earn
	mm := api.MyMachine{Machine: d.Machine.String(), Moniker: d.Moniker, Site: d.Site, Self: true,
		State: api.MachineIdle, Workers: running}
	if lend.Settings != nil && lend.Lending {
		s := lend.Settings
		mm.Lent = p2p.Resources{Cores: uint32(s.Cores), MemBytes: s.MemBytes, GPUs: uint32(s.GPUs)}
		price := d.Prices
		if s.Price != nil {
			price = *s.Price
		}
		mm.PerHour = price.PerHour(mm.Lent)
		mm.State = api.MachineOutsideWin
		if lend.Offering {
			mm.State = api.MachineOffering
		}
		est.EarningsIfBusy = units.PriceFor(mm.PerHour, offeredFor(s.Window, now, 24*time.Hour))
	}
	mm.Allocated = d.Holds.Allocated(now)
	d.fillRecord(ctx, &mm)
	return mm
}

// otherMachines adds the account's other machines, as the market shows
// them, and a problem for each that vanished without withdrawing.
func (d *Dashboard) otherMachines(ctx context.Context, now time.Time, out *api.Overview) {
	self := d.Machine.String()
	held := map[string]market.HeldOffer{}
	for _, h := range d.Book.List(now) {
		held[h.Offer.Machine] = h
	}
	seen := d.Own.List()
	slices.SortFunc(seen, func(a, b market.HeldOffer) int { return strings.Compare(a.Offer.Machine, b.Offer.Machine) })
	for _, s := range seen {
		if s.Offer.Machine == self {
			continue
		}
		o := s.Offer
		m := api.MyMachine{Machine: o.Machine, Moniker: o.Moniker, Site: o.Site, Lent: o.Lent, Allocated: o.Allocated,
			PerHour: o.Price.PerHour(o.Lent), State: api.MachineOffering, LastSeen: s.Received.UTC()}
		if h, ok := held[o.Machine]; ok {
			m.Allocated, m.LastSeen = h.Offer.Allocated, h.Received.UTC()
		} else if d.Book.WasWithdrawn(o.Machine) {
			m.State = api.MachineIdle
		} else if now.Sub(s.Expires) < lostFor {
			m.State = api.MachineLost
			out.Problems = append(out.Problems, api.Problem{Kind: api.ProblemLostMachine, ID: o.Machine, Since: s.Expires.UTC(),
				Message: fmt.Sprintf("machine %s (%s) stopped offering without withdrawing: is its node running?", nameOr(o.Moniker, o.Machine), o.Site)})
		} else {
			continue
		}
		d.fillRecord(ctx, &m)
		out.Machines = append(out.Machines, m)
	}
}

// jobProblems adds what the live jobs will cost, and what went wrong
// lately: failed jobs, workers not heard from.
func jobProblems(list []jobs.Job, now time.Time, out *api.Overview) {
	for _, j := range list {
		switch {
		case j.State == jobs.Failed && now.Sub(j.Updated) < 7*24*time.Hour:
			out.Problems = append(out.Problems, api.Problem{Kind: api.ProblemFailedJob, ID: j.ID, Since: j.Updated,
				Message: fmt.Sprintf("job %s failed: %s", j.Spec.Name, j.Reason)})
		case !j.State.Terminal():
			out.Estimate.Costs += jobCost24h(&j, now)
			for i, w := range j.Workers {
				if (w.State == p2p.WorkerRunning || w.State == p2p.WorkerFetching) && !w.LastSeen.IsZero() && now.Sub(w.LastSeen) > submitter.StaleAfter {
					out.Problems = append(out.Problems, api.Problem{Kind: api.ProblemLostWorker, ID: j.ID, Since: w.LastSeen,
						Message: fmt.Sprintf("job %s: worker %d on %s not heard from for %s", j.Spec.Name, i, nameOr(w.Moniker, w.Machine),
							now.Sub(w.LastSeen).Round(time.Second))})
				}
			}
		}
	}
}

// jobCost24h is what a live job should cost in the next 24 hours: its
// hourly price until its maximum duration, within what is left of its
// maximum price.
func jobCost24h(j *jobs.Job, now time.Time) uint64 {
	r := j.Current()
	if r == nil || r.Settled || !j.Confirmed {
		return 0
	}
	left := 24 * time.Hour
	if !r.Started.IsZero() {
		left = min(left, r.Started.Add(j.Spec.MaxDuration).Sub(now))
	} else {
		left = min(left, j.Spec.MaxDuration)
	}
	budget := j.Spec.MaxPrice - min(j.Cost, j.Spec.MaxPrice)
	return min(units.PriceFor(r.PerHour, left), budget)
}

func nameOr(moniker, id string) string {
	if moniker != "" {
		return moniker
	}
	return id[:min(len(id), 12)]
}

// fillRecord adds the ledger's record of a machine's past jobs.
func (d *Dashboard) fillRecord(ctx context.Context, m *api.MyMachine) {
	if rec, err := d.Ledger.MachineRecord(ctx, submitter.PayeeOf(m.Machine)); err == nil {
		m.Earned, m.Completed, m.Failed = rec.Earned, rec.Completed, rec.Failed
	}
}

// Validators implements api.Validators.
func (d *Dashboard) Validators(ctx context.Context) (*ledger.ValidatorSet, error) {
	return d.Ledger.Validators(ctx)
}

// activityLimit bounds the transactions an activity report reads.
const activityLimit = 500

// blockTimes caches block times by height (they never change).
type blockTimes struct {
	mu sync.Mutex
	at map[int64]time.Time
}

// blockTime returns the time of the block at height h.
func (d *Dashboard) blockTime(ctx context.Context, h int64) (time.Time, error) {
	d.times.mu.Lock()
	t, ok := d.times.at[h]
	d.times.mu.Unlock()
	if ok {
		return t, nil
	}
	res, err := d.Chain.Client().Header(ctx, &h)
	if err != nil {
		return time.Time{}, fmt.Errorf("block %d: %w", h, err)
	}
	t = res.Header.Time.UTC()
	d.times.mu.Lock()
	if d.times.at == nil || len(d.times.at) > 100_000 {
		d.times.at = map[int64]time.Time{}
	}
	d.times.at[h] = t
	d.times.mu.Unlock()
	return t, nil
}

// Activity implements api.Dashboard: the account's transactions of the
// last days, newest first, each with what it moved for, and the credits
// in and out per UTC day.
func (d *Dashboard) Activity(ctx context.Context, addr string, days int) (api.Activity, error) {
	a, err := addressOr(addr, d.Account)
	if err != nil {
		return api.Activity{}, err
	}
	hist, err := d.Ledger.History(ctx, a, activityLimit)
	if err != nil {
		return api.Activity{}, err
	}
	now := time.Now().UTC()
	first := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC).AddDate(0, 0, -(days - 1))
	out := api.Activity{Address: string(a), Days: make([]api.DayFlow, days), Entries: []api.ActivityEntry{}}
	for i := range out.Days {
		out.Days[i].Day = first.AddDate(0, 0, i).Format(time.DateOnly)
	}
	// My machines: settlements name the machines they pay.
	mine := map[string]bool{string(a): true}
	if a == d.Account {
		for _, s := range d.Own.List() {
			mine[submitter.PayeeOf(s.Offer.Machine)] = true
		}
	}
	for _, h := range hist {
		t, err := d.blockTime(ctx, h.Height)
		if err != nil {
			return api.Activity{}, err
		}
		if t.Before(first) {
			break // newest first
		}
		e := describe(h, string(a), mine)
		e.Time = t
		out.Entries = append(out.Entries, e)
		d := &out.Days[min(int(t.Sub(first)/(24*time.Hour)), days-1)]
		d.Earned += e.In
		d.Spent += e.Out
		out.Earned += e.In
		out.Spent += e.Out
	}
	return out, nil
}

// verdictText says what a referee's verdict did.
func verdictText(h ledger.HistoryEntry) string {
	vote := "uphold"
	if h.Attrs["overturn"] == "true" {
		vote = "overturn"
	}
	j := h.Attrs["job"]
	t := fmt.Sprintf("referee %s voted to %s the refusal of %s on job %s", h.Attrs["referee"], vote, h.Attrs["appellant"], j[:min(len(j), 12)])
	switch h.Attrs["verdict"] {
	case ledger.VerdictOverturned:
		t += ": overturned, the appellant is paid"
	case ledger.VerdictUpheld:
		t += ": upheld, the appellant's bond goes to the referees"
	}
	return t
}

// describe says what a ledger transaction moved for account me.
func describe(h ledger.HistoryEntry, me string, mine map[string]bool) api.ActivityEntry {
	e := api.ActivityEntry{Height: h.Height, Hash: h.Hash, Type: h.Type, Job: h.Attrs["job"], Memo: h.Attrs["memo"]}
	from, to := h.Attrs["from"], h.Attrs["to"]
	amount := h.Amount("amount")
	short := func(j string) string { return j[:min(len(j), 12)] }
	switch h.Type {
	case ledger.TypeTransfer:
		switch {
		case from == me && to == me:
			e.What = "transfer to yourself"
		case from == me:
			e.Out, e.Counterparty, e.What = amount, to, "sent to "+to
		default:
			e.In, e.Counterparty, e.What = amount, from, "received from "+from
		}
	case ledger.TypeGrant:
		if to == me {
			e.In, e.Counterparty, e.What = amount, from, "granted by issuer "+from
		} else {
			e.Counterparty, e.What = to, "granted to "+to+" (from your issuer quota)"
		}
	case ledger.TypeOpenEscrow:
		e.Locked, e.What = amount, "locked in escrow for job "+short(e.Job)
	case ledger.TypeSettle:
		var paid, earned uint64
		for _, p := range h.Paid {
			m, v, _ := strings.Cut(p, "=")
			amt, _ := strconv.ParseUint(v, 10, 64)
			if mine[m] {
				earned += amt
			} else {
				paid += amt
			}
		}
		if from == me {
			// Spent is all the job paid, your own machines' share
			// included (it comes back as earned): the figures add up.
			e.Out, e.Unlocked = paid+earned, h.Amount("refund")
			e.What = fmt.Sprintf("job %s settled: paid its machines, the rest refunded", short(e.Job))
			if earned > 0 {
				e.What += " (your own machines earned part of it)"
			}
		} else {
			e.Counterparty = from
			e.What = fmt.Sprintf("earned by your machine from job %s", short(e.Job))
		}
		e.In = earned
	case ledger.TypeClaim:
		lodged := h.Attrs["lodged"] == "true"
		switch {
		case to == me && lodged:
			e.In, e.What = amount, "receipt lodged against the settlement of job "+short(e.Job)+": paid the rest it covers"
		case to == me:
			e.In, e.What = amount, "claimed from the expired escrow of job "+short(e.Job)
		case lodged:
			e.Out, e.Counterparty, e.What = amount, to, "receipt lodged by "+to+" against your settlement of job "+short(e.Job)+" (out of its refund)"
		default:
			e.Out, e.Counterparty, e.What = amount, to, "claimed by "+to+" from your escrow of job "+short(e.Job)
		}
	case ledger.TypeDispute:
		e.What = "failed mark on job " + short(e.Job) + " disputed by " + h.Attrs["machine"]
	case ledger.TypeAppeal:
		e.What = fmt.Sprintf("appeal of the settlement of job %s by %s: claims %s, judged by %s",
			short(e.Job), h.Attrs["appellant"], units.FormatCredits(h.Amount("claim")), h.Attrs["referees"])
		if h.Attrs["owner"] == me {
			e.Out, e.What = h.Amount("bond"), e.What+" (your bond)"
		}
	case ledger.TypeVerdict:
		e.What = verdictText(h)
		majority := strings.Split(h.Attrs["majority"], ",")
		if h.Attrs["verdict"] == ledger.VerdictOverturned && h.Attrs["owner"] == me {
			e.In = h.Amount("paid") // the claim, and the bond back
		}
		if h.Attrs["verdict"] != "" && slices.Contains(majority, me) {
			e.In += h.Amount("fee") / uint64(len(majority))
		}
	case ledger.TypeExpire:
		e.Unlocked, e.What = h.Amount("refund"), "escrow of job "+short(e.Job)+" expired: remainder refunded"
	case ledger.TypeLinkMachine:
		e.What = "machine " + h.Attrs["machine"] + " linked to " + h.Attrs["owner"]
		if h.Attrs["owner"] == me {
			e.Locked = h.Amount("stake") // comes back when the machine leaves
		}
	default:
		e.What = h.Type
	}
	return e
}

// PriceHistory is the recorded samples since t, and the market now as
// the last one.
func (d *Dashboard) PriceHistory(ctx context.Context, since time.Time) ([]api.PriceSample, error) {
	samples := d.History.Since(since)
	now, err := d.Market.Sample(ctx)
	if err != nil {
		return nil, err
	}
	return append(samples, now), nil
}

// addressOr parses s, an account address; empty is self.
func addressOr(s string, self identity.Address) (identity.Address, error) {
	if s == "" {
		return self, nil
	}
	a, err := identity.ParseAddress(s)
	if err != nil {
		return "", fault.Wrap(fault.Malformed, "address", err)
	}
	return a, nil
}

var (
	_ api.Dashboard  = (*Dashboard)(nil)
	_ api.Validators = (*Dashboard)(nil)
)
