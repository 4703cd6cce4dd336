package testnet

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/internal/testutil"
	"github.com/deepmarket/deepmarket/node"
	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/testnet/netlab"
)

// natNet runs three universities under a NAT profile: val0..val2 on the
// emulated internet, node0..node2 (indexes 3..5) each behind its
// university's NAT.
func natNet(t *testing.T, profile string) *Network {
	testutil.NeedRoot(t, netlab.AvailableNAT)
	return startNet(t, Params{Validators: 3, Nodes: 3, Sites: 3, Python: jobPython(),
		Configure: func(_ *Node, c *node.Config) {
			c.P2P.DiscoverInterval = node.Duration{Duration: 5 * time.Second}
			c.P2P.AnnounceInterval = node.Duration{Duration: 5 * time.Second}
			c.P2P.OfferTTL = node.Duration{Duration: 30 * time.Second}
		}},
		RunOptions{Profile: profile, StartTimeout: 2 * time.Minute})
}

// waitReach waits until node i's offer, as node obs holds it, says how
// the machine is reached.
func waitReach(t *testing.T, n *Network, obs int, lenders []int, reach string, within time.Duration) {
	t.Helper()
	c, _ := n.Client(obs)
	deadline := time.Now().Add(within)
	for {
		offers, err := c.Offers(t.Context())
		got := map[string]string{}
		for _, o := range offers {
			got[o.Machine] = o.Reach
		}
		ok := err == nil
		for _, i := range lenders {
			ok = ok && got[n.Manifest.Nodes[i].PeerID] == reach
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: offers' reach %v after %s, want %q for nodes %v (%v)", n.Manifest.Nodes[obs].Name, got, within, reach, lenders, err)
		}
		time.Sleep(time.Second)
	}
}

// relayedBytes is what the validators' relays carried in all.
func relayedBytes(t *testing.T, n *Network) float64 {
	var sum float64
	for i, nd := range n.Manifest.Nodes {
		if !nd.Validator {
			continue
		}
		c, _ := n.Client(i)
		text, err := c.Metrics(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(text, "\n") {
			if strings.HasPrefix(line, "libp2p_relaysvc_data_transferred_bytes_total") {
				f := strings.Fields(line)
				v, _ := strconv.ParseFloat(f[len(f)-1], 64)
				sum += v
			}
		}
	}
	return sum
}

// TestJobsAcrossCampusNATs: labs behind three NATs (profile nat) learn
// that they are private, reserve relay slots on the validators and
// advertise them; a 1-worker job and a 2-worker TensorFlow job from one
// lab run on the two others, whose connections end direct (hole
// punched), and the relays carry the control traffic only. It runs alone,
// before the parallel tests: run beside four other testnets, its two
// TensorFlow workers once never reached each other (a hole punch times its
// simultaneous dials by a measured round trip, which a loaded CPU skews).
func TestJobsAcrossCampusNATs(t *testing.T) {
	n := natNet(t, "nat")
	const submitter, lenderA, lenderB = 3, 4, 5
	for _, i := range []int{submitter, lenderA, lenderB} {
		c, _ := n.Client(i)
		deadline := time.Now().Add(90 * time.Second)
		for {
			st, err := c.Status(t.Context())
			if err == nil && st.NAT.Reachability == "private" && len(st.NAT.RelayAddrs) > 0 && len(st.NAT.PublicAddrs) > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not found private with a relay slot and a public mapping: %+v (%v)", n.Manifest.Nodes[i].Name, st.NAT, err)
			}
			time.Sleep(time.Second)
		}
	}
	lendForTensorFlow(t, n, lenderA, lenderB)
	waitReach(t, n, submitter, []int{lenderA, lenderB}, "nat", 90*time.Second)
	sc, _ := n.Client(submitter)

	one, err := sc.Submit(t.Context(), api.SubmitRequest{Spec: workSpec(workBundle(t), 3, "0.5", "5m"), Yes: true})
	if err != nil {
		t.Fatal(err)
	}
	if j := waitJob(t, sc, one.ID, 3*time.Minute); j.State != jobs.Succeeded {
		t.Fatalf("a 1-worker job on a lab behind a NAT: %s (%s)\n%s", j.State, j.Reason, jobLog(t, sc, one.ID))
	}
	before := relayedBytes(t, n)
	two, err := sc.Submit(t.Context(), api.SubmitRequest{Spec: fashionSpec(t, 2), Yes: true})
	if err != nil {
		t.Fatal(err)
	}
	j := waitJob(t, sc, two.ID, 8*time.Minute)
	if j.State != jobs.Succeeded {
		t.Fatalf("a 2-worker TensorFlow job across two NATs: %s (%s)\n%s", j.State, j.Reason, jobLog(t, sc, two.ID))
	}
	wantWorkersOn(t, n, j, lenderA, lenderB)
	relayed := relayedBytes(t, n) - before
	t.Logf("the relays carried %.0f bytes during the TensorFlow job", relayed)
	if relayed > 1<<20 {
		t.Fatalf("the relays carried %.0f bytes during the TensorFlow job: the bulk went through them", relayed)
	}
	for _, pair := range [][2]int{{lenderA, lenderB}, {submitter, lenderA}, {submitter, lenderB}} {
		if found := connection(t, n, pair[0], pair[1]); found != "direct" {
			t.Errorf("%s's connection to %s is %q, want direct (hole punched)", n.Manifest.Nodes[pair[0]].Name, n.Manifest.Nodes[pair[1]].Name, found)
		}
	}
	n.check(t, all(n), true)
}

// TestSymmetricNATsKeepJobsApart: labs behind symmetric NATs (profile
// nat-symmetric) cannot be hole punched to each other. A 1-worker job
// from a public node runs on one; a 2-worker job waits in the queue,
// saying why, rather than be spread over two labs that cannot reach each
// other; once a public machine lends, it runs there and on one lab.
func TestSymmetricNATsKeepJobsApart(t *testing.T) {
	t.Parallel()
	n := natNet(t, "nat-symmetric")
	const submitter, public, lenderA, lenderB = 0, 1, 4, 5
	lend(t, n, lenderA, 1)
	lend(t, n, lenderB, 1)
	waitReach(t, n, submitter, []int{lenderA, lenderB}, "relay", 2*time.Minute)
	sc, _ := n.Client(submitter)
	bundle := workBundle(t)
	one, err := sc.Submit(t.Context(), api.SubmitRequest{Spec: workSpec(bundle, 3, "0.5", "5m"), Yes: true})
	if err != nil {
		t.Fatal(err)
	}
	if j := waitJob(t, sc, one.ID, 3*time.Minute); j.State != jobs.Succeeded {
		t.Fatalf("a 1-worker job on a lab behind a symmetric NAT: %s (%s)\n%s", j.State, j.Reason, jobLog(t, sc, one.ID))
	}
	spec := workSpec(bundle, 3, "0.5", "5m")
	spec.Workers = 2
	two, err := sc.Submit(t.Context(), api.SubmitRequest{Spec: spec, Yes: true})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		j, err := sc.Job(t.Context(), two.ID)
		if err != nil {
			t.Fatal(err)
		}
		if j.State.Terminal() || j.State == jobs.Running {
			t.Fatalf("a 2-worker job over two symmetric NATs: %s (%s), want it waiting\n%s", j.State, j.Reason, jobLog(t, sc, two.ID))
		}
		if j.State == jobs.Waiting && j.Queue != nil && strings.Contains(j.Queue.Why, "reach each other") {
			t.Logf("waiting: %s", j.Queue.Why)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the 2-worker job is %s (%+v), want waiting for machines that reach each other", j.State, j.Queue)
		}
		time.Sleep(time.Second)
	}
	lend(t, n, public, 1)
	j := waitJob(t, sc, two.ID, 4*time.Minute)
	if j.State != jobs.Succeeded {
		t.Fatalf("the 2-worker job once a public machine lends: %s (%s)\n%s", j.State, j.Reason, jobLog(t, sc, two.ID))
	}
	if machineIndex(n, j.Current().Workers[0].Machine) != public && machineIndex(n, j.Current().Workers[1].Machine) != public {
		t.Fatalf("the 2-worker job ran on %s and %s, neither public", j.Current().Workers[0].Machine, j.Current().Workers[1].Machine)
	}
	n.check(t, all(n), true)
}

// lendForTensorFlow lends one core and 3 GiB of each of the nodes: room
// for one worker of fashionSpec.
func lendForTensorFlow(t *testing.T, n *Network, nodes ...int) {
	t.Helper()
	for _, i := range nodes {
		c, _ := n.Client(i)
		if _, err := c.SetLend(t.Context(), api.LendRequest{Cores: 1, MemBytes: 3 << 30}); err != nil {
			t.Fatal(err)
		}
	}
}

// wantWorkersOn fails t unless job j's current run had a worker on each
// of the nodes.
func wantWorkersOn(t *testing.T, n *Network, j *jobs.Job, nodes ...int) {
	t.Helper()
	machines := map[int]bool{}
	for _, w := range j.Current().Workers {
		machines[machineIndex(n, w.Machine)] = true
	}
	for _, i := range nodes {
		if !machines[i] {
			t.Fatalf("the job ran on nodes %v, want a worker on each of %v", machines, nodes)
		}
	}
}

// fashionSpec is a short real training run of examples/fashion-mnist.
func fashionSpec(t *testing.T, workers int) jobs.File {
	bundle, err := filepath.Abs("../examples/fashion-mnist")
	if err != nil {
		t.Fatal(err)
	}
	return jobs.File{Name: "fashion-nat", Framework: "tensorflow",
		Command: []string{"python3", "train.py", "--epochs", "1", "--steps-per-epoch", "40"}, Bundle: bundle,
		Dataset: "/usr/share/datasets/fashion-mnist", Workers: workers, Cores: 1, Memory: "2GiB",
		MaxPrice: "5", MaxDuration: "15m"}
}

// TestAPublicValidatorRelaysUnderAuto: a university's validator on a
// public address with relay_service left at "auto", as a new university
// would leave it, and a lab behind a NAT whose only public peer it is.
// AutoNAT cannot confirm the validator public with one peer, but the lab
// dials it on its public address from outside, which is evidence enough:
// it relays, says why, and the lab reserves a slot on it.
func TestAPublicValidatorRelaysUnderAuto(t *testing.T) {
	testutil.NeedRoot(t, netlab.AvailableNAT)
	t.Parallel()
	n := startNet(t, Params{Validators: 1, Nodes: 1}, RunOptions{Profile: "nat", RelayAuto: true, StartTimeout: 2 * time.Minute})
	const val, lab = 0, 1
	vc, _ := n.Client(val)
	lc, _ := n.Client(lab)
	deadline := time.Now().Add(60 * time.Second)
	for {
		vst, err1 := vc.Status(t.Context())
		lst, err2 := lc.Status(t.Context())
		if err1 == nil && err2 == nil && vst.NAT.Relaying && len(lst.NAT.RelayAddrs) > 0 {
			if !strings.Contains(vst.NAT.RelayWhy, "dialled on its public address") {
				t.Errorf("the validator relays, saying %q: want the inbound connection that showed it public", vst.NAT.RelayWhy)
			}
			t.Logf("validator: %+v; lab: %+v", vst.NAT, lst.NAT)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("60 s after start under relay_service = auto: validator %+v (%v), lab %+v (%v)", vst.NAT, err1, lst.NAT, err2)
		}
		time.Sleep(time.Second)
	}
}

// TestOnePublicValidatorIsEnough: the smallest real network, one
// university's validator on a public address, its relay_service left at
// "auto" as a new university leaves it, and two labs, each behind a NAT
// of its own whose only public peer is that validator. Both labs lend,
// and one submits a 2-worker TensorFlow job, which runs a worker on each.
// Each lab learns its mapping from that one observer; the labs' relayed
// connection is hole punched (go-libp2p's DCUtR punches to addresses one
// observer has seen), the bundle and dataset come over the direct
// connection, and the workers' tunnel between the labs is punched
// through both NATs (p2p/tunnel's PunchProtocol).
func TestOnePublicValidatorIsEnough(t *testing.T) {
	n := startLabs(t, true)
	waitLabs(t, n, lender, submitter)
	lendForTensorFlow(t, n, lender, submitter)
	waitReach(t, n, submitter, []int{lender, submitter}, "nat", 3*time.Minute)
	// The labs meet when the job needs it: first through the validator's
	// relay, then hole punched.
	sc, _ := n.Client(submitter)
	before := relayedBytes(t, n)
	j, err := sc.Submit(t.Context(), api.SubmitRequest{Spec: fashionSpec(t, 2), Yes: true})
	if err != nil {
		t.Fatal(err)
	}
	if j = waitJob(t, sc, j.ID, 8*time.Minute); j.State != jobs.Succeeded {
		var sts []string
		for _, i := range []int{lender, submitter} {
			c, _ := n.Client(i)
			st, _ := c.Status(t.Context())
			b, _ := os.ReadFile(filepath.Join(n.Dir, n.Manifest.Nodes[i].Home, "node.log"))
			sts = append(sts, fmt.Sprintf("%s: NAT %+v\n%s", n.Manifest.Nodes[i].Name, st.NAT, grepLines(string(b), "punch")))
		}
		t.Fatalf("a 2-worker job on two labs, one public validator: %s (%s)\n%s\n%s", j.State, j.Reason, jobLog(t, sc, j.ID), strings.Join(sts, "\n"))
	}
	wantWorkersOn(t, n, j, lender, submitter)
	// The bundle, the dataset and the workers' traffic went direct: the
	// relay carried the control messages only.
	if relayed := relayedBytes(t, n) - before; relayed > 1<<20 {
		t.Errorf("the relay carried %.0f bytes during the TensorFlow job: the bulk went through it", relayed)
	} else {
		t.Logf("the relay carried %.0f bytes during the TensorFlow job", relayed)
	}
	waitDirect(t, n, submitter, lender, 90*time.Second)
	for _, pair := range [][2]int{{submitter, lender}, {lender, submitter}} {
		c, _ := n.Client(pair[0])
		found := connection(t, n, pair[0], pair[1])
		st, _ := c.Status(t.Context())
		t.Logf("%s: connection to %s %q; NAT %+v", n.Manifest.Nodes[pair[0]].Name, n.Manifest.Nodes[pair[1]].Name, found, st.NAT)
		if found != "direct" {
			t.Errorf("%s's connection to %s is %q, want direct (hole punched); its NAT status %+v", n.Manifest.Nodes[pair[0]].Name,
				n.Manifest.Nodes[pair[1]].Name, found, st.NAT)
		}
	}
}

// The labs of startLabs' network: node0 in univ-b's lab, node1 in
// univ-a's.
const lender, submitter = 1, 2

// startLabs starts the smallest real network: one validator, the only
// public node (its relay_service "auto" with relayAuto, else "on"), and
// two labs behind NATs of their own.
func startLabs(t *testing.T, relayAuto bool) *Network {
	t.Helper()
	testutil.NeedRoot(t, netlab.AvailableNAT)
	n := startNet(t, Params{Validators: 1, Nodes: 2, Sites: 2, Python: jobPython(),
		Configure: func(_ *Node, c *node.Config) {
			c.P2P.DiscoverInterval = node.Duration{Duration: 5 * time.Second}
			c.P2P.AnnounceInterval = node.Duration{Duration: 5 * time.Second}
			c.P2P.OfferTTL = node.Duration{Duration: 30 * time.Second}
		}},
		RunOptions{Profile: "nat", RelayAuto: relayAuto, StartTimeout: 2 * time.Minute})
	if a, b := n.pos[lender].site, n.pos[submitter].site; a == b || a == 0 || b == 0 {
		t.Fatalf("the labs' places %v: want two NATed lab sites", n.pos)
	}
	return n
}

// submitAcrossLabs waits for startLabs' labs, lends the lender and
// submits a one-worker job from the other lab, which makes them meet.
func submitAcrossLabs(t *testing.T, n *Network) (*api.Client, *jobs.Job) {
	t.Helper()
	waitLabs(t, n, lender, submitter)
	lend(t, n, lender, 1)
	waitReach(t, n, submitter, []int{lender}, "nat", 3*time.Minute)
	sc, _ := n.Client(submitter)
	j, err := sc.Submit(t.Context(), api.SubmitRequest{Spec: workSpec(workBundle(t), 3, "0.5", "5m"), Yes: true})
	if err != nil {
		t.Fatal(err)
	}
	return sc, j
}

// waitLabs waits until each of the nodes is found private, with a relay
// slot and a public mapping.
func waitLabs(t *testing.T, n *Network, nodes ...int) {
	t.Helper()
	for _, i := range nodes {
		c, _ := n.Client(i)
		deadline := time.Now().Add(3 * time.Minute)
		for {
			st, err := c.Status(t.Context())
			if err == nil && st.NAT.Reachability == "private" && len(st.NAT.RelayAddrs) > 0 && len(st.NAT.PublicAddrs) > 0 {
				break
			}
			if time.Now().After(deadline) {
				b, _ := os.ReadFile(filepath.Join(n.Dir, n.Manifest.Nodes[i].Home, "node.log"))
				t.Fatalf("%s: not found private with a relay slot and a public mapping: %+v (%v)\n%s", n.Manifest.Nodes[i].Name, st.NAT, err, grepLines(string(b), "observ"))
			}
			time.Sleep(time.Second)
		}
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// connection is how node a is connected to node b, as its peers list
// says: "direct", "relayed", or "" when it is not.
func connection(t *testing.T, n *Network, a, b int) string {
	t.Helper()
	c, _ := n.Client(a)
	peers, err := c.Peers(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range peers {
		if p.PeerID == n.Manifest.Nodes[b].PeerID {
			return p.Connection
		}
	}
	return ""
}

// waitDirect waits until node a's connection to node b is direct.
func waitDirect(t *testing.T, n *Network, a, b int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		found := connection(t, n, a, b)
		if found == "direct" {
			return
		}
		if time.Now().After(deadline) {
			c, _ := n.Client(a)
			st, _ := c.Status(t.Context())
			t.Fatalf("%s's connection to %s is %q after %s, want direct (hole punched): %+v", n.Manifest.Nodes[a].Name,
				n.Manifest.Nodes[b].Name, found, within, st.NAT)
		}
		time.Sleep(time.Second)
	}
}

// TestAFailedHolePunchIsTriedAgain: two labs behind NATs of their own and
// one public validator, as in TestOnePublicValidatorIsEnough, but a
// firewall between the two campuses drops what they send each other
// until their first hole punches have failed (12 s: libp2p's own three
// tries, and some of the node's). The labs dial each other through the
// relay as the job starts, so each holds a relayed connection the other
// dialled. The node tries the punch again (p2p/punch.go: after a
// failure, with a growing delay), from the smaller peer ID, on the
// connection the peer dialled (libp2p's pick of the other had the peer
// reset the DCUtR stream, retry after retry), so once the firewall lets
// them through their connection turns direct, and the job that made them
// meet fetches its bundle over it and succeeds. libp2p alone punches once
// per relayed connection: the connection would stay relayed, and the job
// fail ("no peer delivered a block").
func TestAFailedHolePunchIsTriedAgain(t *testing.T) {
	n := startLabs(t, false)
	a, b := n.pos[lender].site, n.pos[submitter].site
	if err := n.Lab.Block(a, b); err != nil {
		t.Fatal(err)
	}
	punchLog := func() string {
		var out []string
		for _, i := range []int{lender, submitter} {
			bs, _ := os.ReadFile(filepath.Join(n.Dir, n.Manifest.Nodes[i].Home, "node.log"))
			out = append(out, "--- "+n.Manifest.Nodes[i].Name, grepLines(string(bs), "punch"))
		}
		return strings.Join(out, "\n")
	}
	sc, j := submitAcrossLabs(t, n)
	// The labs meet through the relay, and their punch fails.
	deadline := time.Now().Add(2 * time.Minute)
	for failed := ""; failed == ""; time.Sleep(200 * time.Millisecond) {
		for _, i := range []int{lender, submitter} {
			c, _ := n.Client(i)
			if st, err := c.Status(t.Context()); err == nil && st.NAT.LastHolePunch != nil && !st.NAT.LastHolePunch.Success {
				failed = fmt.Sprintf("%s: %s", n.Manifest.Nodes[i].Name, st.NAT.LastHolePunch)
			}
		}
		if failed != "" {
			t.Logf("behind the firewall: %s", failed)
		} else if time.Now().After(deadline) {
			t.Fatalf("no hole punch failed behind the firewall within 2 min\nthe job's log:\n%s", jobLog(t, sc, j.ID))
		}
	}
	// libp2p tries 3 times in about 6 s, then never again on this
	// connection; the firewall outlasts that.
	time.Sleep(12 * time.Second)
	if c := connection(t, n, submitter, lender); c != "relayed" {
		t.Fatalf("the labs' connection is %q behind the firewall, want relayed", c)
	}
	if err := n.Lab.Unblock(a, b); err != nil {
		t.Fatal(err)
	}
	lifted := time.Now()
	deadline = time.Now().Add(90 * time.Second)
	for connection(t, n, submitter, lender) != "direct" {
		if time.Now().After(deadline) {
			t.Fatalf("not direct 90 s after the firewall lifted:\n%s", punchLog())
		}
		time.Sleep(time.Second)
	}
	t.Logf("direct %s after the firewall lifted", time.Since(lifted).Round(time.Second))
	if j = waitJob(t, sc, j.ID, 3*time.Minute); j.State != jobs.Succeeded {
		t.Fatalf("the job that made the labs meet: %s (%s)\n%s", j.State, j.Reason, jobLog(t, sc, j.ID))
	}
}
