package node

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/p2p"
)

// rawPeer is an attacker: a real libp2p host with plain gossipsub (no
// validators) and the node's request protocols, run by a fresh key with
// no credits.
type rawPeer struct {
	key *identity.Key
	rpc *p2p.RPC
	ps  *pubsub.PubSub

	mu     sync.Mutex
	topics map[string]*pubsub.Topic
}

func newRawPeer(t testing.TB, ctx context.Context, chain string, connect ...*testNode) *rawPeer {
	t.Helper()
	k, err := identity.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return newRawPeerWith(t, ctx, chain, k, connect...)
}

// newRawPeerWith is newRawPeer run by key k (a member's, for a greedy
// member rather than a stranger).
func newRawPeerWith(t testing.TB, ctx context.Context, chain string, k *identity.Key, connect ...*testNode) *rawPeer {
	t.Helper()
	h, err := p2p.NewHost(p2p.HostParams{Key: k, Listen: []string{"/ip4/127.0.0.1/tcp/0"}, Version: "evil"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	ps, err := pubsub.NewGossipSub(ctx, h, pubsub.WithFloodPublish(true), pubsub.WithPeerOutboundQueueSize(4096))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range connect {
		if err := h.Connect(ctx, peer.AddrInfo{ID: n.Host().ID(), Addrs: n.Host().Addrs()}); err != nil {
			t.Fatal(err)
		}
	}
	return &rawPeer{key: k, rpc: &p2p.RPC{Host: h, Key: k, ChainID: chain}, ps: ps, topics: map[string]*pubsub.Topic{}}
}

func (p *rawPeer) join(t testing.TB, topic string) (*pubsub.Topic, *pubsub.Subscription) {
	t.Helper()
	tp, err := p.topic(topic)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := tp.Subscribe()
	if err != nil {
		t.Fatal(err)
	}
	return tp, sub
}

// topic joins name once.
func (p *rawPeer) topic(name string) (*pubsub.Topic, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if tp, ok := p.topics[name]; ok {
		return tp, nil
	}
	tp, err := p.ps.Join(name)
	if err != nil {
		return nil, err
	}
	p.topics[name] = tp
	return tp, nil
}

// publishBid gossips sealed, a bid signed by p's key, on the bids topic:
// a machine holds only for a bid it has seen there. It waits (10 s at
// most) for the topic to have a peer.
func (p *rawPeer) publishBid(ctx context.Context, sealed []byte) error {
	tp, err := p.topic(p2p.BidsTopic(p.rpc.ChainID))
	if err != nil {
		return err
	}
	for deadline := time.Now().Add(10 * time.Second); len(tp.ListPeers()) == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			return errors.New("no peer on the bids topic")
		}
	}
	return tp.Publish(ctx, sealed)
}

func (p *rawPeer) reserve(ctx context.Context, machine peer.ID, r p2p.Reserve) (p2p.ReserveReply, error) {
	var reply p2p.ReserveReply
	err := p.rpc.Call(ctx, machine, p2p.ReserveProtocol(p.rpc.ChainID), p2p.TypeReserve, &r, p2p.TypeReserveReply, &reply)
	return reply, err
}

func jobIDOf(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// TestHoldsNeedAFundedBid: a stranger with a fresh key, talking the
// reserve protocol to a lending machine over a real libp2p stream, holds
// nothing: not without a bid the machine can check, not for its own bid,
// and not with a real member's bid it overheard on gossip (only machines
// the ledger backs schedule). A greedy member's machine that overheard the
// bid holds nothing for a bid of a key that is not a member, of more than
// the bidder holds, or that it forged, and with the real bid holds only
// within the caps and the quote window: it cannot commit (only the bidder
// does), so what it holds lapses after its TTL. The owner sees every hold
// and releases one.
func TestHoldsNeedAFundedBid(t *testing.T) {
	t.Parallel()
	chain := testNet(t)
	ctx := t.Context()
	greedyKey, err := identity.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	homes := initNetwork(t, t.TempDir(), chain, []string{"bidder", "lender"}, greedyKey.Address())
	bidder := startNode(t, homes[0], func(c *Config) { c.Scheduler.Quote = false })
	lender := startNode(t, homes[1], withBootstrap(bidder.addr()), func(c *Config) {
		c.Scheduler.Quote = false
		c.Market.HoldsPerScheduler = 2
		c.Market.LaunchWithin = Duration{10 * time.Second}
	})
	if _, err := lender.client.SetLend(ctx, api.LendRequest{Cores: 1, MemBytes: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	stranger := newRawPeer(t, ctx, chain, lender, bidder)
	evil := newRawPeerWith(t, ctx, chain, greedyKey, lender, bidder)
	machine := lender.Host().ID()
	_, bids := evil.join(t, p2p.BidsTopic(chain))

	res := p2p.Resources{Cores: 1, MemBytes: 128 << 20}
	holdBy := func(p *rawPeer, id, job string, bid []byte, by peer.ID) (p2p.ReserveReply, error) {
		return p.reserve(ctx, machine, p2p.Reserve{Op: p2p.OpReserve, ID: id, JobID: job, Res: res, TTL: 5,
			Bidder: by.String(), Bid: bid})
	}
	hold := func(id, job string, bid []byte, by peer.ID) (p2p.ReserveReply, error) {
		return holdBy(evil, id, job, bid, by)
	}
	job := jobIDOf(chain + "evil")
	// No bid at all: the request is malformed, the stream is reset.
	if _, err := evil.reserve(ctx, machine, p2p.Reserve{Op: p2p.OpReserve, ID: "0000000000000001", JobID: job, Res: res, TTL: 5, Bidder: evil.key.PeerID().String()}); err == nil {
		t.Fatal("a hold without a bid was answered")
	}
	// A bid of a key that is not a member.
	own := p2p.Bid{JobID: job, Submitter: string(stranger.key.Address()), Workers: 1, PerWorker: res, MaxPrice: 1, Duration: 60, Framework: "generic"}
	sealed, err := p2p.Seal(stranger.key, chain, p2p.TypeBid, &own, 1, time.Now().Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if r, err := hold("0000000000000002", job, sealed, stranger.key.PeerID()); err != nil || r.OK || !strings.Contains(r.Reason, "not a member") {
		t.Fatalf("a hold for a non-member's bid: %+v %v", r, err)
	}
	// The stranger, for its own bid: it schedules nothing.
	if r, err := holdBy(stranger, "0000000000000012", job, sealed, stranger.key.PeerID()); err != nil || r.OK || !strings.Contains(r.Reason, "ledger backs") {
		t.Fatalf("a stranger's hold for its own bid: %+v %v", r, err)
	}
	// A bid naming the bidder's rich account, signed by another key.
	forged := own
	forged.Submitter = string(bidder.key.Address())
	sealed, _ = p2p.Seal(stranger.key, chain, p2p.TypeBid, &forged, 2, time.Now().Add(time.Minute))
	if r, err := hold("0000000000000003", job, sealed, evil.key.PeerID()); err != nil || r.OK {
		t.Fatalf("a hold for a bid spending another account: %+v %v", r, err)
	}

	// A real member's bid, for more than its balance: gossip ignores it,
	// and a machine handed it refuses to hold for it.
	dear := api.PublishBidRequest{Bid: p2p.Bid{JobID: jobIDOf(chain + "dear"), Workers: 1, PerWorker: res,
		MaxPrice: 2 * LocalStarterCredit, Duration: 60, Framework: "generic"}}
	if _, err := bidder.client.PublishBid(ctx, dear); err == nil {
		t.Fatal("the bidder published a bid beyond its balance")
	}

	// The greedy member's own bid for 1 micro-credit (its balance covers
	// that): the lender's reserve for an hour of a core is more, so it
	// holds nothing.
	cheap := p2p.Bid{JobID: jobIDOf(chain + "cheap"), Submitter: string(evil.key.Address()), Workers: 1, PerWorker: res,
		MaxPrice: 1, Duration: 3600, Framework: "generic", Floor: p2p.DefaultFloor}
	sealed, _ = p2p.Seal(evil.key, chain, p2p.TypeBid, &cheap, 3, time.Now().Add(time.Minute))
	if r, err := hold("0000000000000014", cheap.JobID, sealed, evil.key.PeerID()); err != nil || r.OK || !strings.Contains(r.Reason, "reserve price") {
		t.Fatalf("a hold for a 1-micro-credit bid: %+v %v", r, err)
	}

	// The bidder's real bid, overheard by the stranger on gossip.
	real := api.PublishBidRequest{Bid: p2p.Bid{JobID: jobIDOf(chain + "real"), Workers: 2, PerWorker: res,
		MaxPrice: 10_000_000, Duration: 60, Framework: "generic"}}
	var raw []byte
	for raw == nil {
		if _, err := bidder.client.PublishBid(ctx, real); err != nil {
			t.Fatal(err)
		}
		mctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		m, err := bids.Next(mctx)
		cancel()
		if err == nil {
			raw = m.Data
		}
	}
	by := bidder.Host().ID()
	// The stranger, with the overheard bid: it schedules nothing.
	if r, err := holdBy(stranger, "0000000000000013", real.Bid.JobID, raw, by); err != nil || r.OK || !strings.Contains(r.Reason, "ledger backs") {
		t.Fatalf("a stranger's hold with an overheard bid: %+v %v", r, err)
	}
	// The greedy member may not hold more than the bid's workers need...
	big := p2p.Reserve{Op: p2p.OpReserve, ID: "0000000000000004", JobID: real.Bid.JobID, Res: p2p.Resources{Cores: 3, MemBytes: 1 << 20}, TTL: 5, Bidder: by.String(), Bid: raw}
	if r, err := evil.reserve(ctx, machine, big); err != nil || r.OK {
		t.Fatalf("a hold beyond the bid: %+v %v", r, err)
	}
	// ...nor for another job than the bid's.
	if r, err := hold("0000000000000005", job, raw, by); err != nil || r.OK {
		t.Fatalf("a hold for another job with this bid: %+v %v", r, err)
	}
	// Within the bid and the caps, it holds; the owner sees it.
	if r, err := hold("0000000000000006", real.Bid.JobID, raw, by); err != nil || !r.OK {
		t.Fatalf("a hold for a real, funded bid: %+v %v", r, err)
	}
	st, err := lender.client.Lend(ctx)
	if err != nil || len(st.Holds) != 1 || st.Holds[0].Account != string(bidder.key.Address()) || st.Holds[0].Scheduler != evil.key.PeerID().String() {
		t.Fatalf("the owner's view of the holds: %+v %v", st.Holds, err)
	}
	if st, err = lender.client.ReleaseHold(ctx, "0000000000000006"); err != nil || len(st.Holds) != 0 {
		t.Fatalf("the owner released the hold: %+v %v", st.Holds, err)
	}
	// It cannot commit what it holds: only the bidder does. The hold
	// lapses after its TTL (5 s); the lent core is held meanwhile.
	if r, err := hold("0000000000000007", real.Bid.JobID, raw, by); err != nil || !r.OK {
		t.Fatalf("hold: %+v %v", r, err)
	}
	if r, err := evil.reserve(ctx, machine, p2p.Reserve{Op: p2p.OpCommit, ID: "0000000000000007", JobID: real.Bid.JobID}); err != nil || r.OK {
		t.Fatalf("a scheduler that overheard the bid committed its hold: %+v %v", r, err)
	}
	if r, err := hold("0000000000000008", real.Bid.JobID, raw, by); err != nil || r.OK {
		t.Fatalf("a hold beyond the lent core: %+v %v", r, err)
	}
	eventually(t, 20*time.Second, "the uncommitted hold to lapse", func() bool {
		st, err := lender.client.Lend(ctx)
		return err == nil && len(st.Holds) == 0
	})
	if a := lender.holds.Allocated(time.Now()); a != (p2p.Resources{}) {
		t.Fatalf("allocated after every hold lapsed: %+v", a)
	}
	// Committed by the bidder, then a launch with no escrow behind it:
	// refused as one that may pass (the machine's ledger may be behind),
	// and the hold, not taken, lapses at the end of its launch window
	// rather than never.
	if r, err := hold("0000000000000009", real.Bid.JobID, raw, by); err != nil || !r.OK {
		t.Fatalf("hold: %+v %v", r, err)
	}
	// The commit carries the bidder's receipt for the launch window.
	lenderPayee := string(lender.key.Address())
	rc := bidder.ledger.SignReceipt(ledger.Receipt{Job: real.Bid.JobID, Payee: lenderPayee, Amount: 1_000_000})
	if r, err := bidder.calls.reserve(ctx, machine, nil, p2p.Reserve{Op: p2p.OpCommit, ID: "0000000000000009", JobID: real.Bid.JobID,
		Receipt: &p2p.Receipt{Payee: lenderPayee, Amount: rc.Amount, Sig: rc.Sig}}); err != nil || !r.OK {
		t.Fatalf("the bidder's commit: %+v %v", r, err)
	}
	launch := p2p.Launch{JobID: real.Bid.JobID, Index: 0, World: []string{machine.String()}, Addrs: [][]string{nil},
		Hold: "0000000000000009", Framework: "generic", Command: []string{"python3", "job.py"}, Bundle: "bafkqaaa",
		Res: res, MaxSecs: 60, PerHour: 1, Floor: p2p.DefaultFloor}
	var reply p2p.LaunchReply
	err = evil.rpc.Call(ctx, machine, p2p.JobProtocol(chain), p2p.TypeLaunch, &launch, p2p.TypeLaunchReply, &reply)
	if err != nil || reply.OK || !reply.Retry || !strings.Contains(reply.Reason, "no escrow") {
		t.Fatalf("a launch with no escrow: %+v %v", reply, err)
	}
	eventually(t, 15*time.Second, "the hold of the refused launch to go", func() bool {
		return lender.holds.Allocated(time.Now()) == p2p.Resources{}
	})
}

// TestFakeMachineFlood: a stranger floods a node with offers of thousands
// of machines, each signed by a fresh key of its own (a valid signature,
// authored by that key on gossip), through one libp2p host. None is kept
// (the ledger backs none of them), none is relayed, nothing is remembered
// of the fake signers, the flooder's score falls below the graylist
// threshold, and an honest job bid during the flood is quoted and held on
// the honest lender.
func TestFakeMachineFlood(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("3,000 messages")
	}
	chain := testNet(t)
	ctx := t.Context()
	homes := initNetwork(t, t.TempDir(), chain, []string{"victim", "lender", "relay"})
	victim := startNode(t, homes[0])
	lender := startNode(t, homes[1], withBootstrap(victim.addr()))
	relay := startNode(t, homes[2], withBootstrap(victim.addr()))
	if _, err := lender.client.SetLend(ctx, api.LendRequest{Cores: 1, MemBytes: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the victim holds the lender's offer", func() bool { return hasOffer(victim, lender.Host().ID().String()) })
	evil := newRawPeer(t, ctx, chain, victim)
	offers, _ := evil.join(t, p2p.OffersTopic(chain))
	eventually(t, 10*time.Second, "the flooder on the victim's offers topic", func() bool { return len(offers.ListPeers()) > 0 })

	const fakes = 3000
	flood := make(chan error, 1)
	go func() {
		exp := time.Now().Add(time.Hour)
		for i := range fakes {
			k, err := identity.GenerateKey()
			if err != nil {
				flood <- err
				return
			}
			o := &p2p.Offer{Machine: k.PeerID().String(), Owner: string(k.Address()), Moniker: fmt.Sprint("fake", i), Site: "lab-a",
				Lent: p2p.Resources{Cores: 64, MemBytes: 256 << 30}, Addrs: []string{"/ip4/10.255.255.1/tcp/7701/p2p/" + k.PeerID().String()},
				Software: p2p.Software{OS: "linux"}}
			data, err := p2p.Seal(k, chain, p2p.TypeOffer, o, 1, exp)
			if err != nil {
				flood <- err
				return
			}
			if err := offers.Publish(ctx, data, pubsub.WithSecretKeyAndPeerId(k.PrivKey(), k.PeerID())); err != nil {
				flood <- err
				return
			}
		}
		flood <- nil
	}()

	// An honest bid while the flood runs is quoted, held on the lender.
	job := jobIDOf(chain + "honest")
	quoted := func() bool {
		qs, _ := victim.quotes.Quotes(ctx, job)
		for _, q := range qs {
			if len(q.Workers) == 1 && q.Workers[0].Machine == lender.Host().ID().String() {
				return true
			}
		}
		return false
	}
	start := time.Now()
	for !quoted() {
		if time.Since(start) > 60*time.Second {
			t.Fatal("no quote for the honest bid during the flood")
		}
		if _, err := victim.client.PublishBid(ctx, api.PublishBidRequest{Bid: p2p.Bid{JobID: job, Workers: 1,
			PerWorker: p2p.Resources{Cores: 1, MemBytes: 128 << 20}, MaxPrice: 10_000_000, Duration: 60, Framework: "generic"}}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("honest bid quoted %s into the flood", time.Since(start).Round(time.Millisecond))
	if err := <-flood; err != nil {
		t.Fatal(err)
	}
	// Past ~300 unbacked offers its score crosses the graylist threshold:
	// the victim drops the rest unread.
	eventually(t, 30*time.Second, "the victim to turn away the flood", func() bool { return rejected(victim, "not_admitted") >= 250 })
	t.Logf("the victim ignored %v of %d fake offers, then graylisted the flooder", rejected(victim, "not_admitted"), fakes)
	if n := rejected(relay, "not_admitted"); n != 0 {
		t.Errorf("the victim relayed %v fake offers to the relay", n)
	}
	if n := rejected(victim, "not_admitted"); n > fakes/2 {
		t.Errorf("the victim read %v of %d fake offers: it never graylisted the flooder", n, fakes)
	}
	// Once graylisted the flooder's count stops growing and decays (half-life
	// 10 min), so its score climbs back from just past -2500; it stays far
	// below the publish threshold for minutes.
	eventually(t, 30*time.Second, "the flooder's score below the publish threshold at the victim", func() bool {
		for _, p := range victim.Peers() {
			if p.PeerID == evil.key.PeerID().String() {
				return p.Score < -1000
			}
		}
		return true // disconnected: as good
	})
	for _, n := range []*testNode{victim, relay} {
		for _, o := range n.Offers() {
			if strings.HasPrefix(o.Moniker, "fake") {
				t.Fatalf("%s holds a fake machine's offer: %+v", n.home.Dir, o)
			}
		}
		if got := n.gossip.Tracked(); got > 10 {
			t.Errorf("%s remembers the sequences of %d signers", n.home.Dir, got)
		}
	}
	if n := victim.book.Len(); n != 1 {
		t.Errorf("the victim's offer book holds %d offers, want the lender's 1", n)
	}
}

// A machine the ledger does not back may still save what it lends (the
// owner registers it next), is told why peers ignore it, and gets its bad
// requests refused like any other.
func TestUnregisteredLenderIsToldWhy(t *testing.T) {
	t.Parallel()
	chain := testNet(t)
	dir := t.TempDir()
	ah := initHome(t, filepath.Join(dir, "issuer"), chain)
	issuer := startNode(t, ah)
	st := issuer.Status()
	h := Home{Dir: filepath.Join(dir, "outsider")}
	if _, err := Init(h, InitOptions{
		Moniker: "outsider", Site: "lab-a", Genesis: ah.GenesisPath(), Listen: []string{"/ip4/127.0.0.1/tcp/0"}, API: "127.0.0.1:0",
		LedgerP2P: "tcp://127.0.0.1:" + freePort(t), LedgerRPC: "tcp://127.0.0.1:" + freePort(t),
		LedgerPeers: []string{st.LedgerNodeID + "@127.0.0.1:" + issuer.cfg.Ledger.P2PListen[len("tcp://127.0.0.1:"):]},
	}); err != nil {
		t.Fatal(err)
	}
	// Announcing every 5 s, not 30: the offer that counts is the first
	// after the link, once the machine's replica shows it.
	out := startNode(t, h, withBootstrap(issuer.addr()), func(c *Config) { c.P2P.AnnounceInterval = Duration{5 * time.Second} })
	inv := out.Inventory()

	_, err := out.client.SetLend(t.Context(), api.LendRequest{Cores: inv.Cores + 1, MemBytes: 1 << 30})
	var apiErr *api.Error
	if !errors.As(err, &apiErr) || apiErr.Field != "cores" {
		t.Fatalf("an unregistered machine lending %d of %d cores: %v, want an error on field cores", inv.Cores+1, inv.Cores, err)
	}
	lend, err := out.client.SetLend(t.Context(), api.LendRequest{Cores: 1, MemBytes: 1 << 30})
	if err != nil {
		t.Fatalf("an unregistered machine cannot save what it lends: %v", err)
	}
	if !slices.ContainsFunc(lend.Warnings, func(w string) bool { return strings.Contains(w, "not registered") }) {
		t.Fatalf("lend state without the registration warning: %+v", lend)
	}
	time.Sleep(2 * time.Second)
	if hasOffer(issuer, out.Host().ID().String()) {
		t.Fatal("the issuer holds the offer of a machine the ledger does not back")
	}
	// Its owner, a member, links it: the machine consents, the owner's node
	// sends the link.
	if _, err := issuer.client.Send(t.Context(), api.SendRequest{Kind: "link", Consent: "bm90IGEgY29uc2VudA"}); err == nil {
		t.Fatal("a link with a garbage consent was sent")
	}
	c, err := out.client.Consent(t.Context(), api.ConsentRequest{Owner: string(issuer.key.Address())})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := issuer.client.Send(t.Context(), api.SendRequest{Kind: "link", Consent: c.Token}); err != nil {
		t.Fatalf("link: %v", err)
	}
	if _, err := issuer.client.Send(t.Context(), api.SendRequest{Kind: "link", Consent: c.Token}); err == nil {
		t.Fatal("the same consent linked twice")
	}
	eventually(t, 60*time.Second, "the issuer to hold the linked machine's offer", func() bool { return hasOffer(issuer, out.Host().ID().String()) })
	if l := out.Lend(); !l.Registered || l.Owner != string(issuer.key.Address()) ||
		slices.ContainsFunc(l.Warnings, func(w string) bool { return strings.Contains(w, "not registered") }) {
		t.Errorf("lend state after the link: %+v", l)
	}
}
