package p2p

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/protocol/ping"
)

// PeerInfo is what `peers` shows of one connected peer.
type PeerInfo struct {
	ID        peer.ID
	Addrs     []string
	Version   string
	Site      string
	Moniker   string
	DeepMkt   bool          // the peer is a DeepMarket node
	Latency   time.Duration // zero when not yet measured
	Score     float64       // gossipsub score
	Direction string        // inbound or outbound
	Relayed   bool          // the only connections go through a relay
	Punch     string        // while Relayed: why not direct (PunchWith)
}

// PeerWatcher measures connected peers' latency and keeps their gossip
// scores, so listing peers is instant.
type PeerWatcher struct {
	h        host.Host
	interval time.Duration

	mu     sync.Mutex
	scores map[peer.ID]float64
}

// NewPeerWatcher builds a watcher that pings peers every interval (zero:
// 30 s, light enough to be invisible on a lab machine).
func NewPeerWatcher(h host.Host, interval time.Duration) *PeerWatcher {
	if interval <= 0 {
		interval = 30 * time.Second
	}
	return &PeerWatcher{h: h, interval: interval, scores: map[peer.ID]float64{}}
}

// SetScores records gossip scores; pass it to GossipParams.ScoreInspect.
func (w *PeerWatcher) SetScores(s map[peer.ID]float64) {
	w.mu.Lock()
	w.scores = s
	w.mu.Unlock()
}

// Run pings every connected peer each interval until ctx ends; libp2p's
// ping records the round trip in the peerstore.
func (w *PeerWatcher) Run(ctx context.Context) error {
	tick := time.NewTicker(w.interval)
	defer tick.Stop()
	for {
		w.pingAll(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

func (w *PeerWatcher) pingAll(ctx context.Context) {
	var wg sync.WaitGroup
	for _, p := range w.h.Network().Peers() {
		wg.Add(1)
		go func(p peer.ID) {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			select {
			case <-ping.Ping(cctx, w.h, p):
			case <-cctx.Done():
			}
		}(p)
	}
	wg.Wait()
}

// Peers lists connected peers, sorted by ID.
func (w *PeerWatcher) Peers() []PeerInfo {
	w.mu.Lock()
	scores := w.scores
	w.mu.Unlock()
	ps := w.h.Peerstore()
	var out []PeerInfo
	for _, p := range w.h.Network().Peers() {
		info := PeerInfo{ID: p, Latency: ps.LatencyEWMA(p), Score: scores[p]}
		if v, err := ps.Get(p, "AgentVersion"); err == nil {
			if agent, ok := v.(string); ok {
				info.Version, info.Site, info.Moniker, info.DeepMkt = ParseUserAgent(agent)
			}
		}
		info.Relayed = true
		for _, c := range w.h.Network().ConnsToPeer(p) {
			info.Addrs = append(info.Addrs, c.RemoteMultiaddr().String())
			info.Direction = c.Stat().Direction.String()
			info.Relayed = info.Relayed && Relayed(c)
		}
		if info.Relayed {
			info.Punch = PunchWith(w.h, p)
		}
		out = append(out, info)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}
