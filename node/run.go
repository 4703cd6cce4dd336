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
	"syscall"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"golang.org/x/sync/errgroup"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/inventory"
	"github.com/deepmarket/deepmarket/node/lender"
	"github.com/deepmarket/deepmarket/node/market"
	"github.com/deepmarket/deepmarket/node/submitter"
	"github.com/deepmarket/deepmarket/node/web"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/storage"
)

// Run starts every service and blocks until ctx ends or one fails; then it
// stops them all, withdrawing this machine's offer, and returns.
func (n *Node) Run(ctx context.Context) (err error) {
	n.started = time.Now()
	var undo cleanups // run in reverse when Run returns
	defer undo.run()
	// The API port first: a port in use should fail before anything heavy.
	ln, err := n.listenAPI()
	if err != nil {
		return err
	}
	undo.add(func() { ln.Close() })
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
	disc, err := n.newDiscovery()
	if err != nil {
		return err
	}
	n.blocks.Attach(n.host, disc.ContentRouting())
	if n.prices, err = market.NewPriceHistory(market.PriceHistoryParams{Store: n.store, Sample: n.market.Sample, Logger: n.log.With("module", "prices")}); err != nil {
		return err
	}
	server, err := n.newAPIServer()
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
func (n *Node) listenAPI() (net.Listener, error) {
	ln, err := net.Listen("tcp", n.cfg.API.Listen)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("API address %s is in use (is another node running? set [api] listen in %s or pass --api)", n.cfg.API.Listen, n.home.ConfigPath())
		}
		return nil, fmt.Errorf("API listen %s: %w", n.cfg.API.Listen, err)
	}
	n.apiURL = "http://" + ln.Addr().String()
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
	nat, err := n.natParams()
	if err != nil {
		return err
	}
	n.host, err = p2p.NewHost(p2p.HostParams{
		Key: n.key, Listen: n.cfg.P2P.Listen, Version: Version, Site: n.cfg.Node.Site, Moniker: n.cfg.Node.Moniker,
		ConnLow: n.cfg.P2P.ConnLow, ConnHigh: n.cfg.P2P.ConnHigh, Registerer: n.reg, NAT: nat,
	})
	if err != nil {
		if strings.Contains(err.Error(), "address already in use") {
			return fmt.Errorf("p2p listen %v: address already in use (set [p2p] listen in %s or pass --listen)", n.cfg.P2P.Listen, n.home.ConfigPath())
		}
		return err
	}
	undo.add(func() { n.host.Close() })
	n.blocks, err = storage.Open(n.home.BlocksDir(), storage.Options{
		Logger: n.log.With("module", "storage"), Metrics: storage.NewMetrics(n.reg),
	})
	if err != nil {
		if errors.Is(err, storage.ErrLocked) {
			return fmt.Errorf("%w: is another `deepmarket node run` using this home?", err)
		}
		return err
	}
	undo.add(func() { n.blocks.Close() })
	if err := n.startLedger(); err != nil {
		return err
	}
	undo.add(n.stopLedger)
	return nil
}

// natParams is how the host crosses NATs, from [p2p]: the relays are the
// configured ones or else the bootstrap peers, and the relay serves the
// machines this node's ledger replica backs (none until it has started).
func (n *Node) natParams() (p2p.NATParams, error) {
	public, err := n.cfg.P2P.testnetPublic()
	if err != nil {
		return p2p.NATParams{}, err
	}
	if len(public) > 0 {
		if err := p2p.TreatAsPublic(public); err != nil {
			return p2p.NATParams{}, err
		}
		n.log.Warn("testnet: treating private ranges as public addresses ([p2p] testnet_public)", "ranges", n.cfg.P2P.TestnetPublic)
	}
	relays := n.cfg.P2P.Relays
	if len(relays) == 0 {
		relays = n.cfg.P2P.Bootstrap
	}
	infos, err := p2p.AddrInfos(relays) // validated with the config
	if err != nil {
		return p2p.NATParams{}, err
	}
	infos = slices.DeleteFunc(infos, func(ai peer.AddrInfo) bool { return ai.ID == n.key.PeerID() })
	return p2p.NATParams{
		Off: !n.cfg.P2P.NATTraversal, Relays: infos, RelayService: n.cfg.P2P.RelayService,
		Member: func(p peer.ID) bool {
			reads := n.machines.Load()
			if reads == nil {
				return false
			}
			key, err := p.ExtractPublicKey()
			if err != nil {
				return false
			}
			raw, err := key.Raw()
			if err != nil {
				return false
			}
			_, ok := (*reads).MachineOwner(identity.AddressOf(raw))
			return ok
		},
	}, nil
}

// startMarket joins the gossip topics (the router lives until psCtx ends)
// and sets up the books, the lender, the holds and the request handlers.
func (n *Node) startMarket(psCtx context.Context) (err error) {
	n.peers = p2p.NewPeerWatcher(n.host, 0)
	n.admission = lender.NewAdmission(n.reads, n.cfg.Node.ChainID)
	n.gossip, err = p2p.NewGossip(psCtx, p2p.GossipParams{
		Host: n.host, Key: n.key, ChainID: n.cfg.Node.ChainID,
		Logger:  slog.New(&levelHandler{min: ParseLevel(n.cfg.Log.Libp2pLevel), h: n.log.Handler()}),
		Metrics: p2p.NewMetrics(n.reg), ScoreInspect: n.peers.SetScores, ScoreInspectPeriod: 5 * time.Second,
		Admission: n.admission,
	})
	if err != nil {
		return err
	}
	n.book = market.NewOfferBook(n.cfg.Market.MaxOffers, n.cfg.Market.MaxOffersPerOwner)
	n.bids = market.NewBidLog(1000)
	n.market = n.newMarket()
	n.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "deepmarket", Name: "offers_held", Help: "Live offers this node holds from the market.",
	}, func() float64 { return float64(len(n.book.List(time.Now()))) }))
	n.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: "deepmarket", Name: "offers_refused_total", Help: "Offers of new machines refused because the offer book was full (max_offers, max_offers_per_owner).",
	}, func() float64 { return float64(n.book.Refused()) }))
	if err := n.startLending(); err != nil {
		return err
	}
	n.quotes = submitter.NewQuoteBook()
	n.quoter = n.newQuoter()
	n.rpc = &p2p.RPC{Host: n.host, Key: n.key, ChainID: n.cfg.Node.ChainID, Logger: n.log.With("module", "rpc")}
	n.rpc.Handle(p2p.ReserveProtocol(n.cfg.Node.ChainID), n.desk.Handle)
	n.rpc.Handle(p2p.QuoteProtocol(n.cfg.Node.ChainID), n.quotes.Handle)
	n.serveBook()
	return nil
}

// startJobs makes the executor (this machine's workers) and the job
// manager (this node's own jobs, reloaded from the store).
func (n *Node) startJobs() (err error) {
	workDir := n.cfg.Executor.WorkDir
	if workDir == "" {
		workDir = filepath.Join("/var/tmp/deepmarket-jobs", n.host.ID().String()[len(n.host.ID().String())-12:])
	}
	if n.exec, err = n.newExecutor(workDir); err != nil {
		return err
	}
	n.rpc.Handle(p2p.JobProtocol(n.cfg.Node.ChainID), n.exec.Handle)
	n.jobs = n.newSubmitter()
	return n.jobs.Load()
}

func (n *Node) newDiscovery() (*p2p.Discovery, error) {
	bootstrap, _ := p2p.AddrInfos(n.cfg.P2P.Bootstrap) // validated with the config
	return p2p.NewDiscovery(p2p.DiscoveryParams{
		Host: n.host, ChainID: n.cfg.Node.ChainID, Bootstrap: bootstrap, MDNS: n.cfg.P2P.MDNS, DHT: n.cfg.P2P.DHT,
		Interval: n.cfg.P2P.DiscoverInterval.Duration,
		Logger:   n.log.With("module", "discovery"),
	})
}

func (n *Node) newAPIServer() (*api.Server, error) {
	return api.NewServer(api.Params{
		Token: n.token, Status: n, Lending: n, Market: n, Ledger: n, Data: n, Sched: n, Jobs: n.jobs,
		Dashboard: n, Validators: n, UI: web.FS(), UploadDir: filepath.Join(n.home.Dir, "data", "uploads"),
		// CometBFT registers its metrics process-wide; serve them beside ours.
		Gatherer: firstWins{n.reg, prometheus.DefaultGatherer},
		Logger:   n.log.With("module", "api"),
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
	g.Go(func() error { return disc.Run(gctx) })
	g.Go(func() error { return n.peers.Run(gctx) })
	g.Go(func() error {
		return n.gossip.Offers().Run(gctx, func(r *p2p.Received) {
			now := time.Now()
			n.book.Apply(r, now)
			n.mine.saw(string(n.key.Address()), r, now)
		})
	})
	g.Go(func() error {
		return n.gossip.Bids().Run(gctx, func(r *p2p.Received) {
			n.bids.Add(r, time.Now())
			n.onBid(r)
		})
	})
	g.Go(func() error { return n.syncBook(gctx) })
	g.Go(func() error { return n.lender.Run(gctx) })
	g.Go(func() error { return n.quoter.Run(gctx) })
	g.Go(func() error { return n.store.Run(gctx) })
	g.Go(func() error { return n.ledger.Run(gctx) })
	g.Go(func() error { return n.exec.Run(gctx) })
	g.Go(func() error { return n.ownerWatch().Run(gctx) })
	g.Go(func() error { return n.jobs.Run(gctx) })
	g.Go(func() error { return n.market.Run(gctx) })
	g.Go(func() error { return n.prices.Run(gctx) })
	g.Go(func() error { return n.blocks.Run(gctx) })
	g.Go(func() error { return server.Serve(gctx, ln) })
	g.Go(func() error { return n.probeInventory(gctx) })
	g.Go(func() error { return n.measureLinks(gctx) })
}

// probeInventory runs the full inventory (the Python and TensorFlow
// probe, seconds) after start-up, and re-announces what it found.
func (n *Node) probeInventory(ctx context.Context) error {
	full := inventory.Detect(ctx, n.home.Dir, n.cfg.Inventory.Python)
	if ctx.Err() != nil {
		return nil
	}
	n.inv.Store(&full)
	n.log.Info("inventory", "machine", full.String())
	n.lender.Refresh()
	return nil
}
