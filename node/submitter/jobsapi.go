package submitter

// The API's requests about this node's jobs. They read the jobs' snapshots
// and ask a live job's goroutine through its inbox; none touches a job.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/deepmarket/deepmarket/node/fault"
	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/units"
)

// SubmitRequest submits a job: its spec as written, the directory its
// relative paths are from, and whether to go on without confirmation.
type SubmitRequest struct {
	Spec    jobs.File `json:"spec"`
	BaseDir string    `json:"base_dir"`
	Yes     bool      `json:"yes"`
}

// JobLogs is a chunk of a job's log; Done when the job has ended and
// nothing more will come.
type JobLogs struct {
	Data string `json:"data"`
	Next int64  `json:"next"`
	Done bool   `json:"done"`
}

// Submit validates the spec, adds its inputs to storage, bids, and
// returns once the job has a quote to confirm, waits in the queue, or has
// failed. With Yes the job goes on without confirmation.
func (m *Manager) Submit(ctx context.Context, req SubmitRequest) (*jobs.Job, error) {
	spec, err := req.Spec.Validate(req.BaseDir)
	if err != nil {
		var se *jobs.SpecError
		if errors.As(err, &se) {
			return nil, &fault.Error{Kind: fault.Invalid, Field: se.Key, Message: se.Error()}
		}
		return nil, &fault.Error{Kind: fault.Invalid, Message: err.Error()}
	}
	m.mu.Lock()
	runCtx := m.ctx
	m.mu.Unlock()
	if runCtx == nil {
		return nil, &fault.Error{Kind: fault.Unavailable, Message: "the node is starting; try again"}
	}
	heldWhy := m.holdByDefault(spec)
	if spec.Training.Held() {
		if err := m.p.Holders.CanHold(spec.Command); err != nil {
			return nil, &fault.Error{Kind: fault.Invalid, Field: "training.holder",
				Message: "holder = \"submitter\" runs the job's program on this machine, which cannot: " + err.Error()}
		}
	}
	if err := m.fitsSomewhere(spec); err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	sub := m.p.Account
	j := &job{Job: jobs.Job{ID: jobs.NewID(sub, spec, now), Spec: *spec, State: jobs.Submitted, Submitter: sub,
		Created: now, Confirmed: req.Yes}, in: newInbox()}
	id := j.ID
	m.mu.Lock()
	m.live[id] = &handle{in: j.in, changed: make(chan struct{})}
	m.mu.Unlock()
	m.save(j)
	m.logf(id, "submitted %s: %d %s of %s each", spec.Name, spec.Workers, units.Plural(spec.Workers, "worker", "workers"),
		units.FormatResources(spec.Cores, spec.MemBytes, spec.GPUs))
	if heldWhy != "" {
		m.logf(id, "%s", heldWhy)
	}
	m.start(runCtx, j) // j is its goroutine's from here
	// Wait for the quote (or the end).
	snapshot := m.await(ctx, id, func(j *jobs.Job) bool {
		st, run := j.State, j.Current()
		quoted := run != nil && len(run.Workers) > 0 && st == jobs.Quoting
		return quoted || st == jobs.Waiting || st.Terminal() || (req.Yes && st != jobs.Submitted && st != jobs.Quoting)
	})
	placeIn(&snapshot, m.q.positions(time.Now()))
	return &snapshot, nil
}

// holdByDefault settles who holds the model of a diloco job whose spec
// does not say: this node, the submitter's, whenever it can run the
// job's program as the holder (each worker then paid for its accepted
// rounds, with spot checks on), else the workers. It says which, and why,
// for the job's log; "" when the spec said.
func (m *Manager) holdByDefault(spec *jobs.Spec) string {
	t := spec.Training
	if t == nil || t.Mode != "diloco" || t.Holder != "" {
		return ""
	}
	if err := m.p.Holders.CanHold(spec.Command); err != nil {
		t.Holder = p2p.HolderWorkers
		return "the workers hold the model (this machine cannot run the job's program as the holder: " + err.Error() + ")"
	}
	t.Holder = p2p.HolderSubmitter
	t.FillHeld()
	return fmt.Sprintf("this machine holds the model (the default for diloco): workers are paid for accepted rounds, "+
		"spot checks replay %.3g of them", t.Verify.Rate)
}

// fitsSomewhere refuses at once a job one of whose workers no machine on
// the market could ever take, whatever is free: re-bidding would only
// find the same after half a minute. A node that holds no offers at all
// lets the market answer (schedulers may see machines it does not).
func (m *Manager) fitsSomewhere(spec *jobs.Spec) error {
	held := m.p.Offers.Offers(time.Now())
	if len(held) == 0 {
		return nil
	}
	var best p2p.Resources
	for _, h := range held {
		l := h.Lent
		if uint64(l.Cores) >= uint64(spec.Cores) && l.MemBytes >= spec.MemBytes && uint64(l.GPUs) >= uint64(spec.GPUs) {
			return nil
		}
		if l.Cores > best.Cores || (l.Cores == best.Cores && l.MemBytes > best.MemBytes) {
			best = l
		}
	}
	need := units.FormatResources(spec.Cores, spec.MemBytes, spec.GPUs)
	return &fault.Error{Kind: fault.Invalid, Field: "cores", Message: fmt.Sprintf(
		"no machine on the market lends %s for one worker: of the %d %s this node sees, the largest lends %s "+
			"(ask for less per worker, or lend more: deepmarket lend --cores %d --mem %s)",
		need, len(held), units.Plural(len(held), "machine", "machines"), units.FormatResources(int(best.Cores), best.MemBytes, int(best.GPUs)),
		spec.Cores, units.FormatSize(spec.MemBytes))}
}

// Confirm lets a quoted job go on to reserve, pay into escrow and launch.
func (m *Manager) Confirm(ctx context.Context, id string) (*jobs.Job, error) {
	snap, h, err := m.get(id)
	if err != nil {
		return nil, err
	}
	if snap.State.Terminal() {
		return nil, &fault.Error{Kind: fault.Conflict, Message: fmt.Sprintf("job %s is %s", snap.ID, snap.State)}
	}
	c := copyJob(snap)
	if !c.Confirmed {
		if h != nil {
			h.in.put(askConfirm) // a waiting job may now wait as long as its spec says
		}
		c.Confirmed = true
	}
	return &c, nil
}

// Cancel stops a job; what its workers used is paid, the rest refunded.
// It waits (a little) for the job to end.
func (m *Manager) Cancel(ctx context.Context, id string) (*jobs.Job, error) {
	snap, h, err := m.get(id)
	if err != nil {
		return nil, err
	}
	if snap.State.Terminal() {
		return nil, &fault.Error{Kind: fault.Conflict, Message: fmt.Sprintf("job %s is already %s", snap.ID, snap.State)}
	}
	if h != nil {
		h.in.put(askCancel)
	}
	wctx, cancel := context.WithTimeout(ctx, m.t.cancelWait)
	defer cancel()
	s := m.await(wctx, snap.ID, func(j *jobs.Job) bool { return j.State.Terminal() })
	return &s, nil
}

// get finds the job id, or the one job whose ID it begins (as with git):
// its snapshot, not to be written, and its handle while it is live.
func (m *Manager) get(id string) (*jobs.Job, *handle, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	snap := m.snaps[id]
	if snap == nil && len(id) >= 6 {
		for k, s := range m.snaps {
			if strings.HasPrefix(k, id) {
				if snap != nil {
					return nil, nil, &fault.Error{Kind: fault.Malformed, Field: "id", Message: fmt.Sprintf("%q matches several jobs", id)}
				}
				snap = s
			}
		}
	}
	if snap == nil {
		return nil, nil, &fault.Error{Kind: fault.NotFound, Field: "id", Message: fmt.Sprintf("no job %q submitted from this node", id)}
	}
	return snap, m.live[snap.ID], nil
}

// Job returns a copy of a job.
func (m *Manager) Job(ctx context.Context, id string) (*jobs.Job, error) {
	snap, _, err := m.get(id)
	if err != nil {
		return nil, err
	}
	c := copyJob(snap)
	placeIn(&c, m.q.positions(time.Now()))
	return &c, nil
}

// placeIn fills in what is worked out when a job is read: a waiting
// job's position in the queue, and its summary.
func placeIn(j *jobs.Job, positions map[string]int) {
	if j.Queue != nil {
		j.Queue.Position = positions[j.ID]
	}
	j.Summary = jobs.Summarize(j, time.Now())
}

// Jobs lists this node's jobs, newest first.
func (m *Manager) Jobs(ctx context.Context) ([]jobs.Job, error) {
	pos := m.q.positions(time.Now())
	m.mu.Lock()
	out := make([]jobs.Job, 0, len(m.snaps))
	for _, snap := range m.snaps {
		out = append(out, copyJob(snap))
	}
	m.mu.Unlock()
	for i := range out {
		placeIn(&out[i], pos)
	}
	slices.SortFunc(out, func(a, b jobs.Job) int { return b.Created.Compare(a.Created) })
	return out, nil
}

// Logs returns the job's log from offset: the submitter's own lines and
// every worker's output, each line tagged with its worker.
func (m *Manager) Logs(ctx context.Context, id string, offset int64) (JobLogs, error) {
	snap, _, err := m.get(id)
	if err != nil {
		return JobLogs{}, err
	}
	chunk := readLog(filepath.Join(m.p.LogDir, snap.ID+".log"), offset)
	return JobLogs{Data: string(chunk.Data), Next: chunk.Next, Done: snap.State.Terminal() && len(chunk.Data) == 0}, nil
}

// readLog reads a job's log from offset off, a chunk at most.
func readLog(path string, off int64) p2p.Logs {
	f, err := os.Open(path)
	if err != nil {
		return p2p.Logs{Next: off}
	}
	defer f.Close()
	buf := make([]byte, p2p.MaxLogChunk)
	n, err := f.ReadAt(buf, max(off, 0))
	if err != nil && !errors.Is(err, io.EOF) {
		return p2p.Logs{Next: off}
	}
	return p2p.Logs{Data: buf[:n], Next: max(off, 0) + int64(n)}
}
