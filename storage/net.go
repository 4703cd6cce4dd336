package storage

import (
	"context"
	"time"

	"github.com/ipfs/boxo/bitswap"
	bsnet "github.com/ipfs/boxo/bitswap/network/bsnet"
	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
)

// Router finds providers of a CID and announces this node as one. The
// node passes its Kademlia DHT; nil means connected peers only (a LAN).
type Router interface {
	FindProvidersAsync(ctx context.Context, c cid.Cid, count int) <-chan peer.AddrInfo
	Provide(ctx context.Context, c cid.Cid, announce bool) error
}

// reprovideEvery re-announces pinned roots well within the DHT's 48 h
// record lifetime.
const reprovideEvery = 12 * time.Hour

// Attach starts bitswap on h, serving this store's blocks and fetching
// missing ones from h's peers (and from providers router finds). Protocol
// IDs are plain IPFS bitswap's, so kubo nodes interoperate. Close stops it.
func (s *Store) Attach(h host.Host, router Router) {
	var finder interface {
		FindProvidersAsync(context.Context, cid.Cid, int) <-chan peer.AddrInfo
	}
	if router != nil {
		finder = router
	}
	bs := bitswap.New(context.Background(), bsnet.NewFromIpfsHost(h), finder, s.bs,
		// With the default 1 MiB, a server keeps a single 1 MiB block
		// in flight to each peer and the link idles between blocks.
		bitswap.MaxOutstandingBytesPerPeer(32<<20),
		bitswap.EngineBlockstoreWorkerCount(16),
		bitswap.WithTargetMessageSize(3<<19),
		bitswap.ProviderSearchDelay(500*time.Millisecond),
	)
	s.exch.Store(&exchangeBox{bs})
	s.router = router
}

// Run announces pinned roots through the router (at start, after each
// pin, and every 12 hours) and maintains badger, until ctx ends.
func (s *Store) Run(ctx context.Context) error {
	maintain := time.NewTicker(time.Minute)
	defer maintain.Stop()
	reprovide := time.NewTimer(0)
	defer reprovide.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-maintain.C:
			if err := s.Maintain(); err != nil {
				s.opts.Logger.Warn("blockstore maintenance", "err", err)
			}
		case <-reprovide.C:
			s.provideAll(ctx)
			reprovide.Reset(reprovideEvery)
		case c := <-s.provideCh:
			s.provide(ctx, c)
		}
	}
}

func (s *Store) provideAll(ctx context.Context) {
	if s.router == nil {
		return
	}
	pins, err := s.Pins(ctx)
	if err != nil {
		s.opts.Logger.Warn("list pins to provide", "err", err)
		return
	}
	for _, p := range pins {
		if !p.Partial {
			s.provide(ctx, p.CID)
		}
	}
}

func (s *Store) provide(ctx context.Context, c cid.Cid) {
	if s.router == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := s.router.Provide(ctx, c, true); err != nil {
		s.opts.Logger.Debug("provide", "cid", c, "err", err)
	}
}

// announce queues c for providing without blocking the caller.
func (s *Store) announce(c cid.Cid) {
	select {
	case s.provideCh <- c:
	default:
	}
}
