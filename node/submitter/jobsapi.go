package submitter

// The API's requests about this node's jobs (api.Jobs).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/units"
)

// Submit implements api.Jobs: it validates the spec, adds its inputs to
// storage, bids, and returns once the job has a quote to confirm, waits
// in the queue, or has failed. With Yes the job goes on without
// confirmation.
func (m *Manager) Submit(ctx context.Context, req api.SubmitRequest) (*jobs.Job, error) {
	spec, err := req.Spec.Validate(req.BaseDir)
	if err != nil {
		var se *jobs.SpecError
		if errors.As(err, &se) {
			return nil, &api.Error{Status: http.StatusUnprocessableEntity, Field: se.Key, Message: se.Error()}
		}
		return nil, &api.Error{Status: http.StatusUnprocessableEntity, Message: err.Error()}
	}
	m.mu.Lock()
	running := m.ctx != nil
	m.mu.Unlock()
	if !running {
		return nil, &api.Error{Status: http.StatusServiceUnavailable, Message: "the node is starting; try again"}
	}
	if spec.Training.Held() {
		if err := m.p.Holders.CanHold(spec.Command); err != nil {
			return nil, &api.Error{Status: http.StatusUnprocessableEntity, Field: "training.holder",
				Message: "holder = \"submitter\" runs the job's program on this machine, which cannot: " + err.Error()}
		}
	}
	if err := m.fitsSomewhere(spec); err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	sub := m.p.Account
	j := &jobs.Job{ID: jobs.NewID(sub, spec, now), Spec: *spec, State: jobs.Submitted, Submitter: sub,
		Created: now, Confirmed: req.Yes}
	m.mu.Lock()
	m.jobs[j.ID] = j
	m.mu.Unlock()
	m.save(j, nil)
	m.logf(j, "submitted %s: %d %s of %s each", spec.Name, spec.Workers, units.Plural(spec.Workers, "worker", "workers"),
		units.FormatResources(spec.Cores, spec.MemBytes, spec.GPUs))
	m.start(j)
	// Wait for the quote (or the end).
	snapshot := m.await(ctx, j, func(j *jobs.Job) bool {
		st, run := j.State, j.Current()
		quoted := run != nil && len(run.Workers) > 0 && st == jobs.Quoting
		return quoted || st == jobs.Waiting || st.Terminal() || (req.Yes && st != jobs.Submitted && st != jobs.Quoting)
	})
	placeIn(&snapshot, m.q.positions(time.Now()))
	return &snapshot, nil
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
	return &api.Error{Status: http.StatusUnprocessableEntity, Field: "cores", Message: fmt.Sprintf(
		"no machine on the market lends %s for one worker: of the %d %s this node sees, the largest lends %s "+
			"(ask for less per worker, or lend more: deepmarket lend --cores %d --mem %s)",
		need, len(held), units.Plural(len(held), "machine", "machines"), units.FormatResources(int(best.Cores), best.MemBytes, int(best.GPUs)),
		spec.Cores, units.FormatSize(spec.MemBytes))}
}

// Confirm lets a quoted job go on to reserve, pay into escrow and launch.
func (m *Manager) Confirm(ctx context.Context, id string) (*jobs.Job, error) {
	j, err := m.get(id)
	if err != nil {
		return nil, err
	}
	// id may be a prefix: everything below goes by the job's full ID.
	id = j.ID
	m.mu.Lock()
	defer m.mu.Unlock()
	if j.State.Terminal() {
		return nil, &api.Error{Status: http.StatusConflict, Message: fmt.Sprintf("job %s is %s", id, j.State)}
	}
	if !j.Confirmed {
		j.Confirmed = true
		if ch := m.confirm[id]; ch != nil {
			close(ch)
		}
		m.pokeLocked(id) // a waiting job may now wait as long as its spec says
	}
	snapshot := copyJob(j)
	return &snapshot, nil
}

// Cancel stops a job; what its workers used is paid, the rest refunded.
func (m *Manager) Cancel(ctx context.Context, id string) (*jobs.Job, error) {
	j, err := m.get(id)
	if err != nil {
		return nil, err
	}
	id = j.ID // id may be a prefix: the job loop looks the full one up
	m.mu.Lock()
	if j.State.Terminal() {
		m.mu.Unlock()
		return nil, &api.Error{Status: http.StatusConflict, Message: fmt.Sprintf("job %s is already %s", id, j.State)}
	}
	m.cancelRq[id] = true
	m.pokeLocked(id)
	if ch := m.confirm[id]; ch != nil && !j.Confirmed {
		j.Confirmed = true // wake a job waiting for confirmation, to end
		close(ch)
	}
	m.mu.Unlock()
	// Wait (a little) for the job to end.
	wctx, cancel := context.WithTimeout(ctx, cancelWait)
	defer cancel()
	snapshot := m.await(wctx, j, func(j *jobs.Job) bool { return j.State.Terminal() })
	return &snapshot, nil
}

func (m *Manager) cancelled(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cancelRq[id]
}

func (m *Manager) get(id string) (*jobs.Job, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if j, ok := m.jobs[id]; ok {
		return j, nil
	}
	// A unique prefix will do, as with git.
	var found *jobs.Job
	if len(id) >= 6 {
		for k, j := range m.jobs {
			if strings.HasPrefix(k, id) {
				if found != nil {
					return nil, &api.Error{Status: http.StatusBadRequest, Field: "id", Message: fmt.Sprintf("%q matches several jobs", id)}
				}
				found = j
			}
		}
	}
	if found == nil {
		return nil, &api.Error{Status: http.StatusNotFound, Field: "id", Message: fmt.Sprintf("no job %q submitted from this node", id)}
	}
	return found, nil
}

// Job returns a copy of a job.
func (m *Manager) Job(ctx context.Context, id string) (*jobs.Job, error) {
	j, err := m.get(id)
	if err != nil {
		return nil, err
	}
	pos := m.q.positions(time.Now())
	m.mu.Lock()
	defer m.mu.Unlock()
	snapshot := copyJob(j)
	placeIn(&snapshot, pos)
	return &snapshot, nil
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
	defer m.mu.Unlock()
	out := make([]jobs.Job, 0, len(m.jobs))
	for _, j := range m.jobs {
		c := copyJob(j)
		placeIn(&c, pos)
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b jobs.Job) int { return b.Created.Compare(a.Created) })
	return out, nil
}

// Logs returns the job's log from offset: the submitter's own lines and
// every worker's output, each line tagged with its worker.
func (m *Manager) Logs(ctx context.Context, id string, offset int64) (api.JobLogs, error) {
	j, err := m.get(id)
	if err != nil {
		return api.JobLogs{}, err
	}
	chunk := readLog(filepath.Join(m.p.LogDir, j.ID+".log"), offset)
	m.mu.Lock()
	done := j.State.Terminal()
	m.mu.Unlock()
	return api.JobLogs{Data: string(chunk.Data), Next: chunk.Next, Done: done && len(chunk.Data) == 0}, nil
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

var _ api.Jobs = (*Manager)(nil)
