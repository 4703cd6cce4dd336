package quoter

import (
	"context"
	"crypto/rand"
	"errors"
	"log/slog"
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

func newPeerID(t *testing.T) peer.ID {
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
// a machine marked down cannot be reached.
type machines struct {
	mu   sync.Mutex
	free map[peer.ID]p2p.Resources
	down map[peer.ID]bool
	held map[string]peer.ID // hold ID -> machine
}

func (m *machines) Reserve(_ context.Context, machine peer.ID, _ []string, r p2p.Reserve) (p2p.ReserveReply, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.down[machine] {
		return p2p.ReserveReply{}, errors.New("no route to host")
	}
	f := m.free[machine]
	switch r.Op {
	case p2p.OpRelease:
		delete(m.held, r.ID)
		return p2p.ReserveReply{OK: true, Free: f}, nil
	case p2p.OpReserve:
		if r.Res.Cores > f.Cores || r.Res.MemBytes > f.MemBytes || r.Res.GPUs > f.GPUs {
			return p2p.ReserveReply{Reason: "taken", Free: f}, nil
		}
		f.Cores, f.MemBytes, f.GPUs = f.Cores-r.Res.Cores, f.MemBytes-r.Res.MemBytes, f.GPUs-r.Res.GPUs
		m.free[machine] = f
		m.held[r.ID] = machine
		return p2p.ReserveReply{OK: true, Expires: time.Now().Add(time.Minute).UnixMilli(), Free: f}, nil
	}
	return p2p.ReserveReply{Reason: "unknown op"}, nil
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
		book.Apply(&p2p.Received{Signer: o.id, Seq: 1, Expiry: now.Add(time.Hour), Payload: &p2p.Offer{
			Machine: o.id.String(), Owner: "owner", Moniker: o.id.String()[len(o.id.String())-4:], Lent: lent, Price: o.price}}, now)
	}
	h.mk = market.New(market.Params{Book: book, Subset: market.SubsetAll})
	h.machines = &machines{free: map[peer.ID]p2p.Resources{h.cheap: lent, h.dear: lent}, down: map[peer.ID]bool{}, held: map[string]peer.ID{}}
	h.q = New(Params{Self: newPeerID(t), Market: h.mk, Holds: h.machines, Quotes: SendFunc(func(context.Context, peer.ID, p2p.Quote) error { return nil }),
		Logger: slog.New(slog.DiscardHandler)})
	return h
}

func (h *harness) quote(t *testing.T, job string) p2p.Quote {
	t.Helper()
	bid := p2p.Bid{JobID: job, Workers: 1, PerWorker: p2p.Resources{Cores: 1, MemBytes: 128 << 20},
		MaxPrice: 10_000_000, Duration: 600, Framework: "generic"}
	return h.q.answerBid(t.Context(), bidWork{bid: bid, bidder: newPeerID(t)})
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
			got := believeRefusals(&v, offers, heldPlacement{failed: []int{0}, replies: map[int]p2p.ReserveReply{0: tc.reply}}, &refused)
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
