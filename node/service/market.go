package service

import (
	"context"
	"time"

	"github.com/libp2p/go-libp2p/core/host"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/fault"
	"github.com/deepmarket/deepmarket/node/market"
	"github.com/deepmarket/deepmarket/p2p"
)

// DefaultBidTTL is how long a bid published without a ttl lives.
const DefaultBidTTL = 10 * time.Minute

// QuoteExpecter is told of each bid this node publishes, so that the
// quotes for it are kept until the bid lapses.
type QuoteExpecter interface {
	Expect(job string, until time.Time)
}

// Market answers /offers, /bids and /peers, and publishes this node's
// bids.
type Market struct {
	Host    host.Host
	Account identity.Address
	Book    *market.OfferBook
	BidLog  *market.BidLog
	Topic   *p2p.Topic // the bids topic
	Quotes  QuoteExpecter
	Watch   *p2p.PeerWatcher
}

// Offers lists the live offers this node holds.
func (m *Market) Offers() []api.Offer {
	held := m.Book.List(time.Now())
	self := m.Host.ID().String()
	out := make([]api.Offer, 0, len(held))
	for _, h := range held {
		o := h.Offer
		a := api.Offer{
			Machine: o.Machine, Owner: o.Owner, Moniker: o.Moniker, Site: o.Site,
			Cores: o.Lent.Cores, MemBytes: o.Lent.MemBytes, GPUs: o.Lent.GPUs, GPUModels: o.GPUs,
			DiskBytes: o.DiskBytes, Allocated: o.Allocated, Price: o.Price.PerHour(o.Lent), Prices: o.Price,
			Window: o.Window, Addrs: o.Addrs, Software: o.Software, Links: o.Links, Reach: o.Reach, Images: o.Images,
			ExpiresAt: h.Expires.UTC(), ReceivedAt: h.Received.UTC(), Self: o.Machine == self,
		}
		if o.AvailableUntil > 0 {
			t := time.Unix(o.AvailableUntil, 0).UTC()
			a.AvailableUntil = &t
		}
		out = append(out, a)
	}
	return out
}

// Bids lists the live bids seen on the market, this node's own included.
func (m *Market) Bids() []api.SeenBid {
	seen := m.BidLog.List(time.Now())
	out := make([]api.SeenBid, 0, len(seen))
	for _, b := range seen {
		out = append(out, api.SeenBid{Bid: b.Bid, From: b.From.String(), ReceivedAt: b.Received.UTC(), ExpiresAt: b.Expires.UTC()})
	}
	return out
}

// PublishBid gossips a bid signed by this node; req.TTL is a duration
// ("2m"), DefaultBidTTL when empty.
func (m *Market) PublishBid(ctx context.Context, req api.PublishBidRequest) (api.SeenBid, error) {
	ttl := DefaultBidTTL
	if req.TTL != "" {
		d, err := time.ParseDuration(req.TTL)
		if err != nil || d <= 0 || d > p2p.MaxTTL {
			return api.SeenBid{}, fault.New(fault.Malformed, "ttl", "ttl %q: want a duration up to %s", req.TTL, p2p.MaxTTL)
		}
		ttl = d
	}
	return m.Publish(ctx, req.Bid, ttl)
}

// Publish gossips bid, signed by this node, to live for ttl. A bid
// without a submitter is this node's account's; one without a floor pays
// the default floor (p2p.DefaultFloor), as a submitted job does.
func (m *Market) Publish(ctx context.Context, bid p2p.Bid, ttl time.Duration) (api.SeenBid, error) {
	if bid.Submitter == "" {
		bid.Submitter = string(m.Account)
	}
	if bid.Floor == 0 {
		bid.Floor = p2p.DefaultFloor
	}
	if err := bid.Validate(); err != nil {
		return api.SeenBid{}, fault.Wrap(fault.Invalid, "", err)
	}
	m.Quotes.Expect(bid.JobID, time.Now().Add(ttl))
	if err := m.Topic.PublishBid(ctx, &bid, ttl); err != nil {
		return api.SeenBid{}, err
	}
	now := time.Now().UTC()
	// Gossip does not hand a node its own messages: its bids join the log
	// here, so `bids` lists this node's jobs' too.
	own := bid
	m.BidLog.Add(&p2p.Received{Signer: m.Host.ID(), Type: p2p.TypeBid, Expiry: now.Add(ttl), Bid: &own}, now)
	return api.SeenBid{Bid: bid, From: m.Host.ID().String(), ReceivedAt: now, ExpiresAt: now.Add(ttl)}, nil
}

// Peers lists the connected peers.
func (m *Market) Peers() []api.Peer {
	var out []api.Peer
	for _, p := range m.Watch.Peers() {
		out = append(out, api.Peer{
			PeerID: p.ID.String(), Moniker: p.Moniker, Site: p.Site, Version: p.Version, DeepMarket: p.DeepMkt,
			LatencyMS: float64(p.Latency.Microseconds()) / 1000, Score: p.Score, Direction: p.Direction, Addrs: p.Addrs,
			Connection: map[bool]string{false: "direct", true: "relayed"}[p.Relayed], Punch: p.Punch,
		})
	}
	return out
}

var _ api.Market = (*Market)(nil)
