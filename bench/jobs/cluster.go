package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/deepmarket/deepmarket/node"
	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/jobs"
)

// benchNode is one node running in this process.
type benchNode struct {
	name   string
	n      *node.Node
	c      *api.Client
	cpu    int // the CPU its lent workers are pinned to (lenders)
	cancel context.CancelFunc
	done   chan error
}

// cluster is a submitter and lenders on one fresh ledger, on loopback,
// as node/jobs_e2e_test.go builds it: the lenders join the submitter's
// genesis and ledger peer, mDNS and the DHT off, 100 ms blocks.
type cluster struct {
	sub     *benchNode
	lenders []*benchNode
	all     []*benchNode
	logPath string
	want    map[string]int // machine -> cores lent now
}

// startCluster starts the submitter and n lenders; lender i pins its
// workers to CPU i mod NumCPU. Homes go under dir, work dirs under work
// (which the job user must be able to traverse). Every node answers bids
// with quotes, as by default, unless lendersQuote is false.
func startCluster(ctx context.Context, dir, work, python string, n int, lendersQuote bool) (*cluster, error) {
	c := &cluster{logPath: filepath.Join(dir, "nodes.log")}
	lf, err := os.Create(c.logPath)
	if err != nil {
		return nil, err
	}
	logger := slog.New(slog.NewTextHandler(lf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	chain := "deepmarket-bench-" + randHex(6)

	subHome := node.Home{Dir: filepath.Join(dir, "sub")}
	ledgerP2P := freePort()
	if _, err := node.Init(subHome, node.InitOptions{
		Moniker: "sub", Site: "lab-a", ChainID: chain,
		Listen: []string{"/ip4/127.0.0.1/tcp/0"}, API: "127.0.0.1:0",
		LedgerP2P: "tcp://127.0.0.1:" + ledgerP2P, LedgerRPC: "tcp://127.0.0.1:" + freePort(),
	}); err != nil {
		return nil, fmt.Errorf("init submitter: %w", err)
	}
	sub, err := startNode(ctx, subHome, logger, func(cfg *node.Config) {
		cfg.Inventory.Python = python
		cfg.Executor.WorkDir = filepath.Join(work, "sub")
	})
	if err != nil {
		c.stop()
		return nil, err
	}
	c.sub = sub
	c.all = append(c.all, sub)
	st, err := sub.c.Status(ctx)
	if err != nil {
		c.stop()
		return nil, fmt.Errorf("submitter status: %w", err)
	}
	for i := range n {
		name := fmt.Sprintf("lender%d", i)
		h := node.Home{Dir: filepath.Join(dir, name)}
		if _, err := node.Init(h, node.InitOptions{
			Moniker: name, Site: "lab-a", Genesis: subHome.GenesisPath(),
			Listen: []string{"/ip4/127.0.0.1/tcp/0"}, API: "127.0.0.1:0",
			LedgerP2P: "tcp://127.0.0.1:" + freePort(), LedgerRPC: "tcp://127.0.0.1:" + freePort(),
			LedgerPeers: []string{st.LedgerNodeID + "@127.0.0.1:" + ledgerP2P},
		}); err != nil {
			c.stop()
			return nil, fmt.Errorf("init %s: %w", name, err)
		}
		cpu := i % runtime.NumCPU()
		l, err := startNode(ctx, h, logger, func(cfg *node.Config) {
			cfg.P2P.Bootstrap = append(cfg.P2P.Bootstrap, st.Addrs[0])
			cfg.Inventory.Python = python
			cfg.Executor.WorkDir = filepath.Join(work, name)
			cfg.Executor.CPUs = []int{cpu}
			cfg.Scheduler.Quote = lendersQuote
		})
		if err != nil {
			c.stop()
			return nil, err
		}
		l.cpu = cpu
		c.lenders = append(c.lenders, l)
		c.all = append(c.all, l)
		if err := admit(ctx, sub, l); err != nil {
			c.stop()
			return nil, err
		}
	}
	return c, nil
}

// admit has the submitter, the genesis issuer, admit lender's account,
// and waits until the lender's own replica shows it: only members' offers
// are taken.
func admit(ctx context.Context, sub, lender *benchNode) error {
	st, err := lender.c.Status(ctx)
	if err != nil {
		return fmt.Errorf("%s status: %w", lender.name, err)
	}
	if _, err := sub.c.Send(ctx, api.SendRequest{Kind: "admit", To: st.Account}); err != nil {
		return fmt.Errorf("admit %s: %w", lender.name, err)
	}
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if ls, err := lender.c.Lend(ctx); err == nil && ls.Registered {
			return nil
		}
	}
	return fmt.Errorf("%s: not admitted on its replica after a minute", lender.name)
}

func startNode(ctx context.Context, h node.Home, logger *slog.Logger, opt func(*node.Config)) (*benchNode, error) {
	name := filepath.Base(h.Dir)
	cfg, err := node.LoadConfig(h.ConfigPath())
	if err != nil {
		return nil, err
	}
	cfg.P2P.MDNS = false
	cfg.P2P.DHT = "off"
	cfg.Ledger.BlockTime = node.Duration{Duration: 100 * time.Millisecond}
	opt(&cfg)
	n, err := node.New(h, cfg, logger.With("node", name))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	token, err := h.LoadToken()
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	b := &benchNode{name: name, n: n, cancel: cancel, done: make(chan error, 1)}
	go func() { b.done <- n.Run(rctx) }()
	select {
	case <-n.Ready():
	case err := <-b.done:
		cancel()
		return nil, fmt.Errorf("%s did not start: %w", name, err)
	case <-time.After(60 * time.Second):
		cancel()
		<-b.done
		return nil, fmt.Errorf("%s did not start in 60s", name)
	}
	b.c = api.NewClient(n.APIURL(), token)
	return b, nil
}

// stop ends every node, lenders first, and waits for them.
func (c *cluster) stop() {
	for i := len(c.all) - 1; i >= 0; i-- {
		c.all[i].cancel()
	}
	for _, b := range c.all {
		<-b.done
	}
	c.all = nil
}

// lend sets what each lender lends (0: not lending) and waits until every
// node's offer book shows exactly that, with nothing allocated, so the
// next bid sees the whole capacity from every scheduler.
func (c *cluster) lend(ctx context.Context, cores []int, memPerCore uint64) error {
	want := map[string]int{}
	for i, l := range c.lenders {
		k := 0
		if i < len(cores) {
			k = cores[i]
		}
		if k > 0 {
			if _, err := l.c.SetLend(ctx, api.LendRequest{Cores: k, MemBytes: uint64(k) * memPerCore}); err != nil {
				return fmt.Errorf("%s lend %d cores: %w", l.name, k, err)
			}
			want[l.n.Host().ID().String()] = k
		} else if st, err := l.c.Lend(ctx); err == nil && st.Lending {
			if _, err := l.c.StopLend(ctx); err != nil {
				return fmt.Errorf("%s stop lending: %w", l.name, err)
			}
		}
	}
	c.want = want
	return c.waitOffers(ctx, want, 60*time.Second)
}

// waitIdle waits until every lender's capacity is free again in every
// node's offer book (after a job, its holds are released and re-offered).
func (c *cluster) waitIdle(ctx context.Context) error {
	return c.waitOffers(ctx, c.want, 30*time.Second)
}

// waitOffers waits until every node holds exactly the wanted offers
// (machine -> cores), each with nothing allocated.
func (c *cluster) waitOffers(ctx context.Context, want map[string]int, within time.Duration) error {
	deadline := time.Now().Add(within)
	var last string
	for time.Now().Before(deadline) {
		ok := true
		for _, b := range c.all {
			offers, err := b.c.Offers(ctx)
			if err != nil {
				return err
			}
			got := 0
			for _, o := range offers {
				k, wanted := want[o.Machine]
				if !wanted || int(o.Cores) != k || o.Allocated.Cores != 0 {
					ok = false
					last = fmt.Sprintf("%s holds %s: %d cores, %d allocated (want %d)", b.name, o.Moniker, o.Cores, o.Allocated.Cores, k)
					break
				}
				got++
			}
			if ok && got != len(want) {
				ok = false
				last = fmt.Sprintf("%s holds %d of %d offers", b.name, got, len(want))
			}
			if !ok {
				break
			}
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("offers did not settle in %s: %s", within, last)
}

// addEverywhere adds a directory to every node's storage, so a job's
// inputs are local on every machine (no data transfer at launch), and
// returns its CID.
func (c *cluster) addEverywhere(ctx context.Context, dir string) (string, error) {
	var root string
	for _, b := range c.all {
		p, err := b.c.DataAdd(ctx, dir, nil)
		if err != nil {
			return "", fmt.Errorf("%s: data add %s: %w", b.name, dir, err)
		}
		if root == "" {
			root = p.CID
		} else if p.CID != root {
			return "", fmt.Errorf("%s: data add %s gave %s, the submitter %s: inputs would be transferred", b.name, dir, p.CID, root)
		}
	}
	return root, nil
}

// jobLog reads a job's whole log from the submitter.
// waitJob polls the submitter every poll until j ends, calling each
// (if set) with every state read; past deadline it cancels the job and
// says why, with the end of its log.
func (c *cluster) waitJob(ctx context.Context, j *jobs.Job, deadline time.Time, poll time.Duration, each func(*jobs.Job)) (*jobs.Job, error) {
	start := time.Now()
	for !j.State.Terminal() {
		if time.Now().After(deadline) {
			c.sub.c.CancelJob(ctx, j.ID)
			return j, fmt.Errorf("job %s still %s after %s; log:\n%s", j.ID[:12], j.State, time.Since(start).Round(time.Second), tail(c.jobLog(ctx, j.ID), 30))
		}
		time.Sleep(poll)
		var err error
		if j, err = c.sub.c.Job(ctx, j.ID); err != nil {
			return j, err
		}
		if each != nil {
			each(j)
		}
	}
	return j, nil
}

func (c *cluster) jobLog(ctx context.Context, id string) string {
	var b strings.Builder
	var off int64
	for {
		lg, err := c.sub.c.JobLogs(ctx, id, off)
		if err != nil || lg.Data == "" {
			return b.String()
		}
		b.WriteString(lg.Data)
		off = lg.Next
	}
}

func tail(s string, lines int) string {
	ls := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	return "    " + strings.Join(ls, "\n    ")
}

func randHex(n int) string {
	b := make([]byte, n)
	if _, err := io.ReadFull(rand.Reader, b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// freePort returns a loopback TCP port free at the time of asking.
func freePort() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}

// errNoPlacement is a measurement abandoned because its job got no
// placement in placementTries submissions.
var errNoPlacement = errors.New("no placement")

// placementTries bounds the submissions of one measured job. A bid can
// get no placement at all when several nodes' schedulers race to hold
// the same machines (each takes some, none gets all, all give up); the
// submitter then bids again a few times before failing the job.
const placementTries = 2

// noPlacementLine is what the submitter logs when a bid got no placement
// and it bids again.
const noPlacementLine = "no placement yet"

// submission is a job as Submit returned it, with the times it was
// called and returned, and how many bids of this measurement got no
// placement out of how many were made.
type submission struct {
	job              *jobs.Job
	called, returned time.Time
	unplaced, bids   int
}

// submit submits spec (confirmed in advance) and returns once Submit
// does. A job that failed for want of a placement is submitted again,
// once the lenders' capacity shows free, up to placementTries times.
func (c *cluster) submit(ctx context.Context, spec jobs.File) (submission, error) {
	var s submission
	for tries := 1; ; tries++ {
		s.called = time.Now()
		j, err := c.sub.c.Submit(ctx, api.SubmitRequest{Spec: spec, Yes: true})
		s.returned = time.Now()
		if err != nil {
			return s, fmt.Errorf("submit: %w", err)
		}
		s.job = j
		again := strings.Count(c.jobLog(ctx, j.ID), noPlacementLine)
		s.unplaced += again
		s.bids += again + 1
		if again > 0 {
			logf("%s: %d bid(s) got no placement before this one", spec.Name, again)
		}
		if j.State != jobs.Failed || len(j.Runs) > 0 {
			return s, nil
		}
		s.unplaced++
		logf("%s: no placement, job failed (%s)", spec.Name, truncate(j.Reason, 160))
		if tries >= placementTries {
			return s, fmt.Errorf("%w in %d submissions (%d bids); the last: %s", errNoPlacement, tries, s.bids, j.Reason)
		}
		if err := c.waitIdle(ctx); err != nil {
			return s, err
		}
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
