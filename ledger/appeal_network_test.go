package ledger

import (
	"context"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/identity"
)

// TestNetworkAppealJudgedByValidators: on four real CometBFT validators, a
// payer settles a job for less than it owes and the payee appeals with
// signed transactions through the RPC; the referees the committed block
// drew (the same on every replica) vote through their own nodes, and the
// appellant is paid its claim. A validator the block did not draw is
// refused.
func TestNetworkAppealJudgedByValidators(t *testing.T) {
	issuer, payer, a := key(t, 1), key(t, 2), key(t, 3)
	vals, _ := startValidators(t, 4, genesis(issuer, map[*identity.Key]uint64{payer: 100 * credit, a: credit}, a))
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	waitAll(ctx, t, vals, 2)
	pay := NewClient(vals[0].chain.Client(), payer, testChain)
	mach := NewClient(vals[1].chain.Client(), a, testChain)
	aa := string(a.Address())
	j := job(7)
	if _, err := pay.OpenEscrow(ctx, OpenEscrow{Job: j, Amount: 2 * credit, Expiry: time.Now().Unix() + 3600, Payees: []string{aa}}); err != nil {
		t.Fatal(err)
	}
	if _, err := pay.Settle(ctx, Settle{Job: j, Payments: []Payment{{Machine: aa, Amount: credit / 100, Rounds: 6, Refused: 6}}}); err != nil {
		t.Fatal(err)
	}
	// The machine's node may be a block behind the payer's: it appeals
	// once it sees the settlement.
	for {
		e, err := mach.Escrow(ctx, j)
		if err == nil && e != nil && e.Settled != 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the machine's node never saw the settlement: %+v (%v)", e, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	before, _ := mach.Balance(ctx, a.Address())
	if _, err := mach.Appeal(ctx, j, credit, "bafyevidence", "every round refused"); err != nil {
		t.Fatal(err)
	}
	var refs []string
	for i, v := range vals {
		c := NewClient(v.chain.Client(), v.key, testChain)
		e, err := c.Escrow(ctx, j)
		for (err != nil || e == nil || len(e.Cases) != 1) && ctx.Err() == nil { // a replica a block behind
			time.Sleep(100 * time.Millisecond)
			e, err = c.Escrow(ctx, j)
		}
		if err != nil || e == nil || len(e.Cases) != 1 {
			t.Fatalf("validator %d: escrow %+v (%v)", i, e, err)
		}
		if i > 0 && !equalStrings(e.Cases[0].Referees, refs) {
			t.Fatalf("validator %d drew %v, validator 0 %v", i, e.Cases[0].Referees, refs)
		}
		refs = e.Cases[0].Referees
	}
	clientOf := map[string]*Client{}
	for _, v := range vals {
		clientOf[string(v.key.Address())] = NewClient(v.chain.Client(), v.key, testChain)
	}
	for _, v := range vals {
		if !contains(refs, string(v.key.Address())) {
			_, err := clientOf[string(v.key.Address())].Verdict(ctx, j, aa, true)
			if CodeOf(err) != CodeNotReferee {
				t.Fatalf("a validator not drawn voted: %v", err)
			}
		}
	}
	for _, r := range refs[:2] {
		if _, err := clientOf[r].Verdict(ctx, j, aa, true); err != nil {
			t.Fatal(err)
		}
	}
	// The machine's node may be a block behind the referees'.
	for {
		e, err := mach.Escrow(ctx, j)
		if err == nil && e != nil && e.Cases[0].Verdict == VerdictOverturned {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("escrow after two votes to overturn: %+v (%v)", e, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got, _ := mach.Balance(ctx, a.Address()); got != before+credit {
		t.Fatalf("appellant holds %d, want %d: its claim paid and its bond back", got, before+credit)
	}
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
