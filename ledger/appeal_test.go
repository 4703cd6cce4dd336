package ledger

import (
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/identity"
)

// appealNet is a chain of four validators, a payer, and two machines
// (their own owners): a with credit enough for bonds, poor with less
// than a bond once paid.
type appealNet struct {
	h                *harness
	payer, a, poor   *identity.Key
	vals             []*identity.Key
	byAddr           map[string]*identity.Key
	aa, apoor, apayr string
}

func newAppealNet(t *testing.T) *appealNet {
	t.Helper()
	issuer, payer, a, poor := key(t, 1), key(t, 2), key(t, 3), key(t, 4)
	vals := valKeys(t, 4)
	g := genesis(issuer, map[*identity.Key]uint64{payer: 100 * credit, a: credit}, a, poor)
	n := &appealNet{h: newHarnessWith(t, nil, g, genesisVals(vals)), payer: payer, a: a, poor: poor, vals: vals,
		byAddr: map[string]*identity.Key{}, aa: string(a.Address()), apoor: string(poor.Address()), apayr: string(payer.Address())}
	for _, v := range vals {
		n.byAddr[string(v.Address())] = v
	}
	return n
}

// settled opens job j for a and poor and settles it paying each 0.1.
func (n *appealNet) settled(j string) {
	n.h.t.Helper()
	n.h.must(n.h.tx(n.payer, TypeOpenEscrow, &OpenEscrow{Job: j, Amount: 3 * credit, Expiry: n.h.now.Unix() + 3600, Payees: []string{n.aa, n.apoor}}))
	n.h.must(n.h.tx(n.payer, TypeSettle, &Settle{Job: j, Payments: []Payment{
		{Machine: n.aa, Amount: credit / 10, Rounds: 10, Refused: 9}, {Machine: n.apoor, Amount: credit / 20, Rounds: 10, Refused: 9}}}))
}

func (n *appealNet) referees(j, appellant string) []*identity.Key {
	n.h.t.Helper()
	e := n.h.app.Snapshot().Escrows[j]
	if e == nil || e.caseOf(appellant) < 0 {
		n.h.t.Fatalf("no case of %s on %s", appellant, j)
	}
	var out []*identity.Key
	for _, r := range e.Cases[e.caseOf(appellant)].Referees {
		out = append(out, n.byAddr[r])
	}
	return out
}

func (n *appealNet) verdict(by *identity.Key, j, appellant string, overturn bool) []byte {
	return n.h.tx(by, TypeVerdict, &Verdict{Job: j, Appellant: appellant, Overturn: overturn})
}

func (n *appealNet) balance(k *identity.Key) uint64 {
	return n.h.app.Snapshot().balanceOf(string(k.Address()))
}

// TestAppealsAreJudged: a payee's appeal locks its owner's bond and draws
// three of the four validators; the first side two of them take decides
// it. Overturned, the appellant is paid its claim and its bond back and
// the payer pays the majority as much as the bond; upheld, the majority
// takes the bond. Nobody else votes, nobody votes twice, nothing moves
// after the verdict, and the books balance after every block (the
// harness checks them).
func TestAppealsAreJudged(t *testing.T) {
	n := newAppealNet(t)
	h := n.h
	bond := DefaultParams().AppealBond
	h.must(h.tx(n.payer, TypeOpenEscrow, &OpenEscrow{Job: job(1), Amount: 3 * credit, Expiry: h.now.Unix() + 3600, Payees: []string{n.aa, n.apoor}}))
	expectCode(t, h.block(h.tx(n.a, TypeAppeal, &Appeal{Job: job(1), Claim: credit, Evidence: "bafyev"})), CodeNotSettled, "not settled")
	h.must(h.tx(n.payer, TypeSettle, &Settle{Job: job(1), Payments: []Payment{
		{Machine: n.aa, Amount: credit / 10, Rounds: 10, Refused: 9}, {Machine: n.apoor, Amount: credit / 20, Rounds: 10, Refused: 9}}}))

	expectCode(t, h.block(h.tx(n.poor, TypeAppeal, &Appeal{Job: job(1), Claim: credit, Evidence: "bafyev"})), CodeInsufficientFunds, "bond")
	expectCode(t, h.block(h.tx(n.a, TypeAppeal, &Appeal{Job: job(1), Claim: 3 * credit, Evidence: "bafyev"})), CodeInvalidAmount, "want 1 to")
	expectCode(t, h.block(h.tx(n.a, TypeAppeal, &Appeal{Job: job(1), Claim: credit, Evidence: "bafy ev"})), CodeMalformed, "evidence")
	before := n.balance(n.a)
	h.must(h.tx(n.a, TypeAppeal, &Appeal{Job: job(1), Claim: credit, Evidence: "bafyev", Reason: "my rounds were refused"}))
	expectCode(t, h.block(h.tx(n.a, TypeAppeal, &Appeal{Job: job(1), Claim: 1, Evidence: "bafyev"})), CodeAlreadyVoted, "already")
	if got := n.balance(n.a); got != before-bond {
		t.Fatalf("appellant's balance %d after the appeal, want %d less the bond %d", got, before, bond)
	}
	refs := n.referees(job(1), n.aa)
	if len(refs) != 3 {
		t.Fatalf("%d referees drawn, want 3", len(refs))
	}
	var outsider *identity.Key
	for _, v := range n.vals {
		drawn := false
		for _, r := range refs {
			drawn = drawn || r == v
		}
		if !drawn {
			outsider = v
		}
	}
	expectCode(t, h.block(n.verdict(outsider, job(1), n.aa, true)), CodeNotReferee, "not a referee")
	expectCode(t, h.block(n.verdict(n.payer, job(1), n.aa, false)), CodeNotReferee, "")
	h.must(n.verdict(refs[0], job(1), n.aa, true))
	expectCode(t, h.block(n.verdict(refs[0], job(1), n.aa, true)), CodeAlreadyVoted, "voted")
	h.must(n.verdict(refs[1], job(1), n.aa, false))
	r0, r2 := n.balance(refs[0]), n.balance(refs[2])
	escrowed := h.app.Snapshot().Escrows[job(1)].Amount
	h.must(n.verdict(refs[2], job(1), n.aa, true)) // two of three: overturned
	st := h.app.Snapshot()
	if got := n.balance(n.a); got != before+credit {
		t.Errorf("appellant holds %d after winning, want %d (its claim paid, its bond back)", got, before+credit)
	}
	if n.balance(refs[0]) != r0+bond/2 || n.balance(refs[2]) != r2+bond/2 {
		t.Errorf("the majority was paid %d and %d, want %d each", n.balance(refs[0])-r0, n.balance(refs[2])-r2, bond/2)
	}
	if got := st.Escrows[job(1)].Amount; got != escrowed-credit-bond {
		t.Errorf("escrow holds %d, want %d less the claim and the referees' fee", got, escrowed)
	}
	if r := st.Payers[n.apayr]; r == nil || r.AppealsLost != 1 {
		t.Errorf("payer record %+v, want an appeal lost", r)
	}
	expectCode(t, h.block(n.verdict(refs[1], job(1), n.aa, false)), CodeClosedAppeal, "decided")

	// Upheld: the bond goes to the two that upheld the refusal.
	n.settled(job(2))
	before = n.balance(n.a)
	h.must(h.tx(n.a, TypeAppeal, &Appeal{Job: job(2), Claim: credit, Evidence: "bafyev2"}))
	refs = n.referees(job(2), n.aa)
	r0, r1 := n.balance(refs[0]), n.balance(refs[1])
	h.must(n.verdict(refs[0], job(2), n.aa, false), n.verdict(refs[1], job(2), n.aa, false))
	if got := n.balance(n.a); got != before-bond {
		t.Errorf("appellant holds %d after losing, want %d less the bond", got, before)
	}
	if n.balance(refs[0]) != r0+bond/2 || n.balance(refs[1]) != r1+bond/2 {
		t.Errorf("the majority was paid %d and %d, want %d each", n.balance(refs[0])-r0, n.balance(refs[1])-r1, bond/2)
	}
	if r := h.app.Snapshot().Machines[n.aa]; r == nil || r.AppealsLost != 1 {
		t.Errorf("machine record %+v, want an appeal lost", r)
	}
}

// TestAppealKeepsTheEscrowOpen: an appeal made at the end of the dispute
// window keeps the escrow open until its deadline; undecided by then, it
// lapses as the escrow closes, and the bond comes back. A decided case
// lets the escrow close at the end of its window again.
func TestAppealKeepsTheEscrowOpen(t *testing.T) {
	n := newAppealNet(t)
	h := n.h
	p := DefaultParams()
	n.settled(job(1))
	settledAt := h.now.Unix()
	h.now = time.Unix(settledAt+p.DisputeWindow-10, 0)
	before := n.balance(n.a)
	h.must(h.tx(n.a, TypeAppeal, &Appeal{Job: job(1), Claim: credit, Evidence: "bafylate"}))
	deadline := h.now.Unix() + p.VerdictWindow
	h.now = time.Unix(settledAt+p.DisputeWindow+5, 0)
	expectCode(t, h.block(h.tx(n.poor, TypeAppeal, &Appeal{Job: job(1), Claim: credit, Evidence: "bafylate"})), CodeExpired, "window")
	if h.app.Snapshot().Escrows[job(1)] == nil {
		t.Fatal("the escrow closed with an appeal open")
	}
	refs := n.referees(job(1), n.aa)
	h.now = time.Unix(deadline, 0).Add(-5 * time.Second) // the next block is at the deadline: the escrow closes first
	expectCode(t, h.block(n.verdict(refs[0], job(1), n.aa, true)), CodeUnknownEscrow, "no open escrow")
	if h.app.Snapshot().Escrows[job(1)] != nil {
		t.Fatal("the escrow is open past the case's deadline")
	}
	if got := n.balance(n.a); got != before {
		t.Errorf("appellant holds %d after its case lapsed, want its bond back (%d)", got, before)
	}

	// Decided early: the escrow closes at the end of its window.
	n.settled(job(2))
	settledAt = h.now.Unix()
	h.must(h.tx(n.a, TypeAppeal, &Appeal{Job: job(2), Claim: 1, Evidence: "bafyearly"}))
	refs = n.referees(job(2), n.aa)
	h.must(n.verdict(refs[0], job(2), n.aa, false), n.verdict(refs[1], job(2), n.aa, false))
	if e := h.app.Snapshot().Escrows[job(2)]; e == nil || e.Closes != settledAt+p.DisputeWindow {
		t.Fatalf("escrow %+v, want it to close at %d", e, settledAt+p.DisputeWindow)
	}
}

// TestNoRefereeIsAParty: the payer, the appellant and its owner are never
// drawn; where every validator is one of them, the appeal is refused
// rather than judged by a party.
func TestNoRefereeIsAParty(t *testing.T) {
	issuer, payer, a := key(t, 1), key(t, 2), key(t, 3)
	g := genesis(issuer, map[*identity.Key]uint64{payer: 100 * credit, a: credit}, a)
	h := newHarnessWith(t, nil, g, genesisVals([]*identity.Key{payer, a}))
	aa := string(a.Address())
	h.must(h.tx(payer, TypeOpenEscrow, &OpenEscrow{Job: job(1), Amount: credit, Expiry: h.now.Unix() + 3600, Payees: []string{aa}}))
	h.must(h.tx(payer, TypeSettle, &Settle{Job: job(1), Payments: []Payment{{Machine: aa, Amount: credit / 10}}}))
	expectCode(t, h.block(h.tx(a, TypeAppeal, &Appeal{Job: job(1), Claim: credit / 2, Evidence: "bafy"})), CodeNoReferees, "no validator")

	n := newAppealNet(t)
	for j := range 20 {
		n.settled(job(j))
		n.h.must(n.h.tx(n.a, TypeAppeal, &Appeal{Job: job(j), Claim: 1, Evidence: "bafy"}))
		for _, r := range n.referees(job(j), n.aa) {
			if a := string(r.Address()); a == n.aa || a == n.apayr {
				t.Fatalf("a party drawn as referee: %s", a)
			}
		}
	}
}

// TestAnUpheldMarkCounts: a mark the machine disputed and then lost its
// appeal over counts in its record, and cannot be disputed again; a mark
// whose appeal the referees overturned does not count.
func TestAnUpheldMarkCounts(t *testing.T) {
	n := newAppealNet(t)
	h := n.h
	for _, j := range []string{job(1), job(2)} {
		h.must(h.tx(n.payer, TypeOpenEscrow, &OpenEscrow{Job: j, Amount: credit, Expiry: h.now.Unix() + 3600, Payees: []string{n.aa}}))
		h.must(h.tx(n.payer, TypeSettle, &Settle{Job: j, Payments: []Payment{{Machine: n.aa, Amount: credit / 10, Failed: true}}}))
		h.must(h.tx(n.a, TypeDispute, &Dispute{Job: j}), h.tx(n.a, TypeAppeal, &Appeal{Job: j, Claim: credit / 2, Evidence: "bafy"}))
	}
	refs := n.referees(job(1), n.aa)
	h.must(n.verdict(refs[0], job(1), n.aa, false), n.verdict(refs[1], job(1), n.aa, false))
	if m, _ := h.app.Snapshot().Escrows[job(1)].mark(n.aa); m.Disputed {
		t.Fatal("a mark the referees upheld still counts as disputed")
	}
	expectCode(t, h.block(h.tx(n.a, TypeDispute, &Dispute{Job: job(1)})), CodeClosedAppeal, "decided")
	refs = n.referees(job(2), n.aa)
	h.must(n.verdict(refs[0], job(2), n.aa, true), n.verdict(refs[1], job(2), n.aa, true))
	h.closeWindows()
	if r := h.app.Snapshot().Machines[n.aa]; r == nil || r.Failed != 1 || r.AppealsLost != 1 {
		t.Fatalf("machine record %+v: want the upheld mark counted, the overturned one not", r)
	}
}

// TestOneClaimShutsNobodyOut: a payee claiming all the escrow holds does
// not stop another payee from appealing.
func TestOneClaimShutsNobodyOut(t *testing.T) {
	n := newAppealNet(t)
	h := n.h
	n.settled(job(1))
	h.must(h.tx(n.payer, TypeTransfer, &Transfer{To: n.apoor, Amount: credit}))
	all := h.app.Snapshot().Escrows[job(1)].Amount
	h.must(h.tx(n.a, TypeAppeal, &Appeal{Job: job(1), Claim: all, Evidence: "bafygreedy"}))
	h.must(h.tx(n.poor, TypeAppeal, &Appeal{Job: job(1), Claim: credit, Evidence: "bafyhonest"}))
	if e := h.app.Snapshot().Escrows[job(1)]; len(e.Cases) != 2 {
		t.Fatalf("cases %+v", e.Cases)
	}
}

// TestStrangersCannotAppealOrJudge: a fresh key appealing a settlement it
// is no payee of is refused before anything else (not a member), and one
// giving a verdict is no referee; neither moves a credit.
func TestStrangersCannotAppealOrJudge(t *testing.T) {
	n := newAppealNet(t)
	h := n.h
	n.settled(job(1))
	stranger := key(t, 99)
	expectCode(t, h.block(h.tx(stranger, TypeAppeal, &Appeal{Job: job(1), Claim: 1, Evidence: "bafy"})), CodeNotMember, "not a member")
	h.must(h.tx(n.a, TypeAppeal, &Appeal{Job: job(1), Claim: 1, Evidence: "bafy"}))
	expectCode(t, h.block(h.tx(stranger, TypeVerdict, &Verdict{Job: job(1), Appellant: n.aa, Overturn: true})), CodeNotReferee, "not a validator")
	if e := h.app.Snapshot().Escrows[job(1)]; len(e.Cases) != 1 || len(e.Cases[0].Votes) != 0 {
		t.Fatalf("cases after strangers' attempts: %+v", e.Cases)
	}
}

// TestRefusingDoesNotPay: what a settlement withholds for a machine's
// refused rounds stays in the escrow and is burned when it closes, not
// refunded: refusing a round costs the payer what accepting it would
// have. Referees who uphold the refusal on the machine's appeal give it
// back to the payer; overturned, the machine is paid from it. A
// settlement cannot withhold for rounds it did not refuse, nor more than
// the escrow holds. The books balance after every block, the supply less
// what was burned.
func TestRefusingDoesNotPay(t *testing.T) {
	n := newAppealNet(t)
	h := n.h
	open := func(j string) {
		h.must(h.tx(n.payer, TypeOpenEscrow, &OpenEscrow{Job: j, Amount: 3 * credit, Expiry: h.now.Unix() + 3600, Payees: []string{n.aa, n.apoor}}))
	}
	settle := func(j string, withheld uint64) []byte {
		return h.tx(n.payer, TypeSettle, &Settle{Job: j, Payments: []Payment{
			{Machine: n.aa, Amount: credit / 10, Rounds: 10, Refused: 9, Withheld: withheld}, {Machine: n.apoor, Amount: credit / 10}}})
	}
	open(job(1))
	expectCode(t, h.block(h.tx(n.payer, TypeSettle, &Settle{Job: job(1), Payments: []Payment{{Machine: n.aa, Amount: 1, Withheld: credit}}})),
		CodeMalformed, "no refused round")
	expectCode(t, h.block(settle(job(1), 3*credit)), CodeInvalidAmount, "withholds")

	// Unappealed: burned at the close.
	payer, supply := n.balance(n.payer), h.app.Snapshot().Supply
	h.must(settle(job(1), credit))
	if e := h.app.Snapshot().Escrows[job(1)]; len(e.Withheld) != 1 || e.Withheld[0] != (Withheld{Payee: n.aa, Amount: credit}) {
		t.Fatalf("escrow withholds %+v, want a credit for %s", e.Withheld, n.aa)
	}
	h.closeWindows()
	st := h.app.Snapshot()
	refund := uint64(3*credit - 2*(credit/10) - credit)
	if got := n.balance(n.payer); got != payer+refund {
		t.Errorf("payer refunded %d, want %d: the withheld credit is not its", got-payer, refund)
	}
	if st.Supply != supply-credit || st.Burned != credit {
		t.Errorf("supply %d, burned %d; want %d and a credit", st.Supply, st.Burned, supply-credit)
	}

	// Upheld: the payer's again.
	open(job(2))
	h.must(settle(job(2), credit))
	h.must(h.tx(n.a, TypeAppeal, &Appeal{Job: job(2), Claim: credit, Evidence: "bafyev"}))
	refs := n.referees(job(2), n.aa)
	h.must(n.verdict(refs[0], job(2), n.aa, false), n.verdict(refs[1], job(2), n.aa, false))
	payer = n.balance(n.payer)
	h.closeWindows()
	if got, want := n.balance(n.payer), payer+3*credit-2*(credit/10); got != want {
		t.Errorf("upheld: payer refunded %d, want %d (the withheld credit back)", got-payer, want-payer)
	}
	if st := h.app.Snapshot(); st.Burned != credit {
		t.Errorf("upheld: burned %d in all, want the first job's credit only", st.Burned)
	}

	// Overturned on a claim of half: paid that from what was withheld; the
	// rest, and nothing more, burned.
	open(job(3))
	h.must(settle(job(3), credit))
	h.must(h.tx(n.a, TypeAppeal, &Appeal{Job: job(3), Claim: credit / 2, Evidence: "bafyev"}))
	refs = n.referees(job(3), n.aa)
	h.must(n.verdict(refs[0], job(3), n.aa, true), n.verdict(refs[1], job(3), n.aa, true))
	if e := h.app.Snapshot().Escrows[job(3)]; len(e.Withheld) != 1 || e.Withheld[0].Amount != credit/2 {
		t.Fatalf("overturned: escrow withholds %+v, want half a credit left", e.Withheld)
	}
	payer = n.balance(n.payer)
	h.closeWindows()
	bond := DefaultParams().AppealBond
	if got, want := n.balance(n.payer), payer+3*credit-2*(credit/10)-credit/2-bond-credit/2; got != want {
		t.Errorf("overturned: payer refunded %d, want %d", got-payer, want-payer)
	}
	if st := h.app.Snapshot(); st.Burned != credit+credit/2 {
		t.Errorf("overturned: burned %d in all, want %d", st.Burned, credit+credit/2)
	}

	// A forfeit (a failed mark, no refused round) withholds too: burned.
	open(job(4))
	h.must(h.tx(n.payer, TypeSettle, &Settle{Job: job(4), Payments: []Payment{
		{Machine: n.aa, Failed: true, Rounds: 10, Withheld: credit}, {Machine: n.apoor, Amount: credit / 10}}}))
	payer = n.balance(n.payer)
	h.closeWindows()
	if got, want := n.balance(n.payer), payer+3*credit-credit/10-credit; got != want {
		t.Errorf("forfeit: payer refunded %d, want %d (not the withheld credit)", got-payer, want-payer)
	}
	if st := h.app.Snapshot(); st.Burned != 2*credit+credit/2 {
		t.Errorf("forfeit: burned %d in all, want %d", st.Burned, 2*credit+credit/2)
	}
}
