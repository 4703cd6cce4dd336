package ledger

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	abci "github.com/cometbft/cometbft/abci/types"

	"github.com/deepmarket/deepmarket/identity"
)

// checkTx runs CheckTx as a node's mempool would.
func checkTx(t testing.TB, app *App, tx []byte) *abci.ResponseCheckTx {
	t.Helper()
	res, err := app.CheckTx(context.Background(), &abci.RequestCheckTx{Tx: tx, Type: abci.CheckTxType_New})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// freshKeys are n keys nobody admitted.
func freshKeys(t testing.TB, n int) []*identity.Key {
	out := make([]*identity.Key, n)
	for i := range out {
		k, err := identity.KeyFromSeed(append([]byte(fmt.Sprintf("fresh-%d", i)), make([]byte, 32)...)[:32])
		if err != nil {
			t.Fatal(err)
		}
		out[i] = k
	}
	return out
}

// TestStrangersWriteNothing: 3,000 fresh keys with no credits try every
// free write (links, links of each other, escrows, claims, admits, votes,
// transfers of nothing). CheckTx refuses every one before the mempool;
// a block that carries them anyway refuses every one; the state, its hash
// and its size are what they were.
func TestStrangersWriteNothing(t *testing.T) {
	issuer, alice := key(t, 1), key(t, 2)
	h := newHarnessWith(t, nil, genesis(issuer, map[*identity.Key]uint64{alice: 10 * credit}), genesisVals(valKeys(t, 1)))
	h.must(h.tx(alice, TypeTransfer, &Transfer{To: string(issuer.Address()), Amount: credit}))
	before, books := h.hash(), h.app.Snapshot().books.String()
	strangers := freshKeys(t, 3000)
	var txs [][]byte
	for i, k := range strangers {
		other := strangers[(i+1)%len(strangers)]
		var tx []byte
		switch i % 6 {
		case 0: // its own machine, linked to itself: a free entry
			tx = h.tx(k, TypeLinkMachine, &LinkMachine{Consent: h.consent(other, k.Address())})
		case 1:
			tx = h.tx(k, TypeOpenEscrow, &OpenEscrow{Job: job(i), Amount: 1, Expiry: h.now.Unix() + 100, Payees: []string{string(alice.Address())}})
		case 2:
			tx = h.tx(k, TypeAdmit, &Admit{Account: string(k.Address())})
		case 3:
			tx = h.tx(k, TypeClaim, &Claim{Receipt: SignReceipt(k, testChain, Receipt{Job: job(i), Payee: string(k.Address()), Amount: 1})})
		case 4:
			tx = h.tx(k, TypeValidatorVote, &ValidatorVote{PubKey: k.Public(), Power: 1})
		default:
			tx = h.tx(k, TypeTransfer, &Transfer{To: string(other.Address()), Amount: 1})
		}
		txs = append(txs, tx)
	}
	refused := map[uint32]int{}
	for _, tx := range txs {
		res := checkTx(t, h.app, tx)
		if res.Code == CodeOK {
			t.Fatalf("CheckTx admitted a stranger's transaction")
		}
		refused[res.Code]++
	}
	if refused[CodeNotMember] != 2500 || refused[CodeNotValidator] != 500 {
		t.Fatalf("CheckTx refusals by code: %v", refused)
	}
	accepted := 0
	for _, r := range h.block(txs...) {
		if r.Code == CodeOK {
			accepted++
		}
	}
	if accepted != 0 || !bytes.Equal(h.hash(), before) || h.app.Snapshot().books.String() != books {
		t.Fatalf("%d of %d strangers' transactions accepted; books %s, were %s", accepted, len(txs), h.app.Snapshot().books, books)
	}
}

// TestAdmitAndRevoke: an issuer admits an account without moving credits;
// the member signs; only the issuer that admitted it revokes it, and a
// revoked account signs nothing; genesis members stay.
func TestAdmitAndRevoke(t *testing.T) {
	issuer, other, alice, bob, carol := key(t, 1), key(t, 7), key(t, 2), key(t, 3), key(t, 4)
	g := genesis(issuer, map[*identity.Key]uint64{alice: 10 * credit})
	g.Issuers = append(g.Issuers, GenesisIssuer{Address: string(other.Address()), Quota: credit})
	h := newHarness(t, nil, g)
	h.must(h.tx(alice, TypeTransfer, &Transfer{To: string(bob.Address()), Amount: 2 * credit}))
	// Bob holds credits but no issuer admitted him: he signs nothing.
	expectCode(t, h.block(h.tx(bob, TypeTransfer, &Transfer{To: string(alice.Address()), Amount: 1})), CodeNotMember, "not a member")
	expectCode(t, h.block(h.tx(alice, TypeAdmit, &Admit{Account: string(bob.Address())})), CodeNotIssuer, "only issuers admit")
	h.must(h.tx(issuer, TypeAdmit, &Admit{Account: string(bob.Address())}))
	if st := h.app.Snapshot(); st.Supply != 10*credit || st.Members[string(bob.Address())].By != string(issuer.Address()) {
		t.Fatalf("after admit: supply %d, member %+v", st.Supply, st.Members[string(bob.Address())])
	}
	h.must(h.tx(bob, TypeTransfer, &Transfer{To: string(alice.Address()), Amount: 1}))
	expectCode(t, h.block(h.tx(issuer, TypeAdmit, &Admit{Account: string(bob.Address())})), CodeAlreadyMember, "member already")
	expectCode(t, h.block(h.tx(other, TypeAdmit, &Admit{Account: string(bob.Address()), Revoke: true})), CodeNotIssuer, "admitted by "+string(issuer.Address()))
	expectCode(t, h.block(h.tx(issuer, TypeAdmit, &Admit{Account: string(alice.Address()), Revoke: true})), CodeNotIssuer, "admitted by genesis")
	expectCode(t, h.block(h.tx(issuer, TypeAdmit, &Admit{Account: string(carol.Address()), Revoke: true})), CodeNotMember, "nothing to revoke")
	h.must(h.tx(issuer, TypeAdmit, &Admit{Account: string(bob.Address()), Revoke: true}))
	expectCode(t, h.block(h.tx(bob, TypeTransfer, &Transfer{To: string(alice.Address()), Amount: 1})), CodeNotMember, "not a member")
	// A grant admits its recipient.
	h.must(h.tx(other, TypeGrant, &Grant{To: string(carol.Address()), Amount: credit}))
	h.must(h.tx(carol, TypeTransfer, &Transfer{To: string(alice.Address()), Amount: 1}))
	if st := h.app.Snapshot(); st.Members[string(carol.Address())].By != string(other.Address()) || st.balanceOf(string(bob.Address())) != 2*credit-1 {
		t.Fatalf("carol %+v, bob's balance %d", st.Members[string(carol.Address())], st.balanceOf(string(bob.Address())))
	}
}

// limitsGenesis is genesis with small limits, so tests reach them.
func limitsGenesis(issuer *identity.Key, balances map[*identity.Key]uint64, members ...*identity.Key) GenesisState {
	g := genesis(issuer, balances, members...)
	p := *g.Params // no link stake: the limits alone
	p.MaxMachinesPerOwner, p.MaxOpenEscrows, p.MaxTxsPerBlock, p.ConsentBlocks = 2, 2, 3, 4
	g.Params = &p
	return g
}

// TestMemberLimits: machines per owner, escrows per payer, the least a
// transfer that opens an account moves, registered payees only.
func TestMemberLimits(t *testing.T) {
	issuer, alice, owner, m1, m2, m3, stranger := key(t, 1), key(t, 2), key(t, 3), key(t, 4), key(t, 5), key(t, 6), key(t, 8)
	h := newHarness(t, nil, limitsGenesis(issuer, map[*identity.Key]uint64{alice: 100 * credit}, owner))
	h.must(h.tx(owner, TypeLinkMachine, &LinkMachine{Consent: h.consent(m1, owner.Address())}))
	h.must(h.tx(owner, TypeLinkMachine, &LinkMachine{Consent: h.consent(m2, owner.Address())}))
	expectCode(t, h.block(h.tx(owner, TypeLinkMachine, &LinkMachine{Consent: h.consent(m3, owner.Address())})), CodeLimitReached, "2 machines linked")

	// Payees: m1 (linked to a member) and alice (a member) are
	// registered; a stranger is not.
	exp := h.now.Unix() + 600
	expectCode(t, h.block(h.tx(alice, TypeOpenEscrow, &OpenEscrow{Job: job(1), Amount: credit, Expiry: exp,
		Payees: []string{string(m1.Address()), string(stranger.Address())}})), CodeNotRegistered, string(stranger.Address()))
	h.must(h.tx(alice, TypeOpenEscrow, &OpenEscrow{Job: job(1), Amount: credit, Expiry: exp, Payees: []string{string(m1.Address())}}))
	h.must(h.tx(alice, TypeOpenEscrow, &OpenEscrow{Job: job(2), Amount: credit, Expiry: exp, Payees: []string{string(alice.Address())}}))
	expectCode(t, h.block(h.tx(alice, TypeOpenEscrow, &OpenEscrow{Job: job(3), Amount: credit, Expiry: exp,
		Payees: []string{string(m2.Address())}})), CodeLimitReached, "2 escrows open")
	// A settled escrow counts until its dispute window closes.
	h.must(h.tx(alice, TypeSettle, &Settle{Job: job(2)}))
	expectCode(t, h.block(h.tx(alice, TypeOpenEscrow, &OpenEscrow{Job: job(3), Amount: credit, Expiry: exp,
		Payees: []string{string(m2.Address())}})), CodeLimitReached, "2 escrows open")
	h.closeWindows()
	h.must(h.tx(alice, TypeOpenEscrow, &OpenEscrow{Job: job(3), Amount: credit, Expiry: h.now.Unix() + 600, Payees: []string{string(m2.Address())}}))

	// A new account opens with at least MinNewAccount; one that exists
	// takes any amount.
	expectCode(t, h.block(h.tx(alice, TypeTransfer, &Transfer{To: string(stranger.Address()), Amount: credit - 1})), CodeInvalidAmount, "no account yet")
	h.must(h.tx(alice, TypeTransfer, &Transfer{To: string(stranger.Address()), Amount: credit}))
	h.must(h.tx(alice, TypeTransfer, &Transfer{To: string(stranger.Address()), Amount: 1}))

	// Unlinking frees a slot once the entry it leaves goes,
	// ConsentBlocks later; relinking the machine it left takes no other.
	h.must(h.tx(owner, TypeLinkMachine, &LinkMachine{Consent: h.consent(m2, m2.Address())}))
	expectCode(t, h.block(h.tx(owner, TypeLinkMachine, &LinkMachine{Consent: h.consent(m3, owner.Address())})), CodeLimitReached, "unlinked in the last 4 blocks")
	h.must(h.tx(owner, TypeLinkMachine, &LinkMachine{Consent: h.consent(m2, owner.Address())}))
	h.must(h.tx(owner, TypeLinkMachine, &LinkMachine{Consent: h.consent(m2, m2.Address())}))
	for range 4 {
		h.block()
	}
	h.must(h.tx(owner, TypeLinkMachine, &LinkMachine{Consent: h.consent(m3, owner.Address())}))
	if st := h.app.Snapshot(); st.linksOf[string(owner.Address())] != 2 {
		t.Fatalf("owner has %d machines", st.linksOf[string(owner.Address())])
	}
}

// TestRateLimitPerSigner: at most MaxTxsPerBlock of one signer in a
// block, refused beyond in block order, and as many pending in the
// mempool view.
func TestRateLimitPerSigner(t *testing.T) {
	issuer, alice, bob := key(t, 1), key(t, 2), key(t, 3)
	h := newHarness(t, nil, limitsGenesis(issuer, map[*identity.Key]uint64{alice: 100 * credit, bob: 100 * credit}))
	var txs [][]byte
	for i := 0; i < 5; i++ {
		txs = append(txs, h.tx(alice, TypeTransfer, &Transfer{To: string(bob.Address()), Amount: credit}))
	}
	txs = append(txs, h.tx(bob, TypeTransfer, &Transfer{To: string(alice.Address()), Amount: credit}))
	var codes []uint32
	for _, r := range h.block(txs...) {
		codes = append(codes, r.Code)
	}
	if fmt.Sprint(codes) != fmt.Sprint([]uint32{CodeOK, CodeOK, CodeOK, CodeRateLimited, CodeRateLimited, CodeOK}) {
		t.Fatalf("codes %v", codes)
	}
	if h.balance(alice.Address()) != 98*credit {
		t.Fatalf("alice %d", h.balance(alice.Address()))
	}
	// The mempool holds at most 3 of alice's at once.
	for i := 0; i < 4; i++ {
		res := checkTx(t, h.app, h.tx(alice, TypeTransfer, &Transfer{To: string(bob.Address()), Amount: 1}))
		if want := map[bool]uint32{true: CodeOK, false: CodeRateLimited}[i < 3]; res.Code != want {
			t.Fatalf("pending %d: code %d (%s), want %d", i, res.Code, res.Log, want)
		}
	}
}

// TestLinkConsentCannotBeReplayed: a consent serves for the one change it
// names. Once the machine moved on, its old consents (to its first owner,
// to be unlinked) are refused; so are consents expired, too far ahead,
// from another chain, or signed by someone other than the new owner.
func TestLinkConsentCannotBeReplayed(t *testing.T) {
	issuer, first, second, m := key(t, 1), key(t, 2), key(t, 3), key(t, 4)
	h := newHarness(t, nil, genesis(issuer, nil, first, second))
	toFirst := h.consent(m, first.Address())
	h.must(h.tx(first, TypeLinkMachine, &LinkMachine{Consent: toFirst}))
	// The machine moves to the second owner with a fresh consent.
	toSecond := h.consent(m, second.Address())
	h.must(h.tx(second, TypeLinkMachine, &LinkMachine{Consent: toSecond}))
	if o, ok := h.app.MachineOwner(m.Address()); o != second.Address() || !ok {
		t.Fatalf("machine earns for %s (%v)", o, ok)
	}
	before := h.hash()
	fresh := h.consent(m, first.Address())
	badChain := fresh
	badChain.Sig = m.Sign(badChain.signBytes("deepmarket-other"))
	now := Registration{Owner: string(second.Address()), Changed: h.height, Height: h.height}
	expired := SignLinkConsent(m, testChain, first.Address(), now, h.now.Unix()-1)
	tooFar := SignLinkConsent(m, testChain, first.Address(), now, h.now.Unix()+2*MaxConsentTTL)
	future := fresh
	future.Height = h.height + 100
	future.Sig = m.Sign(future.signBytes(testChain))
	forged := fresh
	forged.Owner = string(issuer.Address())
	for _, c := range []struct {
		name    string
		by      *identity.Key
		consent LinkConsent
		code    uint32
		want    string
	}{
		{"the first owner replays its consent", first, toFirst, CodeBadNonce, "fresh consent"},
		{"the second owner replays its own", second, toSecond, CodeBadNonce, "fresh consent"},
		{"a consent for another chain", first, badChain, CodeBadSignature, "does not verify"},
		{"expired", first, expired, CodeExpired, "expired"},
		{"too far ahead", first, tooFar, CodeExpired, "more than 3600s"},
		{"naming a height not reached", first, future, CodeBadNonce, "a height its machine saw"},
		{"signed by someone else than the new owner", second, fresh, CodeBadSignature, "the new owner"},
		{"owner changed after signing", issuer, forged, CodeBadSignature, "does not verify"},
	} {
		expectCode(t, h.block(h.tx(c.by, TypeLinkMachine, &LinkMachine{Consent: c.consent})), c.code, c.want)
		if !bytes.Equal(before, h.hash()) {
			t.Fatalf("%s: a refused link changed the state", c.name)
		}
	}
	// Unlinking needs the machine's consent too, signed by the owner.
	unlink := h.consent(m, m.Address())
	expectCode(t, h.block(h.tx(first, TypeLinkMachine, &LinkMachine{Consent: unlink})), CodeBadSignature, "an unlink is signed by the owner")
	h.must(h.tx(second, TypeLinkMachine, &LinkMachine{Consent: unlink}))
	if o, ok := h.app.MachineOwner(m.Address()); o != m.Address() || ok {
		t.Fatalf("unlinked machine earns for %s (registered %v)", o, ok)
	}
	// Now unlinked again: the consent it gave while unlinked before (to
	// the first owner) is still refused, for as long as the entry the
	// unlink left is kept, and after that it is too old.
	unlinked := h.height
	expectCode(t, h.block(h.tx(first, TypeLinkMachine, &LinkMachine{Consent: toFirst})), CodeBadNonce, fmt.Sprintf("since height %d", unlinked))
	if l := h.app.Snapshot().Links[string(m.Address())]; l.Owner != string(m.Address()) || l.Former != string(second.Address()) || l.Changed != unlinked {
		t.Fatalf("link %+v", l)
	}
}

// TestConsentsOutliveNoEntry: an unlinked machine's entry is kept for
// ConsentBlocks, counted against the owner it left, and then goes; every
// consent the machine gave before the unlink is refused all along (while
// the entry is kept, because the link changed after it; then, because it
// is older than ConsentBlocks), so the entry's removal revives none.
func TestConsentsOutliveNoEntry(t *testing.T) {
	issuer, owner, m := key(t, 1), key(t, 2), key(t, 4)
	h := newHarness(t, nil, limitsGenesis(issuer, nil, owner))
	window := h.app.Snapshot().Params.ConsentBlocks
	link := h.consent(m, owner.Address())
	h.must(h.tx(owner, TypeLinkMachine, &LinkMachine{Consent: link}))
	h.must(h.tx(owner, TypeLinkMachine, &LinkMachine{Consent: h.consent(m, m.Address())}))
	unlinked := h.height
	if st := h.app.Snapshot(); st.linksOf[string(owner.Address())] != 1 || st.Links[string(m.Address())] == nil {
		t.Fatalf("after the unlink: %d counted, entry %+v", st.linksOf[string(owner.Address())], st.Links[string(m.Address())])
	}
	for h.height+1 < unlinked+window {
		expectCode(t, h.block(h.tx(owner, TypeLinkMachine, &LinkMachine{Consent: link})), CodeBadNonce, "fresh consent")
	}
	if _, ok := h.app.Snapshot().Links[string(m.Address())]; !ok {
		t.Fatalf("at height %d the entry is gone, %d blocks after the unlink", h.height, h.height-unlinked)
	}
	// The block at unlinked+window removes the entry before it runs the
	// replay it carries, which is refused as too old.
	expectCode(t, h.block(h.tx(owner, TypeLinkMachine, &LinkMachine{Consent: link})), CodeExpired, "more than")
	st := h.app.Snapshot()
	if _, ok := st.Links[string(m.Address())]; ok || st.linksOf[string(owner.Address())] != 0 {
		t.Fatalf("at height %d: entry %+v, %d counted for the owner", h.height, st.Links[string(m.Address())], st.linksOf[string(owner.Address())])
	}
	// A fresh consent links it again.
	h.must(h.tx(owner, TypeLinkMachine, &LinkMachine{Consent: h.consent(m, owner.Address())}))
}

// TestClaimByLinkedMachine: a machine that is no member itself, linked to
// a member, is paid from an escrow: it claims (its standing comes from
// the payer) and its owner is credited; it signs nothing else.
func TestClaimByLinkedMachine(t *testing.T) {
	issuer, payer, owner, m := key(t, 1), key(t, 2), key(t, 3), key(t, 4)
	h := newHarness(t, nil, genesis(issuer, map[*identity.Key]uint64{payer: 50 * credit}, owner))
	h.must(h.tx(owner, TypeLinkMachine, &LinkMachine{Consent: h.consent(m, owner.Address())}))
	exp := h.now.Unix() + 30
	h.must(h.tx(payer, TypeOpenEscrow, &OpenEscrow{Job: job(4), Amount: 20 * credit, Expiry: exp, Payees: []string{string(m.Address())}}))
	r := SignReceipt(payer, testChain, Receipt{Job: job(4), Payee: string(m.Address()), Amount: 7 * credit, Seq: 1})
	for h.now.Unix() < exp {
		h.block()
	}
	h.must(h.tx(m, TypeClaim, &Claim{Receipt: r}))
	if h.balance(owner.Address()) != 7*credit || h.balance(m.Address()) != 0 {
		t.Fatalf("owner %d, machine %d", h.balance(owner.Address()), h.balance(m.Address()))
	}
	expectCode(t, h.block(h.tx(m, TypeExpire, &Expire{Job: job(4)})), CodeNotMember, "not a member")
	expectCode(t, h.block(h.tx(m, TypeClaim, &Claim{Receipt: SignReceipt(payer, testChain, Receipt{Job: job(5), Payee: string(m.Address()), Amount: 1})})),
		CodeNotMember, "not a member")
}

// TestEmptyBlocksKeepTheHash: blocks without transactions, or with only
// refused ones, leave the app hash as it was; any change moves it.
func TestEmptyBlocksKeepTheHash(t *testing.T) {
	issuer, alice := key(t, 1), key(t, 2)
	h := newHarness(t, nil, genesis(issuer, map[*identity.Key]uint64{alice: 10 * credit}))
	h.block()
	first := h.hash()
	for i := 0; i < 20; i++ {
		h.block()
	}
	h.block(h.tx(alice, TypeTransfer, &Transfer{To: string(issuer.Address()), Amount: 11 * credit}))
	if !bytes.Equal(first, h.hash()) {
		t.Fatal("empty blocks changed the app hash")
	}
	h.must(h.tx(alice, TypeTransfer, &Transfer{To: string(issuer.Address()), Amount: credit}))
	if bytes.Equal(first, h.hash()) {
		t.Fatal("a transfer left the app hash as it was")
	}
}

// TestStoreReopensAndPrunes: a persistent app run for a few hundred
// blocks reopens at the same height, hash, state and block time (CheckTx
// of an escrow, which reads the time, passes at once), keeps at most the
// last versions, and a twin in memory agrees on every hash.
func TestStoreReopensAndPrunes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "app")
	issuer, alice, bob := key(t, 1), key(t, 2), key(t, 3)
	app, err := OpenApp(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	g := genesis(issuer, map[*identity.Key]uint64{alice: 1000 * credit}, bob)
	h := newHarness(t, app, g)
	twin := newHarness(t, nil, g)
	for i := 0; i < 3*storeKeep; i++ {
		var txs [][]byte
		if i%3 == 0 {
			txs = append(txs, h.tx(alice, TypeTransfer, &Transfer{To: string(bob.Address()), Amount: credit}))
		}
		h.block(txs...)
		twin.block(txs...)
		if !bytes.Equal(h.hash(), twin.hash()) {
			t.Fatalf("block %d: the disk and memory apps disagree", h.height)
		}
	}
	if v := app.store.tree.AvailableVersions(); len(v) > storeKeep+pruneEvery || v[len(v)-1] != int(h.height) {
		t.Fatalf("%d versions kept (%d..%d)", len(v), v[0], v[len(v)-1])
	}
	want := app.Snapshot()
	app.Close()
	again, err := OpenApp(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	got := again.Snapshot()
	if got.Height != want.Height || got.Time != want.Time || !bytes.Equal(got.AppHash, want.AppHash) || got.books.String() != want.books.String() {
		t.Fatalf("reopened at %d/%d/%X (%s), was %d/%d/%X (%s)", got.Height, got.Time, got.AppHash, got.books, want.Height, want.Time, want.AppHash, want.books)
	}
	if p := again.Verify(); len(p) > 0 {
		t.Fatalf("reopened: %v", p)
	}
	tx, _ := NewTx(alice, testChain, TypeOpenEscrow, got.Accounts[string(alice.Address())].Nonce,
		&OpenEscrow{Job: job(9), Amount: credit, Expiry: h.now.Unix() + 600, Payees: []string{string(bob.Address())}})
	if res := checkTx(t, again, tx); res.Code != CodeOK {
		t.Fatalf("CheckTx after reopening: %d %s", res.Code, res.Log)
	}
}

// TestOldStateFormatRefused: a ledger directory written by the badger
// release is refused with a message that says what to do.
func TestOldStateFormatRefused(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"MANIFEST", "KEYREGISTRY", "000001.vlog"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("badger"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	_, err := OpenApp(dir, nil)
	if !errors.Is(err, ErrOldStateFormat) || !strings.Contains(err.Error(), "deepmarket init --force") {
		t.Fatalf("opening a badger ledger: %v", err)
	}
}

// TestBrokenInvariantHalts: a change that breaks the books (credits made
// from nothing) halts FinalizeBlock, caught in O(changes); an entry
// changed without being written to the store is caught by the full check.
func TestBrokenInvariantHalts(t *testing.T) {
	issuer, alice := key(t, 1), key(t, 2)
	h := newHarness(t, nil, genesis(issuer, map[*identity.Key]uint64{alice: 10 * credit}))
	h.must(h.tx(alice, TypeTransfer, &Transfer{To: string(issuer.Address()), Amount: credit}))

	h.app.mu.Lock()
	h.app.state.Accounts[string(alice.Address())].Balance += 5 // no touch: the store does not see it
	h.app.mu.Unlock()
	if p := h.app.Verify(); len(p) == 0 || !strings.Contains(strings.Join(p, "\n"), "differs from the state's") {
		t.Fatalf("full check of an unwritten change: %v", p)
	}
	h.app.mu.Lock()
	h.app.state.touch(pAccount, string(alice.Address())) // now it is written: credits from nothing
	h.app.mu.Unlock()
	defer func() {
		r := recover()
		if r == nil || !strings.Contains(fmt.Sprint(r), "invariant broken") || !strings.Contains(fmt.Sprint(r), "supply 10000000 != balances 10000005") {
			t.Fatalf("FinalizeBlock went on with credits made from nothing: %v", r)
		}
	}()
	h.app.FinalizeBlock(context.Background(), &abci.RequestFinalizeBlock{Height: h.height + 1, Time: h.now})
}
