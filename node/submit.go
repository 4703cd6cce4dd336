package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/units"
)

// Submitter timings.
const (
	quoteWait      = 2 * time.Second  // quotes gathered before choosing
	quoteWaitMax   = 10 * time.Second // waited at most for a first quote
	confirmWait    = 10 * time.Minute // an unconfirmed job is dropped after
	pollEvery      = 3 * time.Second  // status, heartbeat and logs
	receiptEvery   = 30 * time.Second
	lostAfter      = 30 * time.Second // a worker not heard from this long is lost
	maxRuns        = 2                // a job is re-placed at most once
	commitAttempts = 3
	rebids         = 8 // bids again when nothing fits, this often
	rebidEvery     = 2 * time.Second
)

// JobManager is the submitter's side of jobs: it takes a spec to a bid,
// quotes, holds, an escrow, launched workers, and a settlement, keeping
// every step in the node store so a restarted node picks its jobs up.
type JobManager struct {
	n      *Node
	logDir string

	mu       sync.Mutex
	jobs     map[string]*jobs.Job
	confirm  map[string]chan struct{}
	cancels  map[string]context.CancelFunc
	cancelRq map[string]bool
	ctx      context.Context
	wg       sync.WaitGroup
}

func newJobManager(n *Node) *JobManager {
	return &JobManager{n: n, logDir: filepath.Join(n.home.Dir, "data", "joblogs"), jobs: map[string]*jobs.Job{},
		confirm: map[string]chan struct{}{}, cancels: map[string]context.CancelFunc{}, cancelRq: map[string]bool{}}
}

// load reads the persisted jobs; it runs before the API serves, so a
// restarted node answers for its jobs from its first request.
func (m *JobManager) load() error {
	if err := os.MkdirAll(m.logDir, 0o700); err != nil {
		return err
	}
	err := m.n.store.Each("jobs/", func(_ string, doc []byte) error {
		var j jobs.Job
		if err := json.Unmarshal(doc, &j); err != nil {
			return err
		}
		m.jobs[j.ID] = &j
		return nil
	})
	if err != nil {
		return fmt.Errorf("load jobs: %w", err)
	}
	return nil
}

// Run resumes the live jobs and waits for ctx.
func (m *JobManager) Run(ctx context.Context) error {
	m.mu.Lock()
	m.ctx = ctx
	var live []*jobs.Job
	for _, j := range m.jobs {
		if !j.State.Terminal() {
			live = append(live, j)
		}
	}
	m.mu.Unlock()
	for _, j := range live {
		m.n.log.Info("resuming job after restart", "job", j.ID[:12], "state", j.State)
		m.start(j)
	}
	<-ctx.Done()
	m.wg.Wait()
	return nil
}

func (m *JobManager) start(j *jobs.Job) {
	ctx, cancel := context.WithCancel(m.ctx)
	m.mu.Lock()
	m.cancels[j.ID] = cancel
	if m.confirm[j.ID] == nil {
		m.confirm[j.ID] = make(chan struct{})
	}
	m.mu.Unlock()
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer cancel()
		m.drive(ctx, j)
	}()
}

// copyJob copies j deeply enough to read while the job goes on (the
// manager's lock held).
func copyJob(j *jobs.Job) jobs.Job {
	c := *j
	c.Runs = slices.Clone(j.Runs)
	for i := range c.Runs {
		c.Runs[i].Workers = slices.Clone(j.Runs[i].Workers)
	}
	c.Workers = slices.Clone(j.Workers)
	return c
}

// save persists j's current state (under the manager's lock: callers
// hold no lock).
func (m *JobManager) save(j *jobs.Job, f func()) {
	m.mu.Lock()
	if f != nil {
		f()
	}
	j.Updated = time.Now().UTC()
	if r := j.Current(); r != nil {
		j.Workers = slices.Clone(r.Workers)
	}
	snapshot := copyJob(j)
	m.mu.Unlock()
	if err := m.n.store.Put("jobs/"+j.ID, &snapshot); err != nil {
		m.n.log.Error("persist job", "job", j.ID[:12], "err", err)
	}
}

// move changes j's state, persisting it; a move the state machine does
// not allow is a bug, logged and refused.
func (m *JobManager) move(j *jobs.Job, to jobs.State, reason string) bool {
	m.mu.Lock()
	from := j.State
	ok := jobs.CanMove(from, to)
	m.mu.Unlock()
	if !ok {
		m.n.log.Error("job state move refused", "job", j.ID[:12], "from", from, "to", to)
		return false
	}
	m.save(j, func() {
		j.State = to
		if reason != "" || to == jobs.Quoting {
			j.Reason = reason
		}
	})
	m.logf(j, "state %s%s", to, map[bool]string{true: ": " + reason, false: ""}[reason != ""])
	return true
}

// logf appends a line of the submitter's own account to the job's log.
func (m *JobManager) logf(j *jobs.Job, format string, args ...any) {
	m.appendLog(j.ID, fmt.Sprintf("[deepmarket %s] %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, args...)))
}

func (m *JobManager) appendLog(job, s string) {
	f, err := os.OpenFile(filepath.Join(m.logDir, job+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return
	}
	f.WriteString(s)
	f.Close()
}

// Submit implements api.Jobs: it validates the spec, adds its inputs to
// storage, bids, and returns once the job has a quote to confirm (or has
// failed). With Yes the job goes on without confirmation.
func (m *JobManager) Submit(ctx context.Context, req api.SubmitRequest) (*jobs.Job, error) {
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
	if err := m.fitsSomewhere(spec); err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	sub := string(m.n.key.Address())
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
	for {
		m.mu.Lock()
		st, run := j.State, j.Current()
		quoted := run != nil && len(run.Workers) > 0 && st == jobs.Quoting
		snapshot := copyJob(j)
		m.mu.Unlock()
		if quoted || st.Terminal() || (req.Yes && st != jobs.Submitted && st != jobs.Quoting) {
			return &snapshot, nil
		}
		select {
		case <-ctx.Done():
			return &snapshot, nil
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// fitsSomewhere refuses at once a job one of whose workers no machine on
// the market could ever take, whatever is free: re-bidding would only
// find the same after half a minute. A node that holds no offers at all
// lets the market answer (schedulers may see machines it does not).
func (m *JobManager) fitsSomewhere(spec *jobs.Spec) error {
	held := m.n.book.List(time.Now())
	if len(held) == 0 {
		return nil
	}
	var best p2p.Resources
	for _, h := range held {
		l := h.Offer.Lent
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
func (m *JobManager) Confirm(ctx context.Context, id string) (*jobs.Job, error) {
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
	}
	snapshot := copyJob(j)
	return &snapshot, nil
}

// Cancel stops a job; what its workers used is paid, the rest refunded.
func (m *JobManager) Cancel(ctx context.Context, id string) (*jobs.Job, error) {
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
	if ch := m.confirm[id]; ch != nil && !j.Confirmed {
		j.Confirmed = true // wake a job waiting for confirmation, to end
		close(ch)
	}
	m.mu.Unlock()
	// Wait (a little) for the job to end.
	deadline := time.Now().Add(40 * time.Second)
	for time.Now().Before(deadline) {
		m.mu.Lock()
		done := j.State.Terminal()
		snapshot := copyJob(j)
		m.mu.Unlock()
		if done {
			return &snapshot, nil
		}
		select {
		case <-ctx.Done():
			return &snapshot, nil
		case <-time.After(200 * time.Millisecond):
		}
	}
	return m.Job(ctx, id)
}

func (m *JobManager) cancelled(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cancelRq[id]
}

func (m *JobManager) get(id string) (*jobs.Job, error) {
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
func (m *JobManager) Job(ctx context.Context, id string) (*jobs.Job, error) {
	j, err := m.get(id)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	snapshot := copyJob(j)
	return &snapshot, nil
}

// Jobs lists this node's jobs, newest first.
func (m *JobManager) Jobs(ctx context.Context) ([]jobs.Job, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]jobs.Job, 0, len(m.jobs))
	for _, j := range m.jobs {
		out = append(out, copyJob(j))
	}
	slices.SortFunc(out, func(a, b jobs.Job) int { return b.Created.Compare(a.Created) })
	return out, nil
}

// Logs returns the job's log from offset: the submitter's own lines and
// every worker's output, each line tagged with its worker.
func (m *JobManager) Logs(ctx context.Context, id string, offset int64) (api.JobLogs, error) {
	j, err := m.get(id)
	if err != nil {
		return api.JobLogs{}, err
	}
	chunk := readLogs(filepath.Join(m.logDir, j.ID+".log"), offset)
	m.mu.Lock()
	done := j.State.Terminal()
	m.mu.Unlock()
	return api.JobLogs{Data: string(chunk.Data), Next: chunk.Next, Done: done && len(chunk.Data) == 0}, nil
}
