package ledger

import (
	"bytes"
	"testing"

	"github.com/deepmarket/deepmarket/wire"
)

// kindSamples is a message of every transaction type, and what it spends.
func kindSamples(t *testing.T) map[string]struct {
	msg   any
	spend uint64
} {
	k := key(t, 1)
	to := string(k.Address())
	type sample = struct {
		msg   any
		spend uint64
	}
	return map[string]sample{
		TypeTransfer:      {&Transfer{To: to, Amount: 7, Memo: "m"}, 7},
		TypeGrant:         {&Grant{To: to, Amount: 8}, 0},
		TypeLinkMachine:   {&LinkMachine{Consent: SignLinkConsent(k, testChain, k.Address(), Registration{Owner: to, Height: 7}, 100)}, 0},
		TypeOpenEscrow:    {&OpenEscrow{Job: job(1), Amount: 9, Expiry: 9, Payees: []string{to}}, 9},
		TypeSettle:        {&Settle{Job: job(1), Payments: []Payment{{Machine: to, Amount: 1, Failed: true}}}, 0},
		TypeClaim:         {&Claim{Receipt: Receipt{Job: job(1), Payee: to, Amount: 1, Seq: 2, Sig: make([]byte, 64)}}, 0},
		TypeExpire:        {&Expire{Job: job(1)}, 0},
		TypeDispute:       {&Dispute{Job: job(1)}, 0},
		TypeAppeal:        {&Appeal{Job: job(1), Claim: 5, Evidence: "bafy", Reason: "r"}, 0},
		TypeVerdict:       {&Verdict{Job: job(1), Appellant: to, Overturn: true}, 0},
		TypeValidatorVote: {&ValidatorVote{PubKey: k.Public(), Power: 3, Name: "u"}, 0},
		TypeAdmit:         {&Admit{Account: to, Revoke: true}, 0},
	}
}

// TestTxKinds: every kind in the table has a type of its own and a
// handler; a transaction of each kind decodes into the message it was
// built from and spends what its message moves out of the signer's
// balance; and each kind commits, emitting an event of its type.
func TestTxKinds(t *testing.T) {
	samples := kindSamples(t)
	signer := key(t, 2)
	if len(kindByType) != len(txKinds) {
		t.Fatalf("%d kinds in the table, %d types", len(txKinds), len(kindByType))
	}
	for i := range txKinds {
		k := &txKinds[i]
		t.Run(k.typ, func(t *testing.T) {
			if k.typ == "" || k.handle == nil || k.decode == nil || k.spend == nil || k.carries == nil {
				t.Fatalf("kind %q is missing a part: %+v", k.typ, k)
			}
			s, ok := samples[k.typ]
			if !ok {
				t.Fatalf("no sample message of kind %q: add one to kindSamples", k.typ)
			}
			b, err := NewTx(signer, testChain, k.typ, 3, s.msg)
			if err != nil {
				t.Fatal(err)
			}
			d, err := DecodeTx(b)
			if err != nil {
				t.Fatal(err)
			}
			if d.kind != k || d.tx.Type != k.typ || d.tx.Nonce != 3 {
				t.Fatalf("decoded as kind %q, type %q, nonce %d", d.kind.typ, d.tx.Type, d.tx.Nonce)
			}
			if !k.carries(d.msg) {
				t.Fatalf("decoded a %T, which the kind does not carry", d.msg)
			}
			want, got := mustEncode(s.msg), mustEncode(d.msg)
			if !bytes.Equal(want, got) {
				t.Fatalf("decoded a message that encodes as %x, built from one that encodes as %x", got, want)
			}
			if err := d.verifySig(testChain); err != nil {
				t.Fatal(err)
			}
			if spend := k.spend(d.msg); spend != s.spend {
				t.Fatalf("spends %d, want %d", spend, s.spend)
			}
		})
	}
	for typ := range samples {
		if kindByType[typ] == nil {
			t.Errorf("type %q has a sample but no entry in txKinds", typ)
		}
	}
	_, committed := pinnedChain(t)
	for _, k := range txKinds {
		if !committed[k.typ] {
			t.Errorf("pinnedChain commits no %s transaction: add one (and pin the new app hash)", k.typ)
		}
	}
}

// TestNewTxRefusesAMessageOfAnotherKind: a message of another kind, or a
// type the ledger does not know, is refused before it is signed.
func TestNewTxRefusesAMessageOfAnotherKind(t *testing.T) {
	k := key(t, 1)
	to := string(k.Address())
	if _, err := NewTx(k, testChain, TypeGrant, 0, &Transfer{To: to, Amount: 1}); CodeOf(err) != CodeMalformed {
		t.Fatalf("a grant carrying a transfer: %v", err)
	}
	if _, err := NewTx(k, testChain, "mint", 0, &Grant{To: to, Amount: 1}); CodeOf(err) != CodeUnknownType {
		t.Fatalf("an unknown type: %v", err)
	}
	// A message by value serves as well as by pointer: both encode alike.
	byValue, err := NewTx(k, testChain, TypeGrant, 0, Grant{To: to, Amount: 1})
	if err != nil {
		t.Fatal(err)
	}
	byPointer, _ := NewTx(k, testChain, TypeGrant, 0, &Grant{To: to, Amount: 1})
	if !bytes.Equal(byValue, byPointer) {
		t.Fatal("a message by value signs other bytes than by pointer")
	}
}

// TestDecodeTxRefusesABodyOfAnotherKind: a body is decoded as the kind the
// envelope names, and one that is not that kind's message is malformed.
func TestDecodeTxRefusesABodyOfAnotherKind(t *testing.T) {
	k := key(t, 1)
	body, _ := wire.Marshal(&Transfer{To: string(k.Address()), Amount: 1, Memo: "a transfer's"})
	tx := Tx{Type: TypeExpire, Signer: k.Public(), Body: body}
	tx.Sig = k.Sign(tx.signBytes(testChain))
	b, _ := wire.Marshal(&tx)
	if _, err := DecodeTx(b); CodeOf(err) != CodeMalformed {
		t.Fatalf("an expire carrying a transfer's body: %v", err)
	}
}
