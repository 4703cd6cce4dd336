package p2p

import (
	"context"
	"log/slog"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
)

// A peer that speaks gossipsub but that the router has not counted on the
// offers topic for deafAfter is reconnected; the check runs every
// deafCheck.
var (
	deafAfter = 20 * time.Second
	deafCheck = 5 * time.Second
)

// gossipProtocols are the gossipsub versions a DeepMarket node speaks.
var gossipProtocols = []protocol.ID{pubsub.GossipSubID_v13, pubsub.GossipSubID_v12, pubsub.GossipSubID_v11, pubsub.GossipSubID_v10}

// watchDeaf closes the connections of peers that speak gossipsub but
// stay off the offers topic: every member subscribes to it, so such a
// peer is one the router gave up on. gossipsub opens its stream to a
// peer once, when identify says the peer speaks it; if that open fails
// (a peer too busy to answer, as a validator is while a hundred machines
// start) the router drops the peer and never tries again while the
// connection stays up. A machine whose only connections are such peers
// hears no offer and no bid. Closing the connection lets discovery dial
// again, and the router start afresh.
func (g *Gossip) watchDeaf(ctx context.Context, h host.Host, topic string, log *slog.Logger) {
	tick := time.NewTicker(deafCheck)
	defer tick.Stop()
	since := map[peer.ID]time.Time{} // when each deaf peer was first seen so
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		on := map[peer.ID]bool{}
		for _, p := range g.ps.ListPeers(topic) {
			on[p] = true
		}
		now, deaf := time.Now(), map[peer.ID]bool{}
		for _, p := range h.Network().Peers() {
			if on[p] {
				continue
			}
			if speaks, _ := h.Peerstore().SupportsProtocols(p, gossipProtocols...); len(speaks) == 0 {
				continue
			}
			deaf[p] = true
			first, ok := since[p]
			if !ok {
				since[p] = now
				continue
			}
			if now.Sub(first) >= deafAfter {
				log.Info("a peer that speaks gossipsub is off the offers topic: reconnecting", "peer", p, "for", now.Sub(first).Round(time.Second))
				h.Network().ClosePeer(p)
				delete(since, p)
				if h.ConnManager().IsProtected(p, "bootstrap") {
					go redial(ctx, h, p) // not at discovery's next round
				}
			}
		}
		for p := range since {
			if !deaf[p] {
				delete(since, p)
			}
		}
	}
}

// redial connects to p again, at the addresses the peerstore holds, after
// reidentifyDelay.
func redial(ctx context.Context, h host.Host, p peer.ID) {
	select {
	case <-ctx.Done():
		return
	case <-time.After(reidentifyDelay):
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	h.Connect(cctx, peer.AddrInfo{ID: p, Addrs: h.Peerstore().Addrs(p)})
}
