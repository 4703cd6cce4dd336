package lender

import (
	"bufio"
	"bytes"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/p2p"
)

// TestLongFailureIsReported: a worker whose preparation fails with an
// error longer than a status report's reason may be (its command names a
// file of 460 bytes, much of it in two-byte characters, that the bundle
// does not have) is reported failed with the error clipped at a character
// boundary: a report the submitter's check accepts, where the whole error
// made the report count as no answer. The machine's log says why in full.
func TestLongFailureIsReported(t *testing.T) {
	var logs bytes.Buffer
	e := workAreaExecutor(t, filepath.Join(t.TempDir(), "work"), newMemStore())
	e.log = slog.New(slog.NewJSONHandler(&logs, nil))
	e.workers = map[string]*worker{}
	job, bidder := randomJobID(t), peer.ID("the-submitter")
	prog := strings.Repeat("données/", 50) + "train.py"
	name := workerName(job, 1)
	w := &worker{l: p2p.Launch{JobID: job, Index: 1, World: []string{"chief", "this"}, Command: []string{prog, "--epochs", "3"}},
		bidder: bidder, key: workerKey(job, 1), name: name, dir: filepath.Join(e.dir, name), box: name + "-test",
		state: p2p.WorkerFetching, beat: time.Now(), done: make(chan struct{})}
	e.workers[w.key] = w
	e.run(t.Context(), w)
	close(w.done)

	// The submitter asks, as over the job protocol: the reply is encoded
	// and decoded, then checked as pollWorker checks it.
	req, err := p2p.Marshal(&p2p.StatusReq{JobID: job, Index: 1})
	if err != nil {
		t.Fatal(err)
	}
	typ, reply, err := e.Handle(t.Context(), bidder, &p2p.Envelope{Type: p2p.TypeStatusReq, Payload: req})
	if err != nil || typ != p2p.TypeJobStatus {
		t.Fatalf("status: %s, %v", typ, err)
	}
	b, err := p2p.Marshal(reply)
	if err != nil {
		t.Fatal(err)
	}
	var st p2p.JobStatus
	if err := p2p.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	if err := st.Validate(job, 1); err != nil {
		t.Fatalf("the report does not check out, so the submitter hears nothing: %v", err)
	}
	const start = `command[0] "./données/données/`
	if st.State != p2p.WorkerFailed || !strings.HasPrefix(st.Reason, start) || !strings.HasSuffix(st.Reason, "…") ||
		!utf8.ValidString(st.Reason) || len(st.Reason) > p2p.MaxReasonLen || len(st.Reason) < p2p.MaxReasonLen-4 {
		t.Fatalf("reported %s with reason %q (%d bytes)", st.State, st.Reason, len(st.Reason))
	}

	// The machine's owner reads the whole reason in the node's log.
	var warned bool
	sc := bufio.NewScanner(&logs)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var rec struct {
			Level, Msg, Job, Reason string
			Worker                  int
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("log line %q: %v", sc.Bytes(), err)
		}
		if rec.Level == "WARN" && rec.Msg == "worker failed" {
			if warned || rec.Job != job[:12] || rec.Worker != 1 || !strings.HasPrefix(rec.Reason, start) || !strings.HasSuffix(rec.Reason, `train.py" is not a file of the bundle`) {
				t.Fatalf("logged %+v", rec)
			}
			warned = true
		}
	}
	if !warned {
		t.Fatalf("no warning that the worker failed in the log:\n%s", logs.String())
	}
}

// TestOutOfTimeIsReported: a worker past its job's max duration is
// stopped, and its machine says it was out of time, so the submitter ends
// the job as out of time instead of re-placing it as a lost worker (and
// paying for the time twice). A worker stopped because its submitter went
// silent is not out of time.
func TestOutOfTimeIsReported(t *testing.T) {
	e := workAreaExecutor(t, filepath.Join(t.TempDir(), "work"), newMemStore())
	e.workers = map[string]*worker{}
	now, bidder := time.Now(), peer.ID("the-submitter")
	add := func(index int, started, beat time.Time) string {
		job := randomJobID(t)
		name := workerName(job, index)
		w := &worker{l: p2p.Launch{JobID: job, Index: index, World: []string{"chief", "this"}, MaxSecs: 60},
			bidder: bidder, key: workerKey(job, index), name: name, state: p2p.WorkerRunning,
			started: started, beat: beat, done: make(chan struct{}), cancel: func() {}}
		e.workers[w.key] = w
		return job
	}
	over := add(0, now.Add(-61*time.Second), now)
	silent := add(1, now.Add(-10*time.Second), now.Add(-2*submitterSilence))
	within := add(0, now.Add(-59*time.Second), now)
	e.watch(now)
	for _, w := range e.workers {
		close(w.done) // the stopped chief has added its output
	}
	for _, c := range []struct {
		job       string
		index     int
		state     p2p.WorkerState
		outOfTime bool
	}{{over, 0, p2p.WorkerStopped, true}, {silent, 1, p2p.WorkerStopped, false}, {within, 0, p2p.WorkerRunning, false}} {
		req, _ := p2p.Marshal(&p2p.StatusReq{JobID: c.job, Index: c.index})
		_, reply, err := e.Handle(t.Context(), bidder, &p2p.Envelope{Type: p2p.TypeStatusReq, Payload: req})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := p2p.Marshal(reply)
		var st p2p.JobStatus
		if err := p2p.Unmarshal(b, &st); err != nil || st.Validate(c.job, c.index) != nil {
			t.Fatalf("status %+v: %v", st, err)
		}
		if st.State != c.state || st.OutOfTime != c.outOfTime {
			t.Errorf("worker %d of %.8s: %s, out of time %v; want %s, %v (%s)", c.index, c.job, st.State, st.OutOfTime, c.state, c.outOfTime, st.Reason)
		}
	}
}

// TestUnpaidWorkerIsStopped: a worker whose submitter's receipts fall
// behind the floor of its price for the time it ran (two receipt
// intervals and slack ago) is stopped, and says it was unpaid; one whose
// receipts cover the floor runs on, and so does one no floor binds.
func TestUnpaidWorkerIsStopped(t *testing.T) {
	st := newMemStore()
	e := workAreaExecutor(t, filepath.Join(t.TempDir(), "work"), st)
	e.account, e.chainID = "m", "test-chain"
	e.claims = newClaims(newTestEscrows(time.Now), st, "m", e.log)
	e.workers = map[string]*worker{}
	payer, err := identity.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	const perHour = 3_600_000 // 1,000 micro-credits a second
	add := func(floor float64, covered uint64) string {
		job := randomJobID(t)
		w := &worker{l: p2p.Launch{JobID: job, World: []string{"this"}, MaxSecs: 3600, PerHour: perHour, Floor: floor},
			bidder: payer.PeerID(), key: workerKey(job, 0), name: workerName(job, 0), state: p2p.WorkerRunning,
			started: now.Add(-10 * time.Minute), beat: now, done: make(chan struct{}), cancel: func() {}}
		e.workers[w.key] = w
		if covered > 0 {
			r := ledger.SignReceipt(payer, e.chainID, ledger.Receipt{Job: job, Payee: "m", Amount: covered, Seq: 1})
			if err := e.keepReceipt(w, payer.PeerID(), p2p.Receipt{Payee: r.Payee, Amount: r.Amount, Seq: r.Seq, Sig: r.Sig}); err != nil {
				t.Fatal(err)
			}
		}
		return job
	}
	// Ten minutes at 1,000 a second with a 0.5 floor, 75 s of lag: the
	// floor asks for 262,500 at least.
	short := add(0.5, 200_000)
	never := add(0.5, 0)
	covered := add(0.5, 300_000)
	unbound := add(0, 0)
	e.watch(now)
	for _, w := range e.workers {
		close(w.done)
	}
	for job, want := range map[string]p2p.WorkerState{short: p2p.WorkerStopped, never: p2p.WorkerStopped, covered: p2p.WorkerRunning, unbound: p2p.WorkerRunning} {
		st, err := e.Status(payer.PeerID(), p2p.StatusReq{JobID: job})
		if err != nil {
			t.Fatal(err)
		}
		if st.State != want || (want == p2p.WorkerStopped && (!strings.HasPrefix(st.Reason, "stopped: unpaid") || !st.Unpaid)) {
			t.Errorf("worker of %.8s: %s (%s), want %s", job, st.State, st.Reason, want)
		}
	}
}

// TestRefusedWorkerIsStopped: a worker whose last refused_stop round
// answers all refused its update (as its progress file says) is stopped,
// unpaid, and says why; one refused less often, or with the stop off,
// runs on.
func TestRefusedWorkerIsStopped(t *testing.T) {
	work := filepath.Join(t.TempDir(), "work")
	st := newMemStore()
	e := workAreaExecutor(t, work, st)
	e.claims = newClaims(newTestEscrows(time.Now), st, "m", e.log)
	e.workers = map[string]*worker{}
	now := time.Now()
	add := func(report string) *worker {
		job := randomJobID(t)
		w := &worker{l: p2p.Launch{JobID: job, World: []string{"this"}, MaxSecs: 3600},
			key: workerKey(job, 0), name: workerName(job, 0), state: p2p.WorkerRunning,
			started: now.Add(-time.Minute), beat: now, done: make(chan struct{}), cancel: func() {}}
		tmp := filepath.Join(work, w.name, "tmp")
		if err := os.MkdirAll(tmp, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(tmp, "progress.json"), []byte(report), 0o644); err != nil {
			t.Fatal(err)
		}
		e.workers[w.key] = w
		return w
	}
	refused := add(`{"units": 9, "accepted": 2, "refused": 4, "refused_run": 3}`)
	lately := add(`{"units": 9, "accepted": 5, "refused": 4, "refused_run": 2}`)
	silent := add(`{"units": 9}`)
	check := func(stop int, want map[*worker]p2p.WorkerState) {
		t.Helper()
		e.refusedStop = stop
		e.watch(now)
		for w, state := range want {
			w.mu.Lock()
			got, why, unpaid := w.state, w.reason, w.unpaid
			w.mu.Unlock()
			if got != state || (state == p2p.WorkerStopped && (!strings.HasPrefix(why, "stopped: unpaid: the job's holder refused") || !unpaid)) {
				t.Errorf("refused_stop %d, worker %s: %s (%s), want %s", stop, w.name, got, why, state)
			}
		}
	}
	check(0, map[*worker]p2p.WorkerState{refused: p2p.WorkerRunning, lately: p2p.WorkerRunning, silent: p2p.WorkerRunning})
	check(3, map[*worker]p2p.WorkerState{refused: p2p.WorkerStopped, lately: p2p.WorkerRunning, silent: p2p.WorkerRunning})
	if refused.answers != [2]uint64{2, 4} {
		t.Errorf("the node kept the answers %v, want 2 accepted and 4 refused", refused.answers)
	}
	for _, w := range e.workers {
		close(w.done)
	}
}
