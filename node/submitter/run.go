package submitter

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ipfs/go-cid"
	"golang.org/x/sync/errgroup"

	"github.com/deepmarket/deepmarket/node/image"
	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/storage"
	"github.com/deepmarket/deepmarket/units"
)

// holdImage makes sure this node holds the job's image, by CID, before
// anything is bid: one it does not hold (added on another node) is
// fetched from peers and pinned here, so that a missing image fails the
// job now, saying so, rather than on every lender after its escrow, and
// lenders can fetch it from here. The image's size goes into the bids.
func (m *Manager) holdImage(ctx context.Context, j *job, img string) error {
	if img == "" {
		return nil
	}
	c, err := cid.Decode(img)
	if err != nil {
		return fmt.Errorf("image %s: %w", img, err)
	}
	pin, ok, err := m.p.Blocks.Pinned(ctx, c)
	if err != nil {
		return fmt.Errorf("image %s: %w", img, err)
	}
	if !ok || pin.Partial {
		m.logf(j.ID, "fetching the image %s: this node does not hold it", img)
		said := time.Now()
		pin, err = m.p.Blocks.Fetch(ctx, c, func(p storage.Progress) {
			if time.Since(said) >= 5*time.Second {
				said = time.Now()
				m.logf(j.ID, "fetching the image: %s of %s", units.FormatSize(uint64(p.Done)), units.FormatSize(uint64(max(p.Total, p.Done))))
			}
		})
		if err != nil {
			return fmt.Errorf("image %s: this node does not hold it and could not fetch it (%v): add it with `deepmarket env add`, or submit from the node that did", img, err)
		}
	}
	j.ImageBytes = pin.Size
	return nil
}

// drive takes a job through its runs until it ends. Each run is quoted,
// its holds committed, its escrow opened, its workers launched and
// supervised, and it is settled; then the job has ended, or is re-placed
// (once) as the next run.
func (m *Manager) drive(ctx context.Context, j *job) {
	k, launched, ok := m.resumeAt(ctx, j)
	for ; ok; k, launched = k+1, false {
		var end jobs.RunEnd
		if !launched {
			resume := j.Checkpoint // the chief's latest, the next run's start
			if !m.hold(ctx, j, k) || !m.escrow(ctx, j, k) {
				return // the job ended before its launch, or the node stops
			}
			if err := m.launch(ctx, j, k, resume); err != nil {
				m.logf(j.ID, "launch: %v", err)
				end = jobs.RunEnd{Out: jobs.LaunchFailed, Why: "launch failed: " + err.Error()}
			} else {
				launched = true
			}
		}
		if launched {
			if end, ok = m.supervise(ctx, j, k); !ok {
				return // the node stops; the job resumes when it restarts
			}
		}
		m.windDown(ctx, j, k, end) // stop the workers, settle
		ok = m.conclude(j, k, end) // the job ended, or is re-placed as run k+1
	}
}

// resumeAt is where drive takes a job up: run k, already launched (the
// node restarted while it ran) or to be placed; ok is false when the job
// failed instead. A new job's inputs go to storage first; a waiting job
// waits on, from its place in the queue; a job the node restarted with
// while bidding bids again if it was confirmed or may still be; one
// restarted while committing its holds is failed.
func (m *Manager) resumeAt(ctx context.Context, j *job) (k int, launched, ok bool) {
	if j.State == jobs.Submitted {
		if err := m.addInputs(ctx, j); err != nil {
			m.move(j, jobs.Failed, err.Error())
			return 0, false, false
		}
	}
	switch j.State {
	case jobs.Quoting, jobs.Reserving:
		if r := j.Current(); r != nil && r.Started.IsZero() {
			// A quote never launched: its holds go, and it is placed anew
			// as the same run.
			m.releaseHolds(context.WithoutCancel(ctx), r)
			j.Runs = j.Runs[:len(j.Runs)-1]
			m.save(j)
		}
		if j.State == jobs.Quoting && (j.Confirmed || j.Queue != nil) {
			break // it bids again, from its place in the queue if it had one
		}
		if j.Updated.Before(time.Now().Add(-m.t.confirmWait)) || j.State == jobs.Reserving {
			m.move(j, jobs.Failed, "the submitting node restarted before the job was paid for: submit it again")
			return 0, false, false
		}
	case jobs.Escrowed, jobs.Launching, jobs.Running:
		return len(j.Runs) - 1, true, true
	}
	return len(j.Runs), false, true
}

// windDown ends run k: it stops its workers (on a lost worker the chief
// keeps a checkpoint first), settles, and tells the machines they may
// forget the run (its holds freed for a re-placed run; the chief's
// output or checkpoint is already in storage). A run whose launch failed
// also has its holds released.
func (m *Manager) windDown(ctx context.Context, j *job, k int, end jobs.RunEnd) {
	bg := context.WithoutCancel(ctx)
	stopReason := end.Why
	if end.Out == jobs.LaunchFailed {
		stopReason = "launch failed"
	}
	m.stopAll(bg, j, k, stopReason, end.Checkpoint)
	if end.Checkpoint {
		m.awaitCheckpoint(bg, j, k)
	}
	m.settle(bg, j, k, end.Unvacated())
	m.finalStop(bg, j, k)
	if end.Out == jobs.LaunchFailed {
		m.releaseHolds(bg, &j.Runs[k])
	}
}

// conclude moves the job on once run k ended: to its end, or back to
// quoting for the next run, when it reports true.
func (m *Manager) conclude(j *job, k int, end jobs.RunEnd) bool {
	if j.State == jobs.Launching && end.Out == jobs.RunSucceeded {
		m.move(j, jobs.Running, "") // it ran, between two polls
	}
	switch jobs.AfterRun(end.Out, k) {
	case jobs.Quoting:
		if end.Out == jobs.WorkerLost { // a failed launch re-places quietly
			m.logf(j.ID, "re-placing the job once on other machines%s", map[bool]string{true: " from the chief's checkpoint", false: ""}[j.Checkpoint != ""])
			m.move(j, jobs.Quoting, end.Why+": re-placing")
		}
		return true
	case jobs.Succeeded:
		m.move(j, jobs.Succeeded, "")
	case jobs.Cancelled:
		m.move(j, jobs.Cancelled, "cancelled by the submitter")
	default:
		m.move(j, jobs.Failed, end.Why)
	}
	return false
}

// addInputs adds the bundle, dataset and image directories to storage.
func (m *Manager) addInputs(ctx context.Context, j *job) error {
	add := func(what, v string) (string, error) {
		if v == "" || jobs.IsCID(v) {
			return v, nil
		}
		m.logf(j.ID, "adding the %s %s to storage", what, v)
		pin, err := m.p.Blocks.Add(ctx, v, nil)
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
	if v := j.Spec.Image; v != "" && !jobs.IsCID(v) {
		// Checked here, before anything is bid: a lender refuses a layer
		// that does not match its digest, after the job has paid to start.
		m.logf(j.ID, "checking the image %s", v)
		im, err := image.Open(v)
		if err == nil {
			_, err = image.Verify(im)
		}
		if err != nil {
			return fmt.Errorf("image %s: %w", v, err)
		}
	}
	img, err := add("image", j.Spec.Image)
	if err != nil {
		return err
	}
	if err := m.holdImage(ctx, j, img); err != nil {
		return err
	}
	if t := j.Spec.Training; t != nil && t.Validation != "" {
		v, err := add("validation batch", t.Validation)
		if err != nil {
			return err
		}
		c := *t // the bid and the launches carry its address
		c.Validation, j.Spec.Training = v, &c
	}
	j.BundleCID, j.DatasetCID, j.ImageCID = b, d, img
	m.save(j)
	if !m.move(j, jobs.Quoting, "") {
		return errors.New("internal: cannot quote")
	}
	return nil
}

// startHolder starts the model's holder of a held run on this machine,
// before its workers, which reach it as soon as they start.
func (m *Manager) startHolder(j *job, run *jobs.Run, world []string, addrs [][]string) error {
	l := p2p.Launch{JobID: run.ID, Index: len(world), World: world, Addrs: addrs, Framework: j.Spec.Framework,
		Command: j.Spec.Command, Bundle: j.BundleCID, Dataset: j.DatasetCID, Image: j.ImageCID,
		Res:     p2p.Resources{Cores: 1, MemBytes: j.Spec.MemBytes},
		MaxSecs: int64(j.Spec.MaxDuration / time.Second), Training: j.Spec.Training}
	if err := m.p.Holders.Hold(l); err != nil {
		return fmt.Errorf("the model's holder on this machine: %w", err)
	}
	run.Holder = &jobs.Worker{Machine: m.p.Holders.Machine(), Moniker: "this machine", State: p2p.WorkerFetching,
		LastSeen: time.Now().UTC()}
	m.save(j)
	m.logf(j.ID, "the model's holder starts on this machine: it checks every worker's update and pays for the accepted rounds")
	return nil
}

// launch starts every worker of run k (the job launching), the chief
// from resume when that is a checkpoint.
func (m *Manager) launch(ctx context.Context, j *job, k int, resume string) error {
	m.move(j, jobs.Launching, "")
	run := &j.Runs[k]
	world := make([]string, len(run.Workers))
	addrs := make([][]string, len(run.Workers))
	for i, w := range run.Workers {
		world[i] = w.Machine
		addrs[i] = m.p.Machines.Addrs(w.Machine)
		if len(addrs[i]) > 32 {
			addrs[i] = addrs[i][:32]
		}
	}
	run.Started, run.Floor = time.Now().UTC(), j.Spec.Floor
	sync := j.Spec.Training == nil || j.Spec.Training.Mode == "sync"
	run.Lockstep = j.Spec.Framework == "tensorflow" && sync && len(run.Workers) > 1
	m.save(j)
	if j.Spec.Training.Held() {
		if err := m.startHolder(j, run, world, addrs); err != nil {
			return err
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	for i, w := range run.Workers {
		l := p2p.Launch{JobID: run.ID, Index: i, World: world, Addrs: addrs, Hold: w.Hold, Framework: j.Spec.Framework,
			Command: j.Spec.Command, Bundle: j.BundleCID, Dataset: j.DatasetCID, Image: j.ImageCID,
			Res:     p2p.Resources{Cores: uint32(j.Spec.Cores), MemBytes: j.Spec.MemBytes, GPUs: uint32(j.Spec.GPUs)},
			MaxSecs: int64(j.Spec.MaxDuration / time.Second), PerHour: w.PerHour, Floor: j.Spec.Floor, Training: j.Spec.Training}
		if i == 0 {
			l.Resume = resume
		}
		g.Go(func() error {
			// A machine whose replica of the ledger is behind asks for
			// the launch again (reply.Retry), for up to launchPatience:
			// it does not see the run's escrow yet.
			for first := time.Now(); ; {
				reply, err := m.p.Machines.Launch(gctx, w.Machine, l)
				if err != nil {
					return fmt.Errorf("worker %d on %s: %w", i, w.Machine, err)
				}
				switch {
				case reply.OK:
					return nil
				case !reply.Retry || time.Since(first) > m.t.launchPatience:
					return fmt.Errorf("worker %d on %s refused: %s", i, w.Machine, reply.Reason)
				}
				m.logf(j.ID, "worker %d: %s does not see the escrow on its ledger yet; launching again", i, w.Moniker)
				select {
				case <-gctx.Done():
					return gctx.Err()
				case <-time.After(m.t.launchRetry):
				}
			}
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	now := time.Now().UTC()
	for i := range run.Workers {
		run.Workers[i].State, run.Workers[i].LastSeen = p2p.WorkerFetching, now
	}
	m.save(j)
	m.logf(j.ID, "launched %d workers", len(run.Workers))
	return nil
}
