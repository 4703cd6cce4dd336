package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/inventory"
	"github.com/deepmarket/deepmarket/node/web"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/storage"
)

// Version is the DeepMarket release, set at build time with -ldflags.
var Version = "0.1.0-dev"

// Node is one DeepMarket daemon.
type Node struct {
	home    Home
	cfg     Config
	key     *identity.Key
	log     *slog.Logger
	reg     *prometheus.Registry
	token   string
	ready   chan struct{}
	started time.Time

	// Set while Run runs, before ready is closed.
	host      host.Host
	gossip    *p2p.Gossip
	store     *Store
	lender    *Lender
	book      *OfferBook
	bids      *BidLog
	peers     *p2p.PeerWatcher
	apiURL    string
	inv       atomic.Pointer[inventory.Inventory]
	chain     *ledger.Chain
	ledgerApp *ledger.App
	ledger    *ledger.Client
	blocks    *storage.Store
	holds     *Holds
	rpc       *p2p.RPC
	quotes    *QuoteBook
	bidQ      chan bidWork
	exec      *Executor
	jobs      *JobManager
	reads     ledgerReads
	failures  failures
	records   machineRecords
	prices    *PriceHistory
	mine      myMachines
	times     blockTimes
}

// New loads the key and token from home; it opens nothing.
func New(home Home, cfg Config, log *slog.Logger) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	key, err := home.LoadKey()
	if err != nil {
		return nil, err
	}
	token, err := home.LoadToken()
	if err != nil {
		return nil, err
	}
	return &Node{home: home, cfg: cfg, key: key, log: log, reg: prometheus.NewRegistry(), token: token, ready: make(chan struct{})}, nil
}

// Ready is closed once every service has started.
func (n *Node) Ready() <-chan struct{} { return n.ready }

// APIURL is the API's base URL (valid after Ready).
func (n *Node) APIURL() string { return n.apiURL }

// Host is the libp2p host (valid after Ready).
func (n *Node) Host() host.Host { return n.host }

// Key is the node's key.
func (n *Node) Key() *identity.Key { return n.key }

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
	if n.prices, err = NewPriceHistory(PriceHistoryParams{Store: n.store, Sample: n.samplePrices, Logger: n.log.With("module", "prices")}); err != nil {
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
	n.inv.Store(&quick)
	n.host, err = p2p.NewHost(p2p.HostParams{
		Key: n.key, Listen: n.cfg.P2P.Listen, Version: Version, Site: n.cfg.Node.Site, Moniker: n.cfg.Node.Moniker,
		ConnLow: n.cfg.P2P.ConnLow, ConnHigh: n.cfg.P2P.ConnHigh, Registerer: n.reg,
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

// startMarket joins the gossip topics (the router lives until psCtx ends)
// and sets up the books, the lender, the holds and the request handlers.
func (n *Node) startMarket(psCtx context.Context) (err error) {
	n.peers = p2p.NewPeerWatcher(n.host, 0)
	n.gossip, err = p2p.NewGossip(psCtx, p2p.GossipParams{
		Host: n.host, Key: n.key, ChainID: n.cfg.Node.ChainID,
		Logger:  slog.New(&levelHandler{min: ParseLevel(n.cfg.Log.Libp2pLevel), h: n.log.Handler()}),
		Metrics: p2p.NewMetrics(n.reg), ScoreInspect: n.peers.SetScores, ScoreInspectPeriod: 5 * time.Second,
		Admission: n,
	})
	if err != nil {
		return err
	}
	n.book = NewOfferBook(n.cfg.Market.MaxOffers, n.cfg.Market.MaxOffersPerOwner)
	n.bids = NewBidLog(1000)
	n.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "deepmarket", Name: "offers_held", Help: "Live offers this node holds from the market.",
	}, func() float64 { return float64(len(n.book.List(time.Now()))) }))
	n.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: "deepmarket", Name: "offers_refused_total", Help: "Offers of new machines refused because the offer book was full (max_offers, max_offers_per_owner).",
	}, func() float64 { return float64(n.book.Refused()) }))
	n.lender, err = NewLender(LenderParams{
		Store: n.store, Topic: n.gossip.Offers(), Offer: n.buildOffer, Inventory: n.Inventory,
		Defaults: n.cfg.DefaultPrices(), TTL: n.cfg.P2P.OfferTTL.Duration, Interval: n.cfg.P2P.AnnounceInterval.Duration,
		Logger: n.log.With("module", "lender"),
	})
	if err != nil {
		return err
	}
	mc := n.cfg.Market
	n.holds = NewHolds(n.lentNow, HoldLimits{PerBidder: mc.HoldsPerBidder, PerScheduler: mc.HoldsPerScheduler,
		LaunchWithin: mc.LaunchWithin.Duration}, n.lender.Refresh)
	n.quotes = newQuoteBook()
	n.bidQ = make(chan bidWork, bidQueue)
	n.rpc = &p2p.RPC{Host: n.host, Key: n.key, ChainID: n.cfg.Node.ChainID, Logger: n.log.With("module", "rpc")}
	n.rpc.Handle(p2p.ReserveProtocol(n.cfg.Node.ChainID), n.handleReserve)
	n.rpc.Handle(p2p.QuoteProtocol(n.cfg.Node.ChainID), n.handleQuote)
	return nil
}

// startJobs makes the executor (this machine's workers) and the job
// manager (this node's own jobs, reloaded from the store).
func (n *Node) startJobs() (err error) {
	workDir := n.cfg.Executor.WorkDir
	if workDir == "" {
		workDir = filepath.Join("/var/tmp/deepmarket-jobs", n.host.ID().String()[len(n.host.ID().String())-12:])
	}
	if n.exec, err = newExecutor(n, workDir, n.cfg.Inventory.Python); err != nil {
		return err
	}
	n.rpc.Handle(p2p.JobProtocol(n.cfg.Node.ChainID), n.exec.handle)
	n.jobs = newJobManager(n)
	return n.jobs.load()
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
		Gatherer: prometheus.Gatherers{n.reg, prometheus.DefaultGatherer},
		Logger:   n.log.With("module", "api"),
	})
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
	g.Go(func() error { return n.lender.Run(gctx) })
	for range answerBids {
		g.Go(func() error { return n.priceBids(gctx) })
	}
	g.Go(func() error { return n.store.Run(gctx) })
	g.Go(func() error { return n.ledger.Run(gctx) })
	g.Go(func() error { return n.exec.Run(gctx) })
	g.Go(func() error { return n.jobs.Run(gctx) })
	g.Go(func() error { return n.refreshRecords(gctx) })
	g.Go(func() error { return n.prices.Run(gctx) })
	g.Go(func() error { return n.blocks.Run(gctx) })
	g.Go(func() error { return server.Serve(gctx, ln) })
	g.Go(func() error { return n.probeInventory(gctx) })
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

// buildOffer turns lend settings into the offer this machine announces.
func (n *Node) buildOffer(s LendSettings, now time.Time) p2p.Offer {
	inv := n.Inventory()
	gpus := make([]p2p.GPU, 0, s.GPUs)
	for i := 0; i < s.GPUs && i < len(inv.GPUs); i++ {
		gpus = append(gpus, inv.GPUs[i])
	}
	addrs := p2p.FullAddrs(n.host)
	if len(addrs) > 32 {
		addrs = addrs[:32]
	}
	lent := p2p.Resources{Cores: uint32(s.Cores), MemBytes: s.MemBytes, GPUs: uint32(len(gpus))}
	alloc := n.holds.Allocated(now)
	alloc = p2p.Resources{Cores: min(alloc.Cores, lent.Cores), MemBytes: min(alloc.MemBytes, lent.MemBytes), GPUs: min(alloc.GPUs, lent.GPUs)}
	// The account the ledger pays for this machine: its owner's once linked.
	owner, _ := n.reads.MachineOwner(n.key.Address())
	return p2p.Offer{
		Machine: n.host.ID().String(), Owner: string(owner),
		Moniker: n.cfg.Node.Moniker, Site: n.cfg.Node.Site,
		Lent:      lent,
		Allocated: alloc,
		GPUs:      gpus,
		DiskBytes: inv.DiskFree,
		Price:     s.Price,
		Window:    s.Window,
		Addrs:     addrs,
		Software:  p2p.Software{OS: inv.OS, Arch: inv.Arch, Python: inv.Python, TensorFlow: inv.TensorFlow, Version: Version},
	}
}

// lentNow is what this machine lends at this moment: its lend settings
// while its offer is out, nothing otherwise.
func (n *Node) lentNow() p2p.Resources {
	st := n.lender.State(time.Now())
	if !st.Offering || st.Settings == nil {
		return p2p.Resources{}
	}
	return p2p.Resources{Cores: uint32(st.Settings.Cores), MemBytes: st.Settings.MemBytes, GPUs: uint32(st.Settings.GPUs)}
}

// Inventory returns what the machine has (the TensorFlow probe fills in
// shortly after start).
func (n *Node) Inventory() inventory.Inventory { return *n.inv.Load() }

// Status implements api.StatusSource.
func (n *Node) Status() api.Status {
	lend := n.lender.State(time.Now())
	return api.Status{
		PeerID: n.host.ID().String(), Addrs: p2p.FullAddrs(n.host), Account: string(n.key.Address()),
		ChainID: n.cfg.Node.ChainID, Height: n.chain.Height(), Peers: len(n.host.Network().Peers()),
		LedgerNodeID: n.chain.NodeID(), LedgerRPC: n.cfg.Ledger.RPCListen,
		Lending: lend.Lending, Offering: lend.Offering, API: n.apiURL,
		Moniker: n.cfg.Node.Moniker, Site: n.cfg.Node.Site, Version: Version,
		UptimeS: int64(time.Since(n.started).Seconds()), Offers: len(n.book.List(time.Now())),
	}
}

// Lend implements api.Lending: the settings, whether the ledger backs
// this machine (peers ignore its offers otherwise), and what is held on
// it.
func (n *Node) Lend() api.LendState {
	now := time.Now()
	st := n.lender.State(now)
	owner, ok := n.reads.MachineOwner(n.key.Address())
	st.Registered, st.Owner = ok, string(owner)
	if !ok && st.Lending {
		st.Warnings = append(st.Warnings, fmt.Sprintf("this machine (%s) is not registered on the ledger, so peers ignore its offers: "+
			"ask an issuer of your network to admit it (`deepmarket ledger admit %s` on their node), or link it to your member account "+
			"(`deepmarket ledger consent YOUR_ADDRESS` here, then `deepmarket ledger link TOKEN` on your node)", n.key.Address(), n.key.Address()))
	}
	if inv := n.Inventory(); st.Lending && inv.Python != "" && inv.TensorFlow == "" {
		st.Warnings = append(st.Warnings, fmt.Sprintf("the Python jobs run with here (%s, [inventory] python in %s) cannot import TensorFlow: "+
			"this machine is offered for generic jobs only; point [inventory] python at a virtualenv with tensorflow "+
			"(make deps makes one at /opt/deepmarket/venv) and restart the node", n.cfg.Inventory.Python, n.home.ConfigPath()))
	}
	st.Frameworks = []string{"generic"}
	if n.Inventory().TensorFlow != "" {
		st.Frameworks = append(st.Frameworks, "tensorflow")
	}
	st.Holds = n.holds.List(now)
	return st
}

// ReleaseHold implements api.Lending: the owner drops a hold that runs no
// worker.
func (n *Node) ReleaseHold(id string) error {
	err := n.holds.ReleaseByOwner(id)
	switch {
	case errors.Is(err, ErrNoHold):
		return &api.Error{Status: http.StatusNotFound, Field: "hold", Message: err.Error()}
	case errors.Is(err, ErrHoldRunning):
		return &api.Error{Status: http.StatusConflict, Field: "hold", Message: err.Error()}
	}
	return err
}

// SetLend implements api.Lending.
// A machine that cannot enforce a job's limits (memory, processes) does
// not lend: limits are enforced, not trusted.
func (n *Node) SetLend(ctx context.Context, req api.LendRequest) (api.LendState, error) {
	if err := n.exec.capable(); err != nil {
		return api.LendState{}, &api.Error{Status: http.StatusConflict, Message: err.Error() +
			" (run the node as root on a machine with cgroups; see README, Running a training job)"}
	}
	if _, err := n.lender.Set(ctx, req); err != nil {
		var bad *LendError
		if _, registered := n.reads.MachineOwner(n.key.Address()); registered || errors.As(err, &bad) {
			return api.LendState{}, err
		}
		// Saved; gossip refuses the offer of a machine the ledger does
		// not back, which the state's warning explains.
	}
	return n.Lend(), nil
}

// StopLend implements api.Lending.
// Running workers get ReclaimGrace to finish or checkpoint, then stop;
// their submitters re-place them.
func (n *Node) StopLend(ctx context.Context) error {
	if err := n.lender.Stop(ctx); err != nil {
		return err
	}
	n.exec.reclaim(ReclaimGrace)
	return nil
}

// ReclaimGrace is how long running jobs keep a machine its owner takes
// back (lend --stop).
var ReclaimGrace = time.Minute

// Offers implements api.Market.
func (n *Node) Offers() []api.Offer {
	held := n.book.List(time.Now())
	out := make([]api.Offer, 0, len(held))
	for _, h := range held {
		o := h.Offer
		a := api.Offer{
			Machine: o.Machine, Owner: o.Owner, Moniker: o.Moniker, Site: o.Site,
			Cores: o.Lent.Cores, MemBytes: o.Lent.MemBytes, GPUs: o.Lent.GPUs, GPUModels: o.GPUs,
			DiskBytes: o.DiskBytes, Allocated: o.Allocated, Price: o.Price.PerHour(o.Lent), Prices: o.Price,
			Window: o.Window, Addrs: o.Addrs, Software: o.Software,
			ExpiresAt: h.Expires.UTC(), ReceivedAt: h.Received.UTC(), Self: o.Machine == n.host.ID().String(),
		}
		if o.AvailableUntil > 0 {
			t := time.Unix(o.AvailableUntil, 0).UTC()
			a.AvailableUntil = &t
		}
		out = append(out, a)
	}
	return out
}

// Bids implements api.Market.
func (n *Node) Bids() []api.SeenBid {
	seen := n.bids.List(time.Now())
	out := make([]api.SeenBid, 0, len(seen))
	for _, b := range seen {
		out = append(out, api.SeenBid{Bid: b.Bid, From: b.From.String(), ReceivedAt: b.Received.UTC(), ExpiresAt: b.Expires.UTC()})
	}
	return out
}

// PublishBid implements api.Market: it gossips a bid signed by this node.
func (n *Node) PublishBid(ctx context.Context, req api.PublishBidRequest) (api.SeenBid, error) {
	ttl := 10 * time.Minute
	if req.TTL != "" {
		d, err := time.ParseDuration(req.TTL)
		if err != nil || d <= 0 || d > p2p.MaxTTL {
			return api.SeenBid{}, &api.Error{Status: 400, Field: "ttl", Message: fmt.Sprintf("ttl %q: want a duration up to %s", req.TTL, p2p.MaxTTL)}
		}
		ttl = d
	}
	if req.Bid.Submitter == "" {
		req.Bid.Submitter = string(n.key.Address())
	}
	if err := req.Bid.Validate(); err != nil {
		return api.SeenBid{}, &api.Error{Status: 422, Message: err.Error()}
	}
	n.quotes.expect(req.Bid.JobID, time.Now().Add(ttl))
	if err := n.gossip.Bids().Publish(ctx, p2p.TypeBid, &req.Bid, ttl); err != nil {
		return api.SeenBid{}, err
	}
	now := time.Now().UTC()
	return api.SeenBid{Bid: req.Bid, From: n.host.ID().String(), ReceivedAt: now, ExpiresAt: now.Add(ttl)}, nil
}

// Peers implements api.Market.
func (n *Node) Peers() []api.Peer {
	var out []api.Peer
	for _, p := range n.peers.Peers() {
		out = append(out, api.Peer{
			PeerID: p.ID.String(), Moniker: p.Moniker, Site: p.Site, Version: p.Version, DeepMarket: p.DeepMkt,
			LatencyMS: float64(p.Latency.Microseconds()) / 1000, Score: p.Score, Direction: p.Direction, Addrs: p.Addrs,
		})
	}
	return out
}

// PeerIDs lists connected peers (tests use it to wait for topologies).
func (n *Node) PeerIDs() []peer.ID { return n.host.Network().Peers() }

var (
	_ api.StatusSource = (*Node)(nil)
	_ api.Lending      = (*Node)(nil)
	_ api.Market       = (*Node)(nil)
)
