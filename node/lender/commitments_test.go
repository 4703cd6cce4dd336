package lender

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/units"
)

func jobOf(n int) string { return fmt.Sprintf("%064x", n) }

func bidOf(account string, job int, price uint64) *p2p.Bid {
	return &p2p.Bid{JobID: jobOf(job), Submitter: account, MaxPrice: price}
}

// TestCommitmentsBoundAnAccountAcrossTheMarket: one balance backs the
// account's bids in their order on the market, whatever machine each
// bid's holds are asked of; an escrow takes its job's price out of the
// count, a bid no longer live leaves it, and a job's weight is its
// dearest live bid.
func TestCommitmentsBoundAnAccountAcrossTheMarket(t *testing.T) {
	escrows := map[string]uint64{}
	c := NewCommitments(func(job, account string) uint64 { return escrows[account+job] })
	now := time.Now()
	live := now.Add(time.Minute)
	const credit = units.MicroPerCredit
	balance := uint64(10 * credit)
	c.Saw(bidOf("a", 1, 4*credit), 100, live, now)
	c.Saw(bidOf("a", 2, 6*credit), 200, live, now)
	c.Saw(bidOf("a", 3, 1*credit), 300, live, now)
	c.Saw(bidOf("b", 4, 9*credit), 150, live, now) // another account's: not counted against a's balance
	for job, want := range map[int]string{1: "", 2: "", 3: "could lock 11 credits, more than its balance of 10"} {
		if err := c.Backed("a", jobOf(job), balance, now); err == nil && want != "" || err != nil && (want == "" || !strings.Contains(err.Error(), want)) {
			t.Errorf("a's bid %d: %v, want %q", job, err, want)
		}
	}
	if err := c.Backed("b", jobOf(4), balance, now); err != nil {
		t.Errorf("another account's bid: %v", err)
	}
	if got := c.Unbacked("a", balance, now); !slices.Equal(got, []string{jobOf(3)}) {
		t.Errorf("unbacked: %v", got)
	}
	// The first job's escrow opens: its price left the balance, and is
	// not counted twice.
	escrows["a"+jobOf(1)] = 4 * credit
	if got := c.Unbacked("a", balance-4*credit, now); !slices.Equal(got, []string{jobOf(3)}) {
		t.Errorf("unbacked once the first job's escrow locked its price: %v", got)
	}
	escrows["a"+jobOf(1)] = 10 * credit
	if got := c.Unbacked("a", 7*credit, now); len(got) != 0 {
		t.Errorf("unbacked once the first job's escrow locked more than its price: %v", got)
	}
	// An escrow of less than the bid leaves the rest counted.
	escrows["a"+jobOf(1)] = 1
	if err := c.Backed("a", jobOf(3), balance-1, now); err == nil {
		t.Error("a 1-micro-credit escrow made a 4-credit bid's job weigh nothing")
	}
	delete(escrows, "a"+jobOf(1))
	// A dearer bid for the first job keeps its place and weighs its price;
	// a cheaper one after it does not lower it.
	c.Saw(bidOf("a", 1, 8*credit), 400, live, now)
	c.Saw(bidOf("a", 1, 1), 500, live, now)
	if got := c.Unbacked("a", balance, now); !slices.Equal(got, []string{jobOf(2), jobOf(3)}) {
		t.Errorf("unbacked once the first job bid 8 credits: %v", got)
	}
	// A bid not seen, and a job whose bids all expired.
	if c.Await(t.Context(), "a", jobOf(1), 999, 10*time.Millisecond) {
		t.Error("a sequence never seen was found")
	}
	later := now.Add(2 * time.Minute)
	if err := c.Backed("a", jobOf(1), balance, later); err == nil || !strings.Contains(err.Error(), "not live") {
		t.Errorf("an expired bid: %v", err)
	}
}

// TestAwaitedBidArrives: a hold request waits for its bid to arrive on
// the market, and goes on as soon as it does.
func TestAwaitedBidArrives(t *testing.T) {
	c := NewCommitments(func(string, string) uint64 { return 0 })
	now := time.Now()
	go func() {
		time.Sleep(50 * time.Millisecond)
		c.Saw(bidOf("a", 1, 1), 7, now.Add(time.Minute), now)
	}()
	start := time.Now()
	if !c.Await(context.Background(), "a", jobOf(1), 7, 5*time.Second) {
		t.Fatal("the bid arrived and was not seen")
	}
	if waited := time.Since(start); waited > 2*time.Second {
		t.Errorf("waited %s for a bid that came after 50 ms", waited)
	}
	if !c.Await(context.Background(), "a", jobOf(1), 7, 0) {
		t.Error("a bid seen already is waited for")
	}
}

// TestJobBidsKeepTheDearest: past maxJobBids live bids of one job, the
// cheapest goes, so a flood of cheap re-bids cannot hide a dear one.
func TestJobBidsKeepTheDearest(t *testing.T) {
	c := NewCommitments(func(string, string) uint64 { return 0 })
	now := time.Now()
	c.Saw(bidOf("a", 1, 100), 1, now.Add(time.Minute), now)
	for i := range 3 * maxJobBids {
		c.Saw(bidOf("a", 1, 1), uint64(10+i), now.Add(time.Minute), now)
	}
	if err := c.Backed("a", jobOf(1), 99, now); err == nil {
		t.Error("the dear bid was forgotten among cheap ones")
	}
	c.mu.Lock()
	n := len(c.accounts["a"][jobOf(1)].bids)
	c.mu.Unlock()
	if n != maxJobBids {
		t.Errorf("%d bids of one job remembered, want %d", n, maxJobBids)
	}
}

// TestDropUnbacked: the uncommitted holds of unbacked jobs go; committed
// ones, and other accounts' and jobs', stay.
func TestDropUnbacked(t *testing.T) {
	lent := p2p.Resources{Cores: 8, MemBytes: 1 << 30}
	changes := 0
	h := NewHolds(func() p2p.Resources { return lent }, HoldLimits{}, func() { changes++ })
	now := time.Now()
	s := peer.ID("scheduler")
	for _, r := range []HoldRequest{
		reqAs("0000000000000001", 1, "a", jobOf(1)),
		reqAs("0000000000000002", 1, "a", jobOf(2)),
		reqAs("0000000000000003", 1, "a", jobOf(2)),
		reqAs("0000000000000004", 1, "b", jobOf(2)),
	} {
		if reply := h.Apply(s, r, now); !reply.OK {
			t.Fatalf("hold %s: %+v", r.ID, reply)
		}
	}
	commit := HoldRequest{Reserve: &p2p.Reserve{Op: p2p.OpCommit, ID: "0000000000000003", JobID: jobOf(2)}}
	if reply := h.Apply(testBidder, commit, now); !reply.OK {
		t.Fatalf("commit: %+v", reply)
	}
	changes = 0
	if n := h.DropUnbacked("a", []string{jobOf(2)}, now); n != 1 || changes != 1 {
		t.Fatalf("dropped %d holds (%d changes), want 1", n, changes)
	}
	var left []string
	for _, x := range h.List(now) {
		left = append(left, x.ID)
	}
	slices.Sort(left)
	if !slices.Equal(left, []string{"0000000000000001", "0000000000000003", "0000000000000004"}) {
		t.Errorf("holds left: %v", left)
	}
}
