package quoter

import (
	"context"
	"crypto/rand"
	"errors"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/node/market"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/scheduler"
)

func newPeerID(t testing.TB) peer.ID {
	t.Helper()
	_, pub, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// machines answer hold requests as lending machines do: a hold that fits
// what is free is granted, one that does not is refused with what is free;
// a machine marked down cannot be reached, and one marked late does what
// it is asked but its reply comes after the scheduler stopped waiting.
type machines struct {
	mu   sync.Mutex
	free map[peer.ID]p2p.Resources
	down map[peer.ID]bool
	late map[peer.ID]bool
	held map[string]peer.ID // hold ID -> machine
	// stall, when set, holds every release sent to a machine that is
	// down until it is closed.
	stall chan struct{}
}

func (m *machines) Reserve(_ context.Context, machine peer.ID, _ []string, r p2p.Reserve) (p2p.ReserveReply, error) {
	m.mu.Lock()
	if m.down[machine] && r.Op == p2p.OpRelease && m.stall != nil {
		stall := m.stall
		m.mu.Unlock()
		<-stall // a machine that never answers: a caller waiting on it waits for the test
		return p2p.ReserveReply{}, errors.New("no route to host")
	}
	defer m.mu.Unlock()
	if m.down[machine] {
		return p2p.ReserveReply{}, errors.New("no route to host")
	}
	reply := m.apply(machine, r)
	if m.late[machine] {
		return p2p.ReserveReply{}, context.DeadlineExceeded
	}
	return reply, nil
}

func (m *machines) apply(machine peer.ID, r p2p.Reserve) p2p.ReserveReply {
	f := m.free[machine]
	switch r.Op {
	case p2p.OpRelease:
		delete(m.held, r.ID)
		return p2p.ReserveReply{OK: true, Free: f}
	case p2p.OpReserve:
		if r.Res.Cores > f.Cores || r.Res.MemBytes > f.MemBytes || r.Res.GPUs > f.GPUs {
			return p2p.ReserveReply{Reason: "taken", Free: f}
		}
		f.Cores, f.MemBytes, f.GPUs = f.Cores-r.Res.Cores, f.MemBytes-r.Res.MemBytes, f.GPUs-r.Res.GPUs
		m.free[machine] = f
		m.held[r.ID] = machine
		return p2p.ReserveReply{OK: true, Expires: time.Now().Add(time.Minute).UnixMilli(), Free: f}
	}
	return p2p.ReserveReply{Reason: "unknown op"}
}

// harness is a quoter over a market of two machines that lend 2 cores
// each: a cheap one and a dear one.
type harness struct {
	q           *Quoter
	mk          *market.Market
	machines    *machines
	cheap, dear peer.ID
}

func newHarness(t *testing.T) *harness {
	h := &harness{cheap: newPeerID(t), dear: newPeerID(t)}
	book := market.NewOfferBook(10, 10)
	lent := p2p.Resources{Cores: 2, MemBytes: 2 << 30}
	now := time.Now()
	for _, o := range []struct {
		id    peer.ID
		price p2p.Prices
	}{{h.cheap, p2p.Prices{CoreHour: 100_000, MemGiBHour: 20_000}}, {h.dear, p2p.Prices{CoreHour: 2_000_000, MemGiBHour: 100_000}}} {
		book.Apply(&p2p.Received{Signer: o.id, Seq: 1, Expiry: now.Add(time.Hour), Offer: &p2p.Offer{
			Machine: o.id.String(), Owner: "owner", Moniker: o.id.String()[len(o.id.String())-4:], Lent: lent, Price: o.price}}, now)
	}
	h.mk = market.New(market.Params{Book: book, Subset: market.SubsetAll})
	h.machines = &machines{free: map[peer.ID]p2p.Resources{h.cheap: lent, h.dear: lent}, down: map[peer.ID]bool{}, held: map[string]peer.ID{}}
	h.q = New(Params{Self: newPeerID(t), Market: h.mk, Holds: h.machines, Quotes: SendFunc(func(context.Context, peer.ID, p2p.Quote) error { return nil }),
		Logger: slog.New(slog.DiscardHandler)})
	return h
}

func first[A, B any](a A, _ B) A { return a }

func (h *harness) quote(t *testing.T, job string) p2p.Quote {
	t.Helper()
	bid := p2p.Bid{JobID: job, Workers: 1, PerWorker: p2p.Resources{Cores: 1, MemBytes: 128 << 20},
		MaxPrice: 10_000_000, Duration: 600, Framework: "generic"}
	quote, _ := h.q.answerBid(t.Context(), bidWork{bid: bid, bidder: newPeerID(t)})
	return quote
}

// TestAnswerBidHoldsWhatMachinesGrant: a bid is quoted on the cheap
// machine while it has room; once another scheduler took its capacity
// (its offer still says 2 cores free) the machine refuses, and the
// quoter re-quotes on what the machines said and holds the dear one.
func TestAnswerBidHoldsWhatMachinesGrant(t *testing.T) {
	h := newHarness(t)
	q := h.quote(t, "first")
	if len(q.Workers) != 1 || q.Workers[0].Machine != h.cheap.String() || q.Workers[0].Hold == "" || q.HeldUntil == 0 {
		t.Fatalf("with both machines free: %+v", q)
	}
	h.machines.mu.Lock()
	h.machines.free[h.cheap] = p2p.Resources{}
	h.machines.mu.Unlock()
	q = h.quote(t, "second")
	if len(q.Workers) != 1 || q.Workers[0].Machine != h.dear.String() {
		t.Fatalf("with the cheap machine taken: %+v", q)
	}
	if h.mk.Unreachable(h.cheap.String(), time.Now()) {
		t.Error("a machine that refused is taken for unreachable")
	}
	// The refusal went into the quoter's copy, not the view that the
	// market serves the other bids.
	now := time.Now()
	if _, served, _ := h.mk.Indexed(now, ""); !reflect.DeepEqual(served, first(h.mk.View(now, ""))) {
		t.Errorf("the market serves %+v, its offers say %+v", served.Machines, first(h.mk.View(now, "")).Machines)
	}
	h.machines.mu.Lock()
	defer h.machines.mu.Unlock()
	if len(h.machines.held) != 2 {
		t.Errorf("%d holds on the machines, want the 2 quoted", len(h.machines.held))
	}
}

// TestAnswerBidSkipsUnreachableMachines: a machine that cannot be reached
// is left out of the quote and of the view for a while; when no machine
// has room, the quote says why.
func TestAnswerBidSkipsUnreachableMachines(t *testing.T) {
	h := newHarness(t)
	h.machines.down[h.cheap] = true
	q := h.quote(t, "first")
	if len(q.Workers) != 1 || q.Workers[0].Machine != h.dear.String() {
		t.Fatalf("with the cheap machine down: %+v", q)
	}
	if !h.mk.Unreachable(h.cheap.String(), time.Now()) {
		t.Fatal("the machine that could not be reached is not remembered")
	}
	if v, _ := h.mk.View(time.Now(), ""); len(v.Machines) != 1 {
		t.Fatalf("the view still has %d machines", len(v.Machines))
	}
	h.machines.mu.Lock()
	h.machines.free[h.dear] = p2p.Resources{}
	h.machines.mu.Unlock()
	q = h.quote(t, "second")
	if len(q.Workers) != 0 || q.Resource == "" || !strings.Contains(q.Reason, "taken") {
		t.Fatalf("with no machine free: %+v", q)
	}
}

// TestAnswerBidReleasesHoldsWhoseReplyWasLost: a machine that grants the
// hold but answers too late is skipped like an unreachable one, and the
// hold it granted is released: only the quoted machine holds anything,
// where the lost hold used to keep the cheap machine's cores until it
// lapsed.
func TestAnswerBidReleasesHoldsWhoseReplyWasLost(t *testing.T) {
	h := newHarness(t)
	h.machines.late = map[peer.ID]bool{h.cheap: true}
	q := h.quote(t, "first")
	if len(q.Workers) != 1 || q.Workers[0].Machine != h.dear.String() {
		t.Fatalf("with the cheap machine answering late: %+v", q)
	}
	h.q.bg.Wait() // released in the background: the quote did not wait on it
	h.machines.mu.Lock()
	defer h.machines.mu.Unlock()
	if len(h.machines.held) != 1 || h.machines.held[q.Workers[0].Hold] != h.dear {
		t.Errorf("holds on the machines: %v; want only the quoted one, %s on %s", h.machines.held, q.Workers[0].Hold, h.dear)
	}
}

// TestBelieveRefusals: a refusing machine's free resources replace what
// its offer said; one that answered nothing free (unreachable, or no
// longer lending) has nothing left.
func TestBelieveRefusals(t *testing.T) {
	lent := scheduler.Resources{Cores: 4, MemBytes: 4 << 30}
	for _, tc := range []struct {
		name     string
		reply    p2p.ReserveReply
		alloc    scheduler.Resources
		collided bool
	}{
		{"another scheduler took 3 cores", p2p.ReserveReply{Reason: "taken", Free: p2p.Resources{Cores: 1, MemBytes: 1 << 30}},
			scheduler.Resources{Cores: 3, MemBytes: 3 << 30}, true},
		{"unreachable", p2p.ReserveReply{Reason: "unreachable: timeout"}, lent, false},
		{"more free than lent", p2p.ReserveReply{Free: p2p.Resources{Cores: 9, MemBytes: 9 << 30}}, scheduler.Resources{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := scheduler.View{Machines: []scheduler.Machine{{ID: "m", Lent: lent}}}
			offers := []p2p.Offer{{Machine: "m", Moniker: "m1"}}
			refused := ""
			got := believeRefusals(&v, offers, heldPlacement{failed: []int{0}, replies: map[int]p2p.ReserveReply{0: tc.reply}}, &refused, map[string]int{})
			if got != tc.collided || v.Machines[0].Allocated != tc.alloc {
				t.Fatalf("collided %v, allocated %+v; want %v, %+v", got, v.Machines[0].Allocated, tc.collided, tc.alloc)
			}
			if tc.reply.Reason != "" && !strings.Contains(refused, "m1: "+tc.reply.Reason) {
				t.Errorf("refused = %q", refused)
			}
		})
	}
}

// TestHoldIDs: a hold's ID is the same for the same job, scheduler,
// machine and attempt, and differs when any of them does.
func TestHoldIDs(t *testing.T) {
	s1, s2 := newPeerID(t), newPeerID(t)
	base := holdID("job", s1, "m", 0)
	if holdID("job", s1, "m", 0) != base {
		t.Fatal("hold IDs are not deterministic")
	}
	for _, other := range []string{holdID("job2", s1, "m", 0), holdID("job", s2, "m", 0), holdID("job", s1, "m2", 0), holdID("job", s1, "m", 1)} {
		if other == base {
			t.Fatalf("two holds share ID %s", base)
		}
	}
}

// TestQuotesPredictTrainingTime: two one-core machines whose offers say
// they are 100 ms and 10 Mbit/s apart. A synchronous 2-worker job that
// describes its work is refused with the reason (one worker would finish
// sooner) and holds nothing; the same job in diloco mode is quoted with
// its predicted time and speed-up.
func TestQuotesPredictTrainingTime(t *testing.T) {
	a, b := newPeerID(t), newPeerID(t)
	book := market.NewOfferBook(10, 10)
	lent := p2p.Resources{Cores: 1, MemBytes: 2 << 30}
	now := time.Now()
	for _, o := range [][2]peer.ID{{a, b}, {b, a}} {
		book.Apply(&p2p.Received{Signer: o[0], Seq: 1, Expiry: now.Add(time.Hour), Offer: &p2p.Offer{
			Machine: o[0].String(), Owner: "owner", Lent: lent, Price: p2p.Prices{CoreHour: 100_000, MemGiBHour: 20_000},
			Links: []p2p.LinkSample{{Machine: o[1].String(), RTTMicros: 100_000, KBps: 1250}}}}, now)
	}
	ms := &machines{free: map[peer.ID]p2p.Resources{a: lent, b: lent}, down: map[peer.ID]bool{}, held: map[string]peer.ID{}}
	q := New(Params{Self: newPeerID(t), Market: market.New(market.Params{Book: book, Subset: market.SubsetAll}), Holds: ms,
		Quotes: SendFunc(func(context.Context, peer.ID, p2p.Quote) error { return nil }), Logger: slog.New(slog.DiscardHandler)})
	bid := func(tr p2p.Training) p2p.Quote {
		quote, _ := q.answerBid(t.Context(), bidWork{bidder: newPeerID(t), bid: p2p.Bid{JobID: "job-" + tr.Mode, Workers: 2,
			PerWorker: lent, MaxPrice: 10_000_000, Duration: 600, Framework: "generic", Training: &tr}})
		return quote
	}

	// 1,000 steps of 100 ms; 400 kB of weights. Sync: 500 steps of 0.1 s
	// compute + a ring's 2 hops of (50 ms + 200 kB at 1.25 MB/s) = 260 s,
	// against 100 s alone.
	// The job's own statistics say 2 workers take half the steps each.
	even := []float64{1, 0.5}
	sync := bid(p2p.Training{Mode: "sync", Steps: 1000, Params: 100_000, StepMillis: 100, StepsRatio: even})
	if len(sync.Workers) != 0 || sync.Resource != "network" || !strings.Contains(sync.Reason, "1 would take 1m40s") ||
		sync.Predicted == nil || sync.Predicted.Fewest != 1 || sync.Predicted.TotalSeconds < 259 || sync.Predicted.TotalSeconds > 261 {
		t.Fatalf("sync across a slow link: %+v %+v", sync, sync.Predicted)
	}
	if len(ms.held) != 0 {
		t.Errorf("a refused quote left holds: %v", ms.held)
	}
	// Diloco, every 100 steps, int8: 50 s compute + 5 rounds of 2 x (100 kB at 1.25 MB/s + 100 ms).
	local := bid(p2p.Training{Mode: "diloco", SyncEvery: 100, Steps: 1000, Params: 100_000, StepMillis: 100, StepsRatio: even})
	p := local.Predicted
	if len(local.Workers) != 2 || p == nil || p.Fewest != 2 || p.TotalSeconds < 51.7 || p.TotalSeconds > 51.9 || p.SpeedUp < 1.9 {
		t.Fatalf("diloco across a slow link: %+v %+v", local, p)
	}
	// A bid that does not describe its work gets no prediction.
	if plain := bid(p2p.Training{Mode: "sync"}); plain.Predicted != nil || len(plain.Workers) != 0 && plain.Resource != "" {
		t.Errorf("no steps or params: %+v", plain)
	}
}

// A TensorFlow bid on machines without TensorFlow says why; while their
// nodes are still checking their Python it says that, not "no TensorFlow".
func TestTensorFlowBidOnMachinesStillChecking(t *testing.T) {
	for _, checking := range []bool{false, true} {
		book := market.NewOfferBook(10, 10)
		now := time.Now()
		id := newPeerID(t)
		book.Apply(&p2p.Received{Signer: id, Seq: 1, Expiry: now.Add(time.Hour), Offer: &p2p.Offer{
			Machine: id.String(), Owner: "owner", Lent: p2p.Resources{Cores: 2, MemBytes: 2 << 30},
			Software: p2p.Software{Checking: checking}}}, now)
		q := New(Params{Self: newPeerID(t), Market: market.New(market.Params{Book: book, Subset: market.SubsetAll}),
			Holds:  &machines{free: map[peer.ID]p2p.Resources{}, down: map[peer.ID]bool{}, held: map[string]peer.ID{}},
			Quotes: SendFunc(func(context.Context, peer.ID, p2p.Quote) error { return nil }), Logger: slog.New(slog.DiscardHandler)})
		bid := p2p.Bid{JobID: "tf", Workers: 1, PerWorker: p2p.Resources{Cores: 1, MemBytes: 128 << 20}, MaxPrice: 10_000_000,
			Duration: 600, Framework: "tensorflow"}
		quote, _ := q.answerBid(t.Context(), bidWork{bid: bid, bidder: newPeerID(t)})
		want := map[bool]string{false: "has TensorFlow (their owners", true: "1 of them are still checking"}[checking]
		if quote.Resource != "framework" || !strings.Contains(quote.Reason, want) {
			t.Errorf("checking %v: %+v, want a reason with %q", checking, quote, want)
		}
	}
}

// TestOneAccountsDeadMachinesDoNotFailABid: an insider's account offers
// 256 machines cheaper than anyone's, none of which answers. An honest
// bid is still quoted, on the honest machine, after two attempts on the
// insider's machines: an account two of whose machines do not answer is
// left out of the rest of the quote. (Before, each attempt dropped one of
// them, and the bid failed after 8.)
func TestOneAccountsDeadMachinesDoNotFailABid(t *testing.T) {
	book := market.NewOfferBook(1000, 256)
	lent := p2p.Resources{Cores: 2, MemBytes: 2 << 30}
	now := time.Now()
	honest := newPeerID(t)
	ms := &machines{free: map[peer.ID]p2p.Resources{honest: lent}, down: map[peer.ID]bool{}, held: map[string]peer.ID{}}
	offer := func(id peer.ID, owner string, price uint64) {
		book.Apply(&p2p.Received{Signer: id, Seq: 1, Expiry: now.Add(time.Hour), Offer: &p2p.Offer{
			Machine: id.String(), Owner: owner, Moniker: id.String()[len(id.String())-4:], Lent: lent, Price: p2p.Prices{CoreHour: price}}}, now)
	}
	offer(honest, "honest", 1_000_000)
	for range 256 {
		id := newPeerID(t)
		offer(id, "insider", 1)
		ms.free[id], ms.down[id] = lent, true
	}
	mk := market.New(market.Params{Book: book, Subset: market.SubsetAll})
	q := New(Params{Self: newPeerID(t), Market: mk, Holds: ms, Quotes: SendFunc(func(context.Context, peer.ID, p2p.Quote) error { return nil }),
		Logger: slog.New(slog.DiscardHandler)})
	bid := p2p.Bid{JobID: "honest", Workers: 2, PerWorker: p2p.Resources{Cores: 1, MemBytes: 128 << 20},
		MaxPrice: 10_000_000, Duration: 600, Framework: "generic"}
	// The holds asked of the dead machines are released in the
	// background: the quote does not wait on machines that never answer.
	ms.stall = make(chan struct{})
	answered := make(chan p2p.Quote, 1)
	go func() {
		quote, _ := q.answerBid(t.Context(), bidWork{bid: bid, bidder: newPeerID(t)})
		answered <- quote
	}()
	var quote p2p.Quote
	select {
	case quote = <-answered:
	case <-time.After(time.Minute):
		t.Fatal("the quote waited on releasing the holds asked of machines that never answered")
	}
	close(ms.stall)
	q.bg.Wait()
	if len(quote.Workers) != 2 || quote.Workers[0].Machine != honest.String() || quote.Workers[1].Machine != honest.String() {
		t.Fatalf("the honest bid beside 256 dead machines of one account: %+v", quote)
	}
	unreachable := 0
	for id := range ms.down {
		if mk.Unreachable(id.String(), time.Now()) {
			unreachable++
		}
	}
	if unreachable != lostPerAccount {
		t.Errorf("%d of the insider's machines were tried, want %d", unreachable, lostPerAccount)
	}
}

// TestWarmMachineWinsAnImageJob: of two machines alike, a job in an image
// is quoted on the one whose offer says it holds the image (a warm
// start), though the other would win the tie without one; a job without
// an image is quoted as before.
func TestWarmMachineWinsAnImageJob(t *testing.T) {
	const img = "bafybeigdyrzt5sfp7udm7hu76uh7y26nf3efuylqabf3oclgtqy55fbzdi"
	book := market.NewOfferBook(10, 10)
	lent := p2p.Resources{Cores: 2, MemBytes: 2 << 30}
	now := time.Now()
	offer := func(id peer.ID, seq uint64, images ...string) {
		book.Apply(&p2p.Received{Signer: id, Seq: seq, Expiry: now.Add(time.Hour), Offer: &p2p.Offer{
			Machine: id.String(), Owner: "owner", Lent: lent, Price: p2p.Prices{CoreHour: 100_000, MemGiBHour: 20_000}, Images: images}}, now)
	}
	a, b := newPeerID(t), newPeerID(t)
	offer(a, 1)
	offer(b, 1)
	mk := market.New(market.Params{Book: book, Subset: market.SubsetAll})
	v, _ := mk.View(now, "")
	tieWinner, warm := v.Machines[0].ID, v.Machines[1].ID
	wp, _ := peer.Decode(warm)
	offer(wp, 2, "bafyother", img)
	ms := &machines{free: map[peer.ID]p2p.Resources{a: lent, b: lent}, down: map[peer.ID]bool{}, held: map[string]peer.ID{}}
	q := New(Params{Self: newPeerID(t), Market: mk, Holds: ms, Quotes: SendFunc(func(context.Context, peer.ID, p2p.Quote) error { return nil }),
		Logger: slog.New(slog.DiscardHandler)})
	quote := func(job, image string) p2p.Quote {
		bid := p2p.Bid{JobID: job, Workers: 1, PerWorker: p2p.Resources{Cores: 1, MemBytes: 128 << 20},
			MaxPrice: 10_000_000, Duration: 600, Framework: "generic", Image: image, ImageBytes: 50 << 20}
		quote, held := q.answerBid(t.Context(), bidWork{bid: bid, bidder: newPeerID(t)})
		q.release(t.Context(), job, held)
		return quote
	}
	if got := quote("plain", ""); len(got.Workers) != 1 || got.Workers[0].Machine != tieWinner {
		t.Fatalf("a job without an image: %+v, want the tie's winner %s", got, tieWinner)
	}
	got := quote("in-image", img)
	if len(got.Workers) != 1 || got.Workers[0].Machine != warm {
		t.Fatalf("a job in the image: %+v, want the machine that holds it, %s", got, warm)
	}
	// Neither holds another image: both cold, the tie's winner again,
	// and the quote done later by the fetch.
	cold := quote("other-image", "bafyneither")
	plain := quote("plain-again", "")
	if len(cold.Workers) != 1 || cold.Workers[0].Machine != tieWinner || cold.DoneAt < plain.DoneAt+1 {
		t.Errorf("a job in an image neither holds: %+v (done at %d, without an image %d)", cold, cold.DoneAt, plain.DoneAt)
	}
}
