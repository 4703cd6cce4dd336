package node

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/p2p"
)

const testJob = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func reserveReq(id string, cores uint32, ttl int64) *p2p.Reserve {
	return &p2p.Reserve{Op: p2p.OpReserve, ID: id, JobID: testJob, Res: p2p.Resources{Cores: cores, MemBytes: 1 << 20}, TTL: ttl}
}

func TestHoldsLifecycle(t *testing.T) {
	lent := p2p.Resources{Cores: 4, MemBytes: 1 << 30}
	changes := 0
	h := NewHolds(func() p2p.Resources { return lent }, func() { changes++ })
	now := time.Now()
	a, b := peer.ID("scheduler-a"), peer.ID("scheduler-b")

	if r := h.Apply(a, reserveReq("aaaaaaaaaaaaaaaa", 3, 60), now); !r.OK || r.Free.Cores != 1 {
		t.Fatalf("first hold: %+v", r)
	}
	if r := h.Apply(b, reserveReq("bbbbbbbbbbbbbbbb", 2, 60), now); r.OK || r.Free.Cores != 1 || r.Reason == "" {
		t.Fatalf("a hold past capacity: %+v", r)
	}
	if r := h.Apply(a, reserveReq("aaaaaaaaaaaaaaaa", 3, 60), now); !r.OK || r.Free.Cores != 1 {
		t.Fatalf("a retried hold must not count twice: %+v", r)
	}
	if r := h.Apply(b, &p2p.Reserve{Op: p2p.OpRelease, ID: "aaaaaaaaaaaaaaaa", JobID: testJob}, now); r.OK {
		t.Fatalf("another scheduler released a's hold: %+v", r)
	}
	if r := h.Apply(a, &p2p.Reserve{Op: p2p.OpCommit, ID: "aaaaaaaaaaaaaaaa", JobID: testJob}, now); !r.OK {
		t.Fatalf("commit: %+v", r)
	}
	// Uncommitted holds lapse; committed ones stay.
	if r := h.Apply(b, reserveReq("bbbbbbbbbbbbbbbb", 1, 1), now); !r.OK {
		t.Fatalf("b's hold: %+v", r)
	}
	if got := h.Allocated(now.Add(2 * time.Second)); got.Cores != 3 {
		t.Fatalf("after b's hold lapsed: %+v", got)
	}
	if r := h.Apply(b, &p2p.Reserve{Op: p2p.OpCommit, ID: "bbbbbbbbbbbbbbbb", JobID: testJob}, now.Add(2*time.Second)); r.OK {
		t.Fatalf("committed a lapsed hold: %+v", r)
	}
	if r := h.Apply(a, &p2p.Reserve{Op: p2p.OpRelease, ID: "aaaaaaaaaaaaaaaa", JobID: testJob}, now); !r.OK || r.Free.Cores != 4 {
		t.Fatalf("release: %+v", r)
	}
	if changes == 0 {
		t.Fatal("the offer was never told the allocation changed")
	}
	lent = p2p.Resources{}
	if r := h.Apply(a, reserveReq("cccccccccccccccc", 1, 60), now); r.OK || r.Reason != "this machine is not lending now" {
		t.Fatalf("a hold on a machine that stopped lending: %+v", r)
	}
}

func TestHoldsConcurrentNeverOverCommit(t *testing.T) {
	lent := p2p.Resources{Cores: 7, MemBytes: 1 << 30}
	h := NewHolds(func() p2p.Resources { return lent }, nil)
	var wg sync.WaitGroup
	var mu sync.Mutex
	granted := 0
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := h.Apply(peer.ID(fmt.Sprint("s", i%3)), reserveReq(fmt.Sprintf("%016x", i), 1, 60), time.Now())
			if r.OK {
				mu.Lock()
				granted++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if granted != 7 || h.Allocated(time.Now()).Cores != 7 {
		t.Fatalf("granted %d holds of one core on 7 cores; allocated %+v", granted, h.Allocated(time.Now()))
	}
}
