package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"golang.org/x/sync/errgroup"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/ledger"
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

// place bids run k of j, chooses a quote, waits for confirmation,
// commits the holds, opens the escrow and launches; then supervises.
func (m *JobManager) place(ctx context.Context, j *jobs.Job, k int) {
	runID := jobs.RunID(j.ID, k)
	var resume string
	m.mu.Lock()
	resume = j.Checkpoint
	m.mu.Unlock()
	bids := 0
	for attempt := 0; ; attempt++ {
		if m.cancelled(j.ID) {
			m.move(j, jobs.Cancelled, "cancelled before launch")
			return
		}
		if attempt >= commitAttempts {
			m.move(j, jobs.Failed, fmt.Sprintf("machines kept refusing to commit their holds (%d tries)", attempt))
			return
		}
		if j.State != jobs.Quoting && !m.move(j, jobs.Quoting, "") {
			return
		}
		run, why := m.quote(ctx, j, runID)
		if run == nil && bids < rebids && !strings.HasPrefix(why, "no scheduler answered") {
			// Capacity frees as other jobs end (or, re-placing, as the
			// previous run's workers stop): bid again a few times.
			bids++
			m.logf(j, "no placement yet (%s): bidding again in %s", why, rebidEvery)
			select {
			case <-ctx.Done():
				return
			case <-time.After(rebidEvery + time.Duration(rand.IntN(1000))*time.Millisecond):
			}
			attempt--
			continue
		}
		if run == nil {
			m.move(j, jobs.Failed, why)
			return
		}
		m.save(j, func() {
			if len(j.Runs) > k {
				j.Runs[k] = *run
			} else {
				j.Runs = append(j.Runs, *run)
			}
		})
		m.logf(j, "quote: %d workers on %s, %s credits an hour, at most %s credits", len(run.Workers),
			machinesOf(run), units.FormatCredits(run.PerHour), units.FormatCredits(run.Quoted))
		// Confirmation, unless given.
		m.mu.Lock()
		ch := m.confirm[j.ID]
		confirmed := j.Confirmed
		m.mu.Unlock()
		if !confirmed {
			select {
			case <-ctx.Done():
				return
			case <-ch:
			case <-time.After(confirmWait):
				m.releaseHolds(ctx, run)
				m.move(j, jobs.Cancelled, "not confirmed within "+confirmWait.String())
				return
			}
			if m.cancelled(j.ID) {
				m.releaseHolds(ctx, run)
				m.move(j, jobs.Cancelled, "cancelled before launch")
				return
			}
			if time.Now().After(run.HeldUntil) {
				m.releaseHolds(ctx, run)
				m.logf(j, "the holds lapsed while waiting for confirmation: re-quoting")
				attempt--
				continue
			}
		}
		m.move(j, jobs.Reserving, "")
		if err := m.commit(ctx, run); err != nil {
			m.logf(j, "commit: %v; re-quoting", err)
			m.releaseHolds(ctx, run)
			continue
		}
		break
	}
	// Escrow: the job's max price (what earlier runs spent is gone).
	run := &j.Runs[k]
	budget := j.Spec.MaxPrice - min(j.Cost, j.Spec.MaxPrice)
	payees := []string{}
	for _, w := range run.Workers {
		if !slices.Contains(payees, w.Payee) {
			payees = append(payees, w.Payee)
		}
	}
	expiry := time.Now().Add(j.Spec.MaxDuration + m.n.cfg.Jobs.EscrowSlack.Duration).Unix()
	tx, err := m.n.ledger.OpenEscrow(ctx, ledger.OpenEscrow{Job: runID, Amount: budget, Expiry: expiry, Payees: payees})
	if err != nil {
		m.releaseHolds(context.WithoutCancel(ctx), run)
		m.move(j, jobs.Failed, "open escrow: "+ledgerReason(err))
		return
	}
	m.save(j, func() { run.Escrow = budget })
	m.logf(j, "escrow of %s credits opened (tx %s)", units.FormatCredits(budget), tx.Hash.String())
	m.move(j, jobs.Escrowed, "")
	m.move(j, jobs.Launching, "")
	if err := m.launch(ctx, j, k, resume); err != nil {
		m.logf(j, "launch: %v", err)
		bg := context.WithoutCancel(ctx)
		m.stopAll(bg, j, k, "launch failed", false)
		m.settle(bg, j, k, nil)
		m.finalStop(bg, j, k)
		m.releaseHolds(bg, run)
		if k+1 < maxRuns {
			m.place(ctx, j, k+1)
			return
		}
		m.move(j, jobs.Failed, "launch failed: "+err.Error())
		return
	}
	m.supervise(ctx, j, k)
}

func ledgerReason(err error) string {
	var lerr *ledger.Error
	if errors.As(err, &lerr) {
		return lerr.Reason
	}
	return err.Error()
}

func machinesOf(r *jobs.Run) string {
	var names []string
	for _, w := range r.Workers {
		name := w.Moniker
		if name == "" {
			name = w.Machine[len(w.Machine)-8:]
		}
		if w.Site != "" {
			name += " (" + w.Site + ")"
		}
		names = append(names, name)
	}
	return strings.Join(names, ", ")
}

// quote publishes run's bid and picks the cheapest placement offered; the
// other quotes' holds are released.
func (m *JobManager) quote(ctx context.Context, j *jobs.Job, runID string) (*jobs.Run, string) {
	s := &j.Spec
	bid := p2p.Bid{JobID: runID, Workers: uint32(s.Workers),
		PerWorker: p2p.Resources{Cores: uint32(s.Cores), MemBytes: s.MemBytes, GPUs: uint32(s.GPUs)},
		MaxPrice:  s.MaxPrice - min(j.Cost, s.MaxPrice), Duration: int64(s.MaxDuration / time.Second),
		BundleCID: j.BundleCID, DatasetCID: j.DatasetCID, Framework: s.Framework, Site: s.Site}
	if !s.Deadline.IsZero() {
		bid.Deadline = s.Deadline.Unix()
	}
	m.n.quotes.forget(runID) // a bid again: only new quotes count
	if _, err := m.n.PublishBid(ctx, api.PublishBidRequest{Bid: bid, TTL: "2m"}); err != nil {
		return nil, "publish bid: " + err.Error()
	}
	start := time.Now()
	var qs []api.ReceivedQuote
	lastNew, count := start, 0
	for {
		select {
		case <-ctx.Done():
			return nil, "stopped"
		case <-time.After(200 * time.Millisecond):
		}
		qs = m.n.quotes.list(runID)
		now := time.Now()
		if len(qs) > count {
			count, lastNew = len(qs), now
		}
		waited := now.Sub(start)
		// Enough: a placement after the usual wait; or only refusals, and
		// no scheduler has said anything more for a second; or the limit.
		if (waited >= quoteWait && hasPlacement(qs)) || (waited >= quoteWait && count > 0 && now.Sub(lastNew) >= time.Second) ||
			waited >= quoteWaitMax {
			break
		}
	}
	var best *api.ReceivedQuote
	var reasons []string
	for i := range qs {
		q := &qs[i]
		if len(q.Workers) == 0 {
			if len(reasons) < 5 {
				reasons = append(reasons, q.Reason)
			}
			continue
		}
		if best == nil || q.Total < best.Total {
			best = q
		}
	}
	for i := range qs {
		if q := &qs[i]; q != best && len(q.Workers) > 0 {
			r := runOf(q, m.n)
			m.releaseHolds(ctx, r)
		}
	}
	if best == nil {
		if len(reasons) == 0 {
			return nil, "no scheduler answered the bid: are any machines lending on this network?"
		}
		// Schedulers that see the same machines give the same reason.
		slices.Sort(reasons)
		return nil, "no machine can take the job now: " + strings.Join(slices.Compact(reasons), "; ")
	}
	return runOf(best, m.n), ""
}

func hasPlacement(qs []api.ReceivedQuote) bool {
	for _, q := range qs {
		if len(q.Workers) > 0 {
			return true
		}
	}
	return false
}

// runOf turns a quote into a run's plan.
func runOf(q *api.ReceivedQuote, n *Node) *jobs.Run {
	r := &jobs.Run{ID: q.JobID, PerHour: q.PerHour, Quoted: q.Total, Scheduler: q.Scheduler,
		HeldUntil: time.UnixMilli(q.HeldUntil)}
	offers := map[string]p2p.Offer{}
	for _, h := range n.book.List(time.Now()) {
		offers[h.Offer.Machine] = h.Offer
	}
	for _, w := range q.Workers {
		o := offers[w.Machine]
		r.Workers = append(r.Workers, jobs.Worker{Machine: w.Machine, Moniker: o.Moniker, Site: o.Site,
			Payee: payeeOf(w.Machine), Hold: w.Hold, PerHour: w.PerHour, State: "placed"})
	}
	return r
}

// payeeOf is the ledger address a machine is paid at: its key's.
func payeeOf(machine string) string {
	id, err := peer.Decode(machine)
	if err != nil {
		return ""
	}
	pub, err := id.ExtractPublicKey()
	if err != nil {
		return ""
	}
	raw, err := pub.Raw()
	if err != nil {
		return ""
	}
	return string(identity.AddressOf(raw))
}

// machineAddrs is where a machine's offer says it listens.
func (n *Node) machineAddrs(machine string) []string {
	for _, h := range n.book.List(time.Now()) {
		if h.Offer.Machine == machine {
			return h.Offer.Addrs
		}
	}
	return nil
}

// holdsOf lists a run's distinct (machine, hold) pairs.
func holdsOf(r *jobs.Run) [][2]string {
	var out [][2]string
	for _, w := range r.Workers {
		p := [2]string{w.Machine, w.Hold}
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

func (m *JobManager) releaseHolds(ctx context.Context, r *jobs.Run) {
	for _, h := range holdsOf(r) {
		id, err := peer.Decode(h[0])
		if err != nil {
			continue
		}
		m.n.reserve(ctx, id, m.n.machineAddrs(h[0]), p2p.Reserve{Op: p2p.OpRelease, ID: h[1], JobID: r.ID})
	}
}

// commit turns every hold of the run into a commitment; one refusal
// fails the whole (the caller releases and re-quotes).
func (m *JobManager) commit(ctx context.Context, r *jobs.Run) error {
	g, gctx := errgroup.WithContext(ctx)
	for _, h := range holdsOf(r) {
		g.Go(func() error {
			id, err := peer.Decode(h[0])
			if err != nil {
				return err
			}
			reply, err := m.n.reserve(gctx, id, m.n.machineAddrs(h[0]), p2p.Reserve{Op: p2p.OpCommit, ID: h[1], JobID: r.ID})
			if err != nil {
				return err
			}
			if !reply.OK {
				return fmt.Errorf("%s: %s", h[0], reply.Reason)
			}
			return nil
		})
	}
	return g.Wait()
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

// outcome is how a run ended.
type outcome int

const (
	succeeded outcome = iota
	programFailed
	workerLost
	wasCancelled
	timedOut
)

// supervise polls run k's workers (status, heartbeat, receipts, logs)
// until the run ends, then stops the rest, settles, and either finishes
// the job or re-places it.
func (m *JobManager) supervise(ctx context.Context, j *jobs.Job, k int) {
	run := &j.Runs[k]
	// Resuming after a restart: the workers ran on meanwhile; they are lost
	// only if they stay silent from now.
	m.save(j, func() {
		now := time.Now().UTC()
		for i := range run.Workers {
			if run.Workers[i].Ended.IsZero() {
				run.Workers[i].LastSeen = now
			}
		}
	})
	lastReceipt := time.Time{}
	var out outcome
	lost := map[int]bool{}
	for {
		select {
		case <-ctx.Done():
			return // the node stops; the job resumes when it restarts
		case <-time.After(m.pollInterval(j)):
		}
		now := time.Now()
		sendReceipts := now.Sub(lastReceipt) >= receiptEvery
		receipts := map[string]*p2p.Receipt{}
		if sendReceipts {
			receipts = m.receipts(j, k, now)
			lastReceipt = now
		}
		sts := m.poll(ctx, j, k, receipts)
		if j.State == jobs.Launching {
			for _, st := range sts {
				if st != nil && st.State == p2p.WorkerRunning {
					m.move(j, jobs.Running, "")
					break
				}
			}
		}
		done, success, why := true, false, ""
		for i, st := range sts {
			w := &run.Workers[i]
			switch {
			case st == nil:
				if now.Sub(w.LastSeen) > lostAfter {
					lost[i] = true
				}
				done = false
			case st.State == p2p.WorkerStopped:
				lost[i] = true // its machine stopped it: withdrawn or shutting down
			case st.State == p2p.WorkerFailed:
				why = fmt.Sprintf("worker %d on %s failed: %s", i, w.Moniker, st.Reason)
			case st.State == p2p.WorkerExited && st.ExitCode != 0:
				why = fmt.Sprintf("worker %d on %s %s", i, w.Moniker, st.Reason)
			case st.State == p2p.WorkerExited && i == 0 && st.Result != "":
				success = true
				m.save(j, func() { j.ResultCID = st.Result })
			case st.State != p2p.WorkerExited:
				done = false
			}
		}
		unreachable := false
		for _, st := range sts {
			unreachable = unreachable || st == nil
		}
		ended := true
		switch {
		case why != "" && unreachable && len(lost) == 0:
			// A worker failing while another is unreachable is most
			// likely the consequence (its collective ops broke): wait to
			// see whether the unreachable one is lost.
			ended = false
		case len(lost) > 0:
			out, why = workerLost, fmt.Sprintf("lost %d worker(s): no answer for %s, or stopped by their machine", len(lost), lostAfter)
		case why != "":
			out = programFailed
		case success:
			out = succeeded
		case m.cancelled(j.ID):
			out, why = wasCancelled, "cancelled"
		case !run.Started.IsZero() && now.Sub(run.Started) > j.Spec.MaxDuration+time.Minute:
			out, why = timedOut, "max duration "+j.Spec.MaxDuration.String()+" reached"
		case done:
			out, why = programFailed, "every worker exited but the chief left no result"
		default:
			ended = false
		}
		if !ended {
			continue
		}
		bg := context.WithoutCancel(ctx)
		m.logf(j, "run ends: %s", map[bool]string{true: why, false: "the chief finished"}[why != ""])
		// Stop the others; on a lost worker the chief keeps a checkpoint.
		ckpt := out == workerLost && sts[0] != nil // the chief's machine answers
		m.stopAll(bg, j, k, why, ckpt)
		if ckpt {
			m.awaitCheckpoint(bg, j, k)
		}
		m.settle(bg, j, k, lost)
		// The machines may forget the run (its holds freed for a re-placed
		// run); the chief's output or checkpoint is already in storage.
		m.finalStop(bg, j, k)
		if j.State == jobs.Launching && out == succeeded {
			m.move(j, jobs.Running, "") // it ran, between two polls
		}
		switch {
		case out == succeeded:
			m.move(j, jobs.Succeeded, "")
		case out == wasCancelled:
			m.move(j, jobs.Cancelled, "cancelled by the submitter")
		case out == workerLost && k+1 < maxRuns:
			m.logf(j, "re-placing the job once on other machines%s", map[bool]string{true: " from the chief's checkpoint", false: ""}[j.Checkpoint != ""])
			m.move(j, jobs.Quoting, why+": re-placing")
			m.place(ctx, j, k+1)
		default:
			m.move(j, jobs.Failed, why)
		}
		return
	}
}

// pollInterval is pollEvery, but quicker while the workers start, so a
// job shows running as soon as it does.
func (m *JobManager) pollInterval(j *jobs.Job) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r := j.Current(); r != nil && time.Since(r.Started) < time.Minute {
		for _, w := range r.Workers {
			if w.State != p2p.WorkerRunning {
				return 300 * time.Millisecond
			}
		}
	}
	return pollEvery
}

// poll asks each worker of run k how it is, carrying receipts, and pulls
// new log output into the job's log. A nil status is a worker that did
// not answer.
func (m *JobManager) poll(ctx context.Context, j *jobs.Job, k int, receipts map[string]*p2p.Receipt) []*p2p.JobStatus {
	run := &j.Runs[k]
	sts := make([]*p2p.JobStatus, len(run.Workers))
	var wg sync.WaitGroup
	for i := range run.Workers {
		w := run.Workers[i]
		wg.Add(1)
		go func() {
			defer wg.Done()
			var st p2p.JobStatus
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			if err := m.n.jobCall(cctx, w.Machine, p2p.TypeStatusReq, &p2p.StatusReq{JobID: run.ID, Index: i, Receipt: receipts[w.Payee]},
				p2p.TypeJobStatus, &st); err != nil {
				return
			}
			sts[i] = &st
			if st.LogBytes > w.LogOffset {
				var lg p2p.Logs
				if err := m.n.jobCall(cctx, w.Machine, p2p.TypeLogsReq, &p2p.LogsReq{JobID: run.ID, Index: i, Offset: w.LogOffset},
					p2p.TypeLogs, &lg); err == nil && len(lg.Data) > 0 {
					m.appendLog(j.ID, tagLines(fmt.Sprintf("[w%d] ", i), lg.Data))
					w.LogOffset = lg.Next
				}
			}
			m.mu.Lock()
			run.Workers[i].LogOffset = w.LogOffset
			m.mu.Unlock()
		}()
	}
	wg.Wait()
	now := time.Now().UTC()
	m.save(j, func() {
		for i, st := range sts {
			if st == nil {
				continue
			}
			w := &run.Workers[i]
			w.State, w.ExitCode, w.Reason, w.LastSeen = st.State, st.ExitCode, st.Reason, now
			if st.Started > 0 {
				w.Started = clampTime(time.UnixMilli(st.Started), run.Started, now)
			}
			if st.Ended > 0 {
				w.Ended = clampTime(time.UnixMilli(st.Ended), run.Started, now)
			}
			if i == 0 && st.Checkpoint != "" {
				j.Checkpoint = st.Checkpoint
			}
		}
	})
	return sts
}

func clampTime(t, lo, hi time.Time) time.Time {
	if t.Before(lo) {
		return lo
	}
	if t.After(hi) {
		return hi
	}
	return t
}

func tagLines(tag string, b []byte) string {
	s := string(b)
	trail := strings.HasSuffix(s, "\n")
	s = strings.TrimSuffix(s, "\n")
	s = tag + strings.ReplaceAll(s, "\n", "\n"+tag)
	if trail {
		s += "\n"
	}
	return s
}

// used is what worker w of run k has earned by now: its hourly price for
// the time it ran.
func used(run *jobs.Run, w *jobs.Worker, now time.Time) uint64 {
	if w.Started.IsZero() {
		return 0
	}
	end := now
	if !w.Ended.IsZero() {
		end = w.Ended
	} else if !w.LastSeen.IsZero() && w.LastSeen.Before(now) {
		end = w.LastSeen
	}
	if end.Before(w.Started) {
		return 0
	}
	return uint64(float64(w.PerHour) * end.Sub(w.Started).Hours())
}

// receipts signs, for each machine of run k, what its workers have earned
// so far.
func (m *JobManager) receipts(j *jobs.Job, k int, now time.Time) map[string]*p2p.Receipt {
	run := &j.Runs[k]
	owed := map[string]uint64{}
	m.mu.Lock()
	for i := range run.Workers {
		owed[run.Workers[i].Payee] += used(run, &run.Workers[i], now)
	}
	m.mu.Unlock()
	out := map[string]*p2p.Receipt{}
	m.save(j, func() {
		for payee, amount := range owed {
			amount = min(amount, run.Escrow)
			seq := uint64(0)
			for i := range run.Workers {
				if run.Workers[i].Payee == payee {
					run.Workers[i].ReceiptSeq++
					run.Workers[i].Receipt = amount
					seq = max(seq, run.Workers[i].ReceiptSeq)
				}
			}
			r := m.n.ledger.SignReceipt(ledger.Receipt{Job: run.ID, Payee: payee, Amount: amount, Seq: seq})
			out[payee] = &p2p.Receipt{Payee: payee, Amount: r.Amount, Seq: r.Seq, Sig: r.Sig}
		}
	})
	return out
}

// stopAll stops every worker of run k (keeping the chief's checkpoint
// when asked).
func (m *JobManager) stopAll(ctx context.Context, j *jobs.Job, k int, reason string, checkpoint bool) {
	run := &j.Runs[k]
	var wg sync.WaitGroup
	for i, w := range run.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var st p2p.JobStatus
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			m.n.jobCall(cctx, w.Machine, p2p.TypeStop, &p2p.Stop{JobID: run.ID, Index: i, Reason: reason, Checkpoint: checkpoint && i == 0},
				p2p.TypeJobStatus, &st)
		}()
	}
	wg.Wait()
	// One more look, to record when each ended.
	m.poll(ctx, j, k, nil)
}

// awaitCheckpoint waits for the stopped chief's checkpoint CID.
func (m *JobManager) awaitCheckpoint(ctx context.Context, j *jobs.Job, k int) {
	deadline := time.Now().Add(stopGrace + 20*time.Second)
	for time.Now().Before(deadline) && j.Checkpoint == "" {
		time.Sleep(time.Second)
		m.poll(ctx, j, k, nil)
	}
}

// finalStop tells every machine of run k it may forget the worker.
func (m *JobManager) finalStop(ctx context.Context, j *jobs.Job, k int) {
	run := &j.Runs[k]
	for i, w := range run.Workers {
		var st p2p.JobStatus
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		m.n.jobCall(cctx, w.Machine, p2p.TypeStop, &p2p.Stop{JobID: run.ID, Index: i, Final: true}, p2p.TypeJobStatus, &st)
		cancel()
	}
}

// settle pays each machine of run k its hourly price for the time its
// workers ran (a lost machine what its receipts cover) and refunds the
// rest; the ledger records each machine's job as completed or failed.
func (m *JobManager) settle(ctx context.Context, j *jobs.Job, k int, lost map[int]bool) {
	run := &j.Runs[k]
	if run.Settled || run.Escrow == 0 {
		return
	}
	now := time.Now()
	owed := map[string]uint64{}
	failed := map[string]bool{}
	var order []string
	m.mu.Lock()
	for i := range run.Workers {
		w := &run.Workers[i]
		if !slices.Contains(order, w.Payee) {
			order = append(order, w.Payee)
		}
		if lost[i] {
			failed[w.Payee] = true
			owed[w.Payee] = max(owed[w.Payee], w.Receipt)
			continue
		}
		if w.State == p2p.WorkerFailed {
			failed[w.Payee] = true
		}
		owed[w.Payee] += used(run, w, now)
	}
	m.mu.Unlock()
	var total uint64
	for _, p := range order {
		total += owed[p]
	}
	// Never more than the escrow holds: scale down if rounding went over.
	if total > run.Escrow {
		for _, p := range order {
			owed[p] = owed[p] * run.Escrow / total
		}
		total = 0
		for _, p := range order {
			total += owed[p]
		}
	}
	pays := make([]ledger.Payment, 0, len(order))
	for _, p := range order {
		pays = append(pays, ledger.Payment{Machine: p, Amount: owed[p], Failed: failed[p]})
	}
	var tx string
	for attempt := 0; attempt < 5; attempt++ {
		res, err := m.n.ledger.Settle(ctx, ledger.Settle{Job: run.ID, Payments: pays})
		if err == nil {
			tx = res.Hash.String()
			break
		}
		var lerr *ledger.Error
		if errors.As(err, &lerr) && lerr.Code == ledger.CodeUnknownEscrow {
			m.logf(j, "settle: the escrow is gone (claimed or expired): %s", lerr.Reason)
			break
		}
		m.logf(j, "settle: %v (retrying)", err)
		time.Sleep(2 * time.Second)
	}
	m.save(j, func() {
		run.Settled, run.SettleTx, run.Paid, run.Ended = tx != "", tx, total, now.UTC()
		if tx != "" {
			j.Cost += total
		}
	})
	if tx != "" {
		m.logf(j, "settled: paid %s credits to %d machine(s), refunded %s (tx %s)", units.FormatCredits(total), len(order), units.FormatCredits(run.Escrow-total), tx)
	}
}
