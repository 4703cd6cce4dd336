package node

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/image/imagetest"
	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/node/submitter"
	"github.com/deepmarket/deepmarket/p2p"
)

// fashionSpec is a short real training run of examples/fashion-mnist.
func fashionSpec(t *testing.T, workers int, extra ...string) jobs.File {
	bundle, err := filepath.Abs("../examples/fashion-mnist")
	if err != nil {
		t.Fatal(err)
	}
	cmd := append([]string{"python3", "train.py", "--epochs", "2", "--steps-per-epoch", "60"}, extra...)
	return jobs.File{Name: "fashion-e2e", Framework: "tensorflow", Command: cmd, Bundle: bundle,
		Dataset: "/usr/share/datasets/fashion-mnist", Workers: workers, Cores: 1, Memory: "2GiB",
		MaxPrice: "5", MaxDuration: "15m"}
}

// TestFashionMNISTAcrossTwoLenders: a submitter and two lenders lending a
// core each; a 2-worker Fashion-MNIST job forms one TF cluster through
// the tunnels, trains, and its result comes back; each lender is paid
// its price for the time it ran, the submitter pays exactly that, and
// the ledger's audit passes. The job runs in its own image: the
// virtualenv it would run with, packed (`env pack`) onto a small image
// of the host's python3, which each lender fetches and unpacks once (a
// second job in it runs from their caches).
func TestFashionMNISTAcrossTwoLenders(t *testing.T) {
	py := jobPython(t)
	c := startJobCluster(t, py, 2)
	a := c.sub
	before, err := a.client.Balance(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	venv := filepath.Dir(filepath.Dir(py))
	sites, _ := filepath.Glob(filepath.Join(venv, "lib", "python3*", "site-packages"))
	base := imagetest.Layout(t, imagetest.PythonFor(t, sites...))
	img, err := a.client.EnvBuild(t.Context(), api.EnvBuildRequest{Venv: venv, Base: base, Name: "tf"}, nil)
	if err != nil {
		t.Fatalf("env pack: %v", err)
	}
	spec := fashionSpec(t, 2)
	spec.Image = "tf"
	j, err := a.client.Submit(t.Context(), api.SubmitRequest{Spec: spec, Yes: true})
	if err != nil {
		t.Fatal(err)
	}
	// While it trains: no worker listens beyond loopback.
	scanned := false
	for range 120 {
		cur, _ := a.client.Job(t.Context(), j.ID)
		if cur.State == jobs.Running && cur.Current() != nil && cur.Current().Workers[0].State == "running" {
			// Scan once the TF servers listen (after TF's import).
			if assertNoTFPortReachable(t, c.lenders, false) {
				scanned = true
				break
			}
		}
		if cur.State.Terminal() {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	j = waitJob(t, a, j.ID, 6*time.Minute)
	log := jobLog(t, a, j.ID)
	if j.State != jobs.Succeeded {
		t.Fatalf("job %s: %s\n%s", j.State, j.Reason, log)
	}
	if !scanned {
		t.Error("the job ended before its TF servers could be port-scanned")
	}
	// The result: the chief's output dir, fetched by CID.
	out := filepath.Join(t.TempDir(), "result")
	if _, err := a.client.DataGet(t.Context(), j.ResultCID, out, nil); err != nil {
		t.Fatal(err)
	}
	var res struct {
		Accuracy float64 `json:"test_accuracy"`
		Workers  int     `json:"workers"`
	}
	b, err := os.ReadFile(filepath.Join(out, "result.json"))
	if err != nil {
		t.Fatalf("result: %v\n%s", err, log)
	}
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	t.Logf("result %s\nlog:\n%s", b, log)
	if res.Workers != 2 || res.Accuracy < 0.75 {
		t.Errorf("result %s: want 2 workers and test accuracy above 0.75", b)
	}
	// Credits: each lender earned what the settlement paid it, which is
	// its hourly price for the time its worker ran up to its last
	// progress (train.py reports every batch) and the other's; the submitter paid exactly
	// the sum; supply is conserved.
	run := j.Current()
	if !run.Settled || run.Paid == 0 || j.Cost != run.Paid || !run.Progress || !run.Lockstep {
		t.Fatalf("run settled %v, paid %d, job cost %d, progress reported %v", run.Settled, run.Paid, j.Cost, run.Progress)
	}
	var sum uint64
	for i, l := range c.lenders {
		w := run.Workers[i]
		for _, x := range run.Workers {
			if x.Machine == l.host.ID().String() {
				w = x
			}
		}
		until := w.Ended
		if w.ProgressAt.Before(until) {
			until = w.ProgressAt
		}
		// The run is in lockstep (sync, 2 workers): no worker is paid
		// past the other's last progress.
		for _, x := range run.Workers {
			if x.ProgressAt.Before(until) {
				until = x.ProgressAt
			}
		}
		// Its last report comes as it ends, give or take the test set's
		// evaluation and the saving (slower beside make test's packages).
		if w.Units == 0 || w.Ended.Sub(until) > 45*time.Second {
			t.Errorf("worker %d reported %d units, its last %s before it ended", i, w.Units, w.Ended.Sub(until))
		}
		earned := uint64(float64(w.PerHour) * until.Sub(w.Started).Hours())
		// Read on the lender's own replica, which may be a block or a
		// blocksync round behind the submitter's.
		var bal api.Balance
		eventually(t, 30*time.Second, "the lender's replica to show its pay", func() bool {
			b, err := l.client.Balance(t.Context(), "")
			bal = b
			return err == nil && b.Balance != 0
		})
		if bal.Balance > earned+1 || bal.Balance+1 < earned {
			t.Errorf("lender %d earned %d; its worker progressed for %s at %d an hour = %d", i, bal.Balance, until.Sub(w.Started), w.PerHour, earned)
		}
		sum += bal.Balance
	}
	// The rest of the escrow comes back once its dispute window closes.
	eventually(t, testDisputeWindow+time.Minute, "the submitter's balance to reflect the settlement", func() bool {
		after, err := a.client.Balance(t.Context(), "")
		return err == nil && before.Balance-after.Balance == sum
	})
	rep, err := settledAudit(t, c.lenders[0]) // the lender's replica may be a block or two behind
	if err != nil || !rep.OK || rep.Escrowed != 0 || rep.Supply != LocalStarterCredit {
		t.Fatalf("audit: %+v %v", rep, err)
	}
	if j.ImageCID != img.CID || !strings.Contains(log, "checked and unpacked in") {
		t.Errorf("the job ran in %q, want the packed image %s:\n%s", j.ImageCID, img.CID, log)
	}
	// A second job in the image: both lenders run it from their caches.
	spec.Name, spec.Command, spec.Dataset = "tf-again", []string{"python3", "-c", "import tensorflow as tf; print('tf', tf.__version__)"}, ""
	again, err := a.client.Submit(t.Context(), api.SubmitRequest{Spec: spec, Yes: true})
	if err != nil {
		t.Fatal(err)
	}
	again = waitJob(t, a, again.ID, 3*time.Minute)
	if log := jobLog(t, a, again.ID); again.State != jobs.Succeeded || strings.Count(log, "held here, nothing to fetch") != 2 || strings.Count(log, "tf 2.20") != 2 {
		t.Errorf("the second job in the image: %s %s; want both workers run from their machine's cache\n%s", again.State, again.Reason, log)
	}
}

// assertNoTFPortReachable port-scans the lenders' addresses for the
// ports the job's processes listen on (read from their own socket
// tables): TensorFlow's gRPC server binds every interface and runs any
// graph it is sent, so none may answer from the host's network, while
// each answers inside the job's namespace, where the tunnels reach it.
func assertNoTFPortReachable(t *testing.T, lenders []*testNode, must bool) bool {
	t.Helper()
	addrs, _ := net.InterfaceAddrs()
	addrs = append(addrs, &net.IPNet{IP: net.IPv4(127, 0, 0, 1)})
	seen := 0
	for _, l := range lenders {
		for _, tg := range l.exec.Sandboxes() {
			for _, port := range listeningPorts(t, tg.Pid, tg.UID) {
				seen++
				c, err := tg.NetNS.DialTCP(t.Context(), port)
				if err != nil {
					t.Errorf("port %d does not answer inside the job's namespace: %v", port, err)
				} else {
					c.Close()
				}
				for _, a := range addrs {
					ip := a.(*net.IPNet).IP
					if hc, err := net.DialTimeout("tcp", net.JoinHostPort(ip.String(), strconv.Itoa(port)), time.Second); err == nil {
						hc.Close()
						t.Errorf("the job's port %d answers on the lender's address %s", port, ip)
					}
				}
			}
		}
	}
	if seen == 0 && must {
		t.Error("found no job listener: the scan checked nothing")
	}
	return seen > 0
}

// listeningPorts lists the TCP ports listening in pid's network
// namespace, on sockets owned by uid, from /proc/pid/net/tcp{,6} (the
// process's threads and children share its namespace).
func listeningPorts(t *testing.T, pid, uid int) []int {
	var ports []int
	for _, f := range []string{"tcp", "tcp6"} {
		fh, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, f))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		sc.Scan() // header
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 8 || fields[3] != "0A" { // LISTEN
				continue
			}
			if owner, _ := strconv.Atoi(fields[7]); owner != uid {
				continue
			}
			local := fields[1]
			p, _ := strconv.ParseUint(local[strings.IndexByte(local, ':')+1:], 16, 16)
			ports = append(ports, int(p))
		}
		fh.Close()
	}
	return ports
}

// TestFashionMNISTDiLoCoAcrossTwoLenders: a job whose spec says [training]
// mode = "diloco" trains with the deepmarket package the environment has,
// its workers averaging every few steps over their second ports, which
// the nodes tunnel like the first.
func TestFashionMNISTDiLoCoAcrossTwoLenders(t *testing.T) {
	py := jobPython(t)
	c := startJobCluster(t, py, 2)
	a := c.sub
	spec := fashionSpec(t, 2)
	// The work described (120 steps of the mlp, 101,770 parameters), so
	// the quote predicts its time from the lenders' links.
	spec.Training = &p2p.Training{Mode: "diloco", SyncEvery: 20, Compress: "int8", Steps: 120, Params: 101_770, StepMillis: 5,
		Holder: p2p.HolderWorkers} // the workers average among themselves (held runs: held_e2e_test.go)
	j, err := a.client.Submit(t.Context(), api.SubmitRequest{Spec: spec, Yes: true})
	if err != nil {
		t.Fatal(err)
	}
	j = waitJob(t, a, j.ID, 6*time.Minute)
	log := jobLog(t, a, j.ID)
	if j.State != jobs.Succeeded {
		t.Fatalf("job %s: %s\n%s", j.State, j.Reason, log)
	}
	if p := j.Runs[0].Predicted; p == nil || p.TotalSeconds <= 0 || p.Fewest != 2 || p.SpeedUp <= 1 {
		t.Errorf("the quote's prediction: %+v", p)
	}
	out := filepath.Join(t.TempDir(), "result")
	if _, err := a.client.DataGet(t.Context(), j.ResultCID, out, nil); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(out, "result.json"))
	if err != nil {
		t.Fatalf("result: %v\n%s", err, log)
	}
	var res struct {
		Accuracy float64 `json:"test_accuracy"`
		Workers  int     `json:"workers"`
		Mode     string  `json:"mode"`
		Rounds   int     `json:"rounds"`
		Sent     int64   `json:"bytes_sent"`
	}
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	t.Logf("result %s", b)
	// 2 epochs of 60 steps, averaged every 20: 6 rounds, each sending the
	// model's deltas (int8) over the tunnel.
	if res.Mode != "diloco" || res.Workers != 2 || res.Rounds < 5 || res.Sent <= 0 || res.Accuracy < 0.7 {
		t.Errorf("result %s: want diloco over 2 workers, 5+ rounds, bytes sent, test accuracy above 0.7\n%s", b, log)
	}
}

// TestLenderLostMidTrainingReplaces: the lender running worker 1 goes
// away while the job trains; within the loss timeout the submitter stops
// the chief (keeping its checkpoint), settles what was used (the lost
// machine only what its receipts cover), re-places the job on the
// remaining machines from the checkpoint, and it finishes. Credits match
// the receipts and settlements; the audit passes.
func TestLenderLostMidTrainingReplaces(t *testing.T) {
	py := jobPython(t)
	c := startJobCluster(t, py, 3)
	a := c.sub
	before, _ := a.client.Balance(t.Context(), "")
	j, err := a.client.Submit(t.Context(), api.SubmitRequest{Spec: fashionSpec(t, 2, "--epochs", "8", "--steps-per-epoch", "100"), Yes: true})
	if err != nil {
		t.Fatal(err)
	}
	// Wait until worker 1 trains, then stop its machine's node.
	var victim *testNode
	eventually(t, 3*time.Minute, "worker 1 to be training", func() bool {
		if !strings.Contains(jobLog(t, a, j.ID), "[w1] [worker 1] epoch 1/") {
			return false
		}
		cur, _ := a.client.Job(t.Context(), j.ID)
		for _, l := range c.lenders {
			if cur.Current().Workers[1].Machine == l.host.ID().String() {
				victim = l
			}
		}
		return true
	})
	victim.stop()
	j = waitJob(t, a, j.ID, 8*time.Minute)
	log := jobLog(t, a, j.ID)
	if j.State != jobs.Succeeded {
		t.Fatalf("job %s after losing a lender: %s\n%s", j.State, j.Reason, log)
	}
	if len(j.Runs) != 2 || !strings.Contains(log, "re-placing") {
		t.Fatalf("want the job re-placed once; %d runs\n%s", len(j.Runs), log)
	}
	if j.Runs[1].Workers[0].Machine == victim.host.ID().String() || j.Runs[1].Workers[1].Machine == victim.host.ID().String() {
		t.Error("the re-placed run uses the lost machine")
	}
	if !strings.Contains(log, "from the chief's checkpoint") {
		t.Errorf("the re-placed run did not resume from a checkpoint\n%s", log)
	}
	// The lost machine is paid what its receipts covered in run 0, the
	// rest what their settlements said; the submitter paid the sum.
	var lostReceipt uint64
	for _, w := range j.Runs[0].Workers {
		if w.Machine == victim.host.ID().String() {
			lostReceipt = max(lostReceipt, w.Receipt)
		}
	}
	// Every balance is read from the submitter's replica, which has the
	// last settlement (a lender's own may be a block behind).
	var total uint64
	for _, l := range c.lenders {
		if l == victim {
			continue
		}
		bal, err := a.client.Balance(t.Context(), submitter.PayeeOf(l.host.ID().String()))
		if err != nil {
			t.Fatal(err)
		}
		total += bal.Balance
	}
	vbal, err := a.client.Balance(t.Context(), submitter.PayeeOf(victim.host.ID().String()))
	if err != nil {
		t.Fatal(err)
	}
	if vbal.Balance != lostReceipt {
		t.Errorf("the lost lender holds %d, its last receipt covered %d", vbal.Balance, lostReceipt)
	}
	total += vbal.Balance
	if j.Cost != total || j.Runs[0].Paid+j.Runs[1].Paid != total {
		t.Errorf("job cost %d, runs paid %d+%d, lenders hold %d", j.Cost, j.Runs[0].Paid, j.Runs[1].Paid, total)
	}
	waitRefunded(t, a, j)
	after, _ := a.client.Balance(t.Context(), "")
	if before.Balance-after.Balance != total {
		t.Errorf("the submitter spent %d, lenders earned %d", before.Balance-after.Balance, total)
	}
	rep, err := a.client.Audit(t.Context())
	if err != nil || !rep.OK || rep.Escrowed != 0 {
		t.Fatalf("audit: %+v %v", rep, err)
	}
}

// TestSubmitterRestartKeepsItsJob: the submitting node stops while its job
// trains and starts again from its home; it picks the job up from its
// store, and the job finishes and is settled.
func TestSubmitterRestartKeepsItsJob(t *testing.T) {
	py := jobPython(t)
	c := startJobCluster(t, py, 2)
	a := c.sub
	j, err := a.client.Submit(t.Context(), api.SubmitRequest{Spec: fashionSpec(t, 2, "--epochs", "4", "--steps-per-epoch", "100"), Yes: true})
	if err != nil {
		t.Fatal(err)
	}
	// Over five minutes beside make test's other packages at worst: the
	// workers import TensorFlow in their sandboxes first.
	for deadline := time.Now().Add(5 * time.Minute); ; time.Sleep(250 * time.Millisecond) {
		cur, _ := a.client.Job(t.Context(), j.ID)
		if cur.State.Terminal() {
			t.Fatalf("job %s before the restart: %s\n%s", cur.State, cur.Reason, jobLog(t, a, j.ID))
		}
		if strings.Contains(jobLog(t, a, j.ID), "[w0] [worker 0] epoch 1/") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after 5m waiting for the job to train (%s)\n%s", cur.State, jobLog(t, a, j.ID))
		}
	}
	a.stop()
	withPython := func(cfg *Config) { cfg.Inventory.Python = py }
	a2 := startNode(t, a.home, withPython, withBootstrap(c.lenders[0].addr(), c.lenders[1].addr()))
	// Three epochs more: seconds alone, minutes beside make test's other
	// packages (an epoch took 60-80 s there).
	j = waitJob(t, a2, j.ID, 10*time.Minute)
	log := jobLog(t, a2, j.ID)
	if j.State != jobs.Succeeded || j.ResultCID == "" || !j.Current().Settled {
		t.Fatalf("after the submitter restarted: %s (%s), result %q\n%s", j.State, j.Reason, j.ResultCID, log)
	}
	if len(j.Runs) != 1 {
		t.Errorf("the job was re-placed (%d runs): the workers should have run on\n%s", len(j.Runs), log)
	}
	rep, err := settledAudit(t, a2)
	if err != nil || !rep.OK || rep.Escrowed != 0 {
		t.Fatalf("audit: %+v %v", rep, err)
	}
}
