package node

// The node's wiring of the market (node/market): the gossip topics, the
// offer book and the scheduler's view over it, and the book served to and
// copied from peers.

import (
	"context"
	"log/slog"
	"time"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/lender"
	"github.com/deepmarket/deepmarket/node/market"
	"github.com/deepmarket/deepmarket/node/submitter"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"
)

// newMarket builds the scheduler's view over the offer book, limited to
// the [scheduler] subset.
func newMarket(c Config, book *market.OfferBook, peers *p2p.PeerWatcher, lc *ledger.Client, self peer.ID) *market.Market {
	return market.New(market.Params{
		Book: book, Peers: peers, Records: machineRecords{lc},
		Self: self.String(), Site: c.Node.Site,
		Subset: c.Scheduler.Subset, Machines: c.Scheduler.Machines, Nearest: c.Scheduler.Nearest,
	})
}

// machineRecords reads a machine's record from the ledger, which keeps it
// under the account the machine is paid at.
type machineRecords struct{ ledger *ledger.Client }

// MachineRecord implements market.Records.
func (r machineRecords) MachineRecord(ctx context.Context, machine string) (ledger.MachineRecord, error) {
	return r.ledger.MachineRecord(ctx, submitter.PayeeOf(machine))
}

// newGossip joins the offers and bids topics; the router lives until
// psCtx ends. Strangers are turned away by admission, before their
// signature is checked.
func newGossip(psCtx context.Context, c Config, h host.Host, key *identity.Key, peers *p2p.PeerWatcher, admission *lender.Admission,
	reg prometheus.Registerer, log *slog.Logger) (*p2p.Gossip, error) {
	return p2p.NewGossip(psCtx, p2p.GossipParams{
		Host: h, Key: key, ChainID: c.Node.ChainID,
		Logger:  slog.New(&levelHandler{min: ParseLevel(c.Log.Libp2pLevel), h: log.Handler()}),
		Metrics: p2p.NewMetrics(reg), ScoreInspect: peers.SetScores, ScoreInspectPeriod: 5 * time.Second,
		Admission: admission,
	})
}

// registerBookMetrics exports the offer book's size and refusals.
func registerBookMetrics(reg prometheus.Registerer, book *market.OfferBook) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "deepmarket", Name: "offers_held", Help: "Live offers this node holds from the market.",
	}, func() float64 { return float64(len(book.List(time.Now()))) }))
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: "deepmarket", Name: "offers_unanswered_total", Help: "Offers of new machines dropped because the machine did not answer this node's check.",
	}, func() float64 { return float64(book.Unanswered()) }))
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: "deepmarket", Name: "offers_refused_total", Help: "Offers of new machines refused because the offer book was full (max_offers, max_offers_per_owner).",
	}, func() float64 { return float64(book.Refused()) }))
}

// bookPagesPerMinute is what one member (with its machines) may fetch of
// this node's offer book: a book of 20,000 offers is about 300 pages.
const bookPagesPerMinute = 600

// serveBook answers peers' book requests (p2p.BookServer).
func serveBook(rpc *p2p.RPC, book *market.OfferBook, admission *lender.Admission) {
	srv := &p2p.BookServer{Entries: book.Entries, PagesPerMinute: bookPagesPerMinute, Admission: admission}
	srv.Serve(rpc)
}

// newBookSync builds the copying of peers' offer books into this node's
// as it starts, and again each time its gossip reconnects a peer.
func newBookSync(c Config, book *market.OfferBook, rpc *p2p.RPC, gossip *p2p.Gossip, log *slog.Logger) *market.BookSync {
	return market.NewBookSync(market.BookSyncParams{Book: book, Books: p2p.BookClient{RPC: rpc},
		Checker: gossip, MaxOffers: c.Market.MaxOffers, Again: gossip.Rejoined(), Logger: log.With("module", "market")})
}

// vetMachines is the offer book's check of a new machine (market.Vet):
// this host connects to it, at the addresses its offer gives (at most 8)
// and any it knows already; the connection's handshake proves the
// machine's key. This node's own machine passes.
func vetMachines(h host.Host) market.Vet {
	return func(ctx context.Context, machine peer.ID, addrs []string) error {
		if machine == h.ID() || h.Network().Connectedness(machine) == network.Connected {
			return nil // this machine, or one connected already: its key is proven
		}
		info := peer.AddrInfo{ID: machine}
		for _, a := range addrs[:min(len(addrs), 8)] {
			if ai, err := peer.AddrInfoFromString(a); err == nil && ai.ID == machine {
				info.Addrs = append(info.Addrs, ai.Addrs...)
			}
		}
		return h.Connect(ctx, info)
	}
}

// onConnect gives a machine that connects to this host another chance at
// its check: a failed check no longer keeps its offers out of the book (a
// machine this node could not reach while one of them restarted, or
// before a NAT's hole was punched, is reachable now). Its unreachable
// mark, if its hold requests failed, stays: a machine that fails them and
// reconnects must not have every quote try it again.
func onConnect(h host.Host, book *market.OfferBook) {
	h.Network().Notify(&network.NotifyBundle{ConnectedF: func(_ network.Network, c network.Conn) {
		book.Connected(c.RemotePeer())
	}})
}

// registerStrangerMetrics exports the strangers' connections the host
// refused (p2p/gate.go): at accept, before a handshake, and after the
// handshake that took their address over its budget.
func registerStrangerMetrics(reg prometheus.Registerer, h *p2p.Host) {
	if reg == nil {
		return
	}
	for _, at := range []string{"accept", "handshake"} {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "deepmarket", Name: "strangers_refused_total", ConstLabels: prometheus.Labels{"at": at},
			Help: "Inbound connections of peers the ledger does not back refused because their address went over its budget.",
		}, func() float64 {
			accept, handshake := h.StrangersRefused()
			if at == "accept" {
				return float64(accept)
			}
			return float64(handshake)
		}))
	}
}
