package node

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rpchttp "github.com/cometbft/cometbft/rpc/client/http"
	pubsub "github.com/libp2p/go-libp2p-pubsub"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/p2p"
)

// blackhole is a loopback TCP listener that takes connections and never
// answers on them: a machine whose address is this one is dialed, and
// the dial hangs until the dialer gives up, as a machine that is not there
// behind a firewall that drops packets. It counts the connections.
type blackhole struct {
	ln       net.Listener
	accepted atomic.Int64
}

func newBlackhole(t *testing.T) *blackhole {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackhole{ln: ln}
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b.accepted.Add(1)
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		for _, c := range conns {
			c.Close()
		}
	})
	return b
}

func (b *blackhole) port() int { return b.ln.Addr().(*net.TCPAddr).Port }

// TestLinkedFakeMachinesCannotFailAnHonestJob: a member links more fake
// machine keys to itself than a book takes of one owner (each locking the
// ledger's link stake) and offers each of them, cheaper than the honest
// lenders, from one raw libp2p host. No fake machine answers: its address
// takes a connection and says nothing. At most the per-owner bound of
// them enters any node's book, and an honest 2-worker job submitted
// meanwhile runs on the honest lenders: each scheduler tries at most
// lostPerAccount of the member's machines before it leaves the rest of
// them out of the quote, and does not wait on releasing the holds it
// asked of them. Without the bound, the fakes (16 of them in each book,
// the cheapest) use up every quote's 8 attempts, and the job's first bid
// fails.
func TestLinkedFakeMachinesCannotFailAnHonestJob(t *testing.T) {
	t.Parallel()
	const bound, fakes = 16, 20
	py := jobPython(t)
	perOwner := func(c *Config) { c.Market.MaxOffersPerOwner = bound }
	c := startJobClusterWith(t, py, 2, api.LendRequest{Cores: 1, MemBytes: 1 << 30}, []nodeOpt{perOwner}, perOwner)
	sub := c.sub
	ctx := t.Context()
	chain := sub.cfg.Node.ChainID

	// The insider: a member with the credits to stake its fake machines.
	insider, err := identity.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sub.ledger.Admit(ctx, insider.Address()); err != nil {
		t.Fatal(err)
	}
	stake := sub.ledgerApp.Params().LinkStake
	if stake == 0 {
		t.Fatal("the test network links machines without a stake")
	}
	if _, err := sub.ledger.Transfer(ctx, insider.Address(), uint64(fakes+2)*stake, "stakes"); err != nil {
		t.Fatal(err)
	}
	rc, err := rpchttp.New(strings.Replace(sub.cfg.Ledger.RPCListen, "tcp://", "http://", 1), "/websocket")
	if err != nil {
		t.Fatal(err)
	}
	owner := ledger.NewClient(rc, insider, chain)
	keys := make([]*identity.Key, fakes)
	for i := range keys {
		if keys[i], err = identity.GenerateKey(); err != nil {
			t.Fatal(err)
		}
		consent, err := ledger.NewClient(rc, keys[i], chain).ConsentTo(ctx, insider.Address(), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := owner.LinkMachine(ctx, consent); err != nil {
			t.Fatalf("link fake %d: %v", i, err)
		}
	}
	if b, err := owner.Balance(ctx, insider.Address()); err != nil || b >= 3*stake {
		t.Fatalf("the insider's balance after %d links: %d %v; want %d staked", fakes, b, err, uint64(fakes)*stake)
	}

	// Their offers: an honest lender's, cheaper, at an address that never
	// answers.
	var honest p2p.Offer
	for _, h := range sub.book.List(time.Now()) {
		if h.Offer.Machine == c.lenders[0].Host().ID().String() {
			honest = h.Offer
		}
	}
	if honest.Machine == "" {
		t.Fatal("the submitter does not hold the lender's offer")
	}
	hole := newBlackhole(t)
	raw := newRawPeerWith(t, ctx, chain, insider, sub, c.lenders[0], c.lenders[1])
	offers, _ := raw.join(t, p2p.OffersTopic(chain))
	eventually(t, 10*time.Second, "the insider on the offers topic", func() bool { return len(offers.ListPeers()) >= 3 })
	publish := func() {
		for i, k := range keys {
			o := honest
			o.Machine, o.Owner, o.Moniker, o.Site = k.PeerID().String(), string(insider.Address()), fmt.Sprint("fake-", i), "lab-a"
			o.Addrs = []string{fmt.Sprintf("/ip4/127.0.0.1/tcp/%d/p2p/%s", hole.port(), k.PeerID())}
			o.Price = p2p.Prices{CoreHour: max(honest.Price.CoreHour/2, 1), MemGiBHour: honest.Price.MemGiBHour / 2}
			o.Links, o.Allocated = nil, p2p.Resources{}
			data, err := p2p.Seal(k, chain, p2p.TypeOffer, &o, uint64(time.Now().UnixMilli()), time.Now().Add(10*time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			if err := offers.Publish(ctx, data, pubsub.WithSecretKeyAndPeerId(k.PrivKey(), k.PeerID())); err != nil {
				t.Fatal(err)
			}
		}
	}
	fakesIn := func(n *testNode) int {
		count := 0
		for _, h := range n.book.List(time.Now()) {
			if h.Offer.Owner == string(insider.Address()) {
				count++
			}
		}
		return count
	}
	nodes := []*testNode{sub, c.lenders[0], c.lenders[1]}
	eventually(t, 30*time.Second, "every book to fill up with the insider's machines", func() bool {
		publish()
		for _, n := range nodes {
			if fakesIn(n) < bound {
				return false
			}
		}
		return true
	})
	for _, n := range nodes {
		if got := fakesIn(n); got > bound {
			t.Fatalf("%s holds %d of one owner's offers, more than its bound of %d", n.home.Dir, got, bound)
		}
	}

	// The honest job. Its schedulers may collide on the two honest
	// machines (one holds the first while another's attempt holds the
	// second beside a fake), and a bid refused for that waits and bids
	// again: it is delayed, not failed.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "job.py"), []byte("import time\ntime.sleep(1)\nprint('done', flush=True)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := jobs.File{Name: "honest", Framework: "generic", Command: []string{"python3", "job.py"}, Bundle: dir,
		Workers: 2, Cores: 1, Memory: "256MiB", MaxPrice: "5", MaxDuration: "10m"}
	start := time.Now()
	j, err := sub.client.Submit(ctx, api.SubmitRequest{Spec: spec, Yes: true})
	if err != nil {
		t.Fatal(err)
	}
	done := waitJob(t, sub, j.ID, 3*time.Minute)
	if done.State != jobs.Succeeded {
		t.Fatalf("the honest job %s: %s\n%s", done.State, done.Reason, jobLog(t, sub, j.ID))
	}
	run := done.Runs[0]
	for _, w := range run.Workers {
		if w.Machine != c.lenders[0].Host().ID().String() && w.Machine != c.lenders[1].Host().ID().String() {
			t.Errorf("a worker was placed on %s (%s), not on an honest lender", w.Moniker, w.Machine)
		}
	}
	// Each scheduler (3) dialed at most lostPerAccount (2) of the
	// insider's machines, once to hold and once to release what it may
	// have granted; without the bound, each tried 16, and the job's first
	// bid failed.
	if n := hole.accepted.Load(); n > 3*2*2 {
		t.Errorf("the fake machines' address took %d connections: the schedulers tried more than %d of the insider's machines each", n, 2)
	}
	launched := run.Started
	t.Logf("the honest job launched %s after its submission, with %d fake machines in each book; the fakes' address took %d connections",
		launched.Sub(start).Round(100*time.Millisecond), bound, hole.accepted.Load())
}
