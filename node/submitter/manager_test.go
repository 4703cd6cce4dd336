package submitter

// The Manager as the API sees it: its refusals, its snapshots, and the
// one owner of each job.

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/node/fault"
	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/p2p"
)

// TestManagerRefusals: each request the submitter refuses says why in
// the roles' terms (a fault's kind, the field at fault), which node/api
// maps to an HTTP status.
func TestManagerRefusals(t *testing.T) {
	h := newHarness(t, "a")
	ctx := t.Context()

	starting := New(h.Params())
	if err := starting.Load(); err != nil {
		t.Fatal(err)
	}
	if _, err := starting.Submit(ctx, SubmitRequest{Spec: h.Spec(1)}); !isFault(err, fault.Unavailable) {
		t.Errorf("Submit before Run: %v, want unavailable", err)
	}

	h.Start()
	noWorkers, tooBig, noBundle := h.Spec(1), h.Spec(1), h.Spec(1)
	noWorkers.Workers = 0
	tooBig.Cores = 16
	noBundle.Bundle = ""
	for _, tt := range []struct {
		name  string
		spec  jobs.File
		field string
		says  string
	}{
		{"no workers", noWorkers, "workers", "want 1 to"},
		{"no bundle", noBundle, "bundle", "missing"},
		{"no machine large enough", tooBig, "cores", "no machine on the market lends 16 cores"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := h.M.Submit(ctx, SubmitRequest{Spec: tt.spec})
			var fe *fault.Error
			if !isFault(err, fault.Invalid) || !asFault(err, &fe) || fe.Field != tt.field || !strings.Contains(fe.Message, tt.says) {
				t.Errorf("Submit: %#v, want it invalid at %s, saying %q", err, tt.field, tt.says)
			}
		})
	}
	if jobs, _ := h.M.Jobs(ctx); len(jobs) != 0 {
		t.Errorf("refused submissions left %d jobs", len(jobs))
	}

	for name, call := range map[string]func(id string) error{
		"Job":     func(id string) error { _, err := h.M.Job(ctx, id); return err },
		"Confirm": func(id string) error { _, err := h.M.Confirm(ctx, id); return err },
		"Cancel":  func(id string) error { _, err := h.M.Cancel(ctx, id); return err },
		"Logs":    func(id string) error { _, err := h.M.Logs(ctx, id, 0); return err },
	} {
		var fe *fault.Error
		if err := call("0123456789"); !isFault(err, fault.NotFound) || !asFault(err, &fe) || fe.Field != "id" {
			t.Errorf("%s of no job: %v, want not found at id", name, err)
		}
	}
	if _, err := h.Quotes.Quotes(ctx, "0123456789"); !isFault(err, fault.NotFound) {
		t.Errorf("Quotes of no bid: %v, want not found", err)
	}

	// Two jobs whose IDs begin alike: their common prefix names neither.
	h.M.mu.Lock()
	h.M.snaps["abcdef01"] = &jobs.Job{ID: "abcdef01", State: jobs.Succeeded}
	h.M.snaps["abcdef02"] = &jobs.Job{ID: "abcdef02", State: jobs.Succeeded}
	h.M.mu.Unlock()
	if _, err := h.M.Job(ctx, "abcdef"); !isFault(err, fault.Malformed) {
		t.Errorf("an ambiguous prefix: %v, want malformed", err)
	}
	if j, err := h.M.Job(ctx, "abcdef02"); err != nil || j.ID != "abcdef02" {
		t.Errorf("a full ID among alike ones: %v, %v", j, err)
	}
	if _, err := h.M.Job(ctx, "abc"); !isFault(err, fault.NotFound) {
		t.Errorf("a prefix under 6 characters: %v, want not found", err)
	}
}

func asFault(err error, fe **fault.Error) bool {
	e, ok := err.(*fault.Error)
	*fe = e
	return ok
}

// TestManagerQuotesOfBid: the quotes for a job's bid are listed, those
// that place it first, cheapest first.
func TestManagerQuotesOfBid(t *testing.T) {
	h := newHarness(t, "a", "b")
	dear := func(bid p2p.Bid) []p2p.Quote {
		qs := h.PlaceOn("b")(bid)
		qs[0].Total *= 2
		return qs
	}
	h.Market.Answer(func(bid p2p.Bid) []p2p.Quote {
		return append(append(refuse("no GPU")(bid), dear(bid)...), h.PlaceOn("a")(bid)...)
	})
	h.Start()

	j := h.Submit(h.Spec(1), false)
	if got := machinesOf(&j.Runs[0]); got != "a" {
		t.Errorf("quoted on %s, want the cheaper a", got)
	}
	if holds := h.Machines.Holds("b"); holds[released] != 1 {
		t.Errorf("the dearer quote's hold on b: %v, want it released", holds)
	}
	qs, err := h.Quotes.Quotes(t.Context(), j.ID)
	if err != nil || len(qs) != 3 {
		t.Fatalf("Quotes = %d, %v; want 3", len(qs), err)
	}
	if qs[0].Total >= qs[1].Total || len(qs[1].Workers) == 0 || len(qs[2].Workers) != 0 || qs[0].Scheduler != schedulerID.String() {
		t.Errorf("Quotes = %+v, want the placements cheapest first, then the refusal", qs)
	}
}

// TestManagerReadersSeeSnapshots: while a job walks, the API's readers
// see it whole and never reach into it (the race detector checks that
// they touch nothing its goroutine writes), and what a reader does with
// the copy it got changes nothing.
func TestManagerReadersSeeSnapshots(t *testing.T) {
	h := newHarness(t, "a", "b")
	h.Market.Answer(h.PlaceOn("a", "b"))
	h.Start()
	ctx := t.Context()

	done := make(chan struct{})
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				list, err := h.M.Jobs(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				for i := range list {
					j := &list[i]
					if _, err := h.M.Logs(ctx, j.ID, 0); err != nil {
						t.Error(err)
					}
					for k := range j.Runs { // scribble on the copy
						for w := range j.Runs[k].Workers {
							j.Runs[k].Workers[w].State = "scribbled"
						}
					}
					j.State = "scribbled"
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
	j := h.Submit(h.Spec(2), true)
	h.Await(j.ID, jobs.Running)
	h.Machines.Exit("a", 0, "bafyresult")
	h.Machines.Exit("b", 0, "")
	j = h.Await(j.ID, jobs.Succeeded)
	close(done)
	wg.Wait()

	got, err := h.M.Job(ctx, j.ID)
	if err != nil || got.State != jobs.Succeeded || got.Runs[0].Workers[0].State != p2p.WorkerExited {
		t.Errorf("after readers scribbled on their copies: %s, worker 0 %s", got.State, got.Runs[0].Workers[0].State)
	}
	h.CheckSettled(got, 0)
}

// TestManagerLoad: a restarted node lists every stored job, newest
// first, and drives again only the live ones.
func TestManagerLoad(t *testing.T) {
	h := newHarness(t, "a")
	old := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	for i, st := range []jobs.State{jobs.Succeeded, jobs.Waiting, jobs.Cancelled} {
		id := strings.Repeat(string(rune('a'+i)), 64)
		j := jobs.Job{ID: id, State: st, Created: old.Add(time.Duration(i) * time.Hour), Updated: time.Now(),
			Confirmed: true, Queue: &jobs.Queued{Since: time.Now()}}
		if err := h.Store.Put("jobs/"+id, &j); err != nil {
			t.Fatal(err)
		}
	}
	m := New(h.Params())
	if err := m.Load(); err != nil {
		t.Fatal(err)
	}
	list, err := m.Jobs(t.Context())
	if err != nil || len(list) != 3 || list[0].State != jobs.Cancelled || list[2].State != jobs.Succeeded {
		t.Fatalf("Jobs = %+v, %v; want the three, newest first", list, err)
	}
	if len(m.live) != 1 || m.live[strings.Repeat("b", 64)] == nil {
		t.Errorf("live after Load: %d jobs, want the waiting one", len(m.live))
	}
	// A cancel before Run is not lost: the job's goroutine takes it first.
	m.live[strings.Repeat("b", 64)].in.put(askCancel)
	m.t, h.M = h.Timing, m
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- m.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-ran })
	if j := h.Await(strings.Repeat("b", 64), jobs.Cancelled); j.Reason != "cancelled before launch" {
		t.Errorf("cancelled: %s", j.Reason)
	}
}

// TestInbox: what is asked of a job waits, noted once, until taken;
// asking twice is asking once.
func TestInbox(t *testing.T) {
	in := newInbox()
	if a := in.take(); a != 0 {
		t.Fatalf("a new inbox holds %v", a)
	}
	in.put(askConfirm)
	in.put(askConfirm)
	in.put(askCancel)
	select {
	case <-in.note:
	default:
		t.Fatal("no note of what was asked")
	}
	select {
	case <-in.note:
		t.Fatal("three asks, two notes: one is enough")
	default:
	}
	if a := in.take(); a != askConfirm|askCancel {
		t.Errorf("took %v, want a confirmation and a cancel", a)
	}
	if a := in.take(); a != 0 {
		t.Errorf("took %v again", a)
	}
}

// TestDiLoCoIsHeldByDefault: a diloco job whose spec names no holder is
// held by its submitter's node when that node can run the holder, with
// spot checks on, and by its workers when it cannot, each said in the
// job's log; a spec that names one keeps it, and the bid carries what was
// settled.
func TestDiLoCoIsHeldByDefault(t *testing.T) {
	h := newHarness(t, "a")
	h.Market.Answer(h.PlaceOn("a"))
	h.Holders.can = true
	h.Start()
	diloco := func(holder string) jobs.File {
		f := h.Spec(1)
		f.Training = &p2p.Training{Mode: "diloco", Holder: holder}
		return f
	}
	j := h.Submit(diloco(""), false)
	if tr := j.Spec.Training; !tr.Held() || tr.Verify == nil || tr.Verify.Rate < tr.MinVerifyRate() {
		t.Errorf("a diloco job, the node able to hold it: %+v, want held with spot checks", tr)
	}
	if log := h.Log(j.ID); !strings.Contains(log, "this machine holds the model (the default for diloco)") {
		t.Errorf("the job's log says nothing of its holder:\n%s", log)
	}
	if bids := h.Market.Bids(); len(bids) == 0 || !bids[len(bids)-1].Training.Held() {
		t.Errorf("the bid's training terms: %+v, want held", bids)
	}
	if j := h.Submit(diloco(p2p.HolderWorkers), false); j.Spec.Training.Held() {
		t.Errorf("holder = \"workers\": %+v, want the workers to hold", j.Spec.Training)
	}

	h.Holders.can = false
	j = h.Submit(diloco(""), false)
	if j.Spec.Training.Held() || j.Spec.Training.Holder != p2p.HolderWorkers {
		t.Errorf("a node that cannot hold: %+v, want the workers to hold", j.Spec.Training)
	}
	if log := h.Log(j.ID); !strings.Contains(log, "the workers hold the model (this machine cannot run the job's program as the holder: no sandbox in tests)") {
		t.Errorf("the job's log does not say why the workers hold:\n%s", log)
	}
	if _, err := h.M.Submit(t.Context(), SubmitRequest{Spec: diloco(p2p.HolderSubmitter)}); !isFault(err, fault.Invalid) {
		t.Errorf("holder = \"submitter\" on a node that cannot: %v, want refused", err)
	}
}

// TestBidNamesTheImage: a job in an image bids with the image's CID and
// its size, so schedulers can tell machines that hold it (a warm start)
// from those that would fetch it; a job without one names none; a job in
// an image that neither this node nor any peer holds fails before it
// bids.
func TestBidNamesTheImage(t *testing.T) {
	h := newHarness(t, "a")
	h.Market.Answer(h.PlaceOn("a"))
	h.Start()
	f := h.Spec(1)
	f.Image = bundleCID
	j := h.Submit(f, false)
	bids := h.Market.Bids()
	if len(bids) == 0 || bids[0].Image != bundleCID || bids[0].ImageBytes != fakeImageBytes || j.ImageBytes != fakeImageBytes {
		t.Fatalf("the bid %+v, the job's image of %d bytes: want %s of %d bytes", bids, j.ImageBytes, bundleCID, fakeImageBytes)
	}
	h.Submit(h.Spec(1), false)
	if bids := h.Market.Bids(); bids[len(bids)-1].Image != "" || bids[len(bids)-1].ImageBytes != 0 {
		t.Errorf("a job without an image bids %+v", bids[len(bids)-1])
	}
	// An image this node does not hold and no peer delivers: the job
	// fails before it bids, saying what to do.
	before := len(h.Market.Bids())
	f.Image = "bafybeigdyrzt5sfp7udm7hu76uh7y26nf3efuylqabf3oclgtqy55fbzdi"
	j = h.Await(h.Submit(f, true).ID, jobs.Failed)
	if !strings.Contains(j.Reason, "could not fetch it") || !strings.Contains(j.Reason, "env add") || len(h.Market.Bids()) != before {
		t.Errorf("a job in an image nobody holds: %s (%s), %d bids after %d\n%s", j.State, j.Reason, len(h.Market.Bids()), before, h.Log(j.ID))
	}
	if log := h.Log(j.ID); !strings.Contains(log, "fetching the image "+f.Image+": this node does not hold it") {
		t.Errorf("the job's log does not say it looked for the image:\n%s", log)
	}
}
