package lender

import (
	"context"
	"time"

	"github.com/deepmarket/deepmarket/p2p"
)

// stop ends a worker (its checkpoint kept when asked); it returns at once.
func (e *Executor) stop(w *worker, reason string, checkpoint bool) {
	w.mu.Lock()
	if w.stopping || w.state == p2p.WorkerExited || w.state == p2p.WorkerFailed {
		w.mu.Unlock()
		return
	}
	w.stopping, w.wantCkpt = true, checkpoint
	proc := w.proc
	if proc == nil {
		w.state, w.reason, w.ended = p2p.WorkerStopped, reason, time.Now()
		w.cancel()
	} else {
		w.reason = reason
	}
	w.mu.Unlock()
	if proc != nil && !e.spawn(func(context.Context) { proc.Stop(p2p.StopGrace) }) {
		// Run is stopping: the worker's context ends it.
		w.cancel()
	}
}

// Reclaim stops every worker after grace: the owner took the machine
// back. Workers launched meanwhile are not taken (the offer is gone).
func (e *Executor) Reclaim(grace time.Duration) {
	e.mu.Lock()
	ws := make([]*worker, 0, len(e.workers))
	for _, w := range e.workers {
		if !w.holder {
			ws = append(ws, w)
		}
	}
	e.mu.Unlock()
	if len(ws) == 0 {
		return
	}
	started := e.spawn(func(ctx context.Context) {
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		for _, w := range ws {
			e.stop(w, "the owner took the machine back", w.l.Index == 0)
			if w.l.Index == 0 {
				e.spawn(func(ctx context.Context) { e.keepCheckpoint(ctx, w) })
			}
		}
	})
	if started {
		e.log.Info("the owner took the machine back: stopping its jobs after the grace period", "workers", len(ws), "grace", grace)
	}
}

// keepCheckpoint adds a chief's output dir to storage as the run's
// checkpoint once it has ended, if it left none (it may have exited on
// its own when a peer vanished, before being asked to stop). As in
// collectOutput, the time it takes counts in the worker's. It runs under
// ctx, Run's: a checkpoint not kept when the node stops is not kept.
func (e *Executor) keepCheckpoint(ctx context.Context, w *worker) {
	<-w.done
	w.mu.Lock()
	need := w.result == "" && w.ckpt == ""
	w.mu.Unlock()
	if !need {
		return
	}
	pin, err := e.addOutput(ctx, w)
	w.mu.Lock()
	w.ended = time.Now()
	if err == nil {
		w.ckpt = pin.CID.String()
	}
	w.mu.Unlock()
}

// finish forgets a worker whose submitter has what it needs: its hold is
// released, its tunnels closed, its dir and CPUs freed.
func (e *Executor) finish(w *worker) {
	<-w.done
	w.mu.Lock()
	closers := w.closers
	w.closers = nil
	w.mu.Unlock()
	for _, c := range closers {
		c()
	}
	e.holds.Release(w.l.Hold)
	w.mu.Lock()
	left, lease, jl := w.boxLeft, w.lease, w.log
	w.mu.Unlock()
	if err := e.root.RemoveAll(w.name); err == nil && !left {
		if err := e.store.Delete(sandboxesKey + w.box); err != nil {
			e.log.Warn("cannot forget a finished worker", "module", "executor", "err", err)
		}
		// Its files are gone with its dir: the uid owns nothing.
		lease.Release()
	}
	if jl != nil {
		jl.Close() // its files stay until the sweep
	}
	e.mu.Lock()
	delete(e.workers, w.key)
	for c, k := range e.cpus {
		if k == w.key {
			delete(e.cpus, c)
		}
	}
	for g, k := range e.gpus {
		if k == w.key {
			delete(e.gpus, g)
		}
	}
	e.mu.Unlock()
}

// running lists the workers whose programs run here now.
func (e *Executor) running() []*worker {
	e.mu.Lock()
	defer e.mu.Unlock()
	var ws []*worker
	for _, w := range e.workers {
		w.mu.Lock()
		if w.proc != nil && w.state == p2p.WorkerRunning && !w.stopping && !w.holder {
			ws = append(ws, w)
		}
		w.mu.Unlock()
	}
	return ws
}

// Running is how many workers run here now (OwnerJobs).
func (e *Executor) Running() int { return len(e.running()) }

// Suspend freezes every running worker (the owner needs the machine);
// the time each stays frozen is not paid for.
func (e *Executor) Suspend(reason string) {
	for _, w := range e.running() {
		w.mu.Lock()
		proc, frozen := w.proc, !w.frozenAt.IsZero()
		w.mu.Unlock()
		if frozen {
			continue
		}
		if err := proc.Freeze(); err != nil {
			e.log.Warn("cannot suspend a worker", "module", "executor", "job", w.l.JobID[:12], "err", err)
			continue
		}
		w.set(func() { w.frozenAt, w.frozenWhy = time.Now(), reason })
	}
}

// Resume thaws every worker Suspend froze.
func (e *Executor) Resume() {
	e.mu.Lock()
	ws := make([]*worker, 0, len(e.workers))
	for _, w := range e.workers {
		ws = append(ws, w)
	}
	e.mu.Unlock()
	for _, w := range ws {
		w.mu.Lock()
		proc, at := w.proc, w.frozenAt
		w.mu.Unlock()
		if at.IsZero() || proc == nil {
			continue
		}
		if err := proc.Thaw(); err != nil {
			e.log.Warn("cannot resume a worker", "module", "executor", "job", w.l.JobID[:12], "err", err)
			continue
		}
		w.set(func() { w.frozenFor, w.frozenAt, w.frozenWhy = w.frozenFor+time.Since(at), time.Time{}, "" })
	}
}

// Vacate stops every running worker with a checkpoint, for reason: its
// submitter re-places the job elsewhere. A frozen worker is thawed by its
// stop and gets its grace.
func (e *Executor) Vacate(reason string) {
	for _, w := range e.running() {
		w.set(func() { w.vacated = true })
		e.stop(w, reason, true)
		if w.l.Index == 0 {
			e.spawn(func(ctx context.Context) { e.keepCheckpoint(ctx, w) })
		}
	}
}
