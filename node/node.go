package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/inventory"
	"github.com/deepmarket/deepmarket/node/lender"
	"github.com/deepmarket/deepmarket/node/market"
	"github.com/deepmarket/deepmarket/node/quoter"
	"github.com/deepmarket/deepmarket/node/submitter"
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
	lender    *lender.Lender
	book      *market.OfferBook
	bids      *market.BidLog
	peers     *p2p.PeerWatcher
	apiURL    string
	inv       atomic.Pointer[inventory.Inventory]
	chain     *ledger.Chain
	ledgerApp *ledger.App
	ledger    *ledger.Client
	blocks    *storage.Store
	holds     *lender.Holds
	admission *lender.Admission
	desk      *lender.Desk
	links     *p2p.LinkMeter
	rpc       *p2p.RPC
	quotes    *submitter.QuoteBook
	quoter    *quoter.Quoter
	exec      *lender.Executor
	jobs      *submitter.Manager
	reads     lender.LedgerReads
	// machines is reads for the relay service's goroutines, which ask
	// before the ledger has started.
	machines atomic.Pointer[lenderReads]
	market   *market.Market
	prices   *market.PriceHistory
	mine     myMachines
	times    blockTimes
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
		NAT: p2p.NATOf(n.host),
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
	st.Checking = n.Inventory().Probing
	st.NAT = p2p.NATOf(n.host)
	st.Holds = n.holds.List(now)
	return st
}

// ReleaseHold implements api.Lending: the owner drops a hold that runs no
// worker.
func (n *Node) ReleaseHold(id string) error {
	err := n.holds.ReleaseByOwner(id)
	switch {
	case errors.Is(err, lender.ErrNoHold):
		return &api.Error{Status: http.StatusNotFound, Field: "hold", Message: err.Error()}
	case errors.Is(err, lender.ErrHoldRunning):
		return &api.Error{Status: http.StatusConflict, Field: "hold", Message: err.Error()}
	}
	return err
}

// SetLend implements api.Lending.
// A machine that cannot enforce a job's limits (memory, processes) does
// not lend: limits are enforced, not trusted.
func (n *Node) SetLend(ctx context.Context, req api.LendRequest) (api.LendState, error) {
	if err := n.exec.Capable(); err != nil {
		return api.LendState{}, &api.Error{Status: http.StatusConflict, Message: err.Error() +
			" (run the node as root on a machine with cgroups; see README, Running a training job)"}
	}
	if _, err := n.lender.Set(ctx, req); err != nil {
		var bad *lender.LendError
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
	n.exec.Reclaim(ReclaimGrace)
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
			Window: o.Window, Addrs: o.Addrs, Software: o.Software, Links: o.Links, Reach: o.Reach,
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
	n.quotes.Expect(req.Bid.JobID, time.Now().Add(ttl))
	if err := n.gossip.Bids().Publish(ctx, p2p.TypeBid, &req.Bid, ttl); err != nil {
		return api.SeenBid{}, err
	}
	now := time.Now().UTC()
	// Gossip does not hand a node its own messages: its bids join the log
	// here, so `bids` lists this node's jobs' too.
	bid := req.Bid
	n.bids.Add(&p2p.Received{Signer: n.host.ID(), Type: p2p.TypeBid, Expiry: now.Add(ttl), Payload: &bid}, now)
	return api.SeenBid{Bid: req.Bid, From: n.host.ID().String(), ReceivedAt: now, ExpiresAt: now.Add(ttl)}, nil
}

// Peers implements api.Market.
func (n *Node) Peers() []api.Peer {
	var out []api.Peer
	for _, p := range n.peers.Peers() {
		out = append(out, api.Peer{
			PeerID: p.ID.String(), Moniker: p.Moniker, Site: p.Site, Version: p.Version, DeepMarket: p.DeepMkt,
			LatencyMS: float64(p.Latency.Microseconds()) / 1000, Score: p.Score, Direction: p.Direction, Addrs: p.Addrs,
			Connection: map[bool]string{false: "direct", true: "relayed"}[p.Relayed],
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

// lenderReads is lender.LedgerReads, named for the atomic pointer.
type lenderReads = lender.LedgerReads
