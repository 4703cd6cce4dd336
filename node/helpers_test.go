package node

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/internal/testutil"
	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/node/sandbox/sandboxtest"
)

// testNet gives the nodes of one test their own network.
func testNet(t testing.TB) string {
	return fmt.Sprintf("deepmarket-test-%d", time.Now().UnixNano())
}

type testNode struct {
	*Node
	home   Home
	client *api.Client
	stop   func()
}

type nodeOpt func(*Config)

// The API's answers, as a test reads them in process.
func (n *testNode) Status() api.Status  { return n.svc.status.Status() }
func (n *testNode) Lend() api.LendState { return n.svc.lending.Lend() }
func (n *testNode) Offers() []api.Offer { return n.svc.market.Offers() }
func (n *testNode) Peers() []api.Peer   { return n.svc.market.Peers() }
func (n *testNode) SetLend(ctx context.Context, req api.LendRequest) (api.LendState, error) {
	return n.svc.lending.SetLend(ctx, req)
}

func withBootstrap(addrs ...string) nodeOpt {
	return func(c *Config) { c.P2P.Bootstrap = append(c.P2P.Bootstrap, addrs...) }
}

// initHome makes a home in dir on chain, listening on random loopback
// ports, with mDNS and the DHT off so tests control the topology.
func initHome(t testing.TB, dir, chain string) Home {
	t.Helper()
	return initHomeWith(t, dir, chain, testLedgerParams())
}

// initHomeWith is initHome on a ledger of params.
func initHomeWith(t testing.TB, dir, chain string, params *ledger.Params) Home {
	t.Helper()
	h := Home{Dir: dir}
	if _, err := Init(h, InitOptions{
		Moniker: filepath.Base(dir), Site: "lab-a", ChainID: chain,
		Listen: []string{"/ip4/127.0.0.1/tcp/0"}, API: "127.0.0.1:0",
		LedgerP2P: "tcp://127.0.0.1:" + freePort(t), LedgerRPC: "tcp://127.0.0.1:" + freePort(t),
		LedgerParams: params,
	}); err != nil {
		t.Fatal(err)
	}
	return h
}

// testDisputeWindow is the test networks' dispute window: a settled
// escrow refunds its payer this long after the settlement (10 minutes on a
// real network), so tests that read a submitter's balance after a job
// wait for it (waitRefunded).
const testDisputeWindow = 10 * time.Second

// testLedgerParams are the ledger rules of the networks tests make.
func testLedgerParams() *ledger.Params {
	p := ledger.DefaultParams()
	p.DisputeWindow = int64(testDisputeWindow / time.Second)
	return &p
}

// waitRefunded waits until n's ledger replica holds no escrow of job's
// runs: their dispute windows closed and what was left came back.
func waitRefunded(t testing.TB, n *testNode, j *jobs.Job) {
	t.Helper()
	// The block that closes it may be an empty one: up to [ledger]
	// empty_block_interval (30 s) after the window ends on an idle chain.
	within := testDisputeWindow + time.Minute
	deadline := time.Now().Add(within)
	for _, r := range j.Runs {
		for {
			e, err := n.ledger.Escrow(t.Context(), r.ID)
			if ledger.CodeOf(err) == ledger.CodeUnknownEscrow {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the escrow of run %.12s is still open %s later: %+v (%v)", r.ID, within, e, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// settledAudit is n's ledger audit once nothing is in escrow: every
// settled escrow's dispute window closed (or the wait ran out: the audit
// as it is then).
func settledAudit(t testing.TB, n *testNode) (*ledger.AuditReport, error) {
	t.Helper()
	deadline := time.Now().Add(testDisputeWindow + time.Minute)
	for {
		rep, err := n.client.Audit(t.Context())
		if err == nil && rep.Escrowed == 0 || time.Now().After(deadline) {
			return rep, err
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// probing keeps sandbox probes apart: each node's executor probes the
// sandbox once (a trial cgroup named after the process, then removed), and
// two at once, from tests that run in parallel, trip on each other's
// cgroup and leave a node that cannot lend. startNode takes it from a
// node's start until its probe is done (a restarted node that lent probes
// as it starts), needSandbox while it probes.
var probing sync.Mutex

// needSandbox is sandboxtest.Need, probing alone.
func needSandbox(t testing.TB) {
	t.Helper()
	probing.Lock()
	defer probing.Unlock()
	sandboxtest.Need(t)
}

// startNode runs a node from home until the test ends (or stop is called).
func startNode(t testing.TB, h Home, opts ...nodeOpt) *testNode {
	t.Helper()
	cfg, err := LoadConfig(h.ConfigPath())
	if err != nil {
		t.Fatal(err)
	}
	cfg.P2P.MDNS = false
	cfg.P2P.DHT = "off"
	cfg.Ledger.BlockTime = Duration{100 * time.Millisecond}
	// A settled escrow closes in the first block past its dispute window:
	// on an idle chain, an empty one.
	cfg.Ledger.EmptyBlockInterval = Duration{10 * time.Second}
	// Init chose the virtualenv with TensorFlow; a node that runs no
	// TensorFlow job probes its base interpreter (execOpts names the one
	// for jobs).
	cfg.Inventory.Python = basePython(cfg.Inventory.Python)
	for _, o := range opts {
		o(&cfg)
	}
	level := slog.LevelWarn
	if os.Getenv("DM_TEST_LOG") == "info" { // to follow a failing test's nodes step by step
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: level}))
	n, err := New(h, cfg, log.With("node", filepath.Base(h.Dir)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	func() {
		probing.Lock()
		defer probing.Unlock()
		go func() { done <- n.Run(ctx) }()
		select {
		case <-n.Ready():
		case err := <-done:
			cancel()
			t.Fatalf("node did not start: %v", err)
		case <-time.After(90 * time.Second): // a loaded CI machine
			cancel()
			t.Fatal("node did not start in 90s")
		}
		n.exec.Capable() // its one sandbox probe, now
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("node %s: %v", h.Dir, err)
			}
		})
	}
	g := nodesOf(t)
	g.add(stop)
	t.Cleanup(func() { g.stopAll(t) })
	return &testNode{Node: n, home: h, client: api.NewClient(n.APIURL(), n.token), stop: stop}
}

// nodeGroup is the nodes one test started: they stop together when it
// ends, since each takes seconds to stop (its ledger replica's), which
// one after another came to most of a minute for the tests of twenty.
type nodeGroup struct {
	mu    sync.Mutex
	stops []func()
}

// groups holds each running test's nodeGroup.
var groups sync.Map // testing.TB -> *nodeGroup

func nodesOf(t testing.TB) *nodeGroup {
	g, _ := groups.LoadOrStore(t, &nodeGroup{})
	return g.(*nodeGroup)
}

func (g *nodeGroup) add(stop func()) {
	g.mu.Lock()
	g.stops = append(g.stops, stop)
	g.mu.Unlock()
}

// stopAll stops, at once, the nodes of the test that are still running:
// the cleanup of the test's last node to start, so that whatever the test
// set up after it goes first, and all else after every node stopped.
// (Nodes stopping together once hung in libp2p's host Close; p2p.Host
// now closes the network first, and gives up after p2p.CloseTimeout.)
func (g *nodeGroup) stopAll(t testing.TB) {
	g.mu.Lock()
	stops := g.stops
	g.stops = nil
	g.mu.Unlock()
	var wg sync.WaitGroup
	for _, stop := range stops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stop()
		}()
	}
	wg.Wait()
	groups.Delete(t)
}

func (n *testNode) addr() string { return n.Status().Addrs[0] }

// admit has issuer (a node whose local genesis made it the issuer) admit
// member's account: escrows pay registered machines only.
func admit(t testing.TB, issuer, member *testNode) {
	t.Helper()
	if _, err := issuer.ledger.Admit(t.Context(), member.key.Address()); err != nil {
		t.Fatalf("admit %s: %v", member.home.Dir, err)
	}
}

// testWriter sends logs through t.Log, so they show only on failure. It
// drops what CometBFT logs as errors when its peers stop with the test
// (a closed connection, a stopped pool): with 22 nodes they would bury
// the failure's own lines.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	line := strings.TrimRight(string(p), "\n")
	if strings.Contains(line, `msg="Stopping peer for error"`) && strings.HasSuffix(line, "err=EOF") ||
		strings.Contains(line, `msg="Error stopping pool"`) {
		return len(p), nil
	}
	w.t.Log(line)
	return len(p), nil
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s", within, what)
}

func hasOffer(n *testNode, machine string) bool {
	for _, o := range n.Offers() {
		if o.Machine == machine {
			return true
		}
	}
	return false
}

// multicastAvailable reports whether some interface other than loopback
// is up and multicast-capable (mDNS needs one).
func multicastAvailable() bool {
	ifs, err := net.Interfaces()
	if err != nil {
		return false
	}
	for _, i := range ifs {
		if i.Flags&net.FlagUp != 0 && i.Flags&net.FlagMulticast != 0 && i.Flags&net.FlagLoopback == 0 {
			return true
		}
	}
	return false
}

// freePort returns a loopback TCP port free at the time of asking.
func freePort(t testing.TB) string { return testutil.FreePort(t) }

// initNetwork makes the homes of one network under dir: a genesis in which
// the first node validates and issues and every node (and every account
// of members) is a member with starter credits, so the ledger backs every
// node's machine and bids; the others replicate the first's ledger. Start
// the first node first.
func initNetwork(t testing.TB, dir, chain string, names []string, members ...identity.Address) []Home {
	t.Helper()
	keys := make([]*identity.Key, len(names))
	var balances []ledger.GenesisBalance
	for _, m := range members {
		balances = append(balances, ledger.GenesisBalance{Address: string(m), Amount: LocalStarterCredit})
	}
	for i := range names {
		k, err := identity.GenerateKey()
		if err != nil {
			t.Fatal(err)
		}
		keys[i] = k
		balances = append(balances, ledger.GenesisBalance{Address: string(k.Address()), Amount: LocalStarterCredit})
	}
	doc, err := ledger.NewGenesis(chain, []ledger.GenesisValidator{{Name: names[0], PubKey: keys[0].Public(), Power: 10}},
		ledger.GenesisState{
			Issuers:  []ledger.GenesisIssuer{{Address: string(keys[0].Address()), Name: "lab-a", Quota: LocalIssuerQuota}},
			Balances: balances,
			Params:   testLedgerParams(),
		})
	if err != nil {
		t.Fatal(err)
	}
	genesis := filepath.Join(dir, "genesis.json")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := doc.SaveAs(genesis); err != nil {
		t.Fatal(err)
	}
	firstP2P := freePort(t)
	homes := make([]Home, len(names))
	for i, name := range names {
		h := Home{Dir: filepath.Join(dir, name)}
		opts := InitOptions{
			Moniker: name, Site: "lab-a", Genesis: genesis, Key: keys[i],
			Listen: []string{"/ip4/127.0.0.1/tcp/0"}, API: "127.0.0.1:0",
			LedgerP2P: "tcp://127.0.0.1:" + freePort(t), LedgerRPC: "tcp://127.0.0.1:" + freePort(t),
		}
		if i == 0 {
			opts.LedgerP2P = "tcp://127.0.0.1:" + firstP2P
		} else {
			opts.LedgerPeers = []string{ledger.NodeIDOf(keys[0]) + "@127.0.0.1:" + firstP2P}
		}
		if _, err := Init(h, opts); err != nil {
			t.Fatal(err)
		}
		homes[i] = h
	}
	return homes
}
