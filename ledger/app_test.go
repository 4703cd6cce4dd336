package ledger

import (
	"bytes"
	"context"
	"encoding/hex"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	abci "github.com/cometbft/cometbft/abci/types"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/wire"
)

const credit = 1_000_000

func job(n int) string {
	return hex.EncodeToString([]byte(strings.Repeat(string(rune('a'+n%26)), 32)))
}

// genesis is a chain whose issuer has a large quota, with balances and
// members. Its links lock no stake (most tests' owners hold nothing):
// TestLinksLockAStake and the pinned chain link with the default stake.
func genesis(issuer *identity.Key, balances map[*identity.Key]uint64, members ...*identity.Key) GenesisState {
	p := DefaultParams()
	p.LinkStake = 0
	g := GenesisState{Issuers: []GenesisIssuer{{Address: string(issuer.Address()), Quota: 1_000_000 * credit}}, Params: &p}
	for k, v := range balances {
		g.Balances = append(g.Balances, GenesisBalance{Address: string(k.Address()), Amount: v})
	}
	for _, k := range members {
		g.Members = append(g.Members, string(k.Address()))
	}
	return g
}

func TestGrantAndTransfer(t *testing.T) {
	issuer, alice, bob := key(t, 1), key(t, 2), key(t, 3)
	h := newHarness(t, nil, genesis(issuer, nil))
	h.must(h.tx(issuer, TypeGrant, &Grant{To: string(alice.Address()), Amount: 100 * credit}))
	h.must(h.tx(alice, TypeTransfer, &Transfer{To: string(bob.Address()), Amount: 30 * credit, Memo: "thanks"}))
	if h.balance(alice.Address()) != 70*credit || h.balance(bob.Address()) != 30*credit {
		t.Fatalf("balances %d %d", h.balance(alice.Address()), h.balance(bob.Address()))
	}
	st := h.app.Snapshot()
	if st.Supply != 100*credit || st.Issuers[string(issuer.Address())].Quota != 999_900*credit {
		t.Fatalf("supply %d, quota %d", st.Supply, st.Issuers[string(issuer.Address())].Quota)
	}
	// A member cannot grant.
	if r := h.block(h.tx(alice, TypeGrant, &Grant{To: string(alice.Address()), Amount: 1})); r[0].Code != CodeNotIssuer {
		t.Fatalf("member grant: %d %s", r[0].Code, r[0].Log)
	}
}

// TestRejectionsChangeNothing: each bad transaction is refused with its
// code and the app hash is what it was.
func TestRejectionsChangeNothing(t *testing.T) {
	issuer, alice, bob, mallory := key(t, 1), key(t, 2), key(t, 3), key(t, 4)
	g := genesis(issuer, map[*identity.Key]uint64{alice: 50 * credit, bob: math.MaxUint64 - 100*credit})
	g.Issuers[0].Quota = math.MaxUint64
	h := newHarness(t, nil, g)
	committed := h.tx(alice, TypeTransfer, &Transfer{To: string(bob.Address()), Amount: 1})
	h.must(committed)

	otherChain, _ := NewTx(alice, "deepmarket-other", TypeTransfer, h.nonces[alice.Address()], &Transfer{To: string(bob.Address()), Amount: 1})
	// Mallory puts Alice's key in the signer field and signs with her own.
	forged := func() []byte {
		var tx Tx
		wire.Unmarshal(h.tx(mallory, TypeTransfer, &Transfer{To: string(mallory.Address()), Amount: 10}), &tx)
		tx.Signer = alice.Public()
		h.nonces[mallory.Address()]--
		b, _ := wire.Marshal(&tx)
		return b
	}()
	unknown := func() []byte {
		body, _ := wire.Marshal(&Transfer{To: string(bob.Address()), Amount: 1})
		tx := Tx{Type: "mint", Signer: alice.Public(), Nonce: h.nonces[alice.Address()], Body: body}
		tx.Sig = alice.Sign(tx.signBytes(testChain))
		b, _ := wire.Marshal(&tx)
		return b
	}()
	futureNonce, _ := NewTx(alice, testChain, TypeTransfer, 99, &Transfer{To: string(bob.Address()), Amount: 1})

	cases := []struct {
		name string
		tx   func() []byte
		code uint32
	}{
		{"replay of a committed tx", func() []byte { return committed }, CodeBadNonce},
		{"same tx under another chain ID", func() []byte { return otherChain }, CodeBadSignature},
		{"wrong signer", func() []byte { return forged }, CodeBadSignature},
		{"overdraft", func() []byte {
			return h.tx(alice, TypeTransfer, &Transfer{To: string(bob.Address()), Amount: 51 * credit})
		}, CodeInsufficientFunds},
		{"transfer of nearly 2^64", func() []byte {
			return h.tx(alice, TypeTransfer, &Transfer{To: string(bob.Address()), Amount: math.MaxUint64 - 1})
		}, CodeInsufficientFunds},
		{"grant overflowing the supply", func() []byte {
			return h.tx(issuer, TypeGrant, &Grant{To: string(alice.Address()), Amount: 100 * credit})
		}, CodeOverflow},
		{"zero transfer", func() []byte { return h.tx(alice, TypeTransfer, &Transfer{To: string(bob.Address()), Amount: 0}) }, CodeInvalidAmount},
		{"zero grant", func() []byte { return h.tx(issuer, TypeGrant, &Grant{To: string(bob.Address()), Amount: 0}) }, CodeInvalidAmount},
		{"grant by a non-issuer", func() []byte { return h.tx(alice, TypeGrant, &Grant{To: string(alice.Address()), Amount: 1}) }, CodeNotIssuer},
		{"bad address", func() []byte { return h.tx(alice, TypeTransfer, &Transfer{To: "dm1nope", Amount: 1}) }, CodeInvalidAddress},
		{"unknown tx type", func() []byte { return unknown }, CodeUnknownType},
		{"malformed bytes", func() []byte { return []byte{0xff, 0x00, 0x13} }, CodeMalformed},
		{"empty", func() []byte { return []byte{} }, CodeMalformed},
		{"future nonce", func() []byte { return futureNonce }, CodeBadNonce},
		{"oversize", func() []byte { return append(committed, make([]byte, MaxTxSize)...) }, CodeTooLarge},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := h.hash()
			// CheckTx refuses it before the mempool...
			tx := c.tx()
			resp, err := h.app.CheckTx(context.Background(), &abci.RequestCheckTx{Tx: tx, Type: abci.CheckTxType_New})
			if err != nil {
				t.Fatal(err)
			}
			if resp.Code != c.code {
				t.Fatalf("CheckTx: code %d (%s), want %d", resp.Code, resp.Log, c.code)
			}
			// ...and a block that includes it anyway rejects it too.
			r := h.block(tx)
			if r[0].Code != c.code || r[0].Log == "" {
				t.Fatalf("code %d (%s), want %d", r[0].Code, r[0].Log, c.code)
			}
			if !sameExceptHeight(before, h) {
				t.Fatalf("state changed")
			}
		})
	}
}

// TestCheckTxBeforeTheFirstBlock: a chain that has made no block yet has
// no block time. An escrow opened then, as a node does at once when a
// job comes in, passes CheckTx by the clock, rather than failing "expiry
// must be after block time 0 and within 30 days"; the block re-checks it
// by its own time. An expiry already past is refused still.
func TestCheckTxBeforeTheFirstBlock(t *testing.T) {
	issuer, payer, m1 := key(t, 1), key(t, 2), key(t, 3)
	h := newHarness(t, nil, genesis(issuer, map[*identity.Key]uint64{payer: 100 * credit}, m1))
	now := time.Now().Unix()
	for _, c := range []struct {
		expiry int64
		code   uint32
	}{{now - 60, CodeExpired}, {now + 3600, CodeOK}} {
		b, err := NewTx(payer, testChain, TypeOpenEscrow, 0,
			&OpenEscrow{Job: job(1), Amount: credit, Expiry: c.expiry, Payees: []string{string(m1.Address())}})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := h.app.CheckTx(context.Background(), &abci.RequestCheckTx{Tx: b, Type: abci.CheckTxType_New})
		if err != nil || resp.Code != c.code {
			t.Errorf("CheckTx of an escrow expiring at %d (now %d) before the first block: %v code %d (%s), want %d",
				c.expiry, now, err, resp.GetCode(), resp.GetLog(), c.code)
		}
	}
}

// sameExceptHeight: the state after the block hashes as before it.
func sameExceptHeight(before []byte, h *harness) bool {
	return string(h.hash()) == string(before)
}

func TestEscrowSettle(t *testing.T) {
	issuer, payer, m1, m2, owner := key(t, 1), key(t, 2), key(t, 3), key(t, 4), key(t, 5)
	h := newHarness(t, nil, genesis(issuer, map[*identity.Key]uint64{payer: 100 * credit}, m1, owner))
	// m2 earns into owner's account.
	h.must(h.tx(owner, TypeLinkMachine, &LinkMachine{Consent: h.consent(m2, owner.Address())}))
	payees := []string{string(m1.Address()), string(m2.Address())}
	exp := h.now.Unix() + 3600
	h.must(h.tx(payer, TypeOpenEscrow, &OpenEscrow{Job: job(1), Amount: 40 * credit, Expiry: exp, Payees: payees}))
	if h.balance(payer.Address()) != 60*credit {
		t.Fatalf("payer after escrow: %d", h.balance(payer.Address()))
	}
	// Paying more than locked, or a stranger: refused.
	if r := h.block(h.tx(payer, TypeSettle, &Settle{Job: job(1), Payments: []Payment{{Machine: payees[0], Amount: 41 * credit}}})); r[0].Code != CodeInvalidAmount {
		t.Fatalf("overpay: %d %s", r[0].Code, r[0].Log)
	}
	if r := h.block(h.tx(m1, TypeSettle, &Settle{Job: job(1)})); r[0].Code != CodeNotPayer {
		t.Fatalf("stranger settle: %d", r[0].Code)
	}
	h.must(h.tx(payer, TypeSettle, &Settle{Job: job(1), Payments: []Payment{
		{Machine: payees[0], Amount: 10 * credit}, {Machine: payees[1], Amount: 5 * credit, Failed: true}}}))
	if h.balance(m1.Address()) != 10*credit || h.balance(owner.Address()) != 5*credit || h.balance(m2.Address()) != 0 {
		t.Fatalf("payees: m1 %d owner %d m2 %d", h.balance(m1.Address()), h.balance(owner.Address()), h.balance(m2.Address()))
	}
	// The rest waits out the dispute window, and so do the records.
	if h.balance(payer.Address()) != 60*credit {
		t.Fatalf("payer after settle: %d (want the 25 unused held through the dispute window)", h.balance(payer.Address()))
	}
	if st := h.app.Snapshot(); st.Machines[payees[1]] != nil && st.Machines[payees[1]].Failed != 0 || st.Machines[payees[0]] != nil && st.Machines[payees[0]].Completed != 0 {
		t.Fatalf("records counted before the window closed: %+v", st.Machines)
	}
	// Settling twice, or expiring a settled escrow: refused.
	if r := h.block(h.tx(payer, TypeSettle, &Settle{Job: job(1)})); r[0].Code != CodeSettled {
		t.Fatalf("double settle: %d", r[0].Code)
	}
	if r := h.block(h.tx(payer, TypeExpire, &Expire{Job: job(1)})); r[0].Code != CodeSettled {
		t.Fatalf("expire a settled escrow: %d", r[0].Code)
	}
	h.closeWindows()
	if h.balance(payer.Address()) != 85*credit {
		t.Fatalf("payer after the window: %d (want the 25 unused refunded)", h.balance(payer.Address()))
	}
	st := h.app.Snapshot()
	if rec := st.Machines[payees[1]]; rec == nil || rec.Failed != 1 || st.Machines[payees[0]].Completed != 1 {
		t.Fatalf("machine records %+v", st.Machines)
	}
	if rec := st.Payers[string(payer.Address())]; rec == nil || *rec != (PayerRecord{Closed: 1, Paid: 15 * credit, Owed: 15 * credit, Marks: 1}) {
		t.Fatalf("payer record %+v", rec)
	}
	if _, open := st.Escrows[job(1)]; open {
		t.Fatal("the escrow is open after its window")
	}
	if r := h.block(h.tx(payer, TypeSettle, &Settle{Job: job(1)})); r[0].Code != CodeUnknownEscrow {
		t.Fatalf("settle a closed escrow: %d", r[0].Code)
	}
}

func TestEscrowClaimAndExpire(t *testing.T) {
	issuer, payer, m1, m2, mallory := key(t, 1), key(t, 2), key(t, 3), key(t, 4), key(t, 5)
	h := newHarness(t, nil, genesis(issuer, map[*identity.Key]uint64{payer: 100 * credit}, m1, m2))
	payees := []string{string(m1.Address()), string(m2.Address())}
	exp := h.now.Unix() + 60
	h.must(h.tx(payer, TypeOpenEscrow, &OpenEscrow{Job: job(2), Amount: 30 * credit, Expiry: exp, Payees: payees}))
	r1 := SignReceipt(payer, testChain, Receipt{Job: job(2), Payee: payees[0], Amount: 12 * credit, Seq: 3})

	// Before expiry: no claims.
	if r := h.block(h.tx(m1, TypeClaim, &Claim{Receipt: r1})); r[0].Code != CodeNotExpired {
		t.Fatalf("early claim: %d %s", r[0].Code, r[0].Log)
	}
	for h.now.Unix() < exp {
		h.block()
	}
	forged := SignReceipt(mallory, testChain, Receipt{Job: job(2), Payee: payees[0], Amount: 30 * credit, Seq: 4})
	tampered := r1
	tampered.Amount = 29 * credit
	for name, c := range map[string]struct {
		k    *identity.Key
		r    Receipt
		code uint32
	}{
		"forged receipt":         {m1, forged, CodeBadReceipt},
		"tampered receipt":       {m1, tampered, CodeBadReceipt},
		"someone else's receipt": {m2, r1, CodeNotPayee},
	} {
		if r := h.block(h.tx(c.k, TypeClaim, &Claim{Receipt: c.r})); r[0].Code != c.code {
			t.Fatalf("%s: code %d (%s), want %d", name, r[0].Code, r[0].Log, c.code)
		}
	}
	h.must(h.tx(m1, TypeClaim, &Claim{Receipt: r1}))
	if h.balance(m1.Address()) != 12*credit {
		t.Fatalf("claimed %d", h.balance(m1.Address()))
	}
	// The same receipt again pays nothing more.
	if r := h.block(h.tx(m1, TypeClaim, &Claim{Receipt: r1})); r[0].Code != CodeBadReceipt {
		t.Fatalf("double claim: %d", r[0].Code)
	}
	// A later receipt beyond what the escrow holds pays only what is left.
	big := SignReceipt(payer, testChain, Receipt{Job: job(2), Payee: payees[1], Amount: 50 * credit, Seq: 9})
	h.must(h.tx(m2, TypeClaim, &Claim{Receipt: big}))
	if h.balance(m2.Address()) != 18*credit {
		t.Fatalf("claim beyond escrow paid %d, want the 18 left", h.balance(m2.Address()))
	}
	// Expire: only after the claim grace, and only by the payer.
	if r := h.block(h.tx(payer, TypeExpire, &Expire{Job: job(2)})); r[0].Code != CodeNotExpired {
		t.Fatalf("early expire: %d %s", r[0].Code, r[0].Log)
	}
	h.now = h.now.Add(2 * 3600e9)
	if r := h.block(h.tx(m1, TypeExpire, &Expire{Job: job(2)})); r[0].Code != CodeNotPayer {
		t.Fatalf("payee expire: %d", r[0].Code)
	}
	h.must(h.tx(payer, TypeExpire, &Expire{Job: job(2)}))
	if h.balance(payer.Address()) != 70*credit || len(h.app.Snapshot().Escrows) != 0 {
		t.Fatalf("after expire: payer %d, escrows %d", h.balance(payer.Address()), len(h.app.Snapshot().Escrows))
	}
}

func TestEscrowExpireRefundsAll(t *testing.T) {
	issuer, payer, m1 := key(t, 1), key(t, 2), key(t, 3)
	h := newHarness(t, nil, genesis(issuer, map[*identity.Key]uint64{payer: 10 * credit}, m1))
	h.must(h.tx(payer, TypeOpenEscrow, &OpenEscrow{Job: job(3), Amount: 10 * credit, Expiry: h.now.Unix() + 30, Payees: []string{string(m1.Address())}}))
	h.now = h.now.Add(2 * 3600e9)
	h.must(h.tx(payer, TypeExpire, &Expire{Job: job(3)}))
	if h.balance(payer.Address()) != 10*credit {
		t.Fatal("expire did not refund")
	}
}

// randomTx makes a transaction, valid or not, from a small cast of keys.
func randomTx(h *harness, rng *rand.Rand, keys []*identity.Key) []byte {
	k := keys[rng.IntN(len(keys))]
	to := string(keys[rng.IntN(len(keys))].Address())
	amount := uint64(rng.IntN(5)) * credit / uint64(1+rng.IntN(3))
	j := job(rng.IntN(4))
	payees := []string{string(keys[1].Address()), string(keys[2].Address())}
	switch rng.IntN(9) {
	case 0:
		return h.tx(k, TypeGrant, &Grant{To: to, Amount: amount})
	case 1:
		return h.tx(k, TypeOpenEscrow, &OpenEscrow{Job: j, Amount: amount, Expiry: h.now.Unix() + int64(rng.IntN(100)), Payees: payees})
	case 2:
		return h.tx(k, TypeSettle, &Settle{Job: j, Payments: []Payment{{Machine: payees[rng.IntN(2)], Amount: amount / 2}}})
	case 3:
		r := SignReceipt(keys[rng.IntN(len(keys))], testChain, Receipt{Job: j, Payee: string(k.Address()), Amount: amount, Seq: uint64(rng.IntN(5))})
		return h.tx(k, TypeClaim, &Claim{Receipt: r})
	case 4:
		return h.tx(k, TypeExpire, &Expire{Job: j})
	case 5:
		b := h.tx(k, TypeTransfer, &Transfer{To: to, Amount: amount})
		if rng.IntN(4) == 0 {
			b[len(b)-1-rng.IntN(20)] ^= byte(1 + rng.IntN(255)) // corrupt it
		}
		return b
	default:
		return h.tx(k, TypeTransfer, &Transfer{To: to, Amount: amount})
	}
}

// TestRandomBlocksKeepInvariants: thousands of random transactions, valid
// and not, through real blocks; invariants hold after every block (the
// harness checks), and a second app fed the same blocks agrees on every
// app hash.
func TestRandomBlocksKeepInvariants(t *testing.T) {
	rng := rand.New(rand.NewPCG(42, 1))
	keys := []*identity.Key{key(t, 1), key(t, 2), key(t, 3), key(t, 4), key(t, 5), key(t, 6)}
	g := genesis(keys[0], map[*identity.Key]uint64{keys[1]: 20 * credit, keys[2]: 20 * credit})
	h := newHarness(t, nil, g)
	twin := newHarness(t, nil, g)
	ok, bad := 0, 0
	for b := 0; b < 300; b++ {
		var txs [][]byte
		for i := 0; i < 1+rng.IntN(20); i++ {
			txs = append(txs, randomTx(h, rng, keys))
		}
		for _, r := range h.block(txs...) {
			if r.Code == CodeOK {
				ok++
			} else {
				bad++
			}
		}
		twin.block(txs...)
		if string(h.hash()) != string(twin.hash()) {
			t.Fatalf("block %d: the two apps disagree", b)
		}
	}
	if ok < 300 || bad < 300 {
		t.Fatalf("%d accepted and %d rejected: the generator does not exercise both paths", ok, bad)
	}
	t.Logf("%d transactions accepted, %d rejected", ok, bad)
}

func TestPersistentAppRestartsAtSameHash(t *testing.T) {
	dir := t.TempDir()
	issuer, alice, bob := key(t, 1), key(t, 2), key(t, 3)
	app, err := OpenApp(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, app, genesis(issuer, map[*identity.Key]uint64{alice: 10 * credit}, bob))
	h.must(h.tx(alice, TypeTransfer, &Transfer{To: string(bob.Address()), Amount: 3 * credit}))
	h.must(h.tx(alice, TypeOpenEscrow, &OpenEscrow{Job: job(5), Amount: credit, Expiry: h.now.Unix() + 100, Payees: []string{string(bob.Address())}}))
	want := h.hash()
	height := h.height
	app.Close()

	app2, err := OpenApp(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer app2.Close()
	info, _ := app2.Info(context.Background(), &abci.RequestInfo{})
	if info.LastBlockHeight != height || string(info.LastBlockAppHash) != string(want) {
		t.Fatalf("after reopen: height %d hash %X, want %d %X", info.LastBlockHeight, info.LastBlockAppHash, height, want)
	}
	if app2.Snapshot().Accounts[string(bob.Address())].Balance != 3*credit {
		t.Fatal("balance lost")
	}
}

func FuzzCheckTx(f *testing.F) {
	issuer, alice := key(f, 1), key(f, 2)
	seed, _ := NewTx(alice, testChain, TypeTransfer, 0, &Transfer{To: string(issuer.Address()), Amount: 5})
	f.Add(seed)
	vote, _ := NewTx(alice, testChain, TypeValidatorVote, 0, &ValidatorVote{PubKey: issuer.Public(), Power: 10, Name: "u"})
	f.Add(vote)
	admit, _ := NewTx(issuer, testChain, TypeAdmit, 0, &Admit{Account: string(alice.Address())})
	f.Add(admit)
	f.Add([]byte{0xa0})
	app := NewMemoryApp(nil)
	raw, _ := jsonMarshal(genesis(issuer, map[*identity.Key]uint64{alice: 10}))
	app.InitChain(context.Background(), &abci.RequestInitChain{ChainId: testChain, InitialHeight: 1, AppStateBytes: raw,
		Validators: []abci.ValidatorUpdate{abci.Ed25519ValidatorUpdate(alice.Public(), 10)}})
	f.Fuzz(func(t *testing.T, b []byte) {
		resp, err := app.CheckTx(context.Background(), &abci.RequestCheckTx{Tx: b})
		if err != nil {
			t.Fatal(err)
		}
		if resp.Code != CodeOK && resp.Log == "" {
			t.Fatal("rejection without a reason")
		}
		d, err := DecodeTx(b)
		if err == nil && d.msg == nil {
			t.Fatal("decoded without a message")
		}
		if resp.Code == CodeOK {
			if err != nil {
				t.Fatalf("admitted bytes that do not decode: %v", err)
			}
			assertCanonical(t, b, d)
		}
	})
}

// assertCanonical: accepted bytes are the one encoding of what they
// decode to, envelope and body, so they have one hash.
func assertCanonical(t *testing.T, b []byte, d *decoded) {
	t.Helper()
	again, err := wire.Marshal(&d.tx)
	if err != nil || !bytes.Equal(again, b) {
		t.Fatalf("accepted %x, which encodes back to %x (%v)", b, again, err)
	}
	body, err := wire.Marshal(d.msg)
	if err != nil || !bytes.Equal(body, d.tx.Body) {
		t.Fatalf("accepted body %x, which encodes back to %x (%v)", d.tx.Body, body, err)
	}
}

func FuzzDecodeTx(f *testing.F) {
	k := key(f, 1)
	to := string(k.Address())
	for typ, msg := range map[string]any{
		TypeTransfer: &Transfer{To: to, Amount: 1, Memo: "m"}, TypeGrant: &Grant{To: to, Amount: 1},
		TypeOpenEscrow: &OpenEscrow{Job: job(1), Amount: 5, Expiry: 9, Payees: []string{to}}, TypeSettle: &Settle{Job: job(1), Payments: []Payment{{Machine: to, Amount: 1}}},
		TypeClaim: &Claim{Receipt: Receipt{Job: job(1), Payee: to, Amount: 1, Seq: 2, Sig: make([]byte, 64)}}, TypeExpire: &Expire{Job: job(1)},
		TypeLinkMachine:   &LinkMachine{Consent: SignLinkConsent(k, testChain, k.Address(), Registration{Owner: to, Height: 7}, 100)},
		TypeValidatorVote: &ValidatorVote{PubKey: k.Public(), Power: 3}, TypeAdmit: &Admit{Account: to, Revoke: true},
	} {
		b, _ := NewTx(k, testChain, typ, 0, msg)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := DecodeTx(b)
		if err != nil {
			if CodeOf(err) == CodeOK {
				t.Fatal("error with code OK")
			}
			return
		}
		if d.msg == nil || d.signer == "" {
			t.Fatal("decoded without a message or signer")
		}
		assertCanonical(t, b, d)
	})
}

// TestPrepareProposalOrdersNonces: a mempool that holds an account's
// transactions out of order still yields a block that runs them all.
func TestPrepareProposalOrdersNonces(t *testing.T) {
	issuer, alice, bob := key(t, 1), key(t, 2), key(t, 3)
	h := newHarness(t, nil, genesis(issuer, map[*identity.Key]uint64{alice: 10 * credit, bob: 10 * credit}))
	mk := func(k *identity.Key, n uint64) []byte {
		b, _ := NewTx(k, testChain, TypeTransfer, n, &Transfer{To: string(issuer.Address()), Amount: credit})
		return b
	}
	mempool := [][]byte{mk(alice, 2), mk(bob, 1), mk(alice, 0), []byte("junk"), mk(bob, 0), mk(alice, 1)}
	resp, err := h.app.PrepareProposal(context.Background(), &abci.RequestPrepareProposal{Txs: mempool, MaxTxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Txs) != len(mempool) || string(resp.Txs[3]) != "junk" {
		t.Fatalf("proposal changed the set or moved undecodable bytes")
	}
	ok := 0
	for _, r := range h.block(resp.Txs...) {
		if r.Code == CodeOK {
			ok++
		}
	}
	if ok != 5 {
		t.Fatalf("%d of 5 transfers ran", ok)
	}
	small, _ := h.app.PrepareProposal(context.Background(), &abci.RequestPrepareProposal{Txs: mempool, MaxTxBytes: int64(len(mempool[0]) + 1)})
	if len(small.Txs) != 1 {
		t.Fatalf("byte limit: %d txs", len(small.Txs))
	}
}

// TestCommittedWakesOnEachBlock: a reader waiting on Committed wakes when
// the next block is stored, and only then.
func TestCommittedWakesOnEachBlock(t *testing.T) {
	h := newHarness(t, nil, genesis(key(t, 1), nil))
	for range 2 {
		next := h.app.Committed()
		select {
		case <-next:
			t.Fatal("woken before the block")
		default:
		}
		h.block()
		select {
		case <-next:
		default:
			t.Fatal("not woken by the block")
		}
	}
}
