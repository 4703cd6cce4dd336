package p2p

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ipfs/go-cid"
	dht "github.com/libp2p/go-libp2p-kad-dht"
	"github.com/libp2p/go-libp2p/core/event"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/discovery/mdns"
	drouting "github.com/libp2p/go-libp2p/p2p/discovery/routing"
	dutil "github.com/libp2p/go-libp2p/p2p/discovery/util"
)

// DHT modes accepted by DiscoveryParams.DHT.
const (
	DHTAuto   = "auto"   // on when bootstrap peers are configured, in auto mode
	DHTServer = "server" // always on, answering queries (well-connected machines)
	DHTClient = "client" // always on, only querying
	DHTOff    = "off"
)

// DiscoveryParams configures Discovery.
type DiscoveryParams struct {
	Host      host.Host
	ChainID   string
	Bootstrap []peer.AddrInfo
	MDNS      bool
	DHT       string
	Logger    *slog.Logger
	// Interval is how often the bootstrap peers not connected are
	// re-dialled, and the DHT is searched for more; zero means 30 s.
	Interval time.Duration
}

// Discovery finds peers of the same network: mDNS on the LAN, bootstrap
// peers, and a Kademlia DHT (with a DeepMarket protocol prefix, separate
// from the public IPFS DHT) on a WAN.
type Discovery struct {
	p   DiscoveryParams
	dht atomic.Pointer[dht.IpfsDHT] // set while Run runs the DHT
}

// NewDiscovery builds discovery; nothing runs until Run.
func NewDiscovery(p DiscoveryParams) (*Discovery, error) {
	switch p.DHT {
	case "", DHTAuto, DHTServer, DHTClient, DHTOff:
	default:
		return nil, fmt.Errorf("dht mode %q: want auto, server, client or off", p.DHT)
	}
	if p.Interval <= 0 {
		p.Interval = 30 * time.Second
	}
	if p.Logger == nil {
		p.Logger = slog.New(slog.DiscardHandler)
	}
	return &Discovery{p: p}, nil
}

// rendezvous is the namespace under which nodes of one network find each
// other, on mDNS and in the DHT.
func rendezvous(chainID string) string {
	sum := sha256.Sum256([]byte(chainID))
	return "deepmarket-" + hex.EncodeToString(sum[:6])
}

func (d *Discovery) dhtMode() (dht.ModeOpt, bool) {
	switch d.p.DHT {
	case DHTServer:
		return dht.ModeServer, true
	case DHTClient:
		return dht.ModeClient, true
	case DHTOff:
		return 0, false
	default:
		return dht.ModeAuto, len(d.p.Bootstrap) > 0
	}
}

// Run connects to bootstrap peers, starts mDNS and the DHT as configured,
// and keeps looking for peers until ctx ends.
func (d *Discovery) Run(ctx context.Context) error {
	log := d.p.Logger
	h := d.p.Host
	for _, ai := range d.p.Bootstrap {
		h.ConnManager().Protect(ai.ID, "bootstrap")
	}
	failed, err := h.EventBus().Subscribe(new(event.EvtPeerIdentificationFailed))
	if err != nil {
		return fmt.Errorf("watch identify: %w", err)
	}
	defer failed.Close()
	go d.reconnectUnidentified(ctx, failed.Out())
	d.dialBootstrap(ctx)

	lan := &mdnsNotifee{ctx: ctx, h: h, log: log}
	var svc mdns.Service
	startMDNS := func() {
		if svc != nil {
			svc.Close()
		}
		svc = mdns.NewMdnsService(h, rendezvous(d.p.ChainID), lan)
		if err := svc.Start(); err != nil {
			log.Warn("mDNS discovery unavailable", "err", err)
			svc = nil
		}
	}
	if d.p.MDNS {
		startMDNS()
		defer func() {
			if svc != nil {
				svc.Close()
			}
		}()
	}
	lastMDNS := time.Now()

	var rd *drouting.RoutingDiscovery
	if mode, on := d.dhtMode(); on {
		kdht, err := dht.New(h, dht.Mode(mode), dht.ProtocolPrefix("/deepmarket"),
			dht.BootstrapPeers(d.p.Bootstrap...))
		if err != nil {
			return fmt.Errorf("start DHT: %w", err)
		}
		defer kdht.Close()
		d.dht.Store(kdht)
		defer d.dht.Store(nil)
		if err := kdht.Bootstrap(ctx); err != nil {
			log.Warn("DHT bootstrap", "err", err)
		}
		rd = drouting.NewRoutingDiscovery(kdht)
		dutil.Advertise(ctx, rd, rendezvous(d.p.ChainID))
	}

	tick := time.NewTicker(d.p.Interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		d.dialBootstrap(ctx)
		// Until mDNS finds a LAN peer, it starts afresh every mdnsRestart:
		// its sockets are bound to the interfaces up when it started, and
		// a query lost while interfaces come and go (a network up late,
		// sandboxes' veth pairs) leaves the next to a back-off of minutes.
		if d.p.MDNS && !lan.found.Load() && time.Since(lastMDNS) >= mdnsRestart {
			startMDNS()
			lastMDNS = time.Now()
		}
		if rd != nil && len(h.Network().Peers()) < 16 {
			d.findPeers(ctx, rd)
		}
	}
}

// reconnectUnidentified closes a connection whose identify exchange
// failed and dials the peer again when it is a bootstrap peer. libp2p
// identifies a connection once, with a 5 s timeout, and never again: a
// peer too busy to answer in time (a validator while a hundred machines
// start) stays connected, but unknown to gossipsub, which talks only to
// peers identify showed to speak it. A machine connected to its
// validators alone would hear no offers, ever.
func (d *Discovery) reconnectUnidentified(ctx context.Context, events <-chan any) {
	bootstrap := map[peer.ID]peer.AddrInfo{}
	for _, ai := range d.p.Bootstrap {
		bootstrap[ai.ID] = ai
	}
	h := d.p.Host
	for {
		var e any
		var ok bool
		select {
		case <-ctx.Done():
			return
		case e, ok = <-events:
		}
		ev, is := e.(event.EvtPeerIdentificationFailed)
		if !ok || !is {
			return // Run has ended: the subscription is closed
		}
		p := ev.Peer
		if protos, err := h.Peerstore().GetProtocols(p); err == nil && len(protos) > 0 {
			continue // another connection identified it
		}
		d.p.Logger.Info("identify failed: reconnecting", "peer", p, "err", ev.Reason)
		h.Network().ClosePeer(p)
		if ai, ok := bootstrap[p]; ok {
			go redial(ctx, h, ai, d.p.Logger)
		}
	}
}

// reidentifyDelay is how long after a failed identify a bootstrap peer
// is dialled again: long enough not to hammer a busy peer.
var reidentifyDelay = 2 * time.Second

// dialBootstrap dials the bootstrap peers this node is not connected to.
func (d *Discovery) dialBootstrap(ctx context.Context) {
	var wg sync.WaitGroup
	for _, ai := range d.p.Bootstrap {
		if ai.ID == d.p.Host.ID() || d.p.Host.Network().Connectedness(ai.ID) == network.Connected {
			continue
		}
		wg.Add(1)
		go func(ai peer.AddrInfo) {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if err := d.p.Host.Connect(cctx, ai); err != nil {
				d.p.Logger.Warn("cannot reach bootstrap peer", "peer", ai.ID, "err", err)
			}
		}(ai)
	}
	wg.Wait()
}

func (d *Discovery) findPeers(ctx context.Context, rd *drouting.RoutingDiscovery) {
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	peers, err := rd.FindPeers(cctx, rendezvous(d.p.ChainID))
	if err != nil {
		return
	}
	for ai := range peers {
		if ai.ID == d.p.Host.ID() || len(ai.Addrs) == 0 ||
			d.p.Host.Network().Connectedness(ai.ID) == network.Connected {
			continue
		}
		if err := d.p.Host.Connect(cctx, ai); err == nil {
			d.p.Logger.Debug("connected to peer found in DHT", "peer", ai.ID)
		}
	}
}

// mdnsRestart is how often mDNS starts afresh until it finds a peer.
const mdnsRestart = 20 * time.Second

type mdnsNotifee struct {
	ctx   context.Context
	h     host.Host
	log   *slog.Logger
	found atomic.Bool // a LAN peer was found and connected to
}

// HandlePeerFound connects to a LAN peer of the same network.
func (n *mdnsNotifee) HandlePeerFound(ai peer.AddrInfo) {
	if ai.ID == n.h.ID() {
		return
	}
	if n.h.Network().Connectedness(ai.ID) == network.Connected {
		n.found.Store(true)
		return
	}
	ctx, cancel := context.WithTimeout(n.ctx, 10*time.Second)
	defer cancel()
	if err := n.h.Connect(ctx, ai); err != nil {
		n.log.Debug("cannot reach mDNS peer", "peer", ai.ID, "err", err)
		return
	}
	n.found.Store(true)
	n.log.Info("connected to LAN peer", "peer", ai.ID)
}

// ContentRouting finds providers of content and announces this node as
// one, through the DHT while Run has it up (with [p2p] dht = "off", or
// before it starts, it finds nothing and announces nothing: peers are
// then found among connected ones).
func (d *Discovery) ContentRouting() *ContentRouting { return &ContentRouting{d: d} }

// ContentRouting is Discovery's content router; see Discovery.ContentRouting.
type ContentRouting struct{ d *Discovery }

// FindProvidersAsync streams up to count providers of c.
func (r *ContentRouting) FindProvidersAsync(ctx context.Context, c cid.Cid, count int) <-chan peer.AddrInfo {
	if k := r.d.dht.Load(); k != nil {
		return k.FindProvidersAsync(ctx, c, count)
	}
	ch := make(chan peer.AddrInfo)
	close(ch)
	return ch
}

// Provide announces that this node has c.
func (r *ContentRouting) Provide(ctx context.Context, c cid.Cid, announce bool) error {
	if k := r.d.dht.Load(); k != nil {
		return k.Provide(ctx, c, announce)
	}
	return nil
}
