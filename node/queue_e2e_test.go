package node

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/p2p"
)

// sleepBundle is a job bundle whose job.py sleeps argv[1] seconds.
func sleepBundle(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	script := "import sys, time\ntime.sleep(float(sys.argv[1]))\nprint('slept', sys.argv[1])\n"
	if err := os.WriteFile(filepath.Join(dir, "job.py"), []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// sleepJob is a one-worker, one-core job that sleeps secs seconds.
func sleepJob(name, bundle string, secs float64) jobs.File {
	return jobs.File{Name: name, Framework: "generic", Command: []string{"python3", "job.py", fmt.Sprint(secs)}, Bundle: bundle,
		Workers: 1, Cores: 1, Memory: "128MiB", MaxPrice: "1", MaxDuration: "1m"}
}

// TestQueueWaitsAndSurvivesRestart: one lender lending one core, busy
// with a job. The jobs submitted meanwhile wait in the submitter's queue
// instead of failing, saying why and where; one whose max_wait runs out,
// and one whose deadline gets out of reach, fail for that; an unconfirmed
// one is cancelled at no cost. The submitter restarts: the waiting job
// keeps its place and its time in the queue, and runs once the core is
// free, paid for like any job.
func TestQueueWaitsAndSurvivesRestart(t *testing.T) {
	t.Parallel()
	py := genericPython(t)
	c := startJobClusterLending(t, py, 1, api.LendRequest{Cores: 1, MemBytes: 1 << 30})
	sub := c.sub
	bundle := sleepBundle(t)
	ctx := t.Context()
	before, err := sub.client.Balance(ctx, "")
	if err != nil {
		t.Fatal(err)
	}

	busy, err := sub.client.Submit(ctx, api.SubmitRequest{Spec: sleepJob("busy", bundle, 25), Yes: true})
	if err != nil || busy.State == jobs.Failed || busy.State == jobs.Waiting {
		t.Fatalf("the first job: %+v %v", busy, err)
	}
	eventually(t, time.Minute, "the first job to run", func() bool {
		j, _ := sub.client.Job(ctx, busy.ID)
		return j.State == jobs.Running
	})

	waits, err := sub.client.Submit(ctx, api.SubmitRequest{Spec: sleepJob("waits", bundle, 1), Yes: true})
	if err != nil {
		t.Fatal(err)
	}
	if waits.State != jobs.Waiting || waits.Queue == nil || waits.Queue.Position != 1 || waits.Queue.Why == "" ||
		!strings.Contains(waits.Reason, "no machine can take the job now") {
		t.Fatalf("a job submitted while the only core is busy: %s (%s), queue %+v", waits.State, waits.Reason, waits.Queue)
	}
	since := waits.Queue.Since

	// An unconfirmed job waits behind it; then two that cannot wait long.
	impatient := sleepJob("impatient", bundle, 1)
	impatient.MaxWait = "3s"
	late := sleepJob("late", bundle, 1)
	late.Deadline = time.Now().Add(time.Minute + 12*time.Second).UTC().Format(time.RFC3339)
	unconfirmed := sleepJob("unconfirmed", bundle, 1)
	var ids []string
	for _, f := range []jobs.File{unconfirmed, impatient, late} {
		j, err := sub.client.Submit(ctx, api.SubmitRequest{Spec: f, Yes: f.Name != "unconfirmed"})
		if err != nil {
			t.Fatal(err)
		}
		if j.State != jobs.Waiting {
			t.Fatalf("job %s: %s (%s), want waiting", f.Name, j.State, j.Reason)
		}
		if f.Name == "unconfirmed" && j.Queue.Position != 2 {
			t.Errorf("the second job to wait is at position %d", j.Queue.Position)
		}
		ids = append(ids, j.ID)
	}
	first, err := sub.client.Job(ctx, waits.ID)
	if err != nil || first.Queue.Position != 1 {
		t.Errorf("the first job to wait: %+v %v", first.Queue, err)
	}

	cancelled, err := sub.client.CancelJob(ctx, ids[0])
	if err != nil || cancelled.State != jobs.Cancelled || cancelled.Cost != 0 || !strings.Contains(cancelled.Reason, "nothing was paid") {
		t.Fatalf("cancelling a waiting job: %+v %v", cancelled, err)
	}
	j := waitJob(t, sub, ids[1], 30*time.Second)
	if j.State != jobs.Failed || !strings.Contains(j.Reason, "max_wait") || j.Cost != 0 {
		t.Errorf("the job with max_wait 3s: %s (%s), cost %d", j.State, j.Reason, j.Cost)
	}
	j = waitJob(t, sub, ids[2], 30*time.Second)
	if j.State != jobs.Failed || !strings.Contains(j.Reason, "deadline") || j.Cost != 0 {
		t.Errorf("the job whose deadline got out of reach: %s (%s), cost %d", j.State, j.Reason, j.Cost)
	}

	// The submitter restarts while the job waits.
	sub.stop()
	withPython := func(cfg *Config) { cfg.Inventory.Python = py }
	sub2 := startNode(t, sub.home, withPython, withBootstrap(c.lenders[0].addr()))
	back, err := sub2.client.Job(ctx, waits.ID)
	if err != nil {
		t.Fatal(err)
	}
	if back.State.Terminal() || back.Queue == nil || !back.Queue.Since.Equal(since) {
		t.Fatalf("after the restart the waiting job is %s (%s), queue %+v; want it waiting since %s", back.State, back.Reason, back.Queue, since)
	}
	for _, id := range []string{busy.ID, waits.ID} {
		j := waitJob(t, sub2, id, 5*time.Minute)
		if j.State != jobs.Succeeded || !j.Current().Settled || j.Queue != nil {
			t.Fatalf("job %s: %s (%s), queue %+v\n%s", j.Spec.Name, j.State, j.Reason, j.Queue, jobLog(t, sub2, id))
		}
	}
	log := jobLog(t, sub2, waits.ID)
	if !strings.Contains(log, "waiting in the queue (position 1)") || !strings.Contains(log, "its turn in the queue after") {
		t.Errorf("the waiting job's log does not tell its wait:\n%s", log)
	}
	rep, err := settledAudit(t, sub2)
	if err != nil || !rep.OK || rep.Escrowed != 0 {
		t.Fatalf("audit: %+v %v", rep, err)
	}
	after, err := sub2.client.Balance(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	j1, _ := sub2.client.Job(ctx, busy.ID)
	j2, _ := sub2.client.Job(ctx, waits.ID)
	if spent := before.Balance - after.Balance; spent != j1.Cost+j2.Cost {
		t.Errorf("the submitter spent %d; the two jobs that ran cost %d and %d, the others nothing", spent, j1.Cost, j2.Cost)
	}
}

// queueRun is what TestQueueServesAHundredJobs and BenchmarkQueue
// measured of one run.
type queueRun struct {
	jobs, machines int
	work           time.Duration // each job's
	makespan       time.Duration // from the first submission to the last job's end
	states         map[jobs.State]int
	waited         int // jobs that waited in a queue
	over           string
	failures       []string // the first few jobs that did not succeed: name, state, reason, the end of the log
	// Where a machine's time between two jobs went, on average: from the
	// submitter's launch to the worker's start, from the worker's end to
	// the settlement, and from a settlement to the machine's next launch.
	launch, tail, between time.Duration
}

func (r queueRun) ideal() time.Duration {
	return time.Duration(r.jobs) * r.work / time.Duration(r.machines)
}

func (r queueRun) String() string {
	return fmt.Sprintf("%d jobs of %s on %d one-core machines: %v, %d waited in a queue; makespan %s, ideal %s (%.2fx); "+
		"per job, launch to start %s, end to settled %s, settled to the machine's next launch %s",
		r.jobs, r.work, r.machines, r.states, r.waited, r.makespan.Round(100*time.Millisecond), r.ideal(), r.makespan.Seconds()/r.ideal().Seconds(),
		r.launch.Round(10*time.Millisecond), r.tail.Round(10*time.Millisecond), r.between.Round(10*time.Millisecond))
}

// timeline fills in r's launch, tail and between from the runs of the
// jobs that succeeded.
func (r *queueRun) timeline(runs []jobs.Run) {
	byMachine := map[string][]jobs.Run{}
	var launch, tail time.Duration
	for _, run := range runs {
		w := run.Workers[0]
		launch += w.Started.Sub(run.Started)
		tail += run.Ended.Sub(w.Ended)
		byMachine[w.Machine] = append(byMachine[w.Machine], run)
	}
	var between time.Duration
	gaps := 0
	for _, rs := range byMachine {
		slices.SortFunc(rs, func(a, b jobs.Run) int { return a.Started.Compare(b.Started) })
		for i := 1; i < len(rs); i++ {
			between += rs[i].Started.Sub(rs[i-1].Ended)
			gaps++
		}
	}
	if n := time.Duration(len(runs)); n > 0 {
		r.launch, r.tail = launch/n, tail/n
	}
	if gaps > 0 {
		r.between = between / time.Duration(gaps)
	}
}

// runQueue starts lenders one-core machines and two submitting nodes (the
// market's schedulers), submits n sleep jobs of work at once, half from
// each, and waits for them all to end. It watches every machine's holds
// while the jobs run, and checks every escrow was settled and the
// ledger's audits agree.
func runQueue(t testing.TB, py string, lenders, n int, work time.Duration, maxWait string) queueRun {
	chain := fmt.Sprintf("deepmarket-queue-%d", time.Now().UnixNano())
	names := []string{"sub0", "sub1"}
	for i := range lenders {
		names = append(names, fmt.Sprintf("lender%02d", i))
	}
	homes := initNetwork(t, t.TempDir(), chain, names)
	withExec := execOpts(t, py)
	noQuotes := func(c *Config) { c.Scheduler.Quote = false }
	subs := []*testNode{startNode(t, homes[0], withExec("sub0", 0))}
	subs = append(subs, startNode(t, homes[1], withExec("sub1", 1), withBootstrap(subs[0].addr())))
	var ls []*testNode
	for i := range lenders {
		l := startNode(t, homes[2+i], withExec(names[2+i], i), withBootstrap(subs[0].addr()), noQuotes)
		if _, err := l.client.SetLend(context.Background(), api.LendRequest{Cores: 1, MemBytes: 1 << 30}); err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	for _, s := range subs {
		eventually(t, 2*time.Minute, "each submitter to hold every lender's offer", func() bool {
			return len(s.Offers()) >= lenders
		})
	}
	bundle := sleepBundle(t)
	var cids []string
	for _, s := range subs {
		pin, err := s.blocks.Add(context.Background(), bundle, nil)
		if err != nil {
			t.Fatal(err)
		}
		cids = append(cids, pin.CID.String())
	}

	// Watch the machines' own books: never more held than lent.
	stop := make(chan struct{})
	overs := make(chan string, 1)
	var watch sync.WaitGroup
	watch.Add(1)
	go func() {
		defer watch.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			for _, l := range ls {
				if a := l.holds.Allocated(time.Now()); a.Cores > 1 || a.MemBytes > 1<<30 {
					select {
					case overs <- fmt.Sprintf("%s holds %+v of 1 core, 1 GiB", l.home.Dir, a):
					default:
					}
				}
			}
		}
	}()

	start := time.Now()
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := subs[i%2]
			f := sleepJob(fmt.Sprintf("q%03d", i), cids[i%2], work.Seconds())
			f.MaxWait = maxWait
			j, err := s.client.Submit(context.Background(), api.SubmitRequest{Spec: f, Yes: true})
			if err != nil {
				t.Errorf("submit %d: %v", i, err)
				return
			}
			ids[i] = j.ID
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	r := queueRun{jobs: n, machines: lenders, work: work, states: map[jobs.State]int{}}
	var last time.Time
	var succeeded []jobs.Run
	for i, id := range ids {
		s := subs[i%2]
		var j *jobs.Job
		deadline := time.Now().Add(15 * time.Minute)
		for {
			var err error
			if j, err = s.client.Job(context.Background(), id); err != nil {
				t.Fatal(err)
			}
			if j.State.Terminal() || time.Now().After(deadline) {
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
		r.states[j.State]++
		if j.State == jobs.Succeeded && len(j.Runs) == 1 {
			succeeded = append(succeeded, j.Runs[0])
		}
		if j.State == jobs.Succeeded {
			if end := j.Current().Ended; end.After(last) {
				last = end
			}
			if !j.Current().Settled {
				t.Errorf("job %s succeeded unsettled", j.Spec.Name)
			}
		}
		log := jobLog(t, s, id)
		if strings.Contains(log, "waiting in the queue") {
			r.waited++
		}
		if j.State != jobs.Succeeded && len(r.failures) < 5 {
			lines := strings.Split(strings.TrimSpace(log), "\n")
			r.failures = append(r.failures, fmt.Sprintf("%s %s (%s), %d runs; its log ends:\n%s", j.Spec.Name, j.State, j.Reason,
				len(j.Runs), strings.Join(lines[max(0, len(lines)-12):], "\n")))
		}
		if testing.Verbose() && i%(n/4) == n/8 {
			t.Logf("the log of job %s:\n%s", j.Spec.Name, log)
		}
	}
	r.makespan = last.Sub(start)
	r.timeline(succeeded)
	close(stop)
	watch.Wait()
	select {
	case r.over = <-overs:
	default:
	}
	// Every escrow settled or refunded, and the replicas agree.
	var reps []string
	for _, nd := range []*testNode{subs[0], subs[1], ls[0], ls[len(ls)-1]} {
		var rep string
		eventually(t, testDisputeWindow+time.Minute, "an audit with nothing in escrow", func() bool {
			a, err := nd.client.Audit(context.Background())
			if err != nil || !a.OK || a.Escrowed != 0 {
				return false
			}
			rep = fmt.Sprintf("supply %d, balances %d", a.Supply, a.Balances)
			return true
		})
		reps = append(reps, rep)
	}
	for _, rep := range reps[1:] {
		if rep != reps[0] {
			t.Errorf("the audits disagree: %q", reps)
		}
	}
	return r
}

// TestQueueServesAHundredJobs: 100 one-core jobs submitted at once, from
// two nodes, over 20 one-core machines: five rounds' worth, so most wait.
// None fails for lack of a machine: those that find none wait in their
// submitter's queue and run as machines free up. No machine is ever held
// beyond what it lends, every escrow is settled, and the ledger's audits
// agree. The makespan against the ideal is logged (make bench-queue
// measures 200 longer jobs).
func TestQueueServesAHundredJobs(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("22 nodes, 100 jobs")
	}
	py := genericPython(t)
	lenders, n := 20, 100
	if s := os.Getenv("DM_QUEUE_SHAPE"); s != "" { // a smaller run, to look into it
		fmt.Sscanf(s, "%d,%d", &lenders, &n)
	}
	r := runQueue(t, py, lenders, n, 5*time.Second, "")
	t.Log(r)
	if r.over != "" {
		t.Error("over-committed: " + r.over)
	}
	if r.states[jobs.Succeeded] != n {
		t.Errorf("%v, want all %d succeeded; the first that did not:\n%s", r.states, n, strings.Join(r.failures, "\n"))
	}
	if r.waited == 0 {
		t.Error("no job waited in a queue: the test did not load the market")
	}
}

// BenchmarkQueue is make bench-queue: 200 one-core jobs of
// DM_QUEUE_WORK (default 30s) each, submitted at once from two nodes over
// 20 one-core machines, once with the queue and once with max_wait = "0s"
// (a job fails when its first bid finds no machine, as before the
// queue), side by side: jobs succeeded, makespan against the ideal (total
// work over capacity). DM_BENCH_OUT names a JSON file for the results.
func BenchmarkQueue(b *testing.B) {
	py := jobPython(b)
	work := 30 * time.Second
	if s := os.Getenv("DM_QUEUE_WORK"); s != "" {
		var err error
		if work, err = time.ParseDuration(s); err != nil {
			b.Fatalf("DM_QUEUE_WORK: %v", err)
		}
	}
	runs := map[string]queueRun{}
	for _, mode := range []struct{ name, maxWait string }{{"queue", ""}, {"no-queue", "0s"}} {
		b.Run(mode.name, func(b *testing.B) {
			for range b.N {
				r := runQueue(b, py, 20, 200, work, mode.maxWait)
				if r.over != "" {
					b.Error("over-committed: " + r.over)
				}
				runs[mode.name] = r
			}
		})
	}
	q, nq := runs["queue"], runs["no-queue"]
	fmt.Printf("\n200 one-core jobs of %s, submitted at once from 2 nodes, on 20 one-core machines (%d CPUs here)\n", work, runtime.NumCPU())
	fmt.Printf("%-9s %9s %7s %7s %10s %8s %14s\n", "mode", "succeeded", "failed", "queued", "makespan", "ideal", "makespan/ideal")
	for _, m := range []struct {
		name string
		r    queueRun
	}{{"queue", q}, {"no queue", nq}} {
		if m.r.states[jobs.Succeeded] != m.r.jobs {
			// A makespan of the jobs that ran is no measure of the whole.
			fmt.Printf("%-9s %9d %7d %7d %10s %7.0fs %14s\n", m.name, m.r.states[jobs.Succeeded], m.r.states[jobs.Failed], m.r.waited, "-",
				m.r.ideal().Seconds(), "-")
			continue
		}
		if m.r.states[jobs.Succeeded] == 0 {
			fmt.Printf("%-9s %9d %7d %7d %10s %7.0fs %14s\n", m.name, 0, m.r.states[jobs.Failed], m.r.waited, "-", m.r.ideal().Seconds(), "-")
			continue
		}
		fmt.Printf("%-9s %9d %7d %7d %9.1fs %7.0fs %13.2fx\n", m.name, m.r.states[jobs.Succeeded], m.r.states[jobs.Failed], m.r.waited,
			m.r.makespan.Seconds(), m.r.ideal().Seconds(), m.r.makespan.Seconds()/m.r.ideal().Seconds())
		fmt.Printf("%-9s per job: launch to start %s, end to settled %s, settled to the machine's next launch %s\n", "",
			m.r.launch.Round(10*time.Millisecond), m.r.tail.Round(10*time.Millisecond), m.r.between.Round(10*time.Millisecond))
	}
	fmt.Printf("goal: 200 of 200 succeed with the queue, makespan <= 1.5x the ideal\n")
	if out := os.Getenv("DM_BENCH_OUT"); out != "" {
		row := func(r queueRun) map[string]any {
			row := map[string]any{"succeeded": r.states[jobs.Succeeded], "failed": r.states[jobs.Failed], "waited": r.waited,
				"ideal_s": r.ideal().Seconds()}
			if r.states[jobs.Succeeded] == r.jobs {
				row["makespan_s"], row["ratio"] = r.makespan.Seconds(), r.makespan.Seconds()/r.ideal().Seconds()
				row["launch_s"], row["tail_s"], row["between_s"] = r.launch.Seconds(), r.tail.Seconds(), r.between.Seconds()
			}
			return row
		}
		doc := map[string]any{"date": time.Now().UTC().Format(time.RFC3339), "cpus": runtime.NumCPU(), "jobs": 200, "machines": 20,
			"work_s": work.Seconds(), "queue": row(q), "no_queue": row(nq)}
		data, _ := json.MarshalIndent(doc, "", "  ")
		if err := os.WriteFile(out, append(data, '\n'), 0o644); err != nil {
			b.Error(err)
		}
	}
}

// TestLateQuotesAreRefused: once a job's bidder has chosen, a stranger's
// quote for the job, sent over a real stream, is refused (so a scheduler
// that answers late releases what it holds) and not kept among the job's
// quotes.
func TestLateQuotesAreRefused(t *testing.T) {
	t.Parallel()
	py := genericPython(t)
	c := startJobClusterLending(t, py, 1, api.LendRequest{Cores: 1, MemBytes: 1 << 30})
	sub, lend := c.sub, c.lenders[0]
	ctx := t.Context()
	j, err := sub.client.Submit(ctx, api.SubmitRequest{Spec: sleepJob("late-quotes", sleepBundle(t), 1), Yes: true})
	if err != nil || j.State == jobs.Failed {
		t.Fatalf("submit: %+v %v", j, err)
	}
	evil := newRawPeer(t, ctx, sub.cfg.Node.ChainID, sub)
	quote := func(q p2p.Quote) p2p.QuoteAck {
		var ack p2p.QuoteAck
		if err := evil.rpc.Call(ctx, sub.Host().ID(), p2p.QuoteProtocol(evil.rpc.ChainID), p2p.TypeQuote, &q, p2p.TypeQuoteAck, &ack); err != nil {
			t.Fatalf("quote: %v", err)
		}
		return ack
	}
	late := p2p.Quote{JobID: j.ID, PerHour: 1, Total: 1, HeldUntil: time.Now().Add(time.Minute).UnixMilli(),
		Workers: []p2p.QuotedWorker{{Machine: lend.Host().ID().String(), PerHour: 1, Hold: "00000000000000aa"}}}
	if ack := quote(late); ack.OK {
		t.Fatal("a quote after the bidder chose was taken")
	}
	qs, err := sub.client.Quotes(ctx, j.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range qs {
		if q.Scheduler == evil.key.PeerID().String() {
			t.Fatalf("the late quote is among the job's quotes: %+v", q)
		}
	}
	if done := waitJob(t, sub, j.ID, 2*time.Minute); done.State != jobs.Succeeded {
		t.Fatalf("the job: %s (%s)", done.State, done.Reason)
	}
}
