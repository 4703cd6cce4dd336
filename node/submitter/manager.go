package submitter

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/p2p"
)

// PollEvery is how often a running job's workers are asked for their
// status, heartbeat and logs: how soon a run's end is noticed, its
// machines freed and the next job in the queue placed on them.
const PollEvery = time.Second

// StaleAfter is how long a running worker may go unheard before the
// dashboard shows it as a problem (it is lost after jobs.LostAfter).
const StaleAfter = 7 * time.Second

// Submitter timings.
const (
	quoteWait      = 2 * time.Second  // quotes gathered before choosing
	quoteWaitMax   = 10 * time.Second // waited at most for a first quote
	confirmWait    = 10 * time.Minute // an unconfirmed job is dropped after
	receiptEvery   = 30 * time.Second
	commitAttempts = 3
	cancelWait     = 40 * time.Second // Cancel waits at most this for the job to end
	// A stopped chief's checkpoint is waited for this long: the
	// executor's stop grace and time to store it.
	checkpointWait = p2p.StopGrace + 20*time.Second
)

// Manager is the submitter's side of jobs: it takes a spec to a bid,
// quotes, holds, an escrow, launched workers, and a settlement, keeping
// every step in the node store so a restarted node picks its jobs up.
type Manager struct {
	p   Params
	log *slog.Logger

	mu       sync.Mutex
	jobs     map[string]*jobs.Job
	changed  map[string]chan struct{} // job -> closed at its next save (await waits on it)
	confirm  map[string]chan struct{}
	cancels  map[string]context.CancelFunc
	cancelRq map[string]bool
	pokes    map[string]chan struct{} // job -> closed when a cancel asks a waiting job to look
	q        *queue
	ctx      context.Context
	wg       sync.WaitGroup
}

// New makes the manager of this node's jobs; Load reads the persisted
// ones, Run drives them.
func New(p Params) *Manager {
	return &Manager{p: p, log: p.Logger, jobs: map[string]*jobs.Job{}, changed: map[string]chan struct{}{},
		confirm: map[string]chan struct{}{}, cancels: map[string]context.CancelFunc{}, cancelRq: map[string]bool{},
		pokes: map[string]chan struct{}{}, q: newQueue(p.Offers, p.Starvation)}
}

// Load reads the persisted jobs; it runs before the API serves, so a
// restarted node answers for its jobs from its first request.
func (m *Manager) Load() error {
	if err := os.MkdirAll(m.p.LogDir, 0o700); err != nil {
		return err
	}
	err := m.p.Store.Each("jobs/", func(_ string, doc []byte) error {
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
func (m *Manager) Run(ctx context.Context) error {
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
		m.log.Info("resuming job after restart", "job", j.ID[:12], "state", j.State)
		m.start(j)
	}
	m.q.run(ctx)
	m.wg.Wait()
	return nil
}

func (m *Manager) start(j *jobs.Job) {
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
		c.Runs[i].Workers = cloneWorkers(j.Runs[i].Workers)
		if h := j.Runs[i].Holder; h != nil {
			hc := *h
			hc.Curve = slices.Clone(h.Curve)
			c.Runs[i].Holder = &hc
		}
	}
	c.Workers = cloneWorkers(j.Workers)
	if j.Queue != nil {
		q := *j.Queue
		c.Queue = &q
	}
	return c
}

// cloneWorkers copies ws and their curves (which grow in place).
func cloneWorkers(ws []jobs.Worker) []jobs.Worker {
	out := slices.Clone(ws)
	for i := range out {
		out[i].Curve = slices.Clone(ws[i].Curve)
	}
	return out
}

// save persists j's current state (under the manager's lock: callers
// hold no lock).
func (m *Manager) save(j *jobs.Job, f func()) {
	m.mu.Lock()
	if f != nil {
		f()
	}
	j.Updated = time.Now().UTC()
	if r := j.Current(); r != nil {
		j.Workers = cloneWorkers(r.Workers)
	}
	snapshot := copyJob(j)
	if ch, ok := m.changed[j.ID]; ok {
		close(ch) // wake whoever awaits a change of j
		delete(m.changed, j.ID)
	}
	m.mu.Unlock()
	if err := m.p.Store.Put("jobs/"+j.ID, &snapshot); err != nil {
		m.log.Error("persist job", "job", j.ID[:12], "err", err)
	}
}

// await waits until done reports true of j, looking again each time j
// is saved, or until ctx ends; it returns a copy of j as it last saw it.
// done runs with the manager's lock held.
func (m *Manager) await(ctx context.Context, j *jobs.Job, done func(j *jobs.Job) bool) jobs.Job {
	for {
		m.mu.Lock()
		ok := done(j)
		snapshot := copyJob(j)
		changed, watched := m.changed[j.ID]
		if !watched {
			changed = make(chan struct{})
			m.changed[j.ID] = changed
		}
		m.mu.Unlock()
		if ok {
			return snapshot
		}
		select {
		case <-ctx.Done():
			return snapshot
		case <-changed:
		}
	}
}

// move changes j's state, persisting it; a move the state machine does
// not allow is a bug, logged and refused.
func (m *Manager) move(j *jobs.Job, to jobs.State, reason string) bool {
	m.mu.Lock()
	from := j.State
	ok := jobs.CanMove(from, to)
	m.mu.Unlock()
	if !ok {
		m.log.Error("job state move refused", "job", j.ID[:12], "from", from, "to", to)
		return false
	}
	m.save(j, func() {
		j.State = to
		if reason != "" || to == jobs.Quoting {
			j.Reason = reason
		}
		if r := j.Current(); r != nil && to.Terminal() {
			// Workers a machine never started (a declined quote, a job
			// cancelled before launch) are released, not still placed.
			for i := range r.Workers {
				if r.Workers[i].State == jobs.WorkerPlaced {
					r.Workers[i].State = jobs.WorkerReleased
				}
			}
		}
	})
	m.logf(j, "state %s%s", to, map[bool]string{true: ": " + reason, false: ""}[reason != ""])
	return true
}

// logf appends a line of the submitter's own account to the job's log.
func (m *Manager) logf(j *jobs.Job, format string, args ...any) {
	m.appendLog(j.ID, fmt.Sprintf("[deepmarket %s] %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, args...)))
}

func (m *Manager) appendLog(job, s string) {
	f, err := os.OpenFile(filepath.Join(m.p.LogDir, job+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return
	}
	f.WriteString(s)
	f.Close()
}
