package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"golang.org/x/sync/errgroup"

	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/p2p"
)

// drive takes a job through its states until it ends.
func (m *JobManager) drive(ctx context.Context, j *jobs.Job) {
	fail := func(reason string) {
		m.move(j, jobs.Failed, reason)
	}
	if j.State == jobs.Submitted {
		if err := m.addInputs(ctx, j); err != nil {
			fail(err.Error())
			return
		}
	}
	switch j.State {
	case jobs.Quoting, jobs.Reserving:
		if r := j.Current(); r != nil {
			m.releaseHolds(context.WithoutCancel(ctx), r)
		}
		if j.Updated.Before(time.Now().Add(-confirmWait)) || j.State == jobs.Reserving {
			fail("the submitting node restarted before the job was paid for: submit it again")
			return
		}
	case jobs.Escrowed, jobs.Launching, jobs.Running:
		m.supervise(ctx, j, len(j.Runs)-1)
		return
	}
	m.place(ctx, j, len(j.Runs))
}

// addInputs adds the bundle and dataset directories to storage.
func (m *JobManager) addInputs(ctx context.Context, j *jobs.Job) error {
	add := func(what, v string) (string, error) {
		if v == "" || jobs.IsCID(v) {
			return v, nil
		}
		m.logf(j, "adding the %s %s to storage", what, v)
		pin, err := m.n.blocks.Add(ctx, v, nil)
		if err != nil {
			return "", fmt.Errorf("add %s %s: %w", what, v, err)
		}
		return pin.CID.String(), nil
	}
	b, err := add("bundle", j.Spec.Bundle)
	if err != nil {
		return err
	}
	d, err := add("dataset", j.Spec.Dataset)
	if err != nil {
		return err
	}
	m.save(j, func() { j.BundleCID, j.DatasetCID = b, d })
	if !m.move(j, jobs.Quoting, "") {
		return errors.New("internal: cannot quote")
	}
	return nil
}

// jobCall sends a job request to machine, or hands it to this node's own
// executor when the machine is this one.
func (n *Node) jobCall(ctx context.Context, machine string, typ string, req any, replyType string, reply any) error {
	id, err := peer.Decode(machine)
	if err != nil {
		return err
	}
	if id == n.host.ID() {
		b, err := p2p.Marshal(req)
		if err != nil {
			return err
		}
		rt, r, err := n.exec.handle(ctx, id, &p2p.Envelope{Type: typ, Payload: b})
		if err != nil {
			return err
		}
		if rt != replyType {
			return fmt.Errorf("%w %q", p2p.ErrUnknownType, rt)
		}
		rb, err := p2p.Marshal(r)
		if err != nil {
			return err
		}
		return p2p.Unmarshal(rb, reply)
	}
	return n.rpc.Call(ctx, id, p2p.JobProtocol(n.cfg.Node.ChainID), typ, req, replyType, reply)
}

// launch starts every worker of run k.
func (m *JobManager) launch(ctx context.Context, j *jobs.Job, k int, resume string) error {
	run := &j.Runs[k]
	world := make([]string, len(run.Workers))
	addrs := make([][]string, len(run.Workers))
	for i, w := range run.Workers {
		world[i] = w.Machine
		addrs[i] = m.n.machineAddrs(w.Machine)
		if len(addrs[i]) > 32 {
			addrs[i] = addrs[i][:32]
		}
	}
	m.save(j, func() { run.Started = time.Now().UTC() })
	g, gctx := errgroup.WithContext(ctx)
	for i, w := range run.Workers {
		l := p2p.Launch{JobID: run.ID, Index: i, World: world, Addrs: addrs, Hold: w.Hold, Framework: j.Spec.Framework,
			Command: j.Spec.Command, Bundle: j.BundleCID, Dataset: j.DatasetCID,
			Res:     p2p.Resources{Cores: uint32(j.Spec.Cores), MemBytes: j.Spec.MemBytes, GPUs: uint32(j.Spec.GPUs)},
			MaxSecs: int64(j.Spec.MaxDuration / time.Second), PerHour: w.PerHour, Training: j.Spec.Training}
		if i == 0 {
			l.Resume = resume
		}
		g.Go(func() error {
			var reply p2p.LaunchReply
			if err := m.n.jobCall(gctx, w.Machine, p2p.TypeLaunch, &l, p2p.TypeLaunchReply, &reply); err != nil {
				return fmt.Errorf("worker %d on %s: %w", i, w.Machine, err)
			}
			if !reply.OK {
				return fmt.Errorf("worker %d on %s refused: %s", i, w.Machine, reply.Reason)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	m.save(j, func() {
		now := time.Now().UTC()
		for i := range run.Workers {
			run.Workers[i].State, run.Workers[i].LastSeen = p2p.WorkerFetching, now
		}
	})
	m.logf(j, "launched %d workers", len(run.Workers))
	return nil
}
