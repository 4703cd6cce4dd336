package testnet

// The fault and load suite: each scenario runs a testnet of real node
// processes, breaks it the way the world would (kill -9, lost quorum,
// a partition, a flood), asserts the expected outcome, and ends with
// every node's ledger audit passing on one chain (identical block and app
// hashes). `make test-faults` runs them at full size.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node"
	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/testnet/netlab"
)

// size is n, or full under `make test-faults` (DM_FAULTS_FULL=1).
func size(n, full int) int {
	if os.Getenv("DM_FAULTS_FULL") != "" {
		return full
	}
	return n
}

// sinkOpening is what opens a sink's account: a transfer to an account
// that does not exist moves at least the ledger's MinNewAccount.
var sinkOpening = ledger.DefaultParams().MinNewAccount

// newSink is a fresh account, opened by node 0 with sinkOpening.
func newSink(t *testing.T, n *Network) identity.Address {
	t.Helper()
	k, err := identity.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if _, err := n.ledgerClient(t, 0, 0).Transfer(ctx, k.Address(), sinkOpening, "open the sink"); err != nil {
		t.Fatalf("open the sink: %v", err)
	}
	return k.Address()
}

// sinkBalances are what the sink received after its opening, as each node
// sees it.
func sinkBalances(t *testing.T, n *Network, nodes []int, sink identity.Address) []uint64 {
	t.Helper()
	out := make([]uint64, len(nodes))
	for k, i := range nodes {
		c, err := n.Client(i)
		if err != nil {
			t.Fatal(err)
		}
		b, err := c.Balance(t.Context(), string(sink))
		if err != nil {
			t.Fatalf("%s: balance: %v", n.Manifest.Nodes[i].Name, err)
		}
		out[k] = b.Balance - sinkOpening
	}
	return out
}

// waitSink waits until every listed node sees want received by the sink
// after its opening (see waitBalances).
func waitSink(t *testing.T, n *Network, nodes []int, sink identity.Address, want uint64) {
	t.Helper()
	n.waitBalances(t, nodes, sink, sinkOpening+want)
}

// TestFaultValidatorKilledDuringTransfers: kill -9 one of four validators
// while 1,000 transfers flow, restart it: the chain goes on without it,
// it catches up, and every committed transfer is on every node.
func TestFaultValidatorKilledDuringTransfers(t *testing.T) {
	t.Parallel()
	n := startNet(t, Params{Validators: 4, Sites: 2}, RunOptions{})
	n.waitHeights(t, all(n), 2, time.Minute)
	const total = 1000
	sink := newSink(t, n)
	l := &transferLoad{net: n, senders: []int{0, 1, 2}, sink: sink,
		via: func(k int) []int { return []int{k, (k + 1) % 3} }} // never through the victim
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.run(t, t.Context(), total-total%3)
	}()
	for l.committed.Load() < total/4 {
		select {
		case <-done:
			t.Fatalf("the load ended before the kill: %d committed, %s", l.committed.Load(), l.failures())
		case <-time.After(50 * time.Millisecond):
		}
	}
	if err := n.Kill(3); err != nil {
		t.Fatal(err)
	}
	h := n.Heights(t.Context(), []int{0})[0]
	t.Logf("killed val3 at height %d after %d commits", h, l.committed.Load())
	// The chain goes on without it: the rest of the load commits.
	<-done
	// And more, all sent after it died.
	l.run(t, t.Context(), 99)
	want := int64(total - total%3 + 99)
	if got := l.committed.Load(); got != want {
		t.Fatalf("%d of %d transfers committed (%s)", got, want, l.failures())
	}
	if now := n.Heights(t.Context(), []int{0})[0]; now <= h {
		t.Fatalf("no block since val3 died (height %d)", now)
	}
	if err := n.Launch(t.Context(), 3); err != nil {
		t.Fatal(err)
	}
	top := n.Heights(t.Context(), []int{0})[0]
	n.waitHeights(t, all(n), top, 2*time.Minute) // val3 caught up
	// Every committed transfer, on every node.
	n.waitLoaded(t, all(n), sink, l, uint64(want))
	n.check(t, all(n), true)
}

// TestFaultTwoOfFourValidatorsDown: with half the voting power gone no
// block commits (and none forks); one validator back makes two thirds
// again, and the chain goes on with what was waiting.
func TestFaultTwoOfFourValidatorsDown(t *testing.T) {
	t.Parallel()
	n := startNet(t, Params{Validators: 4, Sites: 2}, RunOptions{})
	n.waitHeights(t, all(n), 2, time.Minute)
	sink := newSink(t, n)
	n.Kill(2)
	n.Kill(3)
	time.Sleep(3 * time.Second) // a block in flight may still commit
	before := n.Heights(t.Context(), []int{0, 1})
	cl := n.ledgerClient(t, 0, 0)
	hash, err := cl.Submit(t.Context(), ledger.TypeTransfer, &ledger.Transfer{To: string(sink), Amount: 7})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(8 * time.Second)
	after := n.Heights(t.Context(), []int{0, 1})
	if after[0] != before[0] || after[1] != before[1] {
		t.Fatalf("blocks committed without two thirds of the power: heights %v then %v", before, after)
	}
	if b := sinkBalances(t, n, []int{0}, sink)[0]; b != 0 {
		t.Fatalf("a transfer committed without a quorum: %d", b)
	}
	if err := n.Launch(t.Context(), 2); err != nil {
		t.Fatal(err)
	}
	n.waitHeights(t, []int{0, 1, 2}, before[0]+2, 2*time.Minute)
	wctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if _, err := cl.Wait(wctx, hash); err != nil {
		t.Fatalf("the waiting transfer after the quorum came back: %v", err)
	}
	if err := n.Launch(t.Context(), 3); err != nil {
		t.Fatal(err)
	}
	top := n.Heights(t.Context(), []int{0})[0]
	n.waitHeights(t, all(n), top, 2*time.Minute)
	waitSink(t, n, all(n), sink, 7)
	n.check(t, all(n), true)
}

// TestFaultTenThousandTransfers: 10,000 transfers from four accounts
// through four nodes: all commit, and the audits agree.
func TestFaultTenThousandTransfers(t *testing.T) {
	t.Parallel()
	n := startNet(t, Params{Validators: 4, Sites: 2}, RunOptions{})
	n.waitHeights(t, all(n), 2, time.Minute)
	total := size(10000, 10000)
	sink := newSink(t, n)
	l := &transferLoad{net: n, senders: []int{0, 1, 2, 3}, sink: sink,
		via: func(k int) []int { return []int{k, (k + 1) % 4} }}
	start := time.Now()
	l.run(t, t.Context(), total)
	if got := l.committed.Load(); got != int64(total) {
		t.Fatalf("%d of %d transfers committed (%s)", got, total, l.failures())
	}
	t.Logf("%d transfers committed in %s", total, time.Since(start).Round(time.Millisecond))
	top := n.Heights(t.Context(), []int{0})[0]
	n.waitHeights(t, all(n), top, time.Minute)
	n.waitLoaded(t, all(n), sink, l, uint64(total))
	n.check(t, all(n), true)
}

// jobPython is the interpreter lenders run jobs with.
func jobPython() string {
	if p := os.Getenv("DM_PYTHON"); p != "" {
		return p
	}
	return "python3"
}

// workBundle is a generic job that counts to its first argument, a
// second a step, and writes the count to its output.
func workBundle(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "work")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Dir(dir), 0o755)
	script := `import os, sys, time
steps = int(sys.argv[1])
pause = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
for i in range(steps):
    print("step", i + 1, "of", steps, flush=True)
    time.sleep(pause)
with open(os.path.join(os.environ["DM_OUTPUT_DIR"], "count.txt"), "w") as f:
    f.write(str(steps))
`
	if err := os.WriteFile(filepath.Join(dir, "work.py"), []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func workSpec(bundle string, steps int, pause string, maxDuration string) jobs.File {
	return jobs.File{Name: "work", Framework: "generic", Command: []string{"python3", "work.py", strconv.Itoa(steps), pause},
		Bundle: bundle, Workers: 1, Cores: 1, Memory: "256MiB", MaxPrice: "1", MaxDuration: maxDuration}
}

func lend(t *testing.T, n *Network, i, cores int) {
	t.Helper()
	c, err := n.Client(i)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetLend(t.Context(), api.LendRequest{Cores: cores, MemBytes: uint64(cores) << 30}); err != nil {
		t.Fatalf("%s: lend: %v", n.Manifest.Nodes[i].Name, err)
	}
}

// waitOffers waits until node i holds at least k offers.
func waitOffers(t *testing.T, n *Network, i, k int, within time.Duration) {
	t.Helper()
	c, _ := n.Client(i)
	deadline := time.Now().Add(within)
	for {
		offers, err := c.Offers(t.Context())
		if err == nil && len(offers) >= k {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s holds %d offers after %s, want %d (%v)", n.Manifest.Nodes[i].Name, len(offers), within, k, err)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

func jobLog(t *testing.T, c *api.Client, id string) string {
	l, err := c.JobLogs(t.Context(), id, 0)
	if err != nil {
		return err.Error()
	}
	return l.Data
}

func waitJob(t *testing.T, c *api.Client, id string, within time.Duration) *jobs.Job {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		j, err := c.Job(t.Context(), id)
		if err == nil && j.State.Terminal() {
			return j
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s not done within %s (%v, %v)\n%s", id[:12], within, j, err, jobLog(t, c, id))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// machineIndex finds the testnet node that is machine (a peer ID).
func machineIndex(n *Network, machine string) int {
	for i, nd := range n.Manifest.Nodes {
		if nd.PeerID == machine {
			return i
		}
	}
	return -1
}

// jobCgroupProcs lists processes still in a run's worker cgroups.
func jobCgroupProcs(run string) []string {
	var out []string
	procs, _ := filepath.Glob("/proc/[0-9]*/cgroup")
	for _, f := range procs {
		b, err := os.ReadFile(f)
		if err == nil && strings.Contains(string(b), "/deepmarket/"+run[:16]+"-") {
			out = append(out, filepath.Base(filepath.Dir(f)))
		}
	}
	return out
}

// TestFaultLenderKilledMidJob: the machine running a job's worker is
// killed with SIGKILL; the submitter re-places the job on the other
// lender, where it finishes, and pays the lost machine what its receipts
// covered. Restarted, the killed node reaps the worker it left running.
func TestFaultLenderKilledMidJob(t *testing.T) {
	t.Parallel()
	n := startNet(t, Params{Validators: 2, Nodes: 3, Sites: 2, Python: jobPython()}, RunOptions{})
	lend(t, n, 2, 1)
	lend(t, n, 3, 1)
	sub, _ := n.Client(4)
	waitOffers(t, n, 4, 2, time.Minute)
	j, err := sub.Submit(t.Context(), api.SubmitRequest{Spec: workSpec(workBundle(t), 40, "1", "10m"), Yes: true})
	if err != nil {
		t.Fatal(err)
	}
	var victim int
	deadline := time.Now().Add(4 * time.Minute)
	for !strings.Contains(jobLog(t, sub, j.ID), "step 5 of") {
		if time.Now().After(deadline) {
			t.Fatalf("the job did not start:\n%s", jobLog(t, sub, j.ID))
		}
		time.Sleep(300 * time.Millisecond)
	}
	cur, _ := sub.Job(t.Context(), j.ID)
	victim = machineIndex(n, cur.Current().Workers[0].Machine)
	run0 := cur.Current().ID
	if victim < 0 {
		t.Fatalf("worker on unknown machine %s", cur.Current().Workers[0].Machine)
	}
	n.Kill(victim)
	t.Logf("killed %s, which ran worker 0", n.Manifest.Nodes[victim].Name)
	j = waitJob(t, sub, j.ID, 5*time.Minute)
	log := jobLog(t, sub, j.ID)
	if j.State != jobs.Succeeded || len(j.Runs) != 2 {
		t.Fatalf("after losing its lender the job is %s (%s) with %d runs\n%s", j.State, j.Reason, len(j.Runs), log)
	}
	if machineIndex(n, j.Runs[1].Workers[0].Machine) == victim {
		t.Fatal("re-placed on the killed machine")
	}
	// The killed machine's worker ran on without its node; restarted, the
	// node reaps it.
	if err := n.Launch(t.Context(), victim); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(30 * time.Second)
	for len(jobCgroupProcs(run0)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("processes %v of the lost worker outlived the restart of its node", jobCgroupProcs(run0))
		}
		time.Sleep(300 * time.Millisecond)
	}
	top := n.Heights(t.Context(), []int{0})[0]
	n.waitHeights(t, all(n), top, time.Minute)
	n.check(t, all(n), true)
}

// TestFaultSubmitterKilledMidJob: the submitter dies with SIGKILL while
// its job runs and stays dead. The lender stops the unpaid work, and once
// the escrow expires claims what the submitter's last receipt covered;
// when the submitter comes back it takes the rest of its escrow back.
func TestFaultSubmitterKilledMidJob(t *testing.T) {
	t.Parallel()
	n := startNet(t, Params{Validators: 2, Nodes: 2, Sites: 2, Python: jobPython(),
		Configure: func(nd *Node, cfg *node.Config) { cfg.Jobs.EscrowSlack = node.Duration{Duration: 10 * time.Second} }},
		RunOptions{})
	const lender, submitter = 2, 3
	lend(t, n, lender, 1)
	sub, _ := n.Client(submitter)
	waitOffers(t, n, submitter, 1, time.Minute)
	j, err := sub.Submit(t.Context(), api.SubmitRequest{Spec: workSpec(workBundle(t), 600, "1", "80s"), Yes: true})
	if err != nil {
		t.Fatal(err)
	}
	// Wait for a receipt: what the lender is owed so far.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		cur, err := sub.Job(t.Context(), j.ID)
		if err == nil && cur.Current() != nil && len(cur.Current().Workers) == 1 && cur.Current().Workers[0].Receipt > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no receipt within 2 min:\n%s", jobLog(t, sub, j.ID))
		}
		time.Sleep(500 * time.Millisecond)
	}
	n.Kill(submitter)
	lc, _ := n.Client(lender)
	before, _ := lc.Balance(t.Context(), "")
	// Escrow expiry (80 s + 10 s after the launch) plus the claim delay.
	deadline = time.Now().Add(4 * time.Minute)
	var after api.Balance
	for {
		after, _ = lc.Balance(t.Context(), "")
		if after.Balance > before.Balance {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the lender did not claim within 4 min:%s", n.LogTail(lender, 30))
		}
		time.Sleep(time.Second)
	}
	t.Logf("the lender claimed %d micro-credits", after.Balance-before.Balance)
	// The submitter returns: its job ends, and the rest of the escrow comes
	// back to it.
	if err := n.Launch(t.Context(), submitter); err != nil {
		t.Fatal(err)
	}
	sub, _ = n.Client(submitter)
	j = waitJob(t, sub, j.ID, 3*time.Minute)
	deadline = time.Now().Add(2 * time.Minute)
	for {
		rep, err := sub.Audit(t.Context())
		if err == nil && rep.OK && rep.Escrowed == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("escrow not returned: %+v %v (job %s: %s)\n%s", rep, err, j.State, j.Reason, jobLog(t, sub, j.ID))
		}
		time.Sleep(time.Second)
	}
	top := n.Heights(t.Context(), []int{0})[0]
	n.waitHeights(t, all(n), top, time.Minute)
	n.check(t, all(n), true)
}

// TestFaultConcurrentBids: many jobs bid at once over twenty lending
// machines. No machine ever runs more than it lends, and every escrow
// ends settled or refunded.
func TestFaultConcurrentBids(t *testing.T) {
	t.Parallel()
	lenders, bids := 20, size(200, 1000)
	submitters := 4
	n := startNet(t, Params{Validators: 2, Nodes: lenders + submitters, Sites: 2, Python: jobPython()},
		RunOptions{StartTimeout: 2 * time.Minute})
	for i := 2; i < 2+lenders; i++ {
		lend(t, n, i, 1)
	}
	for s := 0; s < submitters; s++ {
		waitOffers(t, n, 2+lenders+s, lenders, 2*time.Minute)
	}
	bundle := workBundle(t)
	var wg sync.WaitGroup
	var submitErrs atomic.Int64
	start := time.Now()
	for b := range bids {
		s := 2 + lenders + b%submitters
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, _ := n.Client(s)
			spec := workSpec(bundle, 1, "0.5", "5m")
			spec.Name = fmt.Sprintf("bid-%d", b)
			// Submit returns once the job is quoted; under this load the
			// answer may outlast the client's timeout, while the node
			// goes on with the job: every job is read back below.
			if _, err := c.Submit(t.Context(), api.SubmitRequest{Spec: spec, Yes: true}); err != nil {
				submitErrs.Add(1)
			}
		}()
	}
	wg.Wait()
	states := map[jobs.State]int{}
	reasons := map[string]int{}
	total := 0
	for s := 2 + lenders; s < 2+lenders+submitters; s++ {
		c, _ := n.Client(s)
		deadline := time.Now().Add(20 * time.Minute)
		var list []jobs.Job
		for {
			var err error
			list, err = c.Jobs(t.Context())
			live := 0
			for _, j := range list {
				if !j.State.Terminal() {
					live++
				}
			}
			if err == nil && live == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d of %d jobs still live after 20 min (%v)", n.Manifest.Nodes[s].Name, live, len(list), err)
			}
			time.Sleep(2 * time.Second)
		}
		total += len(list)
		for _, j := range list {
			states[j.State]++
			if j.State != jobs.Succeeded {
				reasons[firstWords(j.Reason)]++
			}
			for _, r := range j.Runs {
				if r.Escrow > 0 && !r.Settled {
					t.Errorf("job %s run %s: escrow %d not settled (%s)", j.ID[:12], r.ID[:12], r.Escrow, j.State)
				}
			}
		}
	}
	if total != bids {
		t.Errorf("the submitters hold %d jobs for %d bids (%d submit calls failed)", total, bids, submitErrs.Load())
	}
	t.Logf("why jobs did not run: %v", reasons)
	t.Logf("%d bids over %d machines in %s: %v", bids, lenders, time.Since(start).Round(time.Second), states)
	if states[jobs.Succeeded] == 0 {
		t.Fatal("no job ran")
	}
	for i := 2; i < 2+lenders; i++ {
		peak := metric(t, n, i, "deepmarket_exec_cores_in_use_peak")
		if peak > 1 {
			t.Errorf("%s lends 1 core and ran %v cores' worth of workers at once", n.Manifest.Nodes[i].Name, peak)
		}
	}
	n.check(t, all(n), true)
}

// firstWords shortens a reason to group like ones.
func firstWords(s string) string {
	if f := strings.Fields(s); len(f) > 6 {
		return strings.Join(f[:6], " ")
	}
	return s
}

// metric reads one unlabelled gauge from node i's /metrics.
func metric(t *testing.T, n *Network, i int, name string) float64 {
	t.Helper()
	c, err := n.Client(i)
	if err != nil {
		t.Fatal(err)
	}
	text, err := c.Metrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	t.Fatalf("%s: no metric %s", n.Manifest.Nodes[i].Name, name)
	return 0
}

// TestFaultGossipFlood: a peer floods a node with invalid offers. An
// honest offer still reaches that node about as fast as before the
// flood, and the node scores the flooder down until it is pruned. It runs
// alone, before the parallel tests: it compares two delivery times, and
// other testnets' load between the two would skew the comparison.
func TestFaultGossipFlood(t *testing.T) {
	n := startNet(t, Params{Validators: 2, Nodes: 3, Sites: 2, Python: jobPython()}, RunOptions{})
	const honestA, honestB, victim = 2, 3, 4
	vc, _ := n.Client(victim)
	// Both measurements start on a network that is up.
	waitConnected(t, n, time.Minute)
	// How long an offer takes to arrive here without a flood.
	baseline := timeToOffer(t, n, honestA, victim)
	t.Logf("an honest offer arrives in %s without a flood", baseline)

	k, err := identity.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	h, err := p2p.NewHost(p2p.HostParams{Key: k, Listen: []string{"/ip4/127.0.0.1/tcp/0"}, Version: "flooder"})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ps, err := pubsub.NewGossipSub(t.Context(), h, pubsub.WithFloodPublish(true))
	if err != nil {
		t.Fatal(err)
	}
	topic, err := ps.Join(p2p.OffersTopic(n.Manifest.ChainID))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := topic.Subscribe(); err != nil {
		t.Fatal(err)
	}
	info, err := peer.AddrInfoFromString(n.Addrs.P2P(n.Manifest, victim))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Connect(t.Context(), *info); err != nil {
		t.Fatal(err)
	}
	for len(topic.ListPeers()) == 0 {
		time.Sleep(100 * time.Millisecond)
	}
	// Flood: garbage and offers signed by someone else's key, as fast as
	// the flooder's gossipsub takes them.
	ctx, stop := context.WithCancel(t.Context())
	var sent sync.WaitGroup
	var count int
	sent.Add(1)
	go func() {
		defer sent.Done()
		other, _ := identity.GenerateKey()
		for i := 0; ctx.Err() == nil; i++ {
			var msg []byte
			if i%2 == 0 {
				msg = []byte(fmt.Sprintf("garbage %d", i))
			} else {
				offer := &p2p.Offer{Machine: k.PeerID().String(), Owner: string(k.Address()), Moniker: "fake", Site: "evil",
					Lent: p2p.Resources{Cores: 64, MemBytes: 1 << 40}, Software: p2p.Software{OS: "linux"}}
				msg, _ = p2p.Seal(other, n.Manifest.ChainID, p2p.TypeOffer, offer, uint64(i), time.Now().Add(time.Minute))
			}
			if topic.Publish(ctx, msg) == nil {
				count++
			}
		}
	}()
	time.Sleep(3 * time.Second)
	during := timeToOffer(t, n, honestB, victim)
	stop()
	sent.Wait()
	t.Logf("flooder sent %d invalid messages; an honest offer arrived in %s during the flood", count, during)
	if during > 3*baseline+5*time.Second {
		t.Errorf("an honest offer took %s during the flood, %s without", during, baseline)
	}
	// The flooder's offers never show, and its score sinks.
	offers, _ := vc.Offers(t.Context())
	for _, o := range offers {
		if o.Machine == k.PeerID().String() {
			t.Errorf("the flooder's offer is listed: %+v", o)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		peers, _ := vc.Peers(t.Context())
		score, connected := 0.0, false
		for _, p := range peers {
			if p.PeerID == k.PeerID().String() {
				score, connected = p.Score, true
			}
		}
		if !connected || score < 0 {
			t.Logf("flooder pruned: connected %v, score %.1f", connected, score)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the flooder still scores %.1f after its flood", score)
		}
		time.Sleep(time.Second)
	}
	n.check(t, all(n), true)
}

// waitConnected waits until the nodes' libp2p connections join them all
// into one network. A node that started before the validators listened
// dials them again only after a while, and so does one that reached one
// validator but not the other: until then the gossip it sends may reach
// no one.
func waitConnected(t *testing.T, n *Network, within time.Duration) {
	t.Helper()
	index := map[string]int{}
	for i, nd := range n.Manifest.Nodes {
		index[nd.PeerID] = i
	}
	deadline := time.Now().Add(within)
	for {
		links := make([][]int, len(n.Manifest.Nodes))
		for i := range n.Manifest.Nodes {
			c, err := n.Client(i)
			if err != nil {
				t.Fatal(err)
			}
			peers, _ := c.Peers(t.Context())
			for _, p := range peers {
				if j, ok := index[p.PeerID]; ok {
					links[i], links[j] = append(links[i], j), append(links[j], i)
				}
			}
		}
		reached := map[int]bool{0: true}
		for next := []int{0}; len(next) > 0; {
			i := next[0]
			next = next[1:]
			for _, j := range links[i] {
				if !reached[j] {
					reached[j] = true
					next = append(next, j)
				}
			}
		}
		if len(reached) == len(n.Manifest.Nodes) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the nodes are not one network after %s: connections %v", within, links)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// timeToOffer starts lender lending and returns how long until node
// observer holds its offer.
func timeToOffer(t *testing.T, n *Network, lender, observer int) time.Duration {
	t.Helper()
	oc, _ := n.Client(observer)
	start := time.Now()
	lend(t, n, lender, 1)
	for {
		offers, _ := oc.Offers(t.Context())
		for _, o := range offers {
			if o.Machine == n.Manifest.Nodes[lender].PeerID {
				return time.Since(start)
			}
		}
		if time.Since(start) > 2*time.Minute {
			t.Fatalf("%s never saw %s's offer", n.Manifest.Nodes[observer].Name, n.Manifest.Nodes[lender].Name)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestFaultPartitionHeals: one site is cut off from the others (network
// namespaces, profile lan) while the rest go on; no fork. Healed, the
// minority catches up, an offer made during the cut reaches the others,
// and a job placed from across the old cut runs there.
func TestFaultPartitionHeals(t *testing.T) {
	t.Parallel()
	if err := netlab.Available(); err != nil {
		t.Skipf("network namespaces: %v", err)
	}
	// val0 univ-a, val1 univ-b, val2 univ-c, val3 univ-a, node0 univ-b,
	// node1 univ-c: without univ-c, three validators of four go on.
	n := startNet(t, Params{Validators: 4, Nodes: 2, Sites: 3, Python: jobPython(),
		Configure: func(_ *Node, c *node.Config) {
			c.P2P.DiscoverInterval = node.Duration{Duration: 5 * time.Second}
			c.P2P.AnnounceInterval = node.Duration{Duration: 10 * time.Second}
		}},
		RunOptions{Profile: "lan", StartTimeout: 2 * time.Minute})
	const cut = 2 // univ-c
	minority, majority := []int{2, 5}, []int{0, 1, 3, 4}
	const lender, submitter = 5, 4
	n.waitHeights(t, all(n), 2, time.Minute)
	sink := newSink(t, n)
	if err := n.Partition(cut); err != nil {
		t.Fatal(err)
	}
	lend(t, n, lender, 1) // its offer cannot cross the cut
	l := &transferLoad{net: n, senders: []int{0, 1}, sink: sink, via: func(k int) []int { return []int{k} }}
	l.run(t, t.Context(), 100)
	if l.committed.Load() != 100 {
		t.Fatalf("the majority committed %d of 100 transfers during the partition", l.committed.Load())
	}
	hs := n.Heights(t.Context(), append(append([]int{}, majority...), minority...))
	t.Logf("heights during the partition (majority, then minority): %v", hs)
	if hs[4] >= hs[0] || hs[5] >= hs[0] {
		t.Fatalf("the cut-off site kept up with the chain: %v", hs)
	}
	sc, _ := n.Client(submitter)
	time.Sleep(5 * time.Second)
	if offers, _ := sc.Offers(t.Context()); len(offers) != 0 {
		t.Fatalf("an offer crossed the partition: %+v", offers)
	}
	if err := n.Heal(cut); err != nil {
		t.Fatal(err)
	}
	top := n.Heights(t.Context(), []int{0})[0]
	n.waitHeights(t, minority, top, 2*time.Minute)
	waitOffers(t, n, submitter, 1, 2*time.Minute)
	j, err := sc.Submit(t.Context(), api.SubmitRequest{Spec: workSpec(workBundle(t), 3, "0.5", "5m"), Yes: true})
	if err != nil {
		t.Fatal(err)
	}
	if j = waitJob(t, sc, j.ID, 3*time.Minute); j.State != jobs.Succeeded {
		t.Fatalf("a job across the healed cut: %s (%s)\n%s", j.State, j.Reason, jobLog(t, sc, j.ID))
	}
	if machineIndex(n, j.Current().Workers[0].Machine) != lender {
		t.Fatalf("the job ran on %s", j.Current().Workers[0].Machine)
	}
	top = n.Heights(t.Context(), []int{0})[0]
	n.waitHeights(t, all(n), top, time.Minute)
	n.check(t, all(n), true)
}
