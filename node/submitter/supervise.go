package submitter

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/p2p"
)

// supervise polls run k's workers (status, heartbeat, receipts, logs)
// until the run ends, and says how; false when the node stops first (the
// job resumes when it restarts).
func (m *Manager) supervise(ctx context.Context, j *job, k int) (jobs.RunEnd, bool) {
	run := &j.Runs[k]
	m.heardNow(j, run)
	lastReceipt := time.Time{}
	answered := 0 // the refused rounds the last receipts' answers counted (a held run)
	lost := map[int]bool{}
	var failedSince time.Time // the first poll that found a failure
	var said progressSaid
	for {
		select {
		case <-ctx.Done():
			return jobs.RunEnd{}, false
		case <-time.After(m.pollInterval(j)):
		}
		now := time.Now()
		receipts := map[string]*p2p.Receipt{}
		// A held run's refusals reach their machines at once: the signed
		// answer is what an appeal starts from.
		if refused := refusedRounds(run); now.Sub(lastReceipt) >= m.t.receiptEvery || refused != answered {
			receipts, lastReceipt, answered = m.receipts(j, k, now), now, refused
		}
		sts := m.poll(ctx, j, k, receipts)
		if j.State == jobs.Launching && anyRunning(sts) {
			m.move(j, jobs.Running, "")
		}
		// A held run's holder is read first: its accounts of the refused
		// rounds tell a worker its machine stopped for them (the lender's
		// stop-loss) from a lost one.
		var hst *p2p.JobStatus
		if run.Held() {
			hst = m.pollHolder(ctx, j, run, now)
		}
		f := jobs.Survey(sts, run.Workers, lost, now)
		m.sayProgress(j, &said, now)
		m.look(j)
		if run.Held() {
			lost = f.Lost
			end, ended := jobs.JudgeHeld(f, hst, j.cancelled, run.Started, j.Spec.MaxDuration, now)
			if ended && end.Out == jobs.RunSucceeded {
				j.ResultCID = hst.Result
				m.save(j)
			}
			if ended {
				// Each machine gets the last word: its receipt and the
				// holder's final answer.
				m.poll(ctx, j, k, m.receipts(j, k, now))
				m.logf(j.ID, "run ends: %s", map[bool]string{true: end.Why, false: "the model's holder finished"}[end.Why != ""])
				return end, true
			}
			continue
		}
		f.Stalled = jobs.Stalled(run, j.Spec.StallAfter, now)
		if f.Failed != "" && failedSince.IsZero() {
			failedSince = now
		}
		if f.Failed != "" {
			f.FailedFor = now.Sub(failedSince)
		}
		lost = f.Lost
		if f.Result != "" {
			j.ResultCID = f.Result
			m.save(j)
		}
		if end, ended := jobs.Judge(f, j.cancelled, run.Started, j.Spec.MaxDuration, now); ended {
			m.logf(j.ID, "run ends: %s", map[bool]string{true: end.Why, false: "the chief finished"}[end.Why != ""])
			return end, true
		}
	}
}

// refusedRounds are the rounds of run's workers its holder refused.
func refusedRounds(run *jobs.Run) int {
	n := 0
	for i := range run.Workers {
		n += run.Workers[i].Refused
	}
	return n
}

// progressSaid is the progress last written to a job's log.
type progressSaid struct {
	at      time.Time
	percent float64
	eval    float64
}

// progressEvery is how often a running job's log says its progress, at
// most; it also says so at every tenth of the way and every new evaluation.
const progressEvery = time.Minute

// sayProgress writes the job's progress to its log (what `logs` and
// `submit --wait` show): steps of the planned total, the share done, the
// ETA, and the last loss, accuracy and evaluation.
func (m *Manager) sayProgress(j *job, said *progressSaid, now time.Time) {
	s := jobs.Summarize(&j.Job, now)
	if s == nil || s.Total == 0 {
		return
	}
	eval := 0.0
	if s.Evaluated {
		eval = s.Accuracy + s.Loss
	}
	if now.Sub(said.at) < progressEvery && int(s.Percent/10) == int(said.percent/10) && eval == said.eval {
		return
	}
	*said = progressSaid{at: now, percent: s.Percent, eval: eval}
	m.logf(j.ID, "%s", jobs.ProgressLine(s))
}

// pollHolder asks the model's holder of a held run how it is, pulls its
// log output and its accounts of the workers; a holder unheard for
// jobs.LostAfter (the node restarted: its processes are gone) is reported
// failed.
func (m *Manager) pollHolder(ctx context.Context, j *job, run *jobs.Run, now time.Time) *p2p.JobStatus {
	h := *run.Holder
	idx := len(run.Workers)
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := m.p.Machines.Status(cctx, h.Machine, p2p.StatusReq{JobID: run.ID, Index: idx})
	if err != nil {
		if now.Sub(h.LastSeen) > jobs.LostAfter {
			return &p2p.JobStatus{State: p2p.WorkerFailed, Reason: "it stopped answering (" + err.Error() + ")"}
		}
		return nil
	}
	if st.LogBytes > h.LogOffset {
		if lg, err := m.p.Machines.Logs(cctx, h.Machine, p2p.LogsReq{JobID: run.ID, Index: idx, Offset: h.LogOffset}); err == nil && len(lg.Data) > 0 {
			m.appendLog(j.ID, tagLines("[h] ", lg.Data))
			h.LogOffset = lg.Next
		}
	}
	var doc struct {
		Round   int                           `json:"round"`
		Workers map[string]jobs.HolderAccount `json:"workers"`
	}
	b, err := m.p.Holders.HolderAccounts(run.ID, idx)
	if err == nil && b != nil {
		err = json.Unmarshal(b, &doc)
	}
	if err != nil {
		m.p.Logger.Warn("the holder's accounts cannot be read", "job", j.ID, "err", err)
	}
	run.Holder.State, run.Holder.ExitCode, run.Holder.Reason, run.Holder.LastSeen = st.State, st.ExitCode, st.Reason, now.UTC()
	run.Holder.LogOffset = h.LogOffset
	if p := st.Progress; p != nil && st.Validate(run.ID, idx) == nil {
		recordTraining(run.Holder, p, run.Started, now)
	}
	jobs.ApplyAccounts(run, doc.Workers)
	run.HolderRounds = max(run.HolderRounds, doc.Round)
	m.save(j)
	m.bench(ctx, j, run)
	return &st
}

// bench stops the workers of held run that jobs.Benched lists, while the
// run goes on: what they are paid (their floor) stops with them.
func (m *Manager) bench(ctx context.Context, j *job, run *jobs.Run) {
	for i, why := range jobs.Benched(run) {
		w := &run.Workers[i]
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := m.p.Machines.Stop(cctx, w.Machine, p2p.Stop{JobID: run.ID, Index: i, Reason: "stopped by the submitter: " + why})
		cancel()
		if err != nil {
			m.logf(j.ID, "worker %d on %s: could not stop it (%v); trying again at the next poll", i, w.Machine, err)
			continue
		}
		w.Benched = why
		m.logf(j.ID, "worker %d on %s stopped: %s", i, w.Machine, why)
	}
	m.save(j)
}

// heardNow counts run's live workers as heard from now. Supervising
// starts so: after a restart the workers ran on meanwhile, and are lost
// only if they stay silent from now.
func (m *Manager) heardNow(j *job, run *jobs.Run) {
	now := time.Now().UTC()
	for i := range run.Workers {
		if run.Workers[i].Ended.IsZero() {
			run.Workers[i].LastSeen = now
		}
	}
	m.save(j)
}

// pollInterval is PollEvery, but quicker while the workers start, so a
// job shows running as soon as it does.
func (m *Manager) pollInterval(j *job) time.Duration {
	if r := j.Current(); r != nil && time.Since(r.Started) < time.Minute {
		for _, w := range r.Workers {
			if w.State != p2p.WorkerRunning {
				return m.t.pollStarting
			}
		}
	}
	return m.t.poll
}

// poll asks each worker of run k how it is, carrying receipts, and pulls
// new log output into the job's log. A nil status is a worker that did
// not answer.
func (m *Manager) poll(ctx context.Context, j *job, k int, receipts map[string]*p2p.Receipt) []*p2p.JobStatus {
	run := &j.Runs[k]
	sts := make([]*p2p.JobStatus, len(run.Workers))
	offsets := make([]int64, len(run.Workers))
	var wg sync.WaitGroup
	for i := range run.Workers {
		w := run.Workers[i]
		wg.Add(1)
		go func() {
			defer wg.Done()
			sts[i], offsets[i] = m.pollWorker(ctx, j.ID, run.ID, i, w, receipts[w.Payee])
		}()
	}
	wg.Wait()
	for i := range run.Workers {
		run.Workers[i].LogOffset = offsets[i]
	}
	recordStatuses(&j.Job, run, sts, time.Now().UTC())
	m.save(j)
	return sts
}

// pollWorker asks worker i of run runID of job id (w is a copy) how it
// is, carrying its machine's receipt, and pulls its new log output into
// the job's log; nil when it did not answer. It returns the log offset
// read to.
func (m *Manager) pollWorker(ctx context.Context, id, runID string, i int, w jobs.Worker, receipt *p2p.Receipt) (*p2p.JobStatus, int64) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := m.p.Machines.Status(cctx, w.Machine, p2p.StatusReq{JobID: runID, Index: i, Receipt: receipt})
	if err != nil {
		return nil, w.LogOffset
	}
	if err := st.Validate(runID, i); err != nil {
		m.p.Logger.Warn("a machine's report on its worker does not check out; taken as no answer", "job", id, "worker", i, "machine", w.Machine, "err", err)
		return nil, w.LogOffset
	}
	if st.LogBytes > w.LogOffset {
		if lg, err := m.p.Machines.Logs(cctx, w.Machine, p2p.LogsReq{JobID: runID, Index: i, Offset: w.LogOffset}); err == nil && len(lg.Data) > 0 {
			m.appendLog(id, tagLines(fmt.Sprintf("[w%d] ", i), lg.Data))
			return &st, lg.Next
		}
	}
	return &st, w.LogOffset
}

// recordStatuses records in run's workers what a poll at now found (the
// chief's checkpoint in j).
func recordStatuses(j *jobs.Job, run *jobs.Run, sts []*p2p.JobStatus, now time.Time) {
	for i, st := range sts {
		if st == nil {
			continue
		}
		w := &run.Workers[i]
		w.State, w.ExitCode, w.Reason, w.LastSeen = st.State, st.ExitCode, st.Reason, now
		// A machine that says its worker was suspended longer only earns
		// less: the figure is taken as it comes, never below what it said.
		w.SuspendedNow = st.Suspended
		w.Suspended = max(w.Suspended, time.Duration(st.SuspendedMs)*time.Millisecond)
		if st.Started > 0 {
			w.Started = clampTime(time.UnixMilli(st.Started), run.Started, now)
		}
		if st.Ended > 0 {
			w.Ended = clampTime(time.UnixMilli(st.Ended), run.Started, now)
		}
		if i == 0 && st.Checkpoint != "" {
			j.Checkpoint = st.Checkpoint
		}
		if p := st.Progress; p != nil {
			// Only growth counts, timed by this node's clock: a machine
			// cannot date its worker's progress.
			if w.ProgressAt.IsZero() || p.Units > w.Units {
				w.ProgressAt = now
			}
			w.Units, w.Loss, run.Progress = max(w.Units, p.Units), p.Loss, true
			recordTraining(w, p, run.Started, now)
		}
	}
}

// recordTraining notes a training program's report in w (its curve).
func recordTraining(w *jobs.Worker, p *p2p.Progress, started, now time.Time) {
	steps := p.Steps
	if steps == 0 && p.Total == 0 {
		steps = p.Units // a report of units alone: its curve is over them
	}
	jobs.Record(w, steps, p.Total, p.Loss, p.Accuracy, p.EvalLoss, p.EvalAccuracy, p.EvalAt, now.Sub(started).Seconds())
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

// receipts signs, for each machine of run k, what its workers have earned
// so far.
func (m *Manager) receipts(j *job, k int, now time.Time) map[string]*p2p.Receipt {
	run := &j.Runs[k]
	out := map[string]*p2p.Receipt{}
	for payee, amount := range jobs.OwedSoFar(run, now) {
		seq := uint64(0)
		for i := range run.Workers {
			if run.Workers[i].Payee == payee {
				run.Workers[i].ReceiptSeq++
				run.Workers[i].Receipt = amount
				seq = max(seq, run.Workers[i].ReceiptSeq)
			}
		}
		r := m.p.Ledger.SignReceipt(ledger.Receipt{Job: run.ID, Payee: payee, Amount: amount, Seq: seq})
		out[payee] = &p2p.Receipt{Payee: payee, Amount: r.Amount, Seq: r.Seq, Sig: r.Sig}
		if run.Held() {
			a := m.p.Ledger.SignAnswer(jobs.AnswerTo(run, payee, j.Spec.Training))
			out[payee].Answer = &p2p.Answer{Round: a.Round, Accepted: a.Accepted, Refused: a.Refused, AcceptedMillis: a.AcceptedMillis,
				Reason: a.Reason, Forfeited: a.Forfeited, Refusal: (*p2p.Refusal)(a.Refusal), Sig: a.Sig}
		}
	}
	m.save(j)
	return out
}

// stopAll stops every worker of run k (keeping the chief's checkpoint
// when asked).
func (m *Manager) stopAll(ctx context.Context, j *job, k int, reason string, checkpoint bool) {
	run := &j.Runs[k]
	var wg sync.WaitGroup
	for i, w := range run.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			m.p.Machines.Stop(cctx, w.Machine, p2p.Stop{JobID: run.ID, Index: i, Reason: reason, Checkpoint: checkpoint && i == 0})
		}()
	}
	wg.Wait()
	if h := run.Holder; h != nil {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		m.p.Machines.Stop(cctx, h.Machine, p2p.Stop{JobID: run.ID, Index: len(run.Workers), Reason: reason})
		cancel()
	}
	// Then look until each worker that answers has ended, to record when:
	// a machine stops its worker after replying, within StopGrace.
	deadline := time.Now().Add(m.t.stopWait)
	for {
		sts := m.poll(ctx, j, k, nil)
		if allEnded(sts) || !time.Now().Before(deadline) || ctx.Err() != nil {
			return
		}
		time.Sleep(m.t.pollStarting)
	}
}

// allEnded: every worker that answered reports an end.
func allEnded(sts []*p2p.JobStatus) bool {
	for _, st := range sts {
		if st != nil && st.Ended == 0 {
			return false
		}
	}
	return true
}

// awaitCheckpoint waits for the stopped chief's checkpoint CID.
func (m *Manager) awaitCheckpoint(ctx context.Context, j *job, k int) {
	deadline := time.Now().Add(m.t.checkpointWait)
	for time.Now().Before(deadline) && j.Checkpoint == "" {
		time.Sleep(m.t.poll)
		m.poll(ctx, j, k, nil)
	}
}

// finalStop tells every machine of run k it may forget the worker.
func (m *Manager) finalStop(ctx context.Context, j *job, k int) {
	run := &j.Runs[k]
	for i, w := range run.Workers {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		m.p.Machines.Stop(cctx, w.Machine, p2p.Stop{JobID: run.ID, Index: i, Final: true})
		cancel()
	}
	if h := run.Holder; h != nil {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		m.p.Machines.Stop(cctx, h.Machine, p2p.Stop{JobID: run.ID, Index: len(run.Workers), Final: true})
		cancel()
	}
}
