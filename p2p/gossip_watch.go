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

// A peer that speaks gossipsub but that the router has had no stream to
// for deafAfter is reconnected; the check runs every deafCheck.
var (
	deafAfter = 20 * time.Second
	deafCheck = 5 * time.Second
)

// gossipProtocols are the gossipsub versions a DeepMarket node speaks.
var gossipProtocols = []protocol.ID{pubsub.GossipSubID_v13, pubsub.GossipSubID_v12, pubsub.GossipSubID_v11, pubsub.GossipSubID_v10}

// watchDeaf closes the connections of peers that speak gossipsub but
// that the router keeps no stream to (pubsub's peer list: ListPeers of
// no topic). gossipsub opens its stream to a peer when identify says the
// peer speaks it; if that open fails, again after a few back-offs (a
// peer too busy to answer, as a validator is while a hundred machines
// start), the router drops the peer and never tries again while the
// connection stays up. A machine whose only connections are such peers
// hears no offer and no bid. Closing the connection lets discovery dial
// again, and the router start afresh. A peer the router does talk to is
// left alone whatever it subscribes to.
func (g *Gossip) watchDeaf(ctx context.Context, h host.Host, log *slog.Logger) {
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
		for _, p := range g.ps.ListPeers("") {
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
				log.Info("gossipsub gave up on a peer that speaks it: reconnecting", "peer", p, "for", now.Sub(first).Round(time.Second))
				h.Network().ClosePeer(p)
				delete(since, p)
				select {
				case g.rejoined <- struct{}{}:
				default: // one already waits
				}
				if h.ConnManager().IsProtected(p, "bootstrap") { // not at discovery's next round
					go redial(ctx, h, peer.AddrInfo{ID: p, Addrs: h.Peerstore().Addrs(p)}, log)
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

// redial connects to bootstrap peer ai again after reidentifyDelay.
func redial(ctx context.Context, h host.Host, ai peer.AddrInfo, log *slog.Logger) {
	select {
	case <-ctx.Done():
		return
	case <-time.After(reidentifyDelay):
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := h.Connect(cctx, ai); err != nil {
		log.Warn("cannot reach bootstrap peer", "peer", ai.ID, "err", err)
	}
}
