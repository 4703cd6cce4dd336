package node

import (
	"fmt"
	"net"
	"strings"
	"sync"
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
	"github.com/deepmarket/deepmarket/units"
)

// blackhole is a loopback TCP listener that takes connections and never
// answers on them: a machine whose address is this one is dialed, and
// the dial hangs until the dialer gives up, as a machine that is not there
// behind a firewall that drops packets. It counts the connections.
type blackhole struct {
	ln       net.Listener
	accepted atomic.Int64
}

func newBlackhole(t testing.TB) *blackhole {
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

// insiderMarket is a market of two honest lenders lending a core each and
// a submitting node (which issues memberships), where every book holds at
// most perOwnerBound offers of one owner, and an insider: a member funded
// to stake insiderFakes machines, talking raw protocol to the nodes with
// its own key and signing ledger transactions over CometBFT's RPC.
type insiderMarket struct {
	*jobCluster
	insider *identity.Key
	chain   string
	ledger  *ledger.Client // the insider's
	rc      *rpchttp.HTTP
	raw     *rawPeer
	bundle  string
}

const (
	perOwnerBound = 16
	insiderFakes  = 20
)

func startInsiderMarket(t testing.TB, lenderOpts ...nodeOpt) *insiderMarket {
	t.Helper()
	return startInsiderMarketOf(t, nil, lenderOpts...)
}

// noQuotes has a node answer no bids: in a test of what machines grant the
// insider's own hold requests, the honest schedulers would otherwise place
// its (gossiped, funded) bids and hold the cores first.
func noQuotes(c *Config) { c.Scheduler.Quote = false }

// startInsiderMarketOf is startInsiderMarket with every node started with
// opts too.
func startInsiderMarketOf(t testing.TB, opts []nodeOpt, lenderOpts ...nodeOpt) *insiderMarket {
	t.Helper()
	perOwner := func(c *Config) { c.Market.MaxOffersPerOwner = perOwnerBound }
	c := startJobClusterWith(t, genericPython(t), 2, api.LendRequest{Cores: 1, MemBytes: 1 << 30}, append([]nodeOpt{perOwner}, opts...),
		append(append([]nodeOpt{perOwner}, opts...), lenderOpts...)...)
	m := &insiderMarket{jobCluster: c, chain: c.sub.cfg.Node.ChainID, bundle: sleepBundle(t)}
	ctx := t.Context()
	var err error
	if m.insider, err = identity.GenerateKey(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.sub.ledger.Admit(ctx, m.insider.Address()); err != nil {
		t.Fatal(err)
	}
	stake := c.sub.ledgerApp.Params().LinkStake
	if stake == 0 {
		t.Fatal("the test network links machines without a stake")
	}
	if _, err := c.sub.ledger.Transfer(ctx, m.insider.Address(), uint64(insiderFakes+2)*stake, "stakes"); err != nil {
		t.Fatal(err)
	}
	if m.rc, err = rpchttp.New(strings.Replace(c.sub.cfg.Ledger.RPCListen, "tcp://", "http://", 1), "/websocket"); err != nil {
		t.Fatal(err)
	}
	m.ledger = ledger.NewClient(m.rc, m.insider, m.chain)
	eventually(t, 30*time.Second, "every replica to show the insider's credits", func() bool {
		for _, n := range m.nodes() {
			if n.ledgerApp.BalanceOf(m.insider.Address()) == 0 {
				return false
			}
		}
		return true
	})
	m.raw = newRawPeerWith(t, ctx, m.chain, m.insider, c.sub, c.lenders[0], c.lenders[1])
	return m
}

func (m *insiderMarket) nodes() []*testNode { return []*testNode{m.sub, m.lenders[0], m.lenders[1]} }

// linkFakes links n fresh machine keys to the insider, each consenting
// and each locking the ledger's link stake.
func (m *insiderMarket) linkFakes(t testing.TB, n int) []*identity.Key {
	t.Helper()
	keys := make([]*identity.Key, n)
	for i := range keys {
		var err error
		if keys[i], err = identity.GenerateKey(); err != nil {
			t.Fatal(err)
		}
		consent, err := ledger.NewClient(m.rc, keys[i], m.chain).ConsentTo(t.Context(), m.insider.Address(), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.ledger.LinkMachine(t.Context(), consent); err != nil {
			t.Fatalf("link fake %d: %v", i, err)
		}
	}
	return keys
}

// offerFakes sends offers of keys' machines, each an honest lender's
// offer made cheaper, at hole's address, from the insider's host on the
// offers topic, until every node has checked as many of them as its book
// would take of one owner and found they do not answer; it returns how
// many of them the fullest book took.
func (m *insiderMarket) offerFakes(t testing.TB, keys []*identity.Key, hole *blackhole) int {
	t.Helper()
	ctx := t.Context()
	var honest p2p.Offer
	for _, h := range m.sub.book.List(time.Now()) {
		if h.Offer.Machine == m.lenders[0].Host().ID().String() {
			honest = h.Offer
		}
	}
	if honest.Machine == "" {
		t.Fatal("the submitter does not hold the lender's offer")
	}
	offers, _ := m.raw.join(t, p2p.OffersTopic(m.chain))
	eventually(t, 10*time.Second, "the insider on the offers topic", func() bool { return len(offers.ListPeers()) >= 3 })
	publish := func() {
		for i, k := range keys {
			o := honest
			o.Machine, o.Owner, o.Moniker, o.Site = k.PeerID().String(), string(m.insider.Address()), fmt.Sprint("fake-", i), "lab-a"
			o.Addrs = []string{fmt.Sprintf("/ip4/127.0.0.1/tcp/%d/p2p/%s", hole.port(), k.PeerID())}
			o.Price = p2p.Prices{CoreHour: max(honest.Price.CoreHour/2, 1), MemGiBHour: honest.Price.MemGiBHour / 2}
			o.Links, o.Allocated = nil, p2p.Resources{}
			data, err := p2p.Seal(k, m.chain, p2p.TypeOffer, &o, uint64(time.Now().UnixMilli()), time.Now().Add(10*time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			if err := offers.Publish(ctx, data, pubsub.WithSecretKeyAndPeerId(k.PrivKey(), k.PeerID())); err != nil {
				t.Fatal(err)
			}
		}
	}
	full := uint64(min(len(keys), perOwnerBound))
	eventually(t, 3*time.Minute, "every node to check the insider's machines and drop them", func() bool {
		publish()
		for _, n := range m.nodes() {
			if n.book.Unanswered() < full {
				return false
			}
		}
		return true
	})
	most := 0
	for _, n := range m.nodes() {
		most = max(most, m.fakesIn(n))
	}
	return most
}

// fakesIn is how many of the insider's machines n's book holds.
func (m *insiderMarket) fakesIn(n *testNode) int {
	count := 0
	for _, h := range n.book.List(time.Now()) {
		if h.Offer.Owner == string(m.insider.Address()) {
			count++
		}
	}
	return count
}

// honestRun is what became of an honest job.
type honestRun struct {
	job      *jobs.Job
	launched time.Duration // from its submission; 0 if it never launched
}

// honestJob submits a 2-worker job that sleeps a second and waits for its
// end; it may wait up to maxWait for machines.
func (m *insiderMarket) honestJob(t testing.TB, maxWait string) honestRun {
	t.Helper()
	spec := sleepJob("honest", m.bundle, 1)
	spec.Workers, spec.Memory, spec.MaxPrice, spec.MaxDuration, spec.MaxWait = 2, "256MiB", "5", "10m", maxWait
	start := time.Now()
	j, err := m.sub.client.Submit(t.Context(), api.SubmitRequest{Spec: spec, Yes: true})
	if err != nil {
		t.Fatal(err)
	}
	r := honestRun{job: waitJob(t, m.sub, j.ID, 5*time.Minute)}
	if len(r.job.Runs) > 0 && !r.job.Runs[0].Started.IsZero() {
		r.launched = r.job.Runs[0].Started.Sub(start)
	}
	return r
}

// onHonestLenders reports whether every worker of the job's first run
// was on an honest lender.
func (m *insiderMarket) onHonestLenders(r honestRun) bool {
	if len(r.job.Runs) == 0 {
		return false
	}
	for _, w := range r.job.Runs[0].Workers {
		if w.Machine != m.lenders[0].Host().ID().String() && w.Machine != m.lenders[1].Host().ID().String() {
			return false
		}
	}
	return true
}

// TestLinkedFakeMachinesCannotFailAnHonestJob: a member links more fake
// machine keys to itself than a book takes of one owner (each locking the
// ledger's link stake) and offers each of them, cheaper than the honest
// lenders, from one raw libp2p host. No fake machine answers: its address
// takes a connection and says nothing. Every node checks each new machine
// before its offer enters the book (market.Vet), so none of them enters
// any book, and an honest 2-worker job submitted
// meanwhile runs on the honest lenders: each scheduler tries at most
// lostPerAccount of the member's machines before it leaves the rest of
// them out of the quote, and does not wait on releasing the holds it
// asked of them. (TestOneAccountsDeadMachinesDoNotFailABid, in the
// quoter, shows the bound deterministically: without it the fakes use up
// a quote's attempts.)
func TestLinkedFakeMachinesCannotFailAnHonestJob(t *testing.T) {
	t.Parallel()
	m := startInsiderMarket(t)
	stake := m.sub.ledgerApp.Params().LinkStake
	keys := m.linkFakes(t, insiderFakes)
	if b, err := m.ledger.Balance(t.Context(), m.insider.Address()); err != nil || b >= 3*stake {
		t.Fatalf("the insider's balance after %d links: %d %v; want %d staked", insiderFakes, b, err, uint64(insiderFakes)*stake)
	}
	hole := newBlackhole(t)
	if most := m.offerFakes(t, keys, hole); most > 0 {
		t.Fatalf("a book holds %d of the machines that do not answer", most)
	}

	// The honest job. Its schedulers may collide on the two honest
	// machines (one holds the first while another's attempt holds the
	// second beside a fake), and a bid refused for that waits and bids
	// again: it is delayed, not failed.
	r := m.honestJob(t, "")
	if r.job.State != jobs.Succeeded {
		t.Fatalf("the honest job %s: %s\n%s", r.job.State, r.job.Reason, jobLog(t, m.sub, r.job.ID))
	}
	if !m.onHonestLenders(r) {
		t.Errorf("the honest job ran on %+v, not on the honest lenders", r.job.Runs[0].Workers)
	}
	// How many times the fakes were dialed is logged, not bounded here: a
	// bid that collided bids again, and libp2p may dial an address more
	// than once; the quoter's TestOneAccountsDeadMachinesDoNotFailABid
	// bounds the machines a quote tries per account.
	t.Logf("the honest job launched %s after its submission, with no fake machine in any book; the fakes' address took %d connections",
		r.launched.Round(100*time.Millisecond), hole.accepted.Load())
}

// TestUnlaunchedCommitIsPaidFor: a member holds a lender's core for a bid
// of its own, opens the run's escrow naming the lender, and commits the
// hold with its receipt for the launch window, over raw protocol and a
// raw transaction, then never launches nor settles. The lender's hold
// lapses, it claims with the receipt once the escrow has expired, and is
// paid the receipt's amount: holding a core costs the
// member the core's reserve price for the time it held it waiting. A
// commit without the receipt is refused, and the same run is not held
// again.
func TestUnlaunchedCommitIsPaidFor(t *testing.T) {
	t.Parallel()
	const within = 10 * time.Second
	m := startInsiderMarketOf(t, []nodeOpt{noQuotes}, func(c *Config) { c.Market.LaunchWithin = Duration{within} })
	ctx := t.Context()
	l := m.lenders[0]
	payee := string(l.key.Address())
	var prices p2p.Prices
	for _, h := range m.sub.book.List(time.Now()) {
		if h.Offer.Machine == l.Host().ID().String() {
			prices = h.Offer.Price
		}
	}
	res := p2p.Resources{Cores: 1, MemBytes: 1 << 30}
	need := p2p.HoldCharge(prices.PerHour(res), within)
	if need == 0 {
		t.Fatal("the lender's offer names no prices")
	}
	job := jobIDOf(m.chain + "insider-commit")
	bid := p2p.Bid{JobID: job, Submitter: string(m.insider.Address()), Workers: 1, PerWorker: res, MaxPrice: 10 * units.MicroPerCredit,
		Duration: 600, Framework: "generic", Floor: p2p.DefaultFloor}
	sealed, err := p2p.Seal(m.insider, m.chain, p2p.TypeBid, &bid, 1, time.Now().Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.raw.publishBid(ctx, sealed); err != nil {
		t.Fatal(err)
	}
	holdID := "00000000000000a1"
	if r, err := m.raw.reserve(ctx, l.Host().ID(), p2p.Reserve{Op: p2p.OpReserve, ID: holdID, JobID: job, Res: res, TTL: 60,
		Bidder: m.insider.PeerID().String(), Bid: sealed}); err != nil || !r.OK {
		t.Fatalf("the insider's hold: %+v %v", r, err)
	}
	// An escrow that expires soon: the member never settles it, and the
	// lender claims from it once it has expired.
	if _, err := m.ledger.OpenEscrow(ctx, ledger.OpenEscrow{Job: job, Amount: units.MicroPerCredit, Expiry: time.Now().Add(30 * time.Second).Unix(),
		Payees: []string{payee}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the lender's replica to show the escrow", func() bool {
		_, ok := l.ledgerApp.EscrowOf(job)
		return ok
	})
	commit := func(rc *p2p.Receipt) p2p.ReserveReply {
		r, err := m.raw.reserve(ctx, l.Host().ID(), p2p.Reserve{Op: p2p.OpCommit, ID: holdID, JobID: job, Receipt: rc})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := commit(nil); r.OK || !strings.Contains(r.Reason, "receipt") {
		t.Fatalf("a commit without its receipt: %+v", r)
	}
	signed := ledger.SignReceipt(m.insider, m.chain, ledger.Receipt{Job: job, Payee: payee, Amount: need})
	if r := commit(&p2p.Receipt{Payee: payee, Amount: signed.Amount, Sig: signed.Sig}); !r.OK {
		t.Fatalf("the commit with its receipt: %+v", r)
	}
	before, err := m.ledger.Balance(ctx, l.key.Address())
	if err != nil {
		t.Fatal(err)
	}
	// The launch never comes; the hold lapses.
	eventually(t, within+10*time.Second, "the committed hold to lapse", func() bool { return len(l.holds.List(time.Now())) == 0 })
	if !l.exec.HasClaim(job) {
		t.Fatal("the lapsed hold's receipt is not with the claim service")
	}
	// The run is charged here: while its claim is pending it is not
	// committed here again (its one receipt would cover both).
	sealed, _ = p2p.Seal(m.insider, m.chain, p2p.TypeBid, &bid, 2, time.Now().Add(time.Minute))
	if err := m.raw.publishBid(ctx, sealed); err != nil {
		t.Fatal(err)
	}
	if r, err := m.raw.reserve(ctx, l.Host().ID(), p2p.Reserve{Op: p2p.OpReserve, ID: "00000000000000a2", JobID: job, Res: res, TTL: 60,
		Bidder: m.insider.PeerID().String(), Bid: sealed}); err != nil || !r.OK {
		t.Fatalf("the insider's second hold: %+v %v", r, err)
	}
	if r, err := m.raw.reserve(ctx, l.Host().ID(), p2p.Reserve{Op: p2p.OpCommit, ID: "00000000000000a2", JobID: job,
		Receipt: &p2p.Receipt{Payee: payee, Amount: signed.Amount, Sig: signed.Sig}}); err != nil || r.OK {
		t.Fatalf("a second commit of the charged run: %+v %v", r, err)
	}
	eventually(t, 2*time.Minute, "the lender paid its receipt for the launch window", func() bool {
		b, err := m.ledger.Balance(ctx, l.key.Address())
		return err == nil && b >= before+need
	})
	t.Logf("the lender was paid %s credits for a core held %s unlaunched", units.FormatCredits(need), within)
}

// TestOneBalanceBacksHoldsAcrossTheMarket: a member asks two machines to
// hold capacity, each for a bid of its own that its whole balance covers.
// Each machine alone would grant it; but every machine counts the bids it
// has seen on the market against the account's balance, so only the
// earlier bid holds anywhere: the later one is refused, or, when both
// requests race their bids' gossip, its hold is dropped once its machine
// sees the earlier bid. A bid handed to a machine without being gossiped
// holds nothing.
func TestOneBalanceBacksHoldsAcrossTheMarket(t *testing.T) {
	t.Parallel()
	m := startInsiderMarketOf(t, []nodeOpt{noQuotes})
	ctx := t.Context()
	balance, err := m.ledger.Balance(ctx, m.insider.Address())
	if err != nil || balance == 0 {
		t.Fatalf("the insider's balance: %d %v", balance, err)
	}
	res := p2p.Resources{Cores: 1, MemBytes: 1 << 30}
	seq := uint64(time.Now().UnixNano())
	bidFor := func(name string, ttl time.Duration) (string, []byte) {
		job := jobIDOf(m.chain + name)
		bid := p2p.Bid{JobID: job, Submitter: string(m.insider.Address()), Workers: 1, PerWorker: res, MaxPrice: balance,
			Duration: 60, Framework: "generic", Floor: p2p.DefaultFloor}
		seq++
		sealed, err := p2p.Seal(m.insider, m.chain, p2p.TypeBid, &bid, seq, time.Now().Add(ttl))
		if err != nil {
			t.Fatal(err)
		}
		return job, sealed
	}
	hold := func(l *testNode, id, job string, sealed []byte) p2p.ReserveReply {
		r, err := m.raw.reserve(ctx, l.Host().ID(), p2p.Reserve{Op: p2p.OpReserve, ID: id, JobID: job, Res: res, TTL: 10,
			Bidder: m.insider.PeerID().String(), Bid: sealed})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	holdsOf := func(l *testNode, job string) int {
		n := 0
		for _, h := range l.holds.List(time.Now()) {
			if h.Job == job {
				n++
			}
		}
		return n
	}
	l0, l1 := m.lenders[0], m.lenders[1]

	// A bid never gossiped.
	job, sealed := bidFor("unseen", time.Minute)
	if r := hold(l0, "00000000000000b0", job, sealed); r.OK || !strings.Contains(r.Reason, "not been seen on the market") {
		t.Fatalf("a hold for a bid never gossiped: %+v", r)
	}

	// One after the other (bids of 15 s): the second is refused on the other machine.
	live := time.Now().Add(15 * time.Second)
	first, sealed1 := bidFor("first", 15*time.Second)
	second, sealed2 := bidFor("second", 15*time.Second)
	for _, s := range [][]byte{sealed1, sealed2} {
		if err := m.raw.publishBid(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	// Gossip keeps no order: the other machine must have seen the first bid (sequence seq-1).
	if !l1.commitments.Await(ctx, string(m.insider.Address()), first, seq-1, 10*time.Second) {
		t.Fatal("the other machine never saw the first bid")
	}
	if r := hold(l0, "00000000000000b1", first, sealed1); !r.OK {
		t.Fatalf("the first bid's hold: %+v", r)
	}
	if r := hold(l1, "00000000000000b2", second, sealed2); r.OK || !strings.Contains(r.Reason, "more than its balance") {
		t.Fatalf("the second bid's hold, on another machine: %+v", r)
	}
	eventually(t, 30*time.Second, "the first hold to lapse", func() bool { return holdsOf(l0, first) == 0 })
	time.Sleep(time.Until(live)) // and the two bids to leave the market

	// Racing the gossip: both holds asked at once, each machine waiting
	// for its bid; the later bid is gossiped first, the earlier half a
	// second after, so the later one's machine has seen only its own.
	third, sealed3 := bidFor("third", time.Minute)
	fourth, sealed4 := bidFor("fourth", time.Minute)
	var wg sync.WaitGroup
	var r3, r4 p2p.ReserveReply
	wg.Go(func() { r3 = hold(l0, "00000000000000b3", third, sealed3) })
	wg.Go(func() { r4 = hold(l1, "00000000000000b4", fourth, sealed4) })
	time.Sleep(200 * time.Millisecond)
	if err := m.raw.publishBid(ctx, sealed4); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if err := m.raw.publishBid(ctx, sealed3); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	t.Logf("racing holds: the earlier bid's %+v, the later bid's %+v", r3, r4)
	if !r3.OK {
		t.Fatalf("the earlier bid's hold: %+v", r3)
	}
	eventually(t, 5*time.Second, "the later bid's hold to be gone", func() bool { return holdsOf(l1, fourth) == 0 })
	if holdsOf(l0, third) != 1 {
		t.Fatal("the earlier bid's hold went too")
	}
}
