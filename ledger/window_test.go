package ledger

import (
	"testing"

	"github.com/deepmarket/deepmarket/identity"
)

// TestReceiptsBind: a settlement for less than the payer's own receipt
// pays the rest when the payee lodges the receipt in the dispute window;
// a receipt lodged twice, a forged one or one lodged after the window is
// refused; the payer gets back only what no receipt covered, when the
// window closes; and its record shows what it paid against what it owed.
func TestReceiptsBind(t *testing.T) {
	issuer, payer, m1, m2 := key(t, 1), key(t, 2), key(t, 3), key(t, 4)
	h := newHarness(t, nil, genesis(issuer, map[*identity.Key]uint64{payer: 10 * credit}, m1, m2))
	a1, a2 := string(m1.Address()), string(m2.Address())
	h.must(h.tx(payer, TypeOpenEscrow, &OpenEscrow{Job: job(1), Amount: 2 * credit, Expiry: h.now.Unix() + 3600, Payees: []string{a1, a2}}))
	owed := SignReceipt(payer, testChain, Receipt{Job: job(1), Payee: a1, Amount: 800_000, Seq: 4})
	// Before a settlement or the expiry, claims wait.
	expectCode(t, h.block(h.tx(m1, TypeClaim, &Claim{Receipt: owed})), CodeNotExpired, "claims open then, or once the payer settles")
	// The greedy payer settles at once for 0.01 each.
	h.must(h.tx(payer, TypeSettle, &Settle{Job: job(1), Payments: []Payment{{Machine: a1, Amount: 10_000}, {Machine: a2, Amount: 10_000}}}))
	if h.balance(m1.Address()) != 10_000 || h.balance(payer.Address()) != 8*credit {
		t.Fatalf("after the settlement: payee %d, payer %d", h.balance(m1.Address()), h.balance(payer.Address()))
	}
	// A receipt the payer did not sign, or for another payee: refused.
	forged := owed
	forged.Amount = 2 * credit
	expectCode(t, h.block(h.tx(m1, TypeClaim, &Claim{Receipt: forged})), CodeBadReceipt, "not signed by the payer")
	expectCode(t, h.block(h.tx(m2, TypeClaim, &Claim{Receipt: owed})), CodeNotPayee, "receipt is for")
	// The payee lodges its receipt: it is paid all of it.
	h.must(h.tx(m1, TypeClaim, &Claim{Receipt: owed}))
	if h.balance(m1.Address()) != 800_000 {
		t.Fatalf("after lodging its receipt the payee holds %d, want 800000", h.balance(m1.Address()))
	}
	expectCode(t, h.block(h.tx(m1, TypeClaim, &Claim{Receipt: owed})), CodeBadReceipt, "already paid")
	h.closeWindows()
	if _, open := h.app.Snapshot().Escrows[job(1)]; open {
		t.Fatal("the escrow is still open after its window")
	}
	// 2 - 0.8 - 0.01 come back.
	if h.balance(payer.Address()) != 10*credit-810_000 {
		t.Fatalf("the payer holds %d after the window, want %d", h.balance(payer.Address()), 10*credit-810_000)
	}
	later := SignReceipt(payer, testChain, Receipt{Job: job(1), Payee: a2, Amount: 500_000, Seq: 9})
	expectCode(t, h.block(h.tx(m2, TypeClaim, &Claim{Receipt: later})), CodeUnknownEscrow, "no open escrow")
	rec := h.app.Snapshot().Payers[string(payer.Address())]
	if rec == nil || rec.Paid != 20_000 || rec.Owed != 810_000 || rec.Closed != 1 {
		t.Fatalf("payer record %+v: want paid 20000 of 810000 owed", rec)
	}
}

// TestMarksNeedACause: a failed mark the machine disputes in the window
// does not count in its record, and counts in the payer's as disputed; an
// undisputed one counts once the window closes; only the marked payee
// disputes, once, and only while the window is open.
func TestMarksNeedACause(t *testing.T) {
	issuer, payer, honest, lazy, other := key(t, 1), key(t, 2), key(t, 3), key(t, 4), key(t, 5)
	h := newHarness(t, nil, genesis(issuer, map[*identity.Key]uint64{payer: 10 * credit}, honest, lazy, other))
	ah, al, ao := string(honest.Address()), string(lazy.Address()), string(other.Address())
	h.must(h.tx(payer, TypeOpenEscrow, &OpenEscrow{Job: job(1), Amount: credit, Expiry: h.now.Unix() + 3600, Payees: []string{ah, al, ao}}))
	expectCode(t, h.block(h.tx(honest, TypeDispute, &Dispute{Job: job(1)})), CodeNotSettled, "not settled")
	h.must(h.tx(payer, TypeSettle, &Settle{Job: job(1), Payments: []Payment{
		{Machine: ah, Amount: 10_000, Failed: true}, {Machine: al, Amount: 10_000, Failed: true}, {Machine: ao, Amount: 10_000}}}))
	expectCode(t, h.block(h.tx(other, TypeDispute, &Dispute{Job: job(1)})), CodeNotPayee, "did not mark")
	h.must(h.tx(honest, TypeDispute, &Dispute{Job: job(1)}))
	expectCode(t, h.block(h.tx(honest, TypeDispute, &Dispute{Job: job(1)})), CodeAlreadyVoted, "already")
	h.closeWindows()
	expectCode(t, h.block(h.tx(lazy, TypeDispute, &Dispute{Job: job(1)})), CodeUnknownEscrow, "no open escrow")
	st := h.app.Snapshot()
	if r := st.Machines[ah]; r == nil || r.Failed != 0 || r.Completed != 0 {
		t.Fatalf("the disputed mark counted: %+v", r)
	}
	if r := st.Machines[al]; r == nil || r.Failed != 1 {
		t.Fatalf("the undisputed mark did not count: %+v", r)
	}
	if r := st.Machines[ao]; r == nil || r.Completed != 1 {
		t.Fatalf("the unmarked payee: %+v", r)
	}
	if r := st.Payers[string(payer.Address())]; r == nil || r.Marks != 2 || r.Disputed != 1 {
		t.Fatalf("payer record %+v", r)
	}
}

// TestRefusedRoundsAreTheirOwnStatistic: a settlement's refused rounds
// count in the machine's record and the payer's, apart from failures (a
// machine refused every round is not marked failed); a count that is not
// a share of the rounds is refused and changes nothing.
func TestRefusedRoundsAreTheirOwnStatistic(t *testing.T) {
	issuer, payer, a, b := key(t, 1), key(t, 2), key(t, 3), key(t, 4)
	h := newHarness(t, nil, genesis(issuer, map[*identity.Key]uint64{payer: 10 * credit}, a, b))
	aa, ab := string(a.Address()), string(b.Address())
	h.must(h.tx(payer, TypeOpenEscrow, &OpenEscrow{Job: job(1), Amount: credit, Expiry: h.now.Unix() + 3600, Payees: []string{aa, ab}}))
	expectCode(t, h.block(h.tx(payer, TypeSettle, &Settle{Job: job(1), Payments: []Payment{
		{Machine: aa, Amount: 10_000, Rounds: 3, Refused: 4}}})), CodeMalformed, "refused of")
	expectCode(t, h.block(h.tx(payer, TypeSettle, &Settle{Job: job(1), Payments: []Payment{
		{Machine: aa, Amount: 10_000, Rounds: MaxRounds + 1}}})), CodeMalformed, "at most")
	h.must(h.tx(payer, TypeSettle, &Settle{Job: job(1), Payments: []Payment{
		{Machine: aa, Amount: 10_000, Rounds: 10, Refused: 10}, {Machine: ab, Amount: 10_000, Rounds: 10, Refused: 1}}}))
	h.closeWindows()
	st := h.app.Snapshot()
	if r := st.Machines[aa]; r == nil || r.Rounds != 10 || r.Refused != 10 || r.Failed != 0 || r.Completed != 1 {
		t.Errorf("the machine refused every round: %+v", r)
	}
	if r := st.Machines[ab]; r == nil || r.Rounds != 10 || r.Refused != 1 {
		t.Errorf("the other machine: %+v", r)
	}
	if r := st.Payers[string(payer.Address())]; r == nil || r.Rounds != 20 || r.Refused != 11 || r.Marks != 0 {
		t.Errorf("payer record %+v", r)
	}
}

// TestOnePayersMarksAreCapped: a payer that marks a machine failed in
// escrow after escrow (cheap settlements, none disputed) counts at most
// MaxMarksPerPayer of them in the machine's record; another payer's
// marks count on their own.
func TestOnePayersMarksAreCapped(t *testing.T) {
	issuer, greedy, other, victim := key(t, 1), key(t, 2), key(t, 3), key(t, 4)
	h := newHarness(t, nil, genesis(issuer, map[*identity.Key]uint64{greedy: 10 * credit, other: 10 * credit}, victim))
	av := string(victim.Address())
	mark := func(payer *identity.Key, n int) {
		t.Helper()
		j := job(n)
		h.must(h.tx(payer, TypeOpenEscrow, &OpenEscrow{Job: j, Amount: credit / 10, Expiry: h.now.Unix() + 3600, Payees: []string{av}}))
		h.must(h.tx(payer, TypeSettle, &Settle{Job: j, Payments: []Payment{{Machine: av, Amount: 10_000, Failed: true}}}))
	}
	for i := range 6 {
		mark(greedy, i+1)
	}
	h.closeWindows()
	st := h.app.Snapshot()
	r := st.Machines[av]
	if r == nil || r.Failed != MaxMarksPerPayer || len(r.MarkedBy) != 1 || r.MarkedBy[0].Marks != 6 {
		t.Fatalf("six marks from one payer: %+v, want %d counted of 6", r, MaxMarksPerPayer)
	}
	mark(other, 7)
	h.closeWindows()
	if r := h.app.Snapshot().Machines[av]; r.Failed != MaxMarksPerPayer+1 || len(r.MarkedBy) != 2 {
		t.Fatalf("another payer's mark: %+v", r)
	}
	if r.Failed != MaxMarksPerPayer {
		t.Errorf("the earlier snapshot changed with the state: %+v", r)
	}
}
