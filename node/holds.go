package node

import (
	"fmt"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/units"
)

// Holds is a lending machine's own book of what schedulers have reserved
// on it. The machine is the only authority over its capacity: schedulers
// with overlapping views ask it, and it grants a hold only if the hold
// fits beside the others, so it can never be over-committed whoever asks.
// A hold lapses after its TTL unless committed; a committed hold stays
// until released. Holds live in memory: a restarted machine has none.
type Holds struct {
	mu    sync.Mutex
	lent  func() p2p.Resources // what the machine lends now (zero when not offering)
	holds map[string]*hold
	// changed is told when the allocation changes, so the offer that
	// carries it is re-announced.
	changed func()
}

type hold struct {
	from      peer.ID
	bidder    peer.ID // may commit, release and launch too
	job       string
	res       p2p.Resources
	expires   time.Time // zero once committed
	committed bool
}

// NewHolds makes an empty book over the capacity lent reports.
func NewHolds(lent func() p2p.Resources, changed func()) *Holds {
	return &Holds{lent: lent, holds: map[string]*hold{}, changed: changed}
}

// dropExpired removes lapsed holds; h.mu must be held.
func (h *Holds) dropExpired(now time.Time) bool {
	dropped := false
	for id, x := range h.holds {
		if !x.committed && !now.Before(x.expires) {
			delete(h.holds, id)
			dropped = true
		}
	}
	return dropped
}

func (h *Holds) allocatedLocked() p2p.Resources {
	var a p2p.Resources
	for _, x := range h.holds {
		a.Cores += x.res.Cores
		a.MemBytes += x.res.MemBytes
		a.GPUs += x.res.GPUs
	}
	return a
}

// Allocated is what live holds take now.
func (h *Holds) Allocated(now time.Time) p2p.Resources {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.dropExpired(now)
	return h.allocatedLocked()
}

func free(lent, alloc p2p.Resources) p2p.Resources {
	sub := func(a, b uint64) uint64 {
		if b > a {
			return 0
		}
		return a - b
	}
	return p2p.Resources{
		Cores:    uint32(sub(uint64(lent.Cores), uint64(alloc.Cores))),
		MemBytes: sub(lent.MemBytes, alloc.MemBytes),
		GPUs:     uint32(sub(uint64(lent.GPUs), uint64(alloc.GPUs))),
	}
}

// Apply performs a scheduler's request and says what came of it.
func (h *Holds) Apply(from peer.ID, r *p2p.Reserve, now time.Time) p2p.ReserveReply {
	// The lender's lock is taken (by lent) before ours, never inside it:
	// the lender reads Allocated while holding its own.
	lent := h.lent()
	h.mu.Lock()
	changed := h.dropExpired(now)
	reply := h.applyLocked(from, r, lent, now)
	changed = changed || reply.OK
	reply.Free = free(lent, h.allocatedLocked())
	h.mu.Unlock()
	if changed && h.changed != nil {
		h.changed()
	}
	return reply
}

func (h *Holds) applyLocked(from peer.ID, r *p2p.Reserve, lent p2p.Resources, now time.Time) p2p.ReserveReply {
	x, exists := h.holds[r.ID]
	if exists && x.from != from && !(r.Op != p2p.OpReserve && x.bidder != "" && x.bidder == from) {
		return p2p.ReserveReply{Reason: "reservation " + r.ID + " belongs to another scheduler"}
	}
	switch r.Op {
	case p2p.OpReserve:
		if exists {
			return p2p.ReserveReply{OK: true, Expires: x.expires.UnixMilli()} // a retry
		}
		f := free(lent, h.allocatedLocked())
		if r.Res.Cores > f.Cores || r.Res.MemBytes > f.MemBytes || r.Res.GPUs > f.GPUs {
			why := fmt.Sprintf("only %d cores, %s memory and %d GPUs free here", f.Cores, units.FormatSize(f.MemBytes), f.GPUs)
			if lent == (p2p.Resources{}) {
				why = "this machine is not lending now"
			}
			return p2p.ReserveReply{Reason: why}
		}
		exp := now.Add(time.Duration(r.TTL) * time.Second)
		bidder, _ := peer.Decode(r.Bidder)
		h.holds[r.ID] = &hold{from: from, bidder: bidder, job: r.JobID, res: r.Res, expires: exp}
		return p2p.ReserveReply{OK: true, Expires: exp.UnixMilli()}
	case p2p.OpCommit:
		if !exists {
			return p2p.ReserveReply{Reason: "no such hold (it lapsed or was released): re-quote"}
		}
		x.committed, x.expires = true, time.Time{}
		return p2p.ReserveReply{OK: true}
	case p2p.OpRelease:
		if exists {
			delete(h.holds, r.ID)
		}
		return p2p.ReserveReply{OK: true}
	}
	return p2p.ReserveReply{Reason: "unknown operation " + r.Op}
}

// Committed reports the resources of hold id if it is committed for job
// and launcher may use it (its scheduler or its bidder).
func (h *Holds) Committed(id, job string, launcher peer.ID) (p2p.Resources, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	x, ok := h.holds[id]
	if !ok || !x.committed || x.job != job || (x.from != launcher && x.bidder != launcher) {
		return p2p.Resources{}, false
	}
	return x.res, true
}

// Release drops hold id (a job's worker ended for good).
func (h *Holds) Release(id string) {
	h.mu.Lock()
	_, ok := h.holds[id]
	delete(h.holds, id)
	h.mu.Unlock()
	if ok && h.changed != nil {
		h.changed()
	}
}
