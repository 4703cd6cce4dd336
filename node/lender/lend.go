package lender

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/deepmarket/deepmarket/node/fault"
	"github.com/deepmarket/deepmarket/node/inventory"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/units"
)

// lendKey is where the lend settings live in the node store.
const lendKey = "lend/settings"

// LendSettings is what the owner lends; they survive restarts.
type LendSettings struct {
	Cores    int        `json:"cores"`
	MemBytes uint64     `json:"mem_bytes"`
	GPUs     int        `json:"gpus"`
	Window   string     `json:"window,omitempty"`
	Price    p2p.Prices `json:"price"`
	Since    time.Time  `json:"since"`
	// SuspendAbove overrides the node's [owner] suspend_above when set.
	SuspendAbove *float64 `json:"suspend_above,omitempty"`
}

// ValidateLend checks a request against the machine's inventory and fills
// default prices. A request the inventory cannot satisfy is a
// *fault.Error of kind fault.Invalid that names the field at fault, so
// the CLI and dashboard can point at it.
func ValidateLend(req LendRequest, inv inventory.Inventory, defaults p2p.Prices) (LendSettings, error) {
	bad := func(field, format string, args ...any) (LendSettings, error) {
		return LendSettings{}, fault.New(fault.Invalid, field, format, args...)
	}
	switch {
	case req.Cores <= 0:
		return bad("cores", "cores must be at least 1 (have %d)", req.Cores)
	case req.Cores > inv.Cores:
		return bad("cores", "cannot lend %d cores: this machine has %d", req.Cores, inv.Cores)
	case req.MemBytes == 0:
		return bad("mem_bytes", "memory must be more than 0")
	case req.MemBytes > inv.MemBytes:
		return bad("mem_bytes", "cannot lend %s of memory: this machine has %s", units.FormatSize(req.MemBytes), units.FormatSize(inv.MemBytes))
	case req.GPUs < 0:
		return bad("gpus", "GPUs cannot be negative (have %d)", req.GPUs)
	case req.GPUs > len(inv.GPUs):
		return bad("gpus", "cannot lend %d GPUs: this machine has %d (detected with nvidia-smi)", req.GPUs, len(inv.GPUs))
	}
	if req.Window != "" {
		if _, err := p2p.ParseWindow(req.Window); err != nil {
			return bad("window", "%v", err)
		}
	}
	price := defaults
	if req.Price != nil {
		price = *req.Price
	}
	if price.CoreHour > p2p.MaxUnitPrice || price.MemGiBHour > p2p.MaxUnitPrice || price.GPUHour > p2p.MaxUnitPrice {
		return bad("price", "a reserve price may be at most %s credits per unit-hour", units.FormatCredits(p2p.MaxUnitPrice))
	}
	if a := req.SuspendAbove; a != nil && (*a < 0 || *a > 4096 || *a != *a) {
		return bad("suspend_above", "%v: want 0 (never suspend) to 4096 cores of the owner's load", *a)
	}
	return LendSettings{Cores: req.Cores, MemBytes: req.MemBytes, GPUs: req.GPUs, Window: req.Window, Price: price,
		SuspendAbove: req.SuspendAbove}, nil
}

// LenderParams configures a Lender.
type LenderParams struct {
	Store     Store
	Topic     *p2p.Topic
	Offer     func(LendSettings, time.Time) p2p.Offer // builds the offer to announce
	Inventory func() inventory.Inventory
	Defaults  p2p.Prices
	Pace      PaceParams
	// Machines is how many machines the market holds now (this node's
	// offer book): the pace stretches as it grows.
	Machines func() int
	// Capable, when set, says whether this machine can run jobs at all
	// (the job sandbox): settings saved on a machine that cannot keep
	// nothing on offer, and State says why.
	Capable func() error
	Logger  *slog.Logger
}

// Lender owns this machine's presence in the market: its lend settings and
// the signed offer announced for them, periodically, on change, and only
// inside the availability window; leaving the window or `lend --stop`
// gossips a withdrawal.
type Lender struct {
	p     LenderParams
	wake  chan struct{}
	mu    sync.Mutex
	set   *LendSettings
	out   bool // an offer of ours is live in the market
	until time.Time
	// ownerBusy, when set, is why the machine's owner keeps it off the
	// market now (OwnerWatch).
	ownerBusy string
	pace      Pace // of the last announcement
}

// paceNow is the pace for the market's size now.
func (l *Lender) paceNow() Pace {
	n := 0
	if l.p.Machines != nil {
		n = l.p.Machines()
	}
	return PaceFor(n, l.p.Pace)
}

// OwnerOffering tells the lender whether the machine's owner lets it
// offer itself now, and if not why; a change is announced at once.
func (l *Lender) OwnerOffering(ok bool, why string) {
	if ok {
		why = ""
	}
	l.mu.Lock()
	changed := l.ownerBusy != why
	l.ownerBusy = why
	l.mu.Unlock()
	if changed {
		l.Refresh()
	}
}

// NewLender loads persisted settings.
func NewLender(p LenderParams) (*Lender, error) {
	l := &Lender{p: p, wake: make(chan struct{}, 1), pace: PaceFor(0, p.Pace)}
	var s LendSettings
	found, err := p.Store.Get(lendKey, &s)
	if err != nil {
		return nil, err
	}
	if found {
		l.set = &s
	}
	return l, nil
}

// State reports the settings and whether an offer is out.
func (l *Lender) State(now time.Time) LendState {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := LendState{Lending: l.set != nil, Offering: l.out, OwnerBusy: l.ownerBusy,
		AnnounceEveryS: int64(l.pace.Interval / time.Second), OfferTTLS: int64(l.pace.TTL / time.Second)}
	if l.set != nil {
		price := l.set.Price
		st.Settings = &LendRequest{Cores: l.set.Cores, MemBytes: l.set.MemBytes, GPUs: l.set.GPUs, Window: l.set.Window, Price: &price,
			SuspendAbove: l.set.SuspendAbove}
		since := l.set.Since
		st.Since = &since
		if w, err := p2p.ParseWindow(l.set.Window); err == nil {
			_, change := w.Next(now)
			st.NextChange = &change
		}
		if l.p.Capable != nil {
			if err := l.p.Capable(); err != nil {
				st.Unable = err.Error()
			}
		}
	}
	return st
}

// Lent is what this machine lends at this moment: its lend settings
// while its offer is out, nothing otherwise.
func (l *Lender) Lent() p2p.Resources {
	st := l.State(time.Now())
	if !st.Offering || st.Settings == nil {
		return p2p.Resources{}
	}
	return p2p.Resources{Cores: uint32(st.Settings.Cores), MemBytes: st.Settings.MemBytes, GPUs: uint32(st.Settings.GPUs)}
}

// LentGPUs is how many GPUs this machine lends: the first ones
// nvidia-smi lists, as the offer says.
func (l *Lender) LentGPUs() int {
	l.mu.Lock()
	set := l.set
	l.mu.Unlock()
	if set == nil {
		return 0
	}
	return min(set.GPUs, len(l.p.Inventory().GPUs))
}

// Set validates, persists and announces new settings.
func (l *Lender) Set(ctx context.Context, req LendRequest) (LendState, error) {
	if req.Price != nil && len(req.PriceGiven) > 0 {
		req.Price = l.mergePrice(*req.Price, req.PriceGiven)
	}
	s, err := ValidateLend(req, l.p.Inventory(), l.p.Defaults)
	if err != nil {
		return LendState{}, err
	}
	s.Since = time.Now().UTC().Truncate(time.Second)
	if err := l.p.Store.Put(lendKey, s); err != nil {
		return LendState{}, err
	}
	l.mu.Lock()
	l.set = &s
	err = l.syncLocked(ctx, time.Now(), true)
	l.mu.Unlock()
	if err != nil {
		return LendState{}, fmt.Errorf("settings saved, but announcing failed (it will be retried): %w", err)
	}
	return l.State(time.Now()), nil
}

// mergePrice is p for the units given, and for the others what is lent
// now, else the configured defaults.
func (l *Lender) mergePrice(p p2p.Prices, given []string) *p2p.Prices {
	l.mu.Lock()
	base := l.p.Defaults
	if l.set != nil {
		base = l.set.Price
	}
	l.mu.Unlock()
	out := base
	for _, u := range given {
		switch u {
		case "core":
			out.CoreHour = p.CoreHour
		case "mem":
			out.MemGiBHour = p.MemGiBHour
		case "gpu":
			out.GPUHour = p.GPUHour
		}
	}
	return &out
}

// Stop forgets the settings and withdraws the offer at once.
func (l *Lender) Stop(ctx context.Context) error {
	if err := l.p.Store.Delete(lendKey); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.set = nil
	return l.syncLocked(ctx, time.Now(), true)
}

// Refresh re-announces at once (the inventory or addresses changed).
func (l *Lender) Refresh() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// withdrawGrace is how long a stopping node waits for its withdrawal to
// leave: gossipsub sends asynchronously and has no flush.
const withdrawGrace = 300 * time.Millisecond

// withdrawOnStop tells peers at once that this machine is leaving, so its
// offer does not linger on their books until the TTL.
func (l *Lender) withdrawOnStop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.out {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	w := &p2p.Withdrawal{Machine: l.p.Topic.Signer().String(), Reason: "node stopping"}
	if err := l.p.Topic.PublishWithdrawal(ctx, w, l.pace.TTL); err != nil {
		l.p.Logger.Warn("withdraw offer while stopping", "err", err)
		return
	}
	l.out = false
	time.Sleep(withdrawGrace)
}

// syncLocked makes the market match the settings: announce when lending
// inside the window (always when force or when due), withdraw otherwise.
func (l *Lender) syncLocked(ctx context.Context, now time.Time, force bool) error {
	want := l.set != nil
	var until time.Time
	if want && l.set.Window != "" {
		w, err := p2p.ParseWindow(l.set.Window)
		if err != nil {
			return err
		}
		var inside bool
		inside, until = w.Next(now)
		want = inside
	}
	owner := want && l.ownerBusy != ""
	want = want && !owner
	incapable := ""
	if want && l.p.Capable != nil {
		if err := l.p.Capable(); err != nil {
			incapable, want = err.Error(), false
		}
	}
	l.pace = l.paceNow()
	switch {
	case want:
		offer := l.p.Offer(*l.set, now)
		if !until.IsZero() {
			offer.AvailableUntil = until.Unix()
		}
		ttl := l.pace.TTL
		if !until.IsZero() && until.Sub(now) < ttl {
			ttl = until.Sub(now) // never advertise past the window
		}
		if err := l.p.Topic.PublishOffer(ctx, &offer, ttl); err != nil {
			return err
		}
		l.out, l.until = true, until
		l.p.Logger.Debug("announced offer", "cores", offer.Lent.Cores, "mem", offer.Lent.MemBytes, "ttl", ttl, "next", l.pace.Interval)
	case l.out || force:
		reason := "lend stopped"
		switch {
		case owner:
			reason = l.ownerBusy
		case incapable != "":
			reason = "this machine cannot run jobs"
		case l.set != nil:
			reason = "outside availability window"
		}
		if err := l.p.Topic.PublishWithdrawal(ctx, &p2p.Withdrawal{Machine: l.p.Topic.Signer().String(), Reason: reason}, l.pace.TTL); err != nil {
			return err
		}
		l.out = false
		l.p.Logger.Info("withdrew offer", "reason", reason)
	}
	return nil
}

// Run announces every interval, at window boundaries, and on Refresh,
// until ctx ends; then it withdraws the offer so peers drop it at once.
func (l *Lender) Run(ctx context.Context) error {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			l.withdrawOnStop()
			return nil
		case <-timer.C:
		case <-l.wake:
		}
		now := time.Now()
		l.mu.Lock()
		if err := l.syncLocked(ctx, now, false); err != nil && ctx.Err() == nil {
			l.p.Logger.Warn("announce offer", "err", err)
		}
		next := l.pace.Interval
		if !l.until.IsZero() && l.until.Sub(now) < next {
			next = l.until.Sub(now) + time.Second
		}
		if l.set != nil && l.set.Window != "" && !l.out {
			if w, err := p2p.ParseWindow(l.set.Window); err == nil {
				if _, change := w.Next(now); change.Sub(now) < next {
					next = change.Sub(now) + time.Second
				}
			}
		}
		l.mu.Unlock()
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(next)
	}
}

// SuspendAbove is the owner's load threshold the lend settings give, if
// they give one.
func (l *Lender) SuspendAbove() *float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.set == nil {
		return nil
	}
	return l.set.SuspendAbove
}
