package node

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/node/lender"
	"github.com/deepmarket/deepmarket/node/sandbox"
	"github.com/deepmarket/deepmarket/p2p"
)

// The node's wiring of the lender's room (package node/lender): what this
// machine lends, the holds on it, the desk that grants them, and the
// executor that runs the workers launched on them.

// startLending makes the lender (its settings and offer), the holds on
// this machine and the desk that answers hold requests.
func (n *Node) startLending() (err error) {
	n.links = p2p.NewLinkMeter(n.host, n.cfg.Node.ChainID)
	// Others' probes are answered whether or not this machine probes: at
	// most one a minute from each machine the ledger backs.
	p2p.ServeProbes(n.host, n.cfg.Node.ChainID, time.Minute, n.admission)
	src := lender.OfferSource{
		Host: n.host, Account: n.key.Address(), Moniker: n.cfg.Node.Moniker, Site: n.cfg.Node.Site, Version: Version,
		Inventory: n.Inventory, Owners: n.reads,
		Allocated: func(now time.Time) p2p.Resources { return n.holds.Allocated(now) },
		Links:     n.links.Samples,
		Reach:     func() string { return p2p.ReachOf(n.host) },
	}
	n.lender, err = lender.NewLender(lender.LenderParams{
		Store: n.store, Topic: n.gossip.Offers(), Offer: src.Build, Inventory: n.Inventory,
		Defaults: n.cfg.DefaultPrices(), Pace: n.cfg.P2P.Pace(), Machines: n.book.Len,
		// The executor comes later in start-up (startJobs, before any
		// service runs); until then nothing is offered anyway.
		Capable: func() error {
			if n.exec == nil {
				return errors.New("the node is starting")
			}
			return n.exec.Capable()
		},
		Logger: n.log.With("module", "lender"),
	})
	if err != nil {
		return err
	}
	mc := n.cfg.Market
	n.holds = lender.NewHolds(n.lender.Lent, lender.HoldLimits{PerBidder: mc.HoldsPerBidder, PerScheduler: mc.HoldsPerScheduler,
		LaunchWithin: mc.LaunchWithin.Duration}, n.lender.Refresh)
	n.desk = lender.NewDesk(n.admission, n.holds)
	return nil
}

// newExecutor makes the executor of the workers this machine runs, in
// work area dir.
func (n *Node) newExecutor(dir string) (*lender.Executor, error) {
	if err := sandbox.SetCgroupParent(n.cfg.Executor.CgroupParent); err != nil {
		return nil, fmt.Errorf("[executor] cgroup_parent: %w", err)
	}
	return lender.NewExecutor(lender.ExecutorParams{
		Dir: dir, Python: n.cfg.Inventory.Python, Home: n.home.Dir, UIDRange: n.cfg.Executor.UIDRange,
		KeepLogs: n.cfg.Executor.KeepLogs.Duration, CPUs: n.cfg.Executor.CPUs, ShareCPUs: n.cfg.Executor.ShareCPUs, ChainID: n.cfg.Node.ChainID,
		Host: n.host, Account: n.key.Address(), Store: n.store, Blocks: n.blocks, Ledger: n.ledger, Committed: n.ledgerApp.Committed,
		Holds: n.holds, GPUs: n.lender, Dialer: dialer{n}, Registerer: n.reg, Logger: n.log,
	})
}

// dialer lets the executor reach a run's other machines: at the addresses
// the launch named and those their offers announce.
type dialer struct{ n *Node }

func (d dialer) LearnMachine(machine peer.ID, known []string) {
	d.n.learnAddrs(machine, append(known, d.n.machineAddrs(machine.String())...))
}

var _ lender.Dialer = dialer{}

// measureLinks probes the machines in the offer book every [p2p]
// probe_interval while this machine lends, and re-announces its offer
// with what it measured.
func (n *Node) measureLinks(ctx context.Context) error {
	every := n.cfg.P2P.ProbeInterval.Duration
	if every == 0 {
		return nil
	}
	t := time.NewTimer(min(every, 30*time.Second)) // the book fills first
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if n.lender.State(time.Now()).Lending {
			if n.links.Measure(ctx, n.linkTargets()) > 0 {
				n.lender.Refresh()
			}
		}
		t.Reset(every)
	}
}

// linkTargets are up to p2p.MaxLinks machines of the offer book, other
// than this one, in random order: over rounds, a machine measures its
// links to all the machines it may share a job with.
func (n *Node) linkTargets() []peer.ID {
	var out []peer.ID
	for _, h := range n.book.List(time.Now()) {
		if id, err := peer.Decode(h.Offer.Machine); err == nil && id != n.host.ID() {
			out = append(out, id)
		}
	}
	rand.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out[:min(len(out), p2p.MaxLinks)]
}

// ownerWatch puts the machine's owner first: [owner] in config.toml, the
// threshold lend's settings give over it.
func (n *Node) ownerWatch() *lender.OwnerWatch {
	return &lender.OwnerWatch{
		Policy:    func() lender.OwnerPolicy { return n.cfg.Owner.Policy(n.lender.SuspendAbove()) },
		Jobs:      n.exec,
		Offering:  n.lender.OwnerOffering,
		Logger:    n.log.With("module", "owner"),
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
