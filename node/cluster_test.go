package node

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/jobs"
)

// jobPython is the interpreter with tensorflow-cpu that workers run
// (make test sets DM_PYTHON; `make deps` builds it). Without it the
// end-to-end tests skip, unless DM_REQUIRE_TF says they must run.
func jobPython(t testing.TB) string {
	t.Helper()
	py := os.Getenv("DM_PYTHON")
	if py == "" {
		for _, p := range []string{"/opt/deepmarket/venv/bin/python3", "../.venv/bin/python3"} {
			if _, err := os.Stat(p); err == nil {
				py, _ = filepath.Abs(p)
				break
			}
		}
	}
	if py == "" || !importsTF(py) {
		if os.Getenv("DM_REQUIRE_TF") != "" {
			t.Fatalf("no Python with tensorflow-cpu (DM_PYTHON=%q): run `make deps`", py)
		}
		t.Skip("no Python with tensorflow-cpu: run `make deps` (make test does)")
	}
	needSandbox(t)
	return py
}

// genericPython is the interpreter for tests whose jobs need python3
// alone (no TensorFlow, no deepmarket package): basePython of jobPython.
func genericPython(t testing.TB) string {
	t.Helper()
	return basePython(jobPython(t))
}

// basePython is the interpreter the virtualenv of py was made from (the
// home of its pyvenv.cfg), which lacks the virtualenv's TensorFlow; py
// itself when it is no virtualenv. A node probes its interpreter at start,
// and importing TensorFlow costs seconds of CPU: nodes that run no
// TensorFlow job spare that (twenty nodes took a minute of two cores).
func basePython(py string) string {
	b, err := os.ReadFile(filepath.Join(filepath.Dir(filepath.Dir(py)), "pyvenv.cfg"))
	if err != nil {
		return py
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && strings.TrimSpace(k) == "home" {
			base := filepath.Join(strings.TrimSpace(v), "python3")
			if _, err := os.Stat(base); err == nil && filepath.IsAbs(base) {
				return base
			}
		}
	}
	return py
}

// tfImports caches importsTF's answers: importing TensorFlow takes
// seconds of CPU, and each end-to-end test asks.
var tfImports sync.Map // python path -> bool

// importsTF reports whether py imports TensorFlow and tf_keras.
func importsTF(py string) bool {
	if ok, found := tfImports.Load(py); found {
		return ok.(bool)
	}
	ok := exec.Command(py, "-c", "import tensorflow, tf_keras").Run() == nil
	tfImports.Store(py, ok)
	return ok
}

// jobCluster is a submitter and lenders on one ledger, each lender lending
// one core pinned to its own CPU.
type jobCluster struct {
	sub     *testNode
	lenders []*testNode
}

// execOpts returns options that give a test's node name a job work dir
// of its own (under one dir in /var/tmp, which the job user can reach),
// the job Python, and CPU cpu to pin workers to.
func execOpts(t testing.TB, python string) func(name string, cpu int) nodeOpt {
	t.Helper()
	work, err := os.MkdirTemp("/var/tmp", "deepmarket-test-jobs-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(work, 0o711)
	t.Cleanup(func() { os.RemoveAll(work) })
	return func(name string, cpu int) nodeOpt {
		return func(c *Config) {
			c.Inventory.Python = python
			c.Executor.WorkDir = filepath.Join(work, name)
			c.Executor.CPUs = []int{cpu % runtime.NumCPU()}
		}
	}
}

func startJobCluster(t *testing.T, python string, lenders int) *jobCluster {
	t.Helper()
	return startJobClusterLending(t, python, lenders, api.LendRequest{Cores: 1, MemBytes: 2 << 30})
}

// startJobClusterLending is startJobCluster with each lender lending
// lend, and started with opts.
func startJobClusterLending(t testing.TB, python string, lenders int, lend api.LendRequest, opts ...nodeOpt) *jobCluster {
	t.Helper()
	return startJobClusterWith(t, python, lenders, lend, nil, opts...)
}

// startJobClusterWith is startJobClusterLending with the submitter
// started with subOpts too.
func startJobClusterWith(t testing.TB, python string, lenders int, lend api.LendRequest, subOpts []nodeOpt, opts ...nodeOpt) *jobCluster {
	t.Helper()
	return startJobClusterOn(t, python, lenders, lend, testLedgerParams(), subOpts, opts...)
}

// startJobClusterOn is startJobClusterWith on a ledger of params.
func startJobClusterOn(t testing.TB, python string, lenders int, lend api.LendRequest, params *ledger.Params, subOpts []nodeOpt, opts ...nodeOpt) *jobCluster {
	t.Helper()
	chain := testNet(t)
	dir := t.TempDir()
	withExec := execOpts(t, python)
	ah := initHomeWith(t, filepath.Join(dir, "sub"), chain, params)
	a := startNode(t, ah, append([]nodeOpt{withExec("sub", 0)}, subOpts...)...)
	st := a.Status()
	ledgerPort := a.cfg.Ledger.P2PListen[len("tcp://127.0.0.1:"):]
	c := &jobCluster{sub: a}
	for i := range lenders {
		name := fmt.Sprintf("lender%d", i)
		h := Home{Dir: filepath.Join(dir, name)}
		if _, err := Init(h, InitOptions{
			Moniker: name, Site: "lab-a", Genesis: ah.GenesisPath(), Listen: []string{"/ip4/127.0.0.1/tcp/0"}, API: "127.0.0.1:0",
			LedgerP2P: "tcp://127.0.0.1:" + freePort(t), LedgerRPC: "tcp://127.0.0.1:" + freePort(t),
			LedgerPeers: []string{st.LedgerNodeID + "@127.0.0.1:" + ledgerPort},
		}); err != nil {
			t.Fatal(err)
		}
		n := startNode(t, h, append([]nodeOpt{withBootstrap(a.addr()), withExec(name, i+1)}, opts...)...)
		admit(t, a, n)
		registered(t, n)
		if _, err := n.client.SetLend(t.Context(), lend); err != nil {
			t.Fatal(err)
		}
		c.lenders = append(c.lenders, n)
	}
	// Each offer as it stands once the machine probed its Python: with
	// TensorFlow where python has it. Importing TensorFlow takes a lender
	// seconds alone and minutes beside make test's other packages.
	tf := importsTF(python)
	eventually(t, 5*time.Minute, "the submitter to hold every lender's offer, with its Python probed", func() bool {
		offers := a.Offers()
		for _, l := range c.lenders {
			if !slices.ContainsFunc(offers, func(o api.Offer) bool {
				return o.Machine == l.host.ID().String() && o.Software.Python != "" && !o.Software.Checking &&
					(o.Software.TensorFlow != "" || !tf)
			}) {
				return false
			}
		}
		return true
	})
	return c
}

// registered waits until lender's own replica of the ledger shows the
// machine admitted: before, its node takes its own offer for one the
// ledger does not back and sends nothing, and the next announcement
// comes an announce_interval (30 s) later.
func registered(t testing.TB, lender *testNode) {
	t.Helper()
	eventually(t, time.Minute, "the lender's replica to show it admitted", func() bool { return lender.Lend().Registered })
}

func waitJob(t testing.TB, n *testNode, id string, within time.Duration) *jobs.Job {
	t.Helper()
	var j *jobs.Job
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		var err error
		if j, err = n.client.Job(t.Context(), id); err != nil {
			t.Fatal(err)
		}
		if j.State.Terminal() {
			return j
		}
		time.Sleep(time.Second)
	}
	logs, _ := n.client.JobLogs(t.Context(), id, 0)
	t.Fatalf("job %s still %s after %s; log:\n%s", id[:12], j.State, within, logs.Data)
	return nil
}

func jobLog(t testing.TB, n *testNode, id string) string {
	var b strings.Builder
	var off int64
	for {
		lg, err := n.client.JobLogs(t.Context(), id, off)
		if err != nil || lg.Data == "" {
			return b.String()
		}
		b.WriteString(lg.Data)
		off = lg.Next
	}
}
