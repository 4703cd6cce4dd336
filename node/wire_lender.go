package node

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/inventory"
	"github.com/deepmarket/deepmarket/node/lender"
	"github.com/deepmarket/deepmarket/node/market"
	"github.com/deepmarket/deepmarket/node/sandbox"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/storage"
	"github.com/deepmarket/deepmarket/units"
)

// The node's wiring of the lender's room (package node/lender): what this
// machine lends, the holds on it, the desk that grants them, and the
// executor that runs the workers launched on them.

// lending is the lender's room as this node wires it: what this machine
// lends and its offer, the holds on it, the desk that grants them, and the
// meter of its links to other machines.
type lending struct {
	lender      *lender.Lender
	holds       *lender.Holds
	commitments *lender.Commitments
	desk        *lender.Desk
	links       *p2p.LinkMeter
}

// lendingDeps are what the lender's room reads of the rest of the node.
type lendingDeps struct {
	host      host.Host
	key       *identity.Key
	store     *Store
	offers    *p2p.Topic // the offers topic
	book      *market.OfferBook
	admission *lender.Admission
	owners    lender.Owners
	inventory func() inventory.Inventory
	// capable says whether this machine can enforce a job's limits (the
	// executor's answer, once it exists).
	capable func() error
	// escrowOf reads a job's open escrow on this machine's ledger replica.
	escrowOf func(job string) (ledger.Escrow, bool)
	// images lists the job images the executor holds unpacked, disk what
	// is free in its work area.
	images func(n int) []string
	disk   func() uint64
	log    *slog.Logger
}

// startLending makes the lender (its settings and offer), the holds on
// this machine and the desk that answers hold requests, and answers
// others' link probes: at most one a minute from each machine the ledger
// backs, whether or not this machine probes.
func startLending(c Config, d lendingDeps) (lending, error) {
	var l lending
	l.links = p2p.NewLinkMeter(d.host, c.Node.ChainID)
	p2p.ServeProbes(d.host, c.Node.ChainID, time.Minute, d.admission)
	src := lender.OfferSource{
		Host: d.host, Account: d.key.Address(), Moniker: c.Node.Moniker, Site: c.Node.Site, Version: Version,
		Inventory: d.inventory, Owners: d.owners,
		Allocated: func(now time.Time) p2p.Resources { return l.holds.Announced(now) },
		Links:     l.links.Samples,
		Reach:     func() string { return p2p.ReachOf(d.host) },
		Images:    d.images, Disk: d.disk,
	}
	var err error
	l.lender, err = lender.NewLender(lender.LenderParams{
		Store: d.store, Topic: d.offers, Offer: src.Build, Inventory: d.inventory,
		Defaults: c.DefaultPrices(), Pace: c.P2P.Pace(), Machines: d.book.Len,
		Capable: d.capable, Logger: d.log.With("module", "lender"),
	})
	if err != nil {
		return lending{}, err
	}
	mc := c.Market
	l.holds = lender.NewHolds(l.lender.Lent, lender.HoldLimits{PerBidder: mc.HoldsPerBidder, PerScheduler: mc.HoldsPerScheduler,
		LaunchWithin: mc.LaunchWithin.Duration}, l.lender.Refresh)
	me := string(d.key.Address())
	l.holds.SetEscrowed(func(job, account string, cost, charge uint64) bool {
		e, ok := d.escrowOf(job)
		return ok && lender.EscrowBacks(e, me, account, cost, charge)
	})
	l.commitments = lender.NewCommitments(func(job, account string) uint64 {
		if e, ok := d.escrowOf(job); ok && e.Payer == account {
			return e.Amount
		}
		return 0
	})
	d.admission.SetCommitments(l.commitments)
	l.desk = lender.NewDesk(d.admission, l.holds)
	return l, nil
}

// sawBid counts a bid seen on the market against its account's balance,
// and drops the holds here that the balance no longer backs (a bid that
// reached another machine first, at the same instant: see
// lender.Commitments).
func sawBid(c *lender.Commitments, holds *lender.Holds, reads lender.LedgerReads, r *p2p.Received, now time.Time, log *slog.Logger) {
	if r.Bid == nil || !c.Saw(r.Bid, r.Seq, r.Expiry, now) {
		return
	}
	account := r.Bid.Submitter
	unbacked := c.Unbacked(account, reads.BalanceOf(identity.Address(account)), now)
	if n := holds.DropUnbacked(account, unbacked, now); n > 0 {
		log.Info("dropped holds its balance no longer backs", "account", account, "holds", n, "jobs", len(unbacked))
	}
}

// executorDeps are what the executor reads of the rest of the node.
type executorDeps struct {
	home      Home
	host      host.Host
	key       *identity.Key
	store     *Store
	blocks    *storage.Store
	ledger    *ledger.Client
	committed func() <-chan struct{} // closed when the ledger replica stores its next block
	params    ledger.Params          // the ledger's rules
	lender    *lender.Lender
	holds     *lender.Holds
	dialer    lender.Dialer
	reg       prometheus.Registerer
	log       *slog.Logger
}

// newExecutor makes the executor of the workers this machine runs, in
// [executor] work_dir (a directory of its own under
// /var/tmp/deepmarket-jobs when unset).
func newExecutor(c Config, d executorDeps) (*lender.Executor, error) {
	if err := sandbox.SetCgroupParent(c.Executor.CgroupParent); err != nil {
		return nil, fmt.Errorf("[executor] cgroup_parent: %w", err)
	}
	dir := c.Executor.WorkDir
	if dir == "" {
		id := d.host.ID().String()
		dir = filepath.Join("/var/tmp/deepmarket-jobs", id[len(id)-12:])
	}
	return lender.NewExecutor(lender.ExecutorParams{
		Dir: dir, Python: c.Inventory.Python, Home: d.home.Dir, UIDRange: c.Executor.UIDRange,
		ImageCache: imageCacheBytes(c.Executor.ImageCache),
		KeepLogs:   c.Executor.KeepLogs.Duration, CPUs: c.Executor.CPUs, ShareCPUs: c.Executor.ShareCPUs, ChainID: c.Node.ChainID,
		MinFloor: c.Lend.MinFloor, RefusedStop: c.Lend.RefusedStop, DisputeWindow: time.Duration(d.params.DisputeWindow) * time.Second,
		Host: d.host, Account: d.key.Address(), Store: d.store, Blocks: d.blocks, Ledger: d.ledger, Committed: d.committed,
		Holds: d.holds, GPUs: d.lender, Dialer: d.dialer, Registerer: d.reg, Logger: d.log,
	})
}

// newLinkMeter makes the lender's link meter: it probes the machines of
// the offer book every [p2p] probe_interval while this machine lends, and
// re-announces the offer with what it measured.
func newLinkMeter(c Config, book *market.OfferBook, links *p2p.LinkMeter, offering *lender.Lender, self peer.ID) *lender.LinkMeter {
	machines := lender.OfferBookFunc(func(now time.Time) []string {
		var out []string
		for _, h := range book.List(now) {
			out = append(out, h.Offer.Machine)
		}
		return out
	})
	return lender.NewLinkMeter(links, machines, offering, self, c.P2P.ProbeInterval.Duration)
}

// newOwnerWatch puts the machine's owner first: [owner] in config.toml,
// the threshold lend's settings give over it.
func newOwnerWatch(c Config, l *lender.Lender, exec *lender.Executor, log *slog.Logger) *lender.OwnerWatch {
	return &lender.OwnerWatch{
		Policy:    func() lender.OwnerPolicy { return c.Owner.Policy(l.SuspendAbove()) },
		Jobs:      exec,
		Offering:  l.OwnerOffering,
		Logger:    log.With("module", "owner"),
		Sample:    ownerSample,
		LastInput: ownerInput,
	}
}

// ownerSample reads the machine's CPU counters for the owner policy: nil,
// lender.ReadCPUSample. A test replaces it to count one synthetic owner
// process rather than the whole machine, which other tests share.
var ownerSample func() (lender.CPUSample, error)

// ownerInput is when the owner last typed at a terminal: nil,
// lender.LastTTYInput; a test's synthetic owner does not type.
var ownerInput func() time.Time

// imageCacheBytes is [executor] image_cache in bytes (validated with the
// config; 0, the executor's default, if it does not parse).
func imageCacheBytes(size string) int64 {
	n, err := units.ParseSize(size)
	if err != nil {
		return 0
	}
	return int64(min(n, 1<<62))
}
