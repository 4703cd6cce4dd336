package node

import (
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/ledger"
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
	// commitments are the bids seen on the market, counted against
	// their accounts' balances before this machine holds for one.
	commitments *lender.Commitments
	admission   *lender.Admission
	desk        *lender.Desk
	links       *p2p.LinkMeter
	rpc         *p2p.RPC
	calls       *machineCalls
	quotes      *submitter.QuoteBook
	quoter      *quoter.Quoter
	exec        *lender.Executor
	// execReady is exec for the lender's goroutines, which ask before
	// it is made (startLending runs first): nil until then.
	execReady atomic.Pointer[lender.Executor]
	jobs      *submitter.Manager
	reads     lender.LedgerReads
	// machines is reads for the relay service's goroutines, which ask
	// before the ledger has started.
	machines atomic.Pointer[lenderReads]
	market   *market.Market
	prices   *market.PriceHistory
	own      market.OwnMachines // the account's machines seen on the market
	svc      services           // what answers the API, built by Run
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

// PeerIDs lists connected peers (tests use it to wait for topologies).
func (n *Node) PeerIDs() []peer.ID { return n.host.Network().Peers() }

// lenderReads is lender.LedgerReads, named for the atomic pointer.
type lenderReads = lender.LedgerReads
