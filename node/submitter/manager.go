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

// commitAttempts bounds the quotes whose holds a job tries to commit.
const commitAttempts = 3

// timing is how long the submitter waits for things and how often it
// looks; New sets defaultTiming, tests a quicker one.
type timing struct {
	quotes      quoteWaits
	confirmWait time.Duration // an unconfirmed job is dropped after
	cancelWait  time.Duration // Cancel waits at most this for the job to end
	// poll is how often a run's workers are polled, pollStarting how
	// often while they start (in a run's first minute).
	poll, pollStarting time.Duration
	receiptEvery       time.Duration
	// stopWait is how long stopped workers are polled for their end; a
	// stopped chief's checkpoint is waited for checkpointWait.
	stopWait, checkpointWait time.Duration
	// A launch a machine asks to send again (its ledger behind) is, after
	// launchRetry, for up to launchPatience; a settlement is tried again
	// after settleRetry.
	launchRetry, launchPatience, settleRetry time.Duration
	// queueLook is how often the queue looks at the offers for room.
	queueLook time.Duration
}

var defaultTiming = timing{
	quotes:         quoteWaits{usual: 2 * time.Second, max: 10 * time.Second, quiet: time.Second, least: 250 * time.Millisecond},
	confirmWait:    10 * time.Minute,
	cancelWait:     40 * time.Second,
	poll:           PollEvery,
	pollStarting:   300 * time.Millisecond,
	receiptEvery:   30 * time.Second,
	stopWait:       p2p.StopGrace + 2*time.Second,
	checkpointWait: p2p.StopGrace + 20*time.Second, // the executor's stop grace, and time to store it
	launchRetry:    time.Second,
	launchPatience: time.Minute,
	settleRetry:    2 * time.Second,
	queueLook:      500 * time.Millisecond,
}

// Manager is the submitter's side of jobs: it takes a spec to a bid,
// quotes, holds, an escrow, launched workers, and a settlement, keeping
// every step in the node store so a restarted node picks its jobs up.
//
// Each live job has one owner, its goroutine (drive): only it reads or
// writes the job. The API reads the snapshots the goroutine publishes
// at each save, and asks for a confirmation or a cancel through the
// job's inbox, which the goroutine takes from when it looks.
type Manager struct {
	p   Params
	t   timing
	log *slog.Logger
	q   *queue

	mu sync.Mutex
	// snaps are the jobs as last saved, one each. A snapshot is never
	// written once published: a save replaces it whole.
	snaps map[string]*jobs.Job
	// live are the jobs whose goroutine runs (or is to, from Run), until
	// it ends.
	live map[string]*handle
	ctx  context.Context // Run's, nil before
	wg   sync.WaitGroup
}

// handle is the manager's side of a live job: the inbox its goroutine
// takes what is asked from, and the channel closed at the job's next save
// (or when its goroutine ends), replaced at each (under Manager.mu).
type handle struct {
	in      *inbox
	changed chan struct{}
}

// New makes the manager of this node's jobs; Load reads the persisted
// ones, Run drives them.
func New(p Params) *Manager {
	return &Manager{p: p, t: defaultTiming, log: p.Logger, q: newQueue(p.Offers, p.Starvation),
		snaps: map[string]*jobs.Job{}, live: map[string]*handle{}}
}

// Load reads the persisted jobs; it runs before the API serves, so a
// restarted node answers for its jobs from its first request.
func (m *Manager) Load() error {
	if err := os.MkdirAll(m.p.LogDir, 0o700); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	err := m.p.Store.Each("jobs/", func(_ string, doc []byte) error {
		var j jobs.Job
		if err := json.Unmarshal(doc, &j); err != nil {
			return err
		}
		m.snaps[j.ID] = &j
		if !j.State.Terminal() {
			// Asks are taken from now on: the job's goroutine starts with Run.
			m.live[j.ID] = &handle{in: newInbox(), changed: make(chan struct{})}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("load jobs: %w", err)
	}
	return nil
}

// Run resumes the live jobs and waits for ctx, then for their goroutines.
func (m *Manager) Run(ctx context.Context) error {
	m.mu.Lock()
	m.ctx = ctx
	var resume []*job
	for id, h := range m.live {
		resume = append(resume, &job{Job: copyJob(m.snaps[id]), in: h.in})
	}
	m.mu.Unlock()
	for _, j := range resume {
		m.log.Info("resuming job after restart", "job", j.ID[:12], "state", j.State)
		m.start(ctx, j)
	}
	m.q.run(ctx, m.t.queueLook)
	m.wg.Wait()
	return nil
}

// start hands j to its goroutine, its owner from now on.
func (m *Manager) start(ctx context.Context, j *job) {
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer m.finish(j.ID)
		m.drive(ctx, j)
	}()
}

// finish forgets what the manager kept of a live job once its goroutine
// ended, waking whoever awaited a change of it: none will come.
func (m *Manager) finish(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if h, ok := m.live[id]; ok {
		close(h.changed)
		delete(m.live, id)
	}
}

// copyJob copies j deeply enough that the copy and j may change apart
// (the spec, written once, is shared).
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

// save persists j as it is now, then publishes a snapshot of it to the
// readers (what they see is stored), waking whoever awaits a change of
// it.
func (m *Manager) save(j *job) {
	j.Updated = time.Now().UTC()
	if r := j.Current(); r != nil {
		j.Workers = cloneWorkers(r.Workers)
	}
	snap := copyJob(&j.Job)
	if err := m.p.Store.Put("jobs/"+j.ID, &snap); err != nil {
		m.log.Error("persist job", "job", j.ID[:12], "err", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.snaps[j.ID] = &snap
	if h, ok := m.live[j.ID]; ok {
		close(h.changed)
		h.changed = make(chan struct{})
	}
}

// await waits until done reports true of the job id as last saved,
// looking again at each save, until ctx ends or the job's goroutine
// does; it returns a copy of the snapshot it last saw.
func (m *Manager) await(ctx context.Context, id string, done func(j *jobs.Job) bool) jobs.Job {
	for {
		m.mu.Lock()
		snap := m.snaps[id]
		var changed chan struct{}
		if h, ok := m.live[id]; ok {
			changed = h.changed
		}
		m.mu.Unlock()
		if changed == nil || done(snap) {
			return copyJob(snap)
		}
		select {
		case <-ctx.Done():
			return copyJob(snap)
		case <-changed:
		}
	}
}

// move changes j's state, persisting it; a move the state machine does
// not allow is a bug, logged and refused.
func (m *Manager) move(j *job, to jobs.State, reason string) bool {
	if !jobs.CanMove(j.State, to) {
		m.log.Error("job state move refused", "job", j.ID[:12], "from", j.State, "to", to)
		return false
	}
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
	// Its log says so first: a reader that sees the job ended has its
	// whole log.
	m.logf(j.ID, "state %s%s", to, map[bool]string{true: ": " + reason, false: ""}[reason != ""])
	m.save(j)
	return true
}

// logf appends a line of the submitter's own account to the job's log.
func (m *Manager) logf(id string, format string, args ...any) {
	m.appendLog(id, fmt.Sprintf("[deepmarket %s] %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, args...)))
}

func (m *Manager) appendLog(job, s string) {
	f, err := os.OpenFile(filepath.Join(m.p.LogDir, job+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return
	}
	f.WriteString(s)
	f.Close()
}
