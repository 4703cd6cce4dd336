package node

import (
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/node/lender"
	"github.com/deepmarket/deepmarket/p2p"
)

// The node's wiring of the lender's room (package node/lender): what this
// machine lends, the holds on it, the desk that grants them, and the
// executor that runs the workers launched on them.

// startLending makes the lender (its settings and offer), the holds on
// this machine and the desk that answers hold requests.
func (n *Node) startLending() (err error) {
	src := lender.OfferSource{
		Host: n.host, Account: n.key.Address(), Moniker: n.cfg.Node.Moniker, Site: n.cfg.Node.Site, Version: Version,
		Inventory: n.Inventory, Owners: n.reads,
		Allocated: func(now time.Time) p2p.Resources { return n.holds.Allocated(now) },
	}
	n.lender, err = lender.NewLender(lender.LenderParams{
		Store: n.store, Topic: n.gossip.Offers(), Offer: src.Build, Inventory: n.Inventory,
		Defaults: n.cfg.DefaultPrices(), TTL: n.cfg.P2P.OfferTTL.Duration, Interval: n.cfg.P2P.AnnounceInterval.Duration,
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
	return lender.NewExecutor(lender.ExecutorParams{
		Dir: dir, Python: n.cfg.Inventory.Python, Home: n.home.Dir, UIDRange: n.cfg.Executor.UIDRange,
		KeepLogs: n.cfg.Executor.KeepLogs.Duration, CPUs: n.cfg.Executor.CPUs, ChainID: n.cfg.Node.ChainID,
		Host: n.host, Account: n.key.Address(), Store: n.store, Blocks: n.blocks, Ledger: n.ledger,
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
