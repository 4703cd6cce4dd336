package lender

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/units"
)

const testJob = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// testBidder is the peer that bid, and alone may commit the holds.
var testBidder = peer.ID(mustDecode("12D3KooWD2hEUFdLdWjT6pu87yDEcVf8biXS6iVSdgcqVWvKAuuY"))

func mustDecode(s string) peer.ID {
	p, err := peer.Decode(s)
	if err != nil {
		panic(err)
	}
	return p
}

// reserveReq is a hold request whose bid (checked by Node.checkBid in the
// node) came from testBidder, account "dm1test", and allows up to 8 cores.
func reserveReq(id string, cores uint32, ttl int64) HoldRequest {
	return HoldRequest{Reserve: &p2p.Reserve{Op: p2p.OpReserve, ID: id, JobID: testJob, Res: p2p.Resources{Cores: cores, MemBytes: 1 << 20}, TTL: ttl,
		Bidder: testBidder.String()},
		Account: "dm1test", Most: p2p.Resources{Cores: 8, MemBytes: 1 << 30}}
}

func opReq(op, id string) HoldRequest {
	return HoldRequest{Reserve: &p2p.Reserve{Op: op, ID: id, JobID: testJob}}
}

func TestHoldsLifecycle(t *testing.T) {
	lent := p2p.Resources{Cores: 4, MemBytes: 1 << 30}
	changes := 0
	h := NewHolds(func() p2p.Resources { return lent }, HoldLimits{}, func() { changes++ })
	now := time.Now()
	a, b := peer.ID("scheduler-a"), peer.ID("scheduler-b")

	if r := h.Apply(a, reserveReq("aaaaaaaaaaaaaaaa", 3, 60), now); !r.OK || r.Free.Cores != 1 {
		t.Fatalf("first hold: %+v", r)
	}
	if r := h.Apply(b, reserveReq("bbbbbbbbbbbbbbbb", 2, 60), now); r.OK || r.Free.Cores != 1 || r.Reason == "" {
		t.Fatalf("a hold past capacity: %+v", r)
	}
	if r := h.Apply(a, reserveReq("aaaaaaaaaaaaaaaa", 3, 60), now); !r.OK || r.Free.Cores != 1 {
		t.Fatalf("a retried hold must not count twice: %+v", r)
	}
	if r := h.Apply(b, opReq(p2p.OpRelease, "aaaaaaaaaaaaaaaa"), now); r.OK {
		t.Fatalf("another scheduler released a's hold: %+v", r)
	}
	if r := h.Apply(a, opReq(p2p.OpCommit, "aaaaaaaaaaaaaaaa"), now); r.OK {
		t.Fatalf("the scheduler, not the bidder, committed the hold: %+v", r)
	}
	if r := h.Apply(testBidder, opReq(p2p.OpCommit, "aaaaaaaaaaaaaaaa"), now); !r.OK {
		t.Fatalf("commit: %+v", r)
	}
	// Uncommitted holds lapse; committed ones stay.
	if r := h.Apply(b, reserveReq("bbbbbbbbbbbbbbbb", 1, 1), now); !r.OK {
		t.Fatalf("b's hold: %+v", r)
	}
	if got := h.Allocated(now.Add(2 * time.Second)); got.Cores != 3 {
		t.Fatalf("after b's hold lapsed: %+v", got)
	}
	if r := h.Apply(b, opReq(p2p.OpCommit, "bbbbbbbbbbbbbbbb"), now.Add(2*time.Second)); r.OK {
		t.Fatalf("committed a lapsed hold: %+v", r)
	}
	if r := h.Apply(a, opReq(p2p.OpRelease, "aaaaaaaaaaaaaaaa"), now); !r.OK || r.Free.Cores != 4 {
		t.Fatalf("release: %+v", r)
	}
	if changes == 0 {
		t.Fatal("the offer was never told the allocation changed")
	}
	lent = p2p.Resources{}
	if r := h.Apply(a, reserveReq("cccccccccccccccc", 1, 60), now); r.OK || r.Reason != "this machine is not lending now" {
		t.Fatalf("a hold on a machine that stopped lending: %+v", r)
	}
}

func TestHoldsConcurrentNeverOverCommit(t *testing.T) {
	lent := p2p.Resources{Cores: 7, MemBytes: 1 << 30}
	h := NewHolds(func() p2p.Resources { return lent }, HoldLimits{PerBidder: 1000, PerScheduler: 1000}, nil)
	var wg sync.WaitGroup
	var mu sync.Mutex
	granted := 0
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := reserveReq(fmt.Sprintf("%016x", i), 1, 60)
			req.JobID = fmt.Sprintf("%064x", i)
			r := h.Apply(peer.ID(fmt.Sprint("s", i%3)), req, time.Now())
			if r.OK {
				mu.Lock()
				granted++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if granted != 7 || h.Allocated(time.Now()).Cores != 7 {
		t.Fatalf("granted %d holds of one core on 7 cores; allocated %+v", granted, h.Allocated(time.Now()))
	}
}

// TestHoldsAreBoundedAndLapse: a hold asks for no more than its bid's
// workers need; one bidder account and one scheduler may hold only so
// much; a committed hold lapses unless its launch comes in time; a
// launched one stays until released; the owner sees every hold and may
// release any that runs no worker.
func TestHoldsAreBoundedAndLapse(t *testing.T) {
	lent := p2p.Resources{Cores: 16, MemBytes: 16 << 30}
	h := NewHolds(func() p2p.Resources { return lent }, HoldLimits{PerBidder: 2, PerScheduler: 3, LaunchWithin: time.Minute}, nil)
	now := time.Now()
	a, b := peer.ID("scheduler-a"), peer.ID("scheduler-b")

	greedy := reserveReq("0000000000000001", 9, 60) // the bid allows 8
	if r := h.Apply(a, greedy, now); r.OK {
		t.Fatalf("a hold beyond what the bid's workers need: %+v", r)
	}
	if r := h.Apply(a, reserveReq("0000000000000002", 1, 60), now); !r.OK {
		t.Fatal(r.Reason)
	}
	if r := h.Apply(b, reserveReq("0000000000000003", 1, 60), now); !r.OK {
		t.Fatal(r.Reason)
	}
	// Tentative holds do not count against the bidder, committed ones do.
	for _, id := range []string{"0000000000000002", "0000000000000003"} {
		if r := h.Apply(testBidder, opReq(p2p.OpCommit, id), now); !r.OK {
			t.Fatal(r.Reason)
		}
	}
	if r := h.Apply(b, reserveReq("0000000000000004", 1, 60), now); r.OK || !strings.Contains(r.Reason, "bidder") {
		t.Fatalf("a third hold of one bidder account: %+v", r)
	}
	other := reserveReq("0000000000000005", 1, 60)
	other.Account = "dm1other"
	if r := h.Apply(b, other, now); !r.OK {
		t.Fatalf("another bidder: %+v", r)
	}
	other.ID, other.Account = "0000000000000006", "dm1third"
	if r := h.Apply(b, other, now); !r.OK {
		t.Fatalf("b's third hold: %+v", r)
	}
	other.ID, other.Account = "0000000000000007", "dm1fourth"
	if r := h.Apply(b, other, now); r.OK || !strings.Contains(r.Reason, "scheduler") {
		t.Fatalf("a fourth hold of one scheduler: %+v", r)
	}

	// Committed, then launched in time: it stays. Committed and never
	// launched: it lapses after LaunchWithin.
	if r := h.Apply(testBidder, opReq(p2p.OpCommit, "0000000000000002"), now); !r.OK {
		t.Fatal(r.Reason)
	}
	if r := h.Apply(testBidder, opReq(p2p.OpCommit, "0000000000000003"), now); !r.OK {
		t.Fatal(r.Reason)
	}
	if _, ok := h.Launch("0000000000000002", testJob, a, now.Add(30*time.Second)); !ok {
		t.Fatal("launch of a committed hold refused")
	}
	if _, ok := h.Launch("0000000000000005", testJob, b, now); ok {
		t.Fatal("launched on an uncommitted hold")
	}
	later := now.Add(2 * time.Minute)
	held := map[string]string{}
	for _, x := range h.List(later) {
		held[x.ID] = x.State
	}
	if held["0000000000000002"] != "running" || len(held) != 1 {
		t.Fatalf("after the launch window and TTLs, holds are %v; want only the launched one", held)
	}
	if _, ok := h.Launch("0000000000000003", testJob, b, later); ok {
		t.Fatal("launched on a committed hold that lapsed")
	}

	// The owner releases what runs nothing, and not what runs a worker.
	if r := h.Apply(a, reserveReq("0000000000000008", 1, 60), later); !r.OK {
		t.Fatal(r.Reason)
	}
	if err := h.ReleaseByOwner("0000000000000008"); err != nil {
		t.Fatal(err)
	}
	if err := h.ReleaseByOwner("0000000000000002"); !errors.Is(err, ErrHoldRunning) {
		t.Fatalf("owner released a running hold: %v", err)
	}
	if err := h.ReleaseByOwner("0000000000000099"); !errors.Is(err, ErrNoHold) {
		t.Fatalf("owner released a hold that is not there: %v", err)
	}
	if got := h.Allocated(later); got.Cores != 1 {
		t.Fatalf("allocated %+v, want the one running core", got)
	}
}

// A hold that lapses tells the offer when it lapses, with no request to
// the machine in between: in a big market the offer is otherwise
// re-announced only every few minutes.
func TestHoldLapseIsAnnounced(t *testing.T) {
	lent := p2p.Resources{Cores: 4, MemBytes: 1 << 30}
	changed := make(chan struct{}, 16)
	h := NewHolds(func() p2p.Resources { return lent }, HoldLimits{LaunchWithin: 1500 * time.Millisecond}, func() { changed <- struct{}{} })
	a := peer.ID("scheduler-a")
	wait := func(what string, within time.Duration) time.Duration {
		t.Helper()
		start := time.Now()
		select {
		case <-changed:
			return time.Since(start)
		case <-time.After(within):
			t.Fatalf("the offer was not told %s within %s", what, within)
			return 0
		}
	}
	if r := h.Apply(a, reserveReq("aaaaaaaaaaaaaaaa", 2, 1), time.Now()); !r.OK {
		t.Fatal(r.Reason)
	}
	if r := h.Apply(a, reserveReq("bbbbbbbbbbbbbbbb", 1, 60), time.Now()); !r.OK {
		t.Fatal(r.Reason)
	}
	wait("of the first hold", 100*time.Millisecond)
	wait("of the second hold", 100*time.Millisecond)
	if d := wait("that the 1 s hold lapsed", 3*time.Second); d < 800*time.Millisecond {
		t.Fatalf("told after %s, before the hold lapsed", d)
	}
	if got := h.Allocated(time.Now()); got.Cores != 1 {
		t.Fatalf("after the lapse %d cores are held, want the second hold's 1", got.Cores)
	}
	// A committed hold that no launch follows lapses after LaunchWithin.
	if r := h.Apply(testBidder, opReq(p2p.OpCommit, "bbbbbbbbbbbbbbbb"), time.Now()); !r.OK {
		t.Fatal(r.Reason)
	}
	wait("of the commit", 100*time.Millisecond)
	wait("that the committed hold lapsed", 3*time.Second)
	if got := h.Allocated(time.Now()); got.Cores != 0 {
		t.Fatalf("after the committed hold lapsed %d cores are held", got.Cores)
	}
	select {
	case <-changed:
		t.Fatal("told of a change with no hold left")
	case <-time.After(500 * time.Millisecond):
	}
}

// TestCapturedBidHoldsOnlyForItsQuote: a scheduler holding a bid it
// overheard holds only within the quote window: it cannot commit (only the
// bidder does), its tentative holds use none of the bidder's committed
// slots, and one bid gets at most MaxTentativePerJob tentative holds here.
func TestCapturedBidHoldsOnlyForItsQuote(t *testing.T) {
	lent := p2p.Resources{Cores: 16, MemBytes: 16 << 30}
	h := NewHolds(func() p2p.Resources { return lent }, HoldLimits{PerBidder: 2, PerScheduler: 100}, nil)
	now := time.Now()
	thief := peer.ID("thief")
	for i := range MaxTentativePerJob {
		if r := h.Apply(thief, reserveReq(fmt.Sprintf("%016x", i+1), 1, 60), now); !r.OK {
			t.Fatalf("tentative hold %d: %+v", i, r)
		}
	}
	if r := h.Apply(thief, reserveReq("00000000000000ff", 1, 60), now); r.OK || !strings.Contains(r.Reason, "tentative") {
		t.Fatalf("a tentative hold past the bid's cap: %+v", r)
	}
	if r := h.Apply(thief, opReq(p2p.OpCommit, "0000000000000001"), now); r.OK {
		t.Fatalf("the thief committed a hold: %+v", r)
	}
	// The bidder's own scheduler still holds and commits: the thief's
	// tentative holds took none of its slots.
	for i, id := range []string{"00000000000000a1", "00000000000000a2"} {
		req := reserveReq(id, 1, 60)
		req.JobID = fmt.Sprintf("%064x", i+100)
		if r := h.Apply(testBidder, req, now); !r.OK {
			t.Fatalf("the bidder's hold %s: %+v", id, r)
		}
		if r := h.Apply(testBidder, opReq(p2p.OpCommit, id), now); !r.OK {
			t.Fatalf("the bidder's commit %s: %+v", id, r)
		}
	}
	// The thief's holds lapse with the quote window.
	if got := h.Allocated(now.Add(61 * time.Second)); got.Cores != 2 {
		t.Fatalf("after the quote window, allocated %+v: want the bidder's 2 committed cores", got)
	}
}

// TestAccountsHoldsAreBoundedByItsBalance: the holds one account has on a
// machine lock, at the machine's reserve prices, no more than its balance:
// one cost per job however many schedulers place it, none for a launched
// hold (its escrow locked the price), and the same credit cannot back
// holds for a second job here.
func TestAccountsHoldsAreBoundedByItsBalance(t *testing.T) {
	lent := p2p.Resources{Cores: 16, MemBytes: 16 << 30}
	h := NewHolds(func() p2p.Resources { return lent }, HoldLimits{PerBidder: 100, PerScheduler: 100, LaunchWithin: time.Minute}, nil)
	now := time.Now()
	costly := func(id, job string) HoldRequest {
		r := reserveReq(id, 1, 60)
		r.JobID, r.Cost, r.Balance = job, 600_000, 1_000_000
		return r
	}
	other := strings.Repeat("cd", 32)
	if r := h.Apply("scheduler-a", costly("0000000000000001", testJob), now); !r.OK {
		t.Fatal(r.Reason)
	}
	if r := h.Apply("scheduler-b", costly("0000000000000002", testJob), now); !r.OK {
		t.Fatalf("a second scheduler placing the same bid: %s", r.Reason)
	}
	if r := h.Apply("scheduler-a", costly("0000000000000003", other), now); r.OK || !strings.Contains(r.Reason, "more than its balance") {
		t.Fatalf("a second job on the same credit: %+v", r)
	}
	// The first job launched: its escrow holds the price, and the credit
	// left backs the other job.
	if r := h.Apply(testBidder, opReq(p2p.OpCommit, "0000000000000001"), now); !r.OK {
		t.Fatal(r.Reason)
	}
	if _, ok := h.Launch("0000000000000001", testJob, testBidder, now); !ok {
		t.Fatal("launch")
	}
	h.Release("0000000000000002")
	if r := h.Apply("scheduler-a", costly("0000000000000004", other), now); !r.OK {
		t.Fatalf("the other job once the first launched: %s", r.Reason)
	}
}

// reqAs is reserveReq for another account's bid, for job.
func reqAs(id string, cores uint32, account, job string) HoldRequest {
	r := reserveReq(id, cores, 60)
	r.Account, r.JobID = account, job
	return r
}

// TestStaleHoldsGiveWayToOtherAccounts: an account's holds that have
// nothing behind them (uncommitted for TentativeGrace, counted over its
// streak of holds taken again; committed without an escrow paying this
// machine for EscrowWithin) give way to another account's request that
// does not fit beside them. Fresh holds, escrowed ones, launched ones and
// the requester's own do not; and none go unless the request then fits.
func TestStaleHoldsGiveWayToOtherAccounts(t *testing.T) {
	const insiderJob = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"
	lent := p2p.Resources{Cores: 2, MemBytes: 1 << 30}
	t0 := time.Now()
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	insider, honest := peer.ID("scheduler-insider"), peer.ID("scheduler-honest")
	grace, stale := TentativeGrace, TentativeGrace+time.Second

	t.Run("uncommitted", func(t *testing.T) {
		h := NewHolds(func() p2p.Resources { return lent }, HoldLimits{}, nil)
		if r := h.Apply(insider, reqAs("1111111111111111", 2, "dm1insider", insiderJob), t0); !r.OK {
			t.Fatalf("the insider's hold: %+v", r)
		}
		if r := h.Apply(honest, reserveReq("2222222222222222", 1, 60), at(grace/3)); r.OK {
			t.Fatalf("a fresh hold gave way: %+v", r)
		}
		// Released and taken again: the streak goes on from t0.
		h.Apply(insider, opReq(p2p.OpRelease, "1111111111111111"), at(grace/2))
		if r := h.Apply(insider, reqAs("3333333333333333", 2, "dm1insider", insiderJob), at(grace*2/3)); !r.OK {
			t.Fatalf("the insider's hold again: %+v", r)
		}
		// The offer leaves the stale hold out, so other schedulers ask.
		if a, all := h.Announced(at(stale)), h.Allocated(at(stale)); a.Cores != 0 || all.Cores != 2 {
			t.Fatalf("announced %+v of %+v held: want the stale hold left out", a, all)
		}
		// Its own request takes nothing of its own.
		if r := h.Apply(insider, reqAs("4444444444444444", 1, "dm1insider", insiderJob), at(stale)); r.OK {
			t.Fatalf("the insider's own stale hold gave way to it: %+v", r)
		}
		// Three cores cannot fit however many holds go: none goes.
		if r := h.Apply(honest, reserveReq("5555555555555555", 3, 60), at(stale)); r.OK || len(h.List(at(stale))) != 1 {
			t.Fatalf("a request that cannot fit took a hold's place: %+v, %d holds", r, len(h.List(at(stale))))
		}
		if r := h.Apply(honest, reserveReq("2222222222222222", 1, 60), at(stale)); !r.OK {
			t.Fatalf("a hold %s into its account's streak did not give way: %+v", stale, r)
		}
		if l := h.List(at(stale)); len(l) != 1 || l[0].Account != "dm1test" {
			t.Fatalf("holds after: %+v", l)
		}
	})

	t.Run("committed", func(t *testing.T) {
		escrowed := false
		h := NewHolds(func() p2p.Resources { return lent }, HoldLimits{}, nil)
		h.SetEscrowed(func(job, account string, cost, charge uint64) bool {
			return escrowed && job == insiderJob && account == "dm1insider"
		})
		if r := h.Apply(insider, reqAs("1111111111111111", 2, "dm1insider", insiderJob), t0); !r.OK {
			t.Fatalf("the insider's hold: %+v", r)
		}
		// reqAs names testBidder: it commits.
		if r := h.Apply(testBidder, opReq(p2p.OpCommit, "1111111111111111"), at(time.Second)); !r.OK {
			t.Fatalf("commit: %+v", r)
		}
		if r := h.Apply(honest, reserveReq("2222222222222222", 1, 60), at(EscrowWithin)); r.OK {
			t.Fatalf("a committed hold gave way before its escrow was due: %+v", r)
		}
		escrowed = true
		if r := h.Apply(honest, reserveReq("2222222222222222", 1, 60), at(EscrowWithin+2*time.Second)); r.OK {
			t.Fatalf("an escrowed hold gave way: %+v", r)
		}
		escrowed = false
		if r := h.Apply(honest, reserveReq("2222222222222222", 1, 60), at(EscrowWithin+2*time.Second)); !r.OK {
			t.Fatalf("a committed hold with no escrow %s after its commit did not give way: %+v", EscrowWithin+time.Second, r)
		}
	})

	// A busy honest account bids job after job: its streak here is long,
	// but its next quote's hold stays MinHoldAge, until its commit; and a
	// launch, using what it held, starts its streak again.
	t.Run("busy", func(t *testing.T) {
		h := NewHolds(func() p2p.Resources { return lent }, HoldLimits{}, nil)
		h.Apply(insider, reqAs("1111111111111111", 1, "dm1busy", insiderJob), t0)
		h.Apply(insider, opReq(p2p.OpRelease, "1111111111111111"), at(grace))
		late := at(grace + time.Second) // its streak is stale from here on
		if r := h.Apply(insider, reqAs("3333333333333333", 2, "dm1busy", insiderJob), late); !r.OK {
			t.Fatalf("the busy account's next hold: %+v", r)
		}
		if r := h.Apply(honest, reserveReq("2222222222222222", 1, 60), late.Add(MinHoldAge-time.Second)); r.OK {
			t.Fatalf("a hold %s old gave way: %+v", MinHoldAge-time.Second, r)
		}
		if r := h.Apply(honest, reserveReq("2222222222222222", 1, 60), late.Add(MinHoldAge)); !r.OK {
			t.Fatalf("a hold of a stale streak %s old did not give way: %+v", MinHoldAge, r)
		}
	})
	t.Run("launch resets the streak", func(t *testing.T) {
		h := NewHolds(func() p2p.Resources { return lent }, HoldLimits{}, nil)
		h.Apply(insider, reqAs("1111111111111111", 1, "dm1busy", insiderJob), t0)
		h.Apply(insider, reqAs("3333333333333333", 1, "dm1busy", insiderJob), t0)
		h.Apply(testBidder, opReq(p2p.OpCommit, "1111111111111111"), at(time.Second))
		if _, ok := h.Launch("1111111111111111", insiderJob, testBidder, at(grace)); !ok {
			t.Fatal("launch")
		}
		if r := h.Apply(honest, reserveReq("2222222222222222", 1, 60), at(grace+MinHoldAge)); r.OK {
			t.Fatalf("a hold of an account that just launched here gave way: %+v", r)
		}
		if r := h.Apply(honest, reserveReq("2222222222222222", 1, 60), at(2*grace+time.Second)); !r.OK {
			t.Fatalf("the hold %s after the launch did not give way: %+v", grace+time.Second, r)
		}
	})

	t.Run("launched", func(t *testing.T) {
		h := NewHolds(func() p2p.Resources { return lent }, HoldLimits{}, nil)
		h.Apply(insider, reqAs("1111111111111111", 2, "dm1insider", insiderJob), t0)
		h.Apply(testBidder, opReq(p2p.OpCommit, "1111111111111111"), t0)
		if _, ok := h.Launch("1111111111111111", insiderJob, testBidder, t0); !ok {
			t.Fatal("launch")
		}
		if r := h.Apply(honest, reserveReq("2222222222222222", 1, 60), at(time.Hour)); r.OK {
			t.Fatalf("a launched hold gave way: %+v", r)
		}
	})
}

// TestUnlaunchedCommitsAreCharged: a commit carries the bidder's receipt
// for the hold's reserve price over the launch window, signed by the
// bidder and for this machine, or it is refused. A committed hold that
// lapses, or that its bidder releases, unlaunched while the run's escrow
// is open hands that receipt to the claim service, and the run is not
// committed here again; without an escrow, launched, or released by the
// owner, nothing is charged.
func TestUnlaunchedCommitsAreCharged(t *testing.T) {
	const chain, payee = "deepmarket-test", "dm1machine"
	lent := p2p.Resources{Cores: 2, MemBytes: 1 << 30}
	bidder, err := identity.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	other, _ := identity.GenerateKey()
	escrowed := false
	var kept []ledger.Receipt
	h := NewHolds(func() p2p.Resources { return lent }, HoldLimits{}, nil)
	h.SetEscrowed(func(string, string, uint64, uint64) bool { return escrowed })
	h.SetCharges(HoldCharges{ChainID: chain, Payee: payee,
		Keep: func(r ledger.Receipt) error { kept = append(kept, r); return nil },
		Charged: func(run string) bool {
			return slices.ContainsFunc(kept, func(r ledger.Receipt) bool { return r.Job == run })
		}})
	const rate = 3_600_000 // 3.6 credits an hour: 0.12 for the 2-minute launch window
	need := p2p.HoldCharge(rate, 2*time.Minute)
	if need != 120_000 {
		t.Fatalf("the charge for 2 minutes at 3.6 credits an hour: %d", need)
	}
	hold := func(id, job string, now time.Time) {
		t.Helper()
		r := reqAs(id, 1, "dm1bidder", job)
		r.Bidder, r.Rate = bidder.PeerID().String(), rate
		if reply := h.Apply(bidder.PeerID(), r, now); !reply.OK {
			t.Fatalf("hold %s: %+v", id, reply)
		}
	}
	receipt := func(job, to string, amount uint64, by *identity.Key) *p2p.Receipt {
		r := ledger.SignReceipt(by, chain, ledger.Receipt{Job: job, Payee: to, Amount: amount})
		return &p2p.Receipt{Payee: r.Payee, Amount: r.Amount, Seq: r.Seq, Sig: r.Sig}
	}
	commit := func(id, job string, rc *p2p.Receipt, now time.Time) p2p.ReserveReply {
		return h.Apply(bidder.PeerID(), HoldRequest{Reserve: &p2p.Reserve{Op: p2p.OpCommit, ID: id, JobID: job, Receipt: rc}}, now)
	}
	now := time.Now()
	jobA := strings.Repeat("a", 64)
	hold("1111111111111111", jobA, now)
	for _, c := range []struct {
		rc   *p2p.Receipt
		want string
	}{
		{nil, "carries the bidder's receipt"},
		{receipt(jobA, payee, need-1, bidder), "less than this machine's reserve price"},
		{receipt(jobA, "dm1elsewhere", need, bidder), "not this machine"},
		{receipt(jobA, payee, need, other), "not signed by the bidder"},
		{receipt(strings.Repeat("b", 64), payee, need, bidder), "not signed by the bidder"},
	} {
		if r := commit("1111111111111111", jobA, c.rc, now); r.OK || !strings.Contains(r.Reason, c.want) {
			t.Errorf("commit with receipt %+v: %+v, want a refusal saying %q", c.rc, r, c.want)
		}
	}
	if r := commit("1111111111111111", jobA, receipt(jobA, payee, need, bidder), now); !r.OK {
		t.Fatalf("a commit with a good receipt: %+v", r)
	}
	// Released by the bidder before any escrow: nothing to charge.
	h.Apply(bidder.PeerID(), opReq(p2p.OpRelease, "1111111111111111"), now)
	if len(kept) != 0 {
		t.Fatalf("charged without an escrow: %+v", kept)
	}

	// Lapsed with the escrow open: charged, once.
	escrowed = true
	hold("2222222222222222", jobA, now)
	if r := commit("2222222222222222", jobA, receipt(jobA, payee, need, bidder), now); !r.OK {
		t.Fatalf("commit: %+v", r)
	}
	later := now.Add(3 * time.Minute)
	h.Allocated(later)
	if len(kept) != 1 || kept[0].Job != jobA || kept[0].Amount != need || kept[0].Payee != payee {
		t.Fatalf("kept after the lapse: %+v", kept)
	}
	hold("3333333333333333", jobA, later)
	if r := commit("3333333333333333", jobA, receipt(jobA, payee, 2*need, bidder), later); r.OK || !strings.Contains(r.Reason, "unlaunched once already") {
		t.Fatalf("a second commit of a charged run: %+v", r)
	}

	// Launched, or released by the owner: nothing charged.
	jobC, jobD := strings.Repeat("c", 64), strings.Repeat("d", 64)
	hold("4444444444444444", jobC, later)
	commit("4444444444444444", jobC, receipt(jobC, payee, need, bidder), later)
	if _, ok := h.Launch("4444444444444444", jobC, bidder.PeerID(), later); !ok {
		t.Fatal("launch")
	}
	h.Release("4444444444444444")
	hold("5555555555555555", jobD, later)
	commit("5555555555555555", jobD, receipt(jobD, payee, need, bidder), later)
	if err := h.ReleaseByOwner("5555555555555555"); err != nil {
		t.Fatal(err)
	}
	if len(kept) != 1 {
		t.Fatalf("charged a launched hold or one the owner released: %+v", kept)
	}
}

// TestEscrowBacks: an escrow backs a committed hold when it is the
// account's, pays this machine, is unsettled and covers the hold's cost
// and its launch-window charge for every machine it pays: one escrow of a
// credit cannot back unlaunched holds on a hundred machines. With cost
// and charge 0 any escrow of the account's that pays this machine does,
// settled or not (a receipt may still be lodged against it).
func TestEscrowBacks(t *testing.T) {
	payees := func(n int) []string {
		out := []string{"dm1me"}
		for i := 1; i < n; i++ {
			out = append(out, fmt.Sprintf("dm1other%d", i))
		}
		return out
	}
	credit := uint64(units.MicroPerCredit)
	charge := p2p.HoldCharge(credit, p2p.HoldChargeWindow) // a credit an hour, for the window
	e := ledger.Escrow{Payer: "dm1payer", Amount: credit, Payees: payees(2)}
	for _, tt := range []struct {
		name         string
		e            ledger.Escrow
		account      string
		cost, charge uint64
		want         bool
	}{
		{"covers both", e, "dm1payer", credit / 2, charge, true},
		{"another account's", e, "dm1insider", credit / 2, charge, false},
		{"under the cost", e, "dm1payer", 2 * credit, charge, false},
		{"a credit for 100 machines' windows", ledger.Escrow{Payer: "dm1payer", Amount: credit, Payees: payees(100)}, "dm1payer", credit / 100, charge, false},
		{"enough for 100 machines' windows", ledger.Escrow{Payer: "dm1payer", Amount: 100 * charge, Payees: payees(100)}, "dm1payer", 0, charge, true},
		{"not paying this machine", ledger.Escrow{Payer: "dm1payer", Amount: credit, Payees: []string{"dm1other"}}, "dm1payer", 1, charge, false},
		{"settled", ledger.Escrow{Payer: "dm1payer", Amount: credit, Payees: payees(2), Settled: 1}, "dm1payer", 1, charge, false},
		{"settled, any escrow asked", ledger.Escrow{Payer: "dm1payer", Amount: 0, Payees: payees(2), Settled: 1}, "dm1payer", 0, 0, true},
	} {
		if got := EscrowBacks(tt.e, "dm1me", tt.account, tt.cost, tt.charge); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}
