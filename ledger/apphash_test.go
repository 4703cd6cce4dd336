package ledger

import (
	"encoding/hex"
	"testing"

	"github.com/deepmarket/deepmarket/identity"
)

// pinnedAppHash is the app hash after pinnedChain. It changes only with
// the state's format: a change to it is a new AppVersion and a new
// genesis for every network, never a refactoring.
const pinnedAppHash = "32f58a8aef5ddc4b58aea1a4554c59f8989f676627e20f3c9daa342e6887b2e2"

// pinnedChain runs blocks that use every kind of transaction and leave
// entries in every collection of the state. It returns the harness and
// the types of the transactions committed; each emitted an event of its
// type.
func pinnedChain(t *testing.T) (*harness, map[string]bool) {
	t.Helper()
	issuer, alice, bob, m, owner, stranger := key(t, 1), key(t, 2), key(t, 3), key(t, 4), key(t, 5), key(t, 6)
	vals := valKeys(t, 3)
	g := genesis(issuer, map[*identity.Key]uint64{alice: 100 * credit, owner: 3 * credit}, owner)
	p := DefaultParams() // links lock the default stake
	p.ClaimGrace, p.DisputeWindow = 10, 10
	g.Params = &p
	h := newHarnessWith(t, nil, g, genesisVals(vals[:2]))
	committed := map[string]bool{}
	must := func(txs ...[]byte) {
		t.Helper()
		for i, r := range h.block(txs...) {
			d, err := DecodeTx(txs[i])
			if err != nil || r.Code != CodeOK {
				t.Fatalf("tx %d: code %d: %s (%v)", i, r.Code, r.Log, err)
			}
			if len(r.Events) != 1 || r.Events[0].Type != EventType || r.Events[0].Attributes[0].Key != "type" ||
				r.Events[0].Attributes[0].Value != d.tx.Type {
				t.Fatalf("a %s transaction emitted %v", d.tx.Type, r.Events)
			}
			committed[d.tx.Type] = true
		}
	}
	mAddr := string(m.Address())
	must(
		h.tx(issuer, TypeGrant, &Grant{To: string(bob.Address()), Amount: 10 * credit}),
		h.tx(issuer, TypeAdmit, &Admit{Account: string(stranger.Address())}),
		h.tx(owner, TypeLinkMachine, &LinkMachine{Consent: h.consent(m, owner.Address())}),
		h.tx(alice, TypeTransfer, &Transfer{To: string(bob.Address()), Amount: credit, Memo: "pinned"}),
	)
	exp := h.now.Unix() + 12
	must(
		h.tx(alice, TypeOpenEscrow, &OpenEscrow{Job: job(1), Amount: 5 * credit, Expiry: exp, Payees: []string{mAddr}}),
		h.tx(alice, TypeOpenEscrow, &OpenEscrow{Job: job(2), Amount: 2 * credit, Expiry: exp, Payees: []string{mAddr}}),
		h.tx(alice, TypeOpenEscrow, &OpenEscrow{Job: job(3), Amount: 3 * credit, Expiry: exp + 3600, Payees: []string{mAddr}}),
		h.tx(issuer, TypeAdmit, &Admit{Account: string(stranger.Address()), Revoke: true}),
	)
	must(
		h.tx(alice, TypeSettle, &Settle{Job: job(1), Payments: []Payment{{Machine: mAddr, Amount: credit, Failed: true, Rounds: 4, Refused: 2, Withheld: 2 * credit}}}),
		vote(h, vals[0], vals[2], 10, "third"),
		vote(h, vals[0], vals[1], 5, ""),
		vote(h, vals[1], vals[1], 5, ""),
		h.tx(alice, TypeTransfer, &Transfer{To: string(owner.Address()), Amount: credit, Memo: "bond"}),
	)
	must(h.tx(m, TypeDispute, &Dispute{Job: job(1)}),
		h.tx(m, TypeAppeal, &Appeal{Job: job(1), Claim: credit, Evidence: "bafypinned", Reason: "every round refused"}))
	byAddr := map[string]*identity.Key{}
	for _, v := range vals {
		byAddr[string(v.Address())] = v
	}
	refs := h.app.Snapshot().Escrows[job(1)].Cases[0].Referees
	if len(refs) < 2 {
		t.Fatalf("referees %v", refs)
	}
	must(h.tx(byAddr[refs[0]], TypeVerdict, &Verdict{Job: job(1), Appellant: mAddr, Overturn: true}),
		h.tx(byAddr[refs[1]], TypeVerdict, &Verdict{Job: job(1), Appellant: mAddr, Overturn: true}))
	for h.now.Unix() < exp {
		h.block()
	}
	r := SignReceipt(alice, testChain, Receipt{Job: job(2), Payee: mAddr, Amount: credit / 2, Seq: 1})
	must(h.tx(m, TypeClaim, &Claim{Receipt: r}))
	for h.now.Unix() < exp+p.ClaimGrace {
		h.block()
	}
	must(h.tx(alice, TypeExpire, &Expire{Job: job(2)}))
	if st := h.app.Snapshot(); st.Burned != credit { // withheld 2, the overturned claim paid 1 of them
		t.Fatalf("burned %d, want a credit", st.Burned)
	}
	return h, committed
}

// TestAppHashPinned: the same blocks give the same app hash, release
// after release, so a refactoring cannot fork a network's replicas from
// the ones that run the release before it.
func TestAppHashPinned(t *testing.T) {
	h, _ := pinnedChain(t)
	if got := hex.EncodeToString(h.hash()); got != pinnedAppHash {
		t.Fatalf("app hash %s, pinned %s: the state's format changed", got, pinnedAppHash)
	}
}
