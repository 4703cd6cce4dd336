package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"golang.org/x/sync/errgroup"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/inventory"
	"github.com/deepmarket/deepmarket/node/lender"
	"github.com/deepmarket/deepmarket/node/market"
	"github.com/deepmarket/deepmarket/node/quoter"
	"github.com/deepmarket/deepmarket/node/service"
	"github.com/deepmarket/deepmarket/node/submitter"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/storage"
)

// Run starts every service and blocks until ctx ends or one fails; then it
// stops them all, withdrawing this machine's offer, and returns. The parts
// start in the order written here, each new one made from those before it.
func (n *Node) Run(ctx context.Context) (err error) {
	n.started = time.Now()
	var undo cleanups // run in reverse when Run returns
	defer undo.run()
	// The API port first: a port in use should fail before anything heavy.
	ln, err := listenAPI(n.cfg.API.Listen, n.home.ConfigPath())
	if err != nil {
		return err
	}
	undo.add(func() { ln.Close() })
	n.apiURL = "http://" + ln.Addr().String()
	if err := n.openStores(ctx, &undo); err != nil {
		return err
	}
	// The gossip router outlives the other services by a moment, so the
	// lender can still withdraw this machine's offer while stopping.
	psCtx, psCancel := context.WithCancel(context.Background())
	undo.add(psCancel)
	if err := n.startMarket(psCtx); err != nil {
		return err
	}
	if err := n.startJobs(); err != nil {
		return err
	}
	disc, err := newDiscovery(n.cfg, n.host, n.log)
	if err != nil {
		return err
	}
	n.blocks.Attach(n.host, disc.ContentRouting())
	if n.prices, err = market.NewPriceHistory(market.PriceHistoryParams{Store: n.store, Sample: n.market.Sample, Logger: n.log.With("module", "prices")}); err != nil {
		return err
	}
	n.addServices()
	server, err := newAPIServer(n.token, n.svc, n.jobs, n.reg, filepath.Join(n.home.Dir, "data", "uploads"), n.log)
	if err != nil {
		return err
	}
	// Uploads left by a node that stopped mid-upload.
	os.RemoveAll(filepath.Join(n.home.Dir, "data", "uploads"))

	g, gctx := errgroup.WithContext(ctx)
	n.runServices(gctx, g, disc, server, ln)
	if err := writeFileAtomic(n.home.APIAddrPath(), []byte(n.apiURL+"\n"), 0o644); err != nil {
		n.log.Warn("cannot record API address", "err", err)
	}
	undo.add(func() { os.Remove(n.home.APIAddrPath()) })
	n.log.Info("node started", "peer_id", n.host.ID(), "account", n.key.Address(), "chain_id", n.cfg.Node.ChainID,
		"api", n.apiURL, "addrs", n.host.Addrs())
	close(n.ready)

	err = g.Wait()
	n.log.Info("node stopped")
	return err
}

// cleanups are what Run undoes when it returns, last first.
type cleanups []func()

func (c *cleanups) add(f func()) { *c = append(*c, f) }

func (c *cleanups) run() {
	for i := len(*c) - 1; i >= 0; i-- {
		(*c)[i]()
	}
}

// listenAPI binds the local API's address, and says what to change when
// it is taken.
func listenAPI(addr, configPath string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("API address %s is in use (is another node running? set [api] listen in %s or pass --api)", addr, configPath)
		}
		return nil, fmt.Errorf("API listen %s: %w", addr, err)
	}
	return ln, nil
}

// openStores opens what lives on disk or holds a port: the node store, the
// libp2p host, the blockstore and the ledger replica.
func (n *Node) openStores(ctx context.Context, undo *cleanups) (err error) {
	if n.store, err = OpenStore(n.home.StoreDir(), n.log.With("module", "store")); err != nil {
		return err
	}
	undo.add(func() { n.store.Close() })
	quick := inventory.Detect(ctx, n.home.Dir, "") // no python: the TF probe runs later, off the start-up path
	quick.Probing = true
	n.inv.Store(&quick)
	nat, err := natParams(n.cfg, n.key.PeerID(), registeredOn(&n.machines), n.log)
	if err != nil {
		return err
	}
	if n.host, err = newHost(n.cfg, n.key, n.reg, nat, n.home.ConfigPath(), n.log); err != nil {
		return err
	}
	undo.add(func() { n.host.Close() })
	if n.blocks, err = openBlocks(n.home, n.reg, n.log); err != nil {
		return err
	}
	undo.add(func() { n.blocks.Close() })
	lp, err := startLedger(n.home, n.cfg, n.key, n.store, n.log)
	if err != nil {
		return err
	}
	undo.add(func() { lp.stop(n.log) })
	n.ledgerApp, n.chain, n.ledger, n.reads = lp.app, lp.chain, lp.client, lp.app
	var reads lenderReads = lp.app
	n.machines.Store(&reads)
	return nil
}

// newHost makes the libp2p host on [p2p] listen.
func newHost(c Config, key *identity.Key, reg prometheus.Registerer, nat p2p.NATParams, configPath string, log *slog.Logger) (host.Host, error) {
	h, err := p2p.NewHost(p2p.HostParams{
		Key: key, Listen: c.P2P.Listen, Version: Version, Site: c.Node.Site, Moniker: c.Node.Moniker,
		ConnLow: c.P2P.ConnLow, ConnHigh: c.P2P.ConnHigh, Registerer: reg, NAT: nat, Logger: log.With("module", "p2p"),
		Member: nat.Member, // strangers' inbound connections are limited per address
	})
	if err != nil && strings.Contains(err.Error(), "address already in use") {
		return nil, fmt.Errorf("p2p listen %v: address already in use (set [p2p] listen in %s or pass --listen)", c.P2P.Listen, configPath)
	}
	if ph, ok := h.(*p2p.Host); ok && err == nil {
		registerStrangerMetrics(reg, ph)
	}
	return h, err
}

// openBlocks opens the blockstore in home.
func openBlocks(home Home, reg prometheus.Registerer, log *slog.Logger) (*storage.Store, error) {
	blocks, err := storage.Open(home.BlocksDir(), storage.Options{
		Logger: log.With("module", "storage"), Metrics: storage.NewMetrics(reg),
	})
	if errors.Is(err, storage.ErrLocked) {
		return nil, fmt.Errorf("%w: is another `deepmarket node run` using this home?", err)
	}
	return blocks, err
}

// registeredOn says whether the ledger replica reads points at (none
// until it has started) backs machine p.
func registeredOn(reads *atomic.Pointer[lenderReads]) func(peer.ID) bool {
	return func(p peer.ID) bool {
		r := reads.Load()
		if r == nil {
			return false
		}
		a, err := identity.AddressOfPeer(p)
		if err != nil {
			return false
		}
		_, ok := (*r).MachineOwner(a)
		return ok
	}
}

// natParams is how the host crosses NATs, from [p2p]: the relays are the
// configured ones or else the bootstrap peers, and the relay serves the
// machines member says the ledger backs.
func natParams(c Config, self peer.ID, member func(peer.ID) bool, log *slog.Logger) (p2p.NATParams, error) {
	public, err := c.P2P.testnetPublic()
	if err != nil {
		return p2p.NATParams{}, err
	}
	if len(public) > 0 {
		if err := p2p.TreatAsPublic(public); err != nil {
			return p2p.NATParams{}, err
		}
		log.Warn("testnet: treating private ranges as public addresses ([p2p] testnet_public)", "ranges", c.P2P.TestnetPublic)
	}
	relays := c.P2P.Relays
	if len(relays) == 0 {
		relays = c.P2P.Bootstrap
	}
	infos, err := p2p.AddrInfos(relays) // validated with the config
	if err != nil {
		return p2p.NATParams{}, err
	}
	infos = slices.DeleteFunc(infos, func(ai peer.AddrInfo) bool { return ai.ID == self })
	return p2p.NATParams{Off: !c.P2P.NATTraversal, Relays: infos, RelayService: c.P2P.RelayService, Member: member}, nil
}

// startMarket joins the gossip topics (the router lives until psCtx ends)
// and sets up the books, the lender, the holds and the request handlers.
func (n *Node) startMarket(psCtx context.Context) (err error) {
	chainID := n.cfg.Node.ChainID
	n.peers = p2p.NewPeerWatcher(n.host, 0)
	n.admission = lender.NewAdmission(n.reads, chainID, n.cfg.Lend.Terms())
	if n.gossip, err = newGossip(psCtx, n.cfg, n.host, n.key, n.peers, n.admission, n.reg, n.log); err != nil {
		return err
	}
	n.book = market.NewOfferBook(n.cfg.Market.MaxOffers, n.cfg.Market.MaxOffersPerOwner)
	n.bids = market.NewBidLog(1000)
	n.market = newMarket(n.cfg, n.book, n.peers, n.ledger, n.host.ID())
	registerBookMetrics(n.reg, n.book)
	l, err := startLending(n.cfg, lendingDeps{
		host: n.host, key: n.key, store: n.store, offers: n.gossip.Offers(), book: n.book, admission: n.admission,
		owners: n.reads, inventory: n.Inventory, log: n.log, escrowOf: n.ledgerApp.EscrowOf,
		// The executor comes later in start-up (startJobs, before any
		// service runs); until then nothing is offered anyway.
		capable: func() error {
			if e := n.execReady.Load(); e != nil {
				return e.Capable()
			}
			return errors.New("the node is starting")
		},
		images: func(k int) []string {
			if e := n.execReady.Load(); e != nil {
				return e.Images(k)
			}
			return nil
		},
		disk: func() uint64 {
			if e := n.execReady.Load(); e != nil {
				return e.DiskFree()
			}
			return 0
		},
	})
	if err != nil {
		return err
	}
	n.lender, n.holds, n.commitments, n.desk, n.links = l.lender, l.holds, l.commitments, l.desk, l.links
	n.admission.SetPrices(func() (p2p.Prices, bool) {
		st := n.lender.State(time.Now())
		if !st.Offering || st.Settings == nil || st.Settings.Price == nil {
			return p2p.Prices{}, false
		}
		return *st.Settings.Price, true
	})
	n.quotes = submitter.NewQuoteBook()
	n.rpc = &p2p.RPC{Host: n.host, Key: n.key, ChainID: chainID, Logger: n.log.With("module", "rpc")}
	n.calls = &machineCalls{host: n.host, rpc: n.rpc, chainID: chainID, book: n.book, desk: n.desk, quotes: n.quotes}
	n.quoter = quoter.New(quoter.Params{Self: n.host.ID(), Market: n.market, Holds: quoter.ReserveFunc(n.calls.reserve),
		Quotes: quoter.SendFunc(n.calls.sendQuote), Logger: n.log.With("module", "quoter")})
	n.rpc.Handle(p2p.ReserveProtocol(chainID), n.desk.Handle)
	n.rpc.Handle(p2p.QuoteProtocol(chainID), n.quotes.Handle)
	serveBook(n.rpc, n.book, n.admission)
	return nil
}

// startJobs makes the executor (this machine's workers) and the job
// manager (this node's own jobs, reloaded from the store).
func (n *Node) startJobs() (err error) {
	n.exec, err = newExecutor(n.cfg, executorDeps{
		home: n.home, host: n.host, key: n.key, store: n.store, blocks: n.blocks, ledger: n.ledger,
		committed: n.ledgerApp.Committed, params: n.ledgerApp.Params(), lender: n.lender, holds: n.holds,
		dialer: n.calls, reg: n.reg, log: n.log,
	})
	if err != nil {
		return err
	}
	n.execReady.Store(n.exec)
	// A committed hold this machine's executor never launched is charged
	// to the run's escrow, through the executor's claim service.
	n.holds.SetCharges(lender.HoldCharges{ChainID: n.cfg.Node.ChainID, Payee: string(n.key.Address()),
		Keep: n.exec.KeepHoldCharge, Charged: n.exec.HasClaim})
	n.rpc.Handle(p2p.JobProtocol(n.cfg.Node.ChainID), n.exec.Handle)
	// The market's answers publish this node's bids, the submitter's too.
	n.svc.market = &service.Market{Host: n.host, Account: n.key.Address(), Book: n.book, BidLog: n.bids,
		Topic: n.gossip.Bids(), Quotes: n.quotes, Watch: n.peers}
	n.jobs = newSubmitter(n.cfg, submitterDeps{
		home: n.home, key: n.key, calls: n.calls, exec: n.exec, book: n.book, bids: n.svc.market, quotes: n.quotes,
		ledger: n.ledger, store: n.store, blocks: n.blocks, log: n.log,
	})
	return n.jobs.Load()
}

// newDiscovery finds peers: the bootstrap peers, mDNS and the DHT as
// [p2p] says.
func newDiscovery(c Config, h host.Host, log *slog.Logger) (*p2p.Discovery, error) {
	bootstrap, _ := p2p.AddrInfos(c.P2P.Bootstrap) // validated with the config
	return p2p.NewDiscovery(p2p.DiscoveryParams{
		Host: h, ChainID: c.Node.ChainID, Bootstrap: bootstrap, MDNS: c.P2P.MDNS, DHT: c.P2P.DHT,
		Interval: c.P2P.DiscoverInterval.Duration,
		Logger:   log.With("module", "discovery"),
	})
}

// firstWins gathers from each gatherer in turn and keeps the first family
// of each name. libp2p's AutoNAT builds inner hosts that register libp2p's
// package-wide collectors process-wide as well as in the node's registry;
// prometheus.Gatherers refuses such a duplicate, and serves nothing.
type firstWins []prometheus.Gatherer

func (g firstWins) Gather() ([]*dto.MetricFamily, error) {
	seen := map[string]bool{}
	var out []*dto.MetricFamily
	for _, x := range g {
		mfs, err := x.Gather()
		if err != nil {
			return nil, err
		}
		for _, mf := range mfs {
			if !seen[mf.GetName()] {
				seen[mf.GetName()] = true
				out = append(out, mf)
			}
		}
	}
	slices.SortFunc(out, func(a, b *dto.MetricFamily) int { return strings.Compare(a.GetName(), b.GetName()) })
	return out, nil
}

// runServices starts every long-running service in g; they stop when gctx
// ends (or one of them fails).
func (n *Node) runServices(gctx context.Context, g *errgroup.Group, disc *p2p.Discovery, server *api.Server, ln net.Listener) {
	self := string(n.key.Address())
	n.book.SetVet(gctx, vetMachines(n.host))
	onConnect(n.host, n.book)
	g.Go(func() error { return disc.Run(gctx) })
	g.Go(func() error { return n.peers.Run(gctx) })
	g.Go(func() error {
		return n.gossip.Offers().Run(gctx, func(r *p2p.Received) {
			now := time.Now()
			n.book.Apply(r, now)
			n.own.Saw(self, r, now)
		})
	})
	g.Go(func() error {
		return n.gossip.Bids().Run(gctx, func(r *p2p.Received) {
			n.bids.Add(r, time.Now())
			sawBid(n.commitments, n.holds, n.reads, r, time.Now(), n.log.With("module", "holds"))
			if n.cfg.Scheduler.Quote { // else this node answers no bids
				n.quoter.Queue(r)
			}
		})
	})
	g.Go(func() error { return newBookSync(n.cfg, n.book, n.rpc, n.gossip, n.log).Run(gctx) })
	g.Go(func() error { return n.lender.Run(gctx) })
	g.Go(func() error { return n.quoter.Run(gctx) })
	g.Go(func() error { return n.store.Run(gctx) })
	g.Go(func() error { return n.ledger.Run(gctx) })
	g.Go(func() error { return n.exec.Run(gctx) })
	g.Go(func() error { return newOwnerWatch(n.cfg, n.lender, n.exec, n.log).Run(gctx) })
	g.Go(func() error { return n.jobs.Run(gctx) })
	g.Go(func() error { return n.market.Run(gctx) })
	g.Go(func() error { return n.prices.Run(gctx) })
	g.Go(func() error { return n.blocks.Run(gctx) })
	g.Go(func() error { return server.Serve(gctx, ln) })
	g.Go(func() error { return probeInventory(gctx, n.home.Dir, n.cfg.Inventory.Python, &n.inv, n.lender, n.log) })
	g.Go(func() error { return newLinkMeter(n.cfg, n.book, n.links, n.lender, n.host.ID()).Run(gctx) })
}

// probeInventory runs the full inventory (the Python and TensorFlow
// probe, seconds) after start-up, and has the lender re-announce what it
// found. A probe cut short (a busy machine imports TensorFlow slowly) is
// run again, after 30 s, then after twice as long each time up to 10
// minutes: until then the offer says the software is being checked.
func probeInventory(ctx context.Context, home, python string, inv *atomic.Pointer[inventory.Inventory], l *lender.Lender, log *slog.Logger) error {
	for wait := 30 * time.Second; ; wait = min(2*wait, 10*time.Minute) {
		full := inventory.Detect(ctx, home, python)
		if ctx.Err() != nil {
			return nil
		}
		inv.Store(&full)
		if !full.Probing {
			log.Info("inventory", "machine", full.String())
			l.Refresh()
			return nil
		}
		log.Warn("the Python and TensorFlow probe did not finish in time (a busy machine?): trying again",
			"python", python, "timeout", inventory.PythonProbeTimeout, "retry", wait)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}
