package service

import (
	"time"

	"github.com/libp2p/go-libp2p/core/host"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/inventory"
	"github.com/deepmarket/deepmarket/node/lender"
	"github.com/deepmarket/deepmarket/node/market"
	"github.com/deepmarket/deepmarket/p2p"
)

// About is what a node says of itself that its configuration fixes.
type About struct {
	ChainID   string
	LedgerRPC string
	Moniker   string
	Site      string
	Version   string
	API       string // the API's base URL
	Started   time.Time
}

// Status answers /status and /inventory.
type Status struct {
	About   About
	Host    host.Host
	Account identity.Address
	Chain   *ledger.Chain
	Lender  *lender.Lender
	Book    *market.OfferBook
	Machine func() inventory.Inventory // what the machine has, as last probed
}

// Status is the node at a glance.
func (s *Status) Status() api.Status {
	now := time.Now()
	lend := s.Lender.State(now)
	return api.Status{
		PeerID: s.Host.ID().String(), Addrs: p2p.FullAddrs(s.Host), Account: string(s.Account),
		ChainID: s.About.ChainID, Height: s.Chain.Height(), Peers: len(s.Host.Network().Peers()),
		LedgerNodeID: s.Chain.NodeID(), LedgerRPC: s.About.LedgerRPC,
		Lending: lend.Lending, Offering: lend.Offering, API: s.About.API,
		Moniker: s.About.Moniker, Site: s.About.Site, Version: s.About.Version,
		UptimeS: int64(now.Sub(s.About.Started).Seconds()), Offers: len(s.Book.List(now)),
		NAT: p2p.NATOf(s.Host),
	}
}

// Inventory is what the machine has (the TensorFlow probe fills it in
// shortly after start).
func (s *Status) Inventory() api.Inventory { return s.Machine() }

var _ api.StatusSource = (*Status)(nil)
