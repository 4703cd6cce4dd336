package lender

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/storage"
)

// TestRecomputeJudgesTheAnswerFirst: what a referee decides before it runs
// anything, on packages an appellant made (real storage, real
// signatures). Evidence whose answer the payer did not sign, or signed to
// another machine, a claim over what the refused rounds could have paid
// and an answer that refused nothing all leave the refusal standing; a
// spot check's forfeit and a bid without a validation batch are not
// judged; an answer that counts refusals but names none is overturned;
// one that names an update the evidence does not hold stands. (The
// recomputation itself: python/tests/test_referee.py, and
// TestRefereesPayARefusedHonestWorker end to end.)
func TestRecomputeJudgesTheAnswerFirst(t *testing.T) {
	e := testExecutor(t)
	e.chainID = "chain"
	payer, _ := identity.GenerateKey()
	stranger, _ := identity.GenerateKey()
	appellant := "dm1appellant"
	job := strings.Repeat("ab", 32)
	refusal := &ledger.Refusal{Round: 4, Theta: "aa", Update: "bb"}
	terms := ledger.Terms{Validation: "bafkreidnc6osh7kyprbm4iuur2vwrvnjugirnirlcvlifjgdu7mxvg2e4u", Tolerance: 0.1, Echo: 0.98, Residual: 0.9}
	answer := func(signer *identity.Key, payee string, change func(*ledger.Answer)) ledger.Answer {
		a := ledger.Answer{Job: job, Payee: payee, Round: 6, Accepted: 2, Refused: 3, Refusal: refusal, Terms: terms}
		if change != nil {
			change(&a)
		}
		return ledger.SignAnswer(signer, e.chainID, a)
	}
	// pack adds a package holding a, and a worker's evidence of round 4
	// whose update is named "cc" (not the answer's "bb").
	pack := func(a ledger.Answer) string {
		dir := filepath.Join(t.TempDir(), "pkg")
		os.MkdirAll(filepath.Join(dir, "w1", "round-4"), 0o755)
		os.WriteFile(filepath.Join(dir, "w1", "round-4", "evidence.json"), []byte(`{"round":4,"update":"cc"}`), 0o644)
		b, _ := json.Marshal(a)
		os.WriteFile(filepath.Join(dir, "answer.json"), b, 0o644)
		pin, err := e.blocks.(*storage.Store).Add(t.Context(), dir, nil)
		if err != nil {
			t.Fatal(err)
		}
		return pin.CID.String()
	}
	for _, c := range []struct {
		name     string
		a        ledger.Answer
		claim    uint64
		overturn bool
		abstain  bool
		want     string
	}{
		{name: "signed by another key", a: answer(stranger, appellant, nil), want: "no answer the payer signed"},
		{name: "to another machine", a: answer(payer, "dm1other", nil), want: "no answer the payer signed"},
		{name: "a claim over the cap", a: answer(payer, appellant, nil), claim: 101, want: "over what the refused rounds"},
		{name: "nothing refused", a: answer(payer, appellant, func(a *ledger.Answer) { a.Refused = 0 }), want: "refused nothing"},
		{name: "a forfeit", a: answer(payer, appellant, func(a *ledger.Answer) { a.Forfeited = true }), abstain: true, want: "spot check"},
		{name: "refusals naming nothing", a: answer(payer, appellant, func(a *ledger.Answer) { a.Refusal = nil }), overturn: true, want: "without naming"},
		{name: "no batch", a: answer(payer, appellant, func(a *ledger.Answer) { a.Terms.Validation = "" }), abstain: true, want: "no validation batch"},
		{name: "an update the evidence lacks", a: answer(payer, appellant, nil), want: "no round with the update"},
	} {
		t.Run(c.name, func(t *testing.T) {
			claim := c.claim
			if claim == 0 {
				claim = 100
			}
			d := ledger.Docket{Job: job, PayerKey: payer.Public(), Appellant: appellant, Claim: claim, Cap: 100, Evidence: pack(c.a)}
			v, err := e.recompute(t.Context(), d)
			if err != nil {
				t.Fatal(err)
			}
			if v.Overturn != c.overturn || v.Abstain != c.abstain || !strings.Contains(v.Why, c.want) {
				t.Errorf("verdict %+v: want overturn %v, abstain %v, saying %q", v, c.overturn, c.abstain, c.want)
			}
		})
	}
	// Evidence that is not a content address is upheld, without a fetch.
	v, err := e.recompute(t.Context(), ledger.Docket{Job: job, PayerKey: payer.Public(), Appellant: appellant, Evidence: "not-a-cid"})
	if err != nil || v.Overturn || v.Abstain {
		t.Errorf("evidence %q: %+v, %v", "not-a-cid", v, err)
	}
}
