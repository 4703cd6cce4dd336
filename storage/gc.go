package storage

import (
	"context"
	"fmt"

	"github.com/ipfs/boxo/ipld/merkledag"
	"github.com/ipfs/go-cid"
	ipld "github.com/ipfs/go-ipld-format"
)

// GCResult is what a collection removed.
type GCResult struct {
	Removed      int   `json:"removed_blocks"`
	RemovedBytes int64 `json:"removed_bytes"`
	Kept         int   `json:"kept_blocks"`
	// ReclaimedBytes is the disk space freed by rewriting packs.
	ReclaimedBytes int64 `json:"reclaimed_bytes"`
	// Incomplete lists pinned roots with blocks missing (dropped as
	// corrupt, say); a `data get` of each fetches them again.
	Incomplete []cid.Cid `json:"incomplete,omitempty"`
}

// GC removes every block not reachable from a pin (partial fetches count
// as pins, walked as far as their blocks are present), then reclaims the
// space in badger's value log. Adds and fetches wait while it runs.
func (s *Store) GC(ctx context.Context) (GCResult, error) {
	s.gc.Lock()
	defer s.gc.Unlock()
	pins, err := s.Pins(ctx)
	if err != nil {
		return GCResult{}, err
	}
	live := make(liveSet)
	dag := s.offlineDAG()
	var res GCResult
	for _, p := range pins {
		if err := s.mark(ctx, dag, p.CID, live); err != nil {
			if ctx.Err() != nil {
				return res, ctx.Err()
			}
			if !p.Partial {
				res.Incomplete = append(res.Incomplete, p.CID)
			}
		}
	}
	keys, err := s.bs.AllKeysChan(ctx)
	if err != nil {
		return res, err
	}
	for k := range keys {
		if live[string(k.Hash())] {
			res.Kept++
			continue
		}
		if n, err := s.packs.GetSize(ctx, k); err == nil {
			res.RemovedBytes += int64(n)
		}
		if err := s.bs.DeleteBlock(ctx, k); err != nil {
			return res, fmt.Errorf("gc: delete %s: %w", k, err)
		}
		res.Removed++
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	s.opts.Metrics.addGC(res.Removed)
	if err := s.ds.Sync(ctx, ipldRootKey); err != nil {
		return res, err
	}
	if res.ReclaimedBytes, err = s.packs.compact(ctx); err != nil {
		return res, fmt.Errorf("gc: rewrite packs: %w", err)
	}
	if err := s.ds.DB.Flatten(1); err != nil {
		return res, fmt.Errorf("gc: compact: %w", err)
	}
	for s.ds.DB.RunValueLogGC(0.1) == nil {
	}
	return res, nil
}

// liveSet holds multihashes: the blockstore keys blocks by multihash
// and lists them back as raw CIDs, whatever codec they were put with.
type liveSet map[string]bool

func (l liveSet) visit(c cid.Cid) bool {
	k := string(c.Hash())
	if l[k] {
		return false
	}
	l[k] = true
	return true
}

var ipldRootKey = pinPrefix.Parent()

// mark adds to live every block reachable from c that is on disk. Raw
// blocks have no links and are marked without being read. It returns an
// error if a block is missing.
func (s *Store) mark(ctx context.Context, dag ipld.DAGService, c cid.Cid, live liveSet) error {
	var missing error
	getLinks := func(ctx context.Context, c cid.Cid) ([]*ipld.Link, error) {
		if c.Type() == cid.Raw {
			if ok, _ := s.bs.Has(ctx, c); !ok && missing == nil {
				missing = ipld.ErrNotFound{Cid: c}
			}
			return nil, nil
		}
		nd, err := dag.Get(ctx, c)
		if err != nil {
			if missing == nil {
				missing = err
			}
			return nil, nil
		}
		return nd.Links(), nil
	}
	if err := merkledag.Walk(ctx, getLinks, c, live.visit); err != nil {
		return err
	}
	return missing
}
