package lender

import (
	"context"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/storage"
)

// lateWrites counts the writes to storage made once it is set.
type lateWrites struct {
	after atomic.Bool
	n     atomic.Int32
}

func (l *lateWrites) write() {
	if l.after.Load() {
		l.n.Add(1)
	}
}

type guardedStore struct {
	Store
	late *lateWrites
}

func (s guardedStore) Put(key string, v any) error {
	s.late.write()
	return s.Store.Put(key, v)
}

func (s guardedStore) Delete(key string) error {
	s.late.write()
	return s.Store.Delete(key)
}

type guardedBlocks struct {
	Blocks
	late *lateWrites
}

// AddFrom takes its time, as with a big output: only ctx ends it early.
func (b guardedBlocks) AddFrom(ctx context.Context, root *os.Root, path string, progress func(storage.Progress)) (storage.Pin, error) {
	t := time.NewTimer(time.Second)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	pin, err := b.Blocks.AddFrom(ctx, root, path, progress)
	b.late.write()
	return pin, err
}

// goroutineIDs are the goroutines running now.
func goroutineIDs() map[string]bool {
	ids := map[string]bool{}
	for _, g := range goroutineStacks() {
		ids[strings.Fields(g)[1]] = true
	}
	return ids
}

func goroutineStacks() []string {
	buf := make([]byte, 16<<20)
	return strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n")
}

// lenderGoroutines are the stacks of the goroutines, other than those in
// before, that run this package's code or that its code started.
func lenderGoroutines(before map[string]bool) []string {
	var out []string
	for _, g := range goroutineStacks() {
		if !before[strings.Fields(g)[1]] && strings.Contains(g, "github.com/deepmarket/deepmarket/node/lender.") {
			out = append(out, g)
		}
	}
	return out
}

// TestRunWaitsForEveryGoroutine: when the node stops while its workers
// are being stopped, finished, checkpointed and reclaimed, and a claim
// waits for its escrow's expiry, the executor's Run returns only once
// every goroutine the executor started has ended: none is left, and
// nothing is written to storage after.
func TestRunWaitsForEveryGoroutine(t *testing.T) {
	e := runnerExecutor(t)
	late := &lateWrites{}
	e.store = guardedStore{Store: e.store, late: late}
	e.blocks = guardedBlocks{Blocks: e.blocks, late: late}
	e.holds = NewHolds(func() p2p.Resources { return p2p.Resources{Cores: 64, MemBytes: 64 << 30} }, HoldLimits{}, nil)
	escrows := newTestEscrows(time.Now)
	e.ledger = escrows
	e.claims = newClaims(escrows, e.store, "m", e.log)
	before := goroutineIDs()

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- e.Run(ctx) }()

	job, bidder := randomJobID(t), peer.ID("the-submitter")
	escrows.open(job, time.Now().Add(time.Hour)) // its claim waits an hour
	launch := func(index int) p2p.Launch {
		return p2p.Launch{JobID: job, Index: index, World: []string{e.self, e.self}, Command: []string{"python3", "-c", "import time; time.sleep(300)"},
			Res: p2p.Resources{Cores: 1, MemBytes: 256 << 20}, MaxSecs: 600}
	}
	eventually(t, "the executor runs jobs", func() bool { return e.admit(bidder, launch(0), false) == nil })
	t.Cleanup(func() {
		// What the chief's submitter would have asked once done.
		for _, w := range e.snapshot() {
			e.finish(w)
		}
	})
	if err := e.admit(bidder, launch(1), false); err != nil {
		t.Fatal(err)
	}
	e.claims.Watch(job)
	for i := range 2 {
		e.mu.Lock()
		w := e.workers[workerKey(job, i)]
		e.mu.Unlock()
		eventually(t, "the worker runs", func() bool {
			st := w.status(time.Now())
			if st.State == p2p.WorkerFailed {
				t.Fatalf("worker %d failed: %s", i, st.Reason)
			}
			return st.State == p2p.WorkerRunning
		})
	}

	// The chief stops without its output and then is reclaimed, which
	// keeps its checkpoint; the other is finished; the node stops
	// meanwhile.
	for i := range 2 {
		if _, err := e.Stop(bidder, p2p.Stop{JobID: job, Index: i, Final: i == 1}); err != nil {
			t.Fatal(err)
		}
	}
	e.Reclaim(0)
	cancel()
	select {
	case err := <-ran:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Run did not return a minute after the node stopped")
	}
	late.after.Store(true)

	// A goroutine that called Done as it returned may still be on its way
	// out; one that Run did not wait for is not.
	var left []string
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if left = lenderGoroutines(before); len(left) == 0 {
			break
		}
	}
	if len(left) > 0 {
		t.Fatalf("%d goroutines of the executor outlived its Run:\n\n%s", len(left), strings.Join(left, "\n\n"))
	}
	if n := late.n.Load(); n > 0 {
		t.Fatalf("%d writes to storage after Run returned", n)
	}
	if err := e.admit(bidder, launch(0), false); err == nil {
		t.Error("a stopped executor took a worker")
	}
}
