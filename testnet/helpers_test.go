package testnet

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/internal/testutil"
	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node"
)

// binary is the deepmarket executable the tests' nodes run, built once.
var binary string

func TestMain(m *testing.M) {
	// make test's tmpfs for the nodes' homes (scripts/test.sh says why);
	// the jobs' work dirs are in /var/tmp either way.
	if d := os.Getenv("DM_TEST_STATE_DIR"); d != "" {
		os.Setenv("TMPDIR", d)
	}
	flag.Parse()
	if !flagSet("test.parallel") {
		// The testnets' tests spend most of their time waiting on the
		// nodes' timers (receipts, escrow expiry, lost workers, AutoNAT),
		// not on the CPU: more of them at once than there are CPUs.
		if err := flag.Set("test.parallel", strconv.Itoa(parallelTests)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	dir, err := os.MkdirTemp("", "dm-testnet-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "deepmarket")
	build := exec.Command("go", "build", "-o", binary, "../cmd/deepmarket")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build deepmarket:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// parallelTests is how many of this package's parallel tests run at once
// unless -parallel says otherwise.
const parallelTests = 4

// flagSet says whether the command line set flag name.
func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// basePort finds n×4 free ports in a row below the ephemeral range.
func basePort(t *testing.T, nodes int) int {
	t.Helper()
	return testutil.FreePortRange(t, PortsPerNode*nodes)
}

// startNet makes a testnet in a temporary directory and runs it; the
// nodes stop when the test ends (their logs are printed if it failed).
func startNet(t *testing.T, p Params, opts RunOptions) *Network {
	t.Helper()
	configure := p.Configure
	p.Configure = func(nd *Node, cfg *node.Config) {
		testConfig(cfg)
		if configure != nil {
			configure(nd, cfg)
		}
	}
	p.Out = filepath.Join(t.TempDir(), "tn")
	p.BasePort = basePort(t, p.Validators+p.Nodes)
	if p.LedgerParams == nil {
		// A settled escrow refunds its payer once its dispute window
		// closes: 10 s here, not a real network's 10 minutes.
		lp := ledger.DefaultParams()
		lp.DisputeWindow = 10
		p.LedgerParams = &lp
	}
	if _, err := Init(p); err != nil {
		t.Fatal(err)
	}
	opts.Binary = binary
	opts.Progress = testWriter{t}
	n, err := Start(t.Context(), p.Out, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n.Close()
		if t.Failed() {
			for i, nd := range n.Manifest.Nodes {
				t.Logf("--- %s log:%s", nd.Name, n.LogTail(i, 200))
			}
		}
	})
	return n
}

// testConfig shortens what a test would otherwise wait on for nothing
// (the production defaults stay as they are):
//   - an idle chain makes a block every empty_block_interval (30 s by
//     default): a network that just started, or one that waits for its
//     first transaction, sat idle that long before its first blocks;
//   - a node with no peers dials its bootstrap peers again every
//     discover_interval (30 s): one that started before the validators
//     listened sat alone that long, its offers seen by no one.
func testConfig(cfg *node.Config) {
	cfg.Ledger.EmptyBlockInterval = node.Duration{Duration: time.Second}
	cfg.P2P.DiscoverInterval = node.Duration{Duration: 5 * time.Second}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Logf("%s", b)
	return len(b), nil
}

// key loads node i's key (its account).
func (n *Network) key(t *testing.T, i int) *identity.Key {
	t.Helper()
	k, err := n.Home(i).LoadKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// ledgerClient signs with node i's key and talks to node via's RPC.
func (n *Network) ledgerClient(t *testing.T, i, via int) *ledger.Client {
	t.Helper()
	rpc, err := n.RPC(via)
	if err != nil {
		t.Fatal(err)
	}
	return ledger.NewClient(rpc, n.key(t, i), n.Manifest.ChainID)
}

// transferLoad sends count transfers of 1 micro-credit to sink, from the
// senders' accounts, each sender through the RPC of via(sender); it
// returns how many committed. Failures to broadcast (a node down) are
// retried through the next node; a transaction lost in a killed
// node's mempool does not count.
type transferLoad struct {
	net       *Network
	senders   []int
	via       func(k int) []int // nodes to broadcast through, in order of preference
	sink      identity.Address
	committed atomic.Int64
	// resent counts transfers sent again after a try whose outcome was
	// not known (a node that failed to answer may have taken it): each may
	// have committed twice.
	resent atomic.Int64
	failed atomic.Int64

	mu     sync.Mutex
	errors []string // the first few failures, for the test's message
}

// fail counts a transfer that did not commit, keeping the first few
// reasons.
func (l *transferLoad) fail(what string, err error) {
	l.failed.Add(1)
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.errors) < 5 {
		l.errors = append(l.errors, fmt.Sprintf("%s: %v", what, err))
	}
}

// failures says how many transfers failed, and the first reasons.
func (l *transferLoad) failures() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.errors) == 0 {
		return fmt.Sprintf("%d failed", l.failed.Load())
	}
	return fmt.Sprintf("%d failed; first: %s", l.failed.Load(), strings.Join(l.errors, "; "))
}

func (l *transferLoad) run(t *testing.T, ctx context.Context, count int) {
	t.Helper()
	var wg sync.WaitGroup
	per := count / len(l.senders)
	for k, s := range l.senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			vias := l.via(k)
			clients := make([]*ledger.Client, len(vias))
			for j, v := range vias {
				clients[j] = l.net.ledgerClient(t, s, v)
			}
			var mu sync.Mutex
			cur := 0
			// submit broadcasts one transfer, through the next node
			// when one fails.
			submit := func() (*ledger.Client, string, error) {
				mu.Lock()
				defer mu.Unlock()
				var h string
				var err error
				for try := 0; try < 3*len(clients); try++ {
					h, err = clients[cur].Submit(ctx, ledger.TypeTransfer, &ledger.Transfer{To: string(l.sink), Amount: 1, Memo: "load"})
					if err == nil {
						return clients[cur], h, nil
					}
					if ledger.CodeOf(err) == ledger.CodeBadNonce {
						// A transaction lost with a killed node left a gap: the
						// client learns the nonce again on its next try.
						continue
					}
					cur = (cur + 1) % len(clients)
					l.resent.Add(1)
					time.Sleep(200 * time.Millisecond)
				}
				return nil, "", err
			}
			type sent struct {
				c *ledger.Client
				h string
			}
			hashes := make(chan sent, per)
			var waiters sync.WaitGroup
			for range 8 {
				waiters.Add(1)
				go func() {
					defer waiters.Done()
					for x := range hashes {
						// A transfer refused in its block for its nonce (its
						// predecessor sent through the other node reached the
						// proposer later, or was lost with a node) is sent
						// again, as a wallet would: the load is what is
						// measured, and every transfer must commit once.
						for again := 0; ; again++ {
							wctx, cancel := context.WithTimeout(ctx, 90*time.Second)
							_, err := x.c.Wait(wctx, x.h)
							cancel()
							if err == nil {
								l.committed.Add(1)
								break
							}
							if ledger.CodeOf(err) != ledger.CodeBadNonce || again == 3 {
								l.fail("wait for "+x.h, err)
								break
							}
							l.resent.Add(1)
							c, h, err := submit()
							if err != nil {
								l.fail("submit again", err)
								break
							}
							x = sent{c, h}
						}
					}
				}()
			}
			for m := 0; m < per; m++ {
				c, h, err := submit()
				if err != nil {
					l.fail("submit", err)
					continue
				}
				hashes <- sent{c, h}
			}
			close(hashes)
			waiters.Wait()
		}()
	}
	wg.Wait()
}

// waitHeights waits until every listed node is at or past height h.
func (n *Network) waitHeights(t *testing.T, nodes []int, h int64, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		hs := n.Heights(t.Context(), nodes)
		ok := true
		for _, x := range hs {
			ok = ok && x >= h
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nodes %v did not reach height %d within %s: at %v", nodes, h, within, hs)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// waitBalances waits until every listed node holds want in account addr.
// A replica may report a height before it has applied that block, or be a
// block behind the node that answered a client's commit: it gets a little
// time to catch up. Any other amount fails the test.
func (n *Network) waitBalances(t *testing.T, nodes []int, addr identity.Address, want uint64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var wrong []string
		for _, i := range nodes {
			c, err := n.Client(i)
			if err != nil {
				t.Fatal(err)
			}
			b, err := c.Balance(t.Context(), string(addr))
			switch {
			case err != nil:
				wrong = append(wrong, fmt.Sprintf("%s: %v", n.Manifest.Nodes[i].Name, err))
			case b.Balance != want:
				wrong = append(wrong, fmt.Sprintf("%s holds %d", n.Manifest.Nodes[i].Name, b.Balance))
			}
		}
		if len(wrong) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: want %d on every node; %s", addr, want, strings.Join(wrong, ", "))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitLoaded waits until every node shows the same balance for sink, at
// least want transfers in and at most the ones l sent again more: a
// transfer whose first try's outcome was not known may have committed
// twice (a wallet's double send, not the ledger's).
func (n *Network) waitLoaded(t *testing.T, nodes []int, sink identity.Address, l *transferLoad, want uint64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		seen := map[uint64]bool{}
		var errs []string
		for _, i := range nodes {
			c, err := n.Client(i)
			if err != nil {
				t.Fatal(err)
			}
			b, err := c.Balance(t.Context(), string(sink))
			if err != nil {
				errs = append(errs, err.Error())
				continue
			}
			seen[b.Balance] = true
		}
		if len(errs) == 0 && len(seen) == 1 {
			for b := range seen {
				in, most := b-sinkOpening, want+uint64(l.resent.Load())
				if b >= sinkOpening && in >= want && in <= most {
					return
				}
				if b >= sinkOpening+want {
					t.Fatalf("%s: %d transfers in, more than the %d sent plus %d sent again", sink, in, want, l.resent.Load())
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: want %d transfers in on every node (plus at most %d sent again); balances %v %v", sink, want, l.resent.Load(), seen, errs)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// check requires a passing audit everywhere and one chain.
func (n *Network) check(t *testing.T, nodes []int, wantNoEscrow bool) *Consistency {
	t.Helper()
	var res *Consistency
	var err error
	// A settled escrow refunds only once its dispute window (10 s here)
	// closes, in the next block, which on an idle chain may be an empty
	// one (30 s): first wait for one node to hold no escrow, which one
	// audit tells (the whole network's audit takes a minute or more beside
	// make test's other packages).
	if wantNoEscrow {
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(2 * time.Second) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			_, err := n.Check(ctx, nodes[:1], true)
			cancel()
			if err == nil || time.Now().After(deadline) {
				break
			}
		}
	}
	// A node that just caught up may answer its audit a block behind the
	// others' view: retry for a minute and a half.
	for deadline := time.Now().Add(90 * time.Second); time.Now().Before(deadline); {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		res, err = n.Check(ctx, nodes, wantNoEscrow)
		cancel()
		if err == nil {
			t.Logf("audit passes on %d nodes; app hash %s at height %d", len(nodes), res.AppHash, res.Height)
			return res
		}
		time.Sleep(time.Second)
	}
	t.Fatalf("consistency: %v", err)
	return nil
}

func all(n *Network) []int {
	out := make([]int, len(n.Manifest.Nodes))
	for i := range out {
		out[i] = i
	}
	return out
}
