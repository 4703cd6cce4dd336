package lender

import (
	"bufio"
	"bytes"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/libp2p/go-libp2p/core/peer"

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
