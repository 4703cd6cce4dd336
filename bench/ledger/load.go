package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	mempl "github.com/cometbft/cometbft/mempool"

	"github.com/deepmarket/deepmarket/ledger"
)

// loadOpts is the load generator's settings, the same for every case.
type loadOpts struct {
	workers  int
	rate     float64       // offered tx/s over all workers; 0: as fast as the window allows
	inflight int           // at most this many txs broadcast and not yet committed (0: no limit)
	warmup   time.Duration // load before the measured window
	duration time.Duration // the measured window
	drain    time.Duration // at most this long after the window for its txs to commit
}

// phaseResult is one load phase on one network.
type phaseResult struct {
	Rate        float64 `json:"offered_tx_per_s,omitempty"` // 0: saturation
	TPS         float64 `json:"tx_per_s"`
	P50ms       float64 `json:"p50_ms"`
	P90ms       float64 `json:"p90_ms"`
	P99ms       float64 `json:"p99_ms"`
	Committed   int64   `json:"committed_in_window"`
	Blocks      int     `json:"blocks_in_window"`
	TxsPerBlock float64 `json:"txs_per_block"`
	BlockMs     float64 `json:"block_interval_ms"`
	CPUCores    float64 `json:"cpu_cores_busy"` // process CPU time / wall time in the window
	Sent        int64   `json:"accepted_in_window"`
	Samples     int     `json:"latency_samples"`
	Uncommitted int64   `json:"uncommitted_after_drain"` // accepted in the window, not committed by the end of the drain
	MempoolFull int64   `json:"mempool_full_retries"`
	Rejected    int64   `json:"rejected"`        // CheckTx said no, or broadcast failed
	FailedExec  int64   `json:"failed_in_block"` // committed with a non-zero code
	Resyncs     int64   `json:"nonce_resyncs"`   // streams restarted from the committed nonce
	Exhausted   bool    `json:"workload_exhausted"`
	Behind      float64 `json:"max_behind_ms,omitempty"` // fixed rate: how late the generator fell at worst
	Error       string  `json:"error,omitempty"`
}

var verbose bool

// sentTx is a tracked transaction: when it was (last) broadcast, and
// whether it counts among the window's pending ones.
type sentTx struct {
	at      time.Duration
	counted bool
}

// tracker maps a tx's hash to when it was broadcast (since the start).
type tracker struct {
	shards [64]struct {
		mu sync.Mutex
		m  map[[32]byte]sentTx
	}
}

func newTracker() *tracker {
	t := &tracker{}
	for i := range t.shards {
		t.shards[i].m = map[[32]byte]sentTx{}
	}
	return t
}

// put records a broadcast; existed: the tx was tracked already (sent again).
func (t *tracker) put(h [32]byte, at time.Duration) (existed bool) {
	s := &t.shards[h[0]&63]
	s.mu.Lock()
	prev, existed := s.m[h]
	s.m[h] = sentTx{at: at, counted: prev.counted}
	s.mu.Unlock()
	return existed
}

// count marks a tracked tx as pending in the window; false if it was
// already, or is no longer tracked.
func (t *tracker) count(h [32]byte) bool {
	s := &t.shards[h[0]&63]
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[h]
	if !ok || e.counted {
		return false
	}
	e.counted = true
	s.m[h] = e
	return true
}

func (t *tracker) take(h [32]byte) (sentTx, bool) {
	s := &t.shards[h[0]&63]
	s.mu.Lock()
	e, ok := s.m[h]
	if ok {
		delete(s.m, h)
	}
	s.mu.Unlock()
	return e, ok
}

type blockObs struct {
	height int64
	at     time.Duration
	ok     int
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func isFull(err error) bool {
	var full mempl.ErrMempoolIsFull
	return errors.As(err, &full) || errors.Is(err, mempl.ErrRecheckFull)
}

// runLoad drives a running network: opts.workers goroutines, worker w
// sending to validator w mod n with BroadcastTxSync, each owning the streams
// w, w+workers, ... and sending one transaction of each in turn, retrying a
// transaction the mempool had no room for. At most opts.inflight
// transactions are out (broadcast, not yet committed): at saturation a
// worker sends as soon as there is room, at a fixed rate on its schedule. A
// watcher reads validator 0's committed blocks and their results as they
// appear, and frees the room of the transactions they hold.
func runLoad(ctx context.Context, nw *network, src source, opts loadOpts) phaseResult {
	res := phaseResult{Rate: opts.rate}
	tr := newTracker()
	start := time.Now()
	since := func() time.Duration { return time.Since(start) }
	tA, tB := opts.warmup, opts.warmup+opts.duration

	var (
		stopLoad    atomic.Bool
		stopCh      = make(chan struct{})
		slots       chan struct{} // in flight: one per tx broadcast and not yet seen committed
		sentWindow  atomic.Int64  // accepted in the window
		pendWindow  atomic.Int64  // accepted in the window and not yet seen committed
		full        atomic.Int64
		rejected    atomic.Int64
		failedExec  atomic.Int64
		resyncs     atomic.Int64
		exhausted   atomic.Bool
		errMu       sync.Mutex
		firstErr    string
		obs         []blockObs
		lats        []time.Duration
		obsMu       sync.Mutex
		watcherDone = make(chan struct{})
		stopWatch   = make(chan struct{})
	)
	noteErr := func(s string) {
		errMu.Lock()
		if firstErr == "" {
			firstErr = s
		}
		errMu.Unlock()
	}

	if opts.inflight > 0 {
		slots = make(chan struct{}, opts.inflight)
	}
	// Watcher: validator 0's blocks, in order, when their results exist.
	cl0 := nw.nodes[0].client
	h0 := nw.nodes[0].chain.Height()
	go func() {
		defer close(watcherDone)
		h := h0 + 1
		for {
			br, err := cl0.BlockResults(ctx, &h)
			if err != nil {
				select {
				case <-stopWatch:
					return
				case <-time.After(2 * time.Millisecond):
				}
				continue
			}
			at := since()
			b, err := cl0.Block(ctx, &h)
			if err != nil {
				noteErr(fmt.Sprintf("block %d: %v", h, err))
				return
			}
			ok := 0
			var l []time.Duration
			for i, tx := range b.Block.Txs {
				sent, found := tr.take(sha256.Sum256(tx))
				if found && slots != nil {
					<-slots
				}
				inWindow := found && sent.at >= tA && sent.at < tB
				good := true
				if i < len(br.TxsResults) && br.TxsResults[i].Code != 0 {
					good = false
					failedExec.Add(1)
					noteErr(fmt.Sprintf("committed with code %d: %s", br.TxsResults[i].Code, br.TxsResults[i].Log))
				} else {
					ok++
				}
				if inWindow {
					if sent.counted {
						pendWindow.Add(-1)
					}
					if good {
						l = append(l, at-sent.at)
					}
				}
			}
			if verbose {
				fmt.Printf("    block %d at %v: %d txs (%d ok), header time %s, round %d\n", h, at.Round(time.Millisecond), len(b.Block.Txs), ok, b.Block.Time.Format("15:04:05.000"), b.Block.LastCommit.Round)
			}
			obsMu.Lock()
			obs = append(obs, blockObs{height: h, at: at, ok: ok})
			lats = append(lats, l...)
			obsMu.Unlock()
			h++
		}
	}()

	var (
		wg     sync.WaitGroup
		behind atomic.Int64
	)
	// With a fixed rate, worker w sends its k-th tx at (k + w/workers) *
	// workers/rate, late if a broadcast held it up (it then catches up).
	var interval time.Duration
	if opts.rate > 0 {
		interval = time.Duration(float64(time.Second) * float64(opts.workers) / opts.rate)
	}
	// Stream s belongs to validator s mod n (an account's txs all go to one
	// node, in order) and is held by one worker at a time: a worker takes
	// a stream from its validator's queue, sends that stream's next tx and
	// puts it back. Streams thus advance evenly whatever the workers' luck.
	nn := len(nw.nodes)
	queues := make([]chan int, nn)
	for v := range queues {
		queues[v] = make(chan int, src.streams())
	}
	for st := 0; st < src.streams(); st++ {
		queues[st%nn] <- st
	}
	pend := make([][]byte, src.streams()) // taken from the source, not yet accepted
	for w := 0; w < opts.workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := nw.nodes[w%nn].client
			queue := queues[w%nn]
			next := time.Duration(w) * interval / time.Duration(opts.workers)
			for !stopLoad.Load() {
				var s int
				select {
				case s = <-queue:
				case <-stopCh:
					return
				}
				tx := pend[s]
				if tx == nil {
					if tx = src.next(s); tx == nil {
						if since() < tB {
							exhausted.Store(true)
						}
						continue // the stream is done: it is not put back
					}
					pend[s] = tx
				}
				if interval > 0 {
					if d := next - since(); d > 0 {
						time.Sleep(d)
					} else if -d > time.Duration(behind.Load()) {
						behind.Store(int64(-d))
					}
				}
				if slots != nil {
					select {
					case slots <- struct{}{}:
					case <-stopCh:
						queue <- s
						return
					}
				}
				h := sha256.Sum256(tx)
				at := since()
				if tr.put(h, at) && slots != nil {
					<-slots // sent before: it holds a slot already
				}
				r, err := cl.BroadcastTxSync(ctx, tx)
				switch {
				case err == nil && r.Code == 0, errors.Is(err, mempl.ErrTxInCache):
					pend[s] = nil
					next += interval
					if at >= tA && at < tB {
						sentWindow.Add(1)
						if tr.count(h) {
							pendWindow.Add(1)
						}
					}
				case err != nil && isFull(err):
					if _, ok := tr.take(h); ok && slots != nil {
						<-slots
					}
					full.Add(1)
					time.Sleep(5 * time.Millisecond)
				case err == nil && r.Code == ledger.CodeBadNonce && src.resync(ctx, cl, s):
					// The stream's earlier txs failed in a block: it goes
					// on from the account's committed nonce, sending those
					// again. (With several validators, one that got an
					// account's txs from two peers at once can hold them
					// out of nonce order: CometBFT's local ABCI client
					// calls CheckTx under its mutex but adds the tx to the
					// mempool after releasing it. The ledger's
					// PrepareProposal reorders them; this path remains for
					// whatever else makes a transaction fail in a block.)
					if _, ok := tr.take(h); ok && slots != nil {
						<-slots
					}
					pend[s] = nil
					resyncs.Add(1)
				default:
					// A stream cannot skip a transaction (nonces): it ends.
					if _, ok := tr.take(h); ok && slots != nil {
						<-slots
					}
					pend[s] = nil
					rejected.Add(1)
					if err != nil {
						noteErr(fmt.Sprintf("broadcast: %v", err))
					} else {
						noteErr(fmt.Sprintf("CheckTx code %d: %s", r.Code, r.Log))
					}
					continue // not put back
				}
				queue <- s
			}
		}()
	}
	defer func() {
		// What was taken and not sent goes back: the next phase on this
		// chain sends it first.
		for s, tx := range pend {
			if tx != nil {
				src.unread(s)
			}
		}
	}()

	sleepUntil := func(t time.Duration) {
		if d := t - since(); d > 0 {
			time.Sleep(d)
		}
	}
	sleepUntil(tA)
	cpuA := cpuTime()
	sleepUntil(tB)
	cpuB := cpuTime()
	stopLoad.Store(true)
	close(stopCh)
	wg.Wait()
	// Drain: give the window's transactions time to commit.
	for deadline := since() + opts.drain; pendWindow.Load() > 0 && since() < deadline; {
		time.Sleep(10 * time.Millisecond)
	}
	close(stopWatch)
	<-watcherDone

	res.CPUCores = float64(cpuB-cpuA) / float64(tB-tA)
	res.Sent = sentWindow.Load()
	res.Uncommitted = max(pendWindow.Load(), 0)
	res.MempoolFull = full.Load()
	res.Rejected = rejected.Load()
	res.FailedExec = failedExec.Load()
	res.Resyncs = resyncs.Load()
	res.Exhausted = exhausted.Load()
	res.Error = firstErr
	res.Behind = float64(time.Duration(behind.Load()).Microseconds()) / 1000

	// Throughput: whole block intervals ending in (tA, tB].
	var prev, last time.Duration = -1, -1
	for _, o := range obs {
		switch {
		case o.at <= tA:
			prev = o.at
		case o.at <= tB:
			if prev < 0 {
				prev = tA
			}
			last = o.at
			res.Committed += int64(o.ok)
			res.Blocks++
		}
	}
	if res.Blocks > 0 && last > prev {
		res.TPS = float64(res.Committed) / (last - prev).Seconds()
		res.TxsPerBlock = float64(res.Committed) / float64(res.Blocks)
		res.BlockMs = float64((last - prev).Milliseconds()) / float64(res.Blocks)
	}
	slices.Sort(lats)
	res.Samples = len(lats)
	if len(lats) > 0 {
		q := func(p float64) float64 {
			i := int(p * float64(len(lats)-1))
			return float64(lats[i].Microseconds()) / 1000
		}
		res.P50ms, res.P90ms, res.P99ms = q(0.50), q(0.90), q(0.99)
	}
	return res
}
