package ledger

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	abci "github.com/cometbft/cometbft/abci/types"

	"github.com/deepmarket/deepmarket/identity"
)

// valKeys are n validator keys, distinct from the harness' account keys.
func valKeys(t testing.TB, n int) []*identity.Key {
	out := make([]*identity.Key, n)
	for i := range out {
		out[i] = key(t, byte(100+i))
	}
	return out
}

func genesisVals(keys []*identity.Key, powers ...int64) []abci.ValidatorUpdate {
	var out []abci.ValidatorUpdate
	for i, k := range keys {
		p := int64(10)
		if i < len(powers) {
			p = powers[i]
		}
		out = append(out, abci.Ed25519ValidatorUpdate(k.Public(), p))
	}
	return out
}

func vote(h *harness, by *identity.Key, of *identity.Key, power int64, name string) []byte {
	h.t.Helper()
	return h.tx(by, TypeValidatorVote, &ValidatorVote{PubKey: of.Public(), Power: power, Name: name})
}

// set reads the validators query as a client would.
func set(t testing.TB, app *App) ValidatorSet {
	t.Helper()
	res, err := app.Query(context.Background(), &abci.RequestQuery{Path: "/validators"})
	if err != nil || res.Code != CodeOK {
		t.Fatalf("validators query: %v %+v", err, res)
	}
	var v ValidatorSet
	if err := json.Unmarshal(res.Value, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// powersOf is the set as "name-or-account=power", by key order.
func powersOf(h *harness) map[string]int64 {
	out := map[string]int64{}
	for _, v := range h.app.Snapshot().Validators {
		out[string(identity.AddressOf(v.PubKey))] = v.Power
	}
	return out
}

func updatesString(us []abci.ValidatorUpdate) string {
	var parts []string
	for _, u := range us {
		parts = append(parts, fmt.Sprintf("%s=%d", identity.AddressOf(u.PubKey.GetEd25519()), u.Power))
	}
	return strings.Join(parts, " ")
}

// notAPoint is 32 bytes that decode to no point of the curve (y = 2).
var notAPoint = append([]byte{2}, make([]byte, 31)...)

func expectCode(t testing.TB, rs []*abci.ExecTxResult, want uint32, contains string) {
	t.Helper()
	if rs[0].Code != want || !strings.Contains(rs[0].Log, contains) {
		t.Fatalf("code %d %q, want %d containing %q", rs[0].Code, rs[0].Log, want, contains)
	}
}

// TestValidatorVoteNeedsTwoThirds: in a set of four equal validators a
// newcomer needs three votes (30 of 40 > 2/3); two change nothing, the
// third carries it and FinalizeBlock returns it to CometBFT.
func TestValidatorVoteNeedsTwoThirds(t *testing.T) {
	vs := valKeys(t, 4)
	uni := key(t, 150)
	h := newHarnessWith(t, nil, genesis(key(t, 1), nil), genesisVals(vs))
	if got := set(t, h.app); got.TotalPower != 40 || len(got.Validators) != 4 || len(got.Proposals) != 0 {
		t.Fatalf("genesis set %+v", got)
	}

	h.must(vote(h, vs[0], uni, 10, "uni-e"))
	h.must(vote(h, vs[1], uni, 10, ""))
	if len(h.updates) != 0 || len(powersOf(h)) != 4 {
		t.Fatalf("two of four votes changed the set: updates %v", updatesString(h.updates))
	}
	got := set(t, h.app)
	if len(got.Proposals) != 1 {
		t.Fatalf("proposals %+v", got.Proposals)
	}
	p := got.Proposals[0]
	if !bytes.Equal(p.PubKey, uni.Public()) || p.Power != 10 || p.Name != "uni-e" || p.VotePower != 20 || p.Needed != 27 || len(p.Voters) != 2 {
		t.Fatalf("proposal %+v", p)
	}

	// A second identical vote is refused and spends no nonce.
	before := h.hash()
	expectCode(t, h.block(vote(h, vs[1], uni, 10, "")), CodeAlreadyVoted, "20 of the 27")
	if !bytes.Equal(before, h.hash()) {
		t.Fatal("a refused vote changed the state")
	}

	rs := h.block(vote(h, vs[2], uni, 10, ""))
	if rs[0].Code != CodeOK {
		t.Fatalf("third vote: %d %s", rs[0].Code, rs[0].Log)
	}
	if want := fmt.Sprintf("%s=10", uni.Address()); updatesString(h.updates) != want {
		t.Fatalf("updates %q, want %q", updatesString(h.updates), want)
	}
	got = set(t, h.app)
	if got.TotalPower != 50 || len(got.Validators) != 5 || len(got.Proposals) != 0 {
		t.Fatalf("set after the third vote: %+v", got)
	}
	var carried string
	for _, a := range rs[0].Events[0].Attributes {
		if a.Key == "carried" {
			carried = a.Value
		}
	}
	if carried != base64.StdEncoding.EncodeToString(uni.Public())+"=10" {
		t.Fatalf("event says carried %q", carried)
	}
	for _, v := range got.Validators {
		if bytes.Equal(v.PubKey, uni.Public()) && (v.Name != "uni-e" || v.Account != string(uni.Address())) {
			t.Fatalf("new validator %+v", v)
		}
	}
	// The newcomer now votes; the next block returns no updates.
	h.must(vote(h, uni, key(t, 151), 10, "uni-f"))
	if len(h.updates) != 0 {
		t.Fatalf("a vote that did not carry returned updates %s", updatesString(h.updates))
	}
}

// TestValidatorVoteRejections: each bad vote is refused with its code and
// the app hash is what it was; CheckTx refuses the same.
func TestValidatorVoteRejections(t *testing.T) {
	vs := valKeys(t, 2)
	outsider, uni := key(t, 2), key(t, 150)
	h := newHarnessWith(t, nil, genesis(key(t, 1), nil), genesisVals(vs))
	h.must(vote(h, vs[0], uni, 10, "uni-e"))
	before := h.hash()
	cases := []struct {
		name string
		by   *identity.Key
		msg  ValidatorVote
		code uint32
		want string
	}{
		{"non-validator", outsider, ValidatorVote{PubKey: uni.Public(), Power: 10}, CodeNotValidator, "is not a validator"},
		{"newcomer votes for itself", uni, ValidatorVote{PubKey: uni.Public(), Power: 10}, CodeNotValidator, "is not a validator"},
		{"short key", vs[1], ValidatorVote{PubKey: uni.Public()[:31], Power: 10}, CodeInvalidValidator, "31 bytes"},
		{"no key", vs[1], ValidatorVote{Power: 10}, CodeInvalidValidator, "0 bytes"},
		{"not a point", vs[1], ValidatorVote{PubKey: notAPoint, Power: 10}, CodeInvalidValidator, "not an ed25519 public key"},
		{"small order", vs[1], ValidatorVote{PubKey: make([]byte, 32), Power: 10}, CodeInvalidValidator, "not an ed25519 public key"},
		{"negative power", vs[1], ValidatorVote{PubKey: uni.Public(), Power: -1}, CodeInvalidValidator, "power -1"},
		{"power too high", vs[1], ValidatorVote{PubKey: uni.Public(), Power: MaxValidatorPower + 1}, CodeInvalidValidator, "power 1000001"},
		{"long name", vs[1], ValidatorVote{PubKey: uni.Public(), Power: 10, Name: strings.Repeat("x", 65)}, CodeInvalidValidator, "65 bytes"},
		{"control in name", vs[1], ValidatorVote{PubKey: uni.Public(), Power: 10, Name: "a\nb"}, CodeInvalidValidator, "printable"},
		{"other name", vs[1], ValidatorVote{PubKey: uni.Public(), Power: 10, Name: "uni-x"}, CodeInvalidValidator, `named "uni-e"`},
		{"remove a non-member", vs[1], ValidatorVote{PubKey: outsider.Public(), Power: 0}, CodeInvalidValidator, "nothing to remove"},
		{"same power", vs[1], ValidatorVote{PubKey: vs[0].Public(), Power: 10}, CodeInvalidValidator, "already has power 10"},
		{"duplicate", vs[0], ValidatorVote{PubKey: uni.Public(), Power: 10}, CodeAlreadyVoted, "already voted"},
	}
	for _, c := range cases {
		tx := h.tx(c.by, TypeValidatorVote, &c.msg)
		res, err := h.app.CheckTx(context.Background(), &abci.RequestCheckTx{Tx: tx, Type: abci.CheckTxType_New})
		if err != nil || res.Code != c.code || !strings.Contains(res.Log, c.want) {
			t.Errorf("%s: CheckTx %d %q, want %d containing %q", c.name, res.Code, res.Log, c.code, c.want)
		}
		rs := h.block(tx)
		if rs[0].Code != c.code || !strings.Contains(rs[0].Log, c.want) {
			t.Errorf("%s: block %d %q, want %d containing %q", c.name, rs[0].Code, rs[0].Log, c.code, c.want)
		}
		if !bytes.Equal(before, h.hash()) {
			t.Fatalf("%s: a refused vote changed the state", c.name)
		}
	}
}

// TestValidatorSetNeverEmpty: the last validator cannot vote itself out.
func TestValidatorSetNeverEmpty(t *testing.T) {
	vs := valKeys(t, 1)
	h := newHarnessWith(t, nil, genesis(key(t, 1), nil), genesisVals(vs))
	expectCode(t, h.block(vote(h, vs[0], vs[0], 0, "")), CodeInvalidValidator, "would leave none")
	if len(powersOf(h)) != 1 || len(h.updates) != 0 {
		t.Fatal("the last validator was removed")
	}
	// With a second one in, it may leave.
	other := key(t, 150)
	h.must(vote(h, vs[0], other, 5, "b"))
	if updatesString(h.updates) != fmt.Sprintf("%s=5", other.Address()) {
		t.Fatalf("updates %s", updatesString(h.updates))
	}
	// 10 of 15 is not more than 2/3: the other must agree.
	h.must(vote(h, vs[0], vs[0], 0, ""))
	if len(h.updates) != 0 {
		t.Fatalf("10 of 15 carried: %s", updatesString(h.updates))
	}
	h.must(vote(h, other, vs[0], 0, ""))
	if updatesString(h.updates) != fmt.Sprintf("%s=0", vs[0].Address()) {
		t.Fatalf("updates %s", updatesString(h.updates))
	}
	if p := powersOf(h); len(p) != 1 || p[string(other.Address())] != 5 {
		t.Fatalf("set %v", p)
	}
	expectCode(t, h.block(vote(h, other, other, 0, "")), CodeInvalidValidator, "would leave none")
}

// TestValidatorRemovalRecounts: removing a validator drops its pending
// votes, and counts every other pending change again against the smaller
// set, which may carry one in the same transaction.
func TestValidatorRemovalRecounts(t *testing.T) {
	vs := valKeys(t, 4)
	x, y := key(t, 150), key(t, 151)
	// Powers 10, 10, 10, 5: 35 in all, a change needs 24.
	h := newHarnessWith(t, nil, genesis(key(t, 1), nil), genesisVals(vs, 10, 10, 10, 5))
	h.must(vote(h, vs[0], x, 10, "x"), vote(h, vs[1], x, 10, "")) // 20 of 35
	h.must(vote(h, vs[2], y, 7, "y"))                             // 10 of 35
	h.must(vote(h, vs[0], vs[2], 0, ""), vote(h, vs[1], vs[2], 0, ""))
	if len(h.updates) != 0 || len(set(t, h.app).Proposals) != 3 {
		t.Fatalf("updates %s, proposals %+v", updatesString(h.updates), set(t, h.app).Proposals)
	}
	// vs[3] makes 25 of 35 to remove vs[2]: then x's 20 of the 25 left
	// carry too, and vs[2]'s vote for y is dropped.
	rs := h.block(vote(h, vs[3], vs[2], 0, ""))
	if rs[0].Code != CodeOK {
		t.Fatalf("vote: %s", rs[0].Log)
	}
	want := map[string]int64{string(vs[2].Address()): 0, string(x.Address()): 10}
	if len(h.updates) != 2 {
		t.Fatalf("updates %s", updatesString(h.updates))
	}
	for i, u := range h.updates {
		if want[string(identity.AddressOf(u.PubKey.GetEd25519()))] != u.Power || u.PubKey.GetEd25519() == nil {
			t.Fatalf("updates %s", updatesString(h.updates))
		}
		if i > 0 && bytes.Compare(h.updates[i-1].PubKey.GetEd25519(), u.PubKey.GetEd25519()) >= 0 {
			t.Fatalf("updates not in key order: %s", updatesString(h.updates))
		}
	}
	got := set(t, h.app)
	if got.TotalPower != 35 || len(got.Validators) != 4 || len(got.Proposals) != 0 {
		t.Fatalf("set %+v", got)
	}
}

// TestValidatorVoteMovesAndWithdraws: a validator's vote on a key is its
// latest; voting for the key's current power withdraws it.
func TestValidatorVoteMovesAndWithdraws(t *testing.T) {
	vs := valKeys(t, 4)
	x := key(t, 150)
	h := newHarnessWith(t, nil, genesis(key(t, 1), nil), genesisVals(vs))
	h.must(vote(h, vs[0], x, 10, "x"), vote(h, vs[1], x, 20, ""))
	if ps := set(t, h.app).Proposals; len(ps) != 2 || ps[0].Power != 10 || ps[1].Power != 20 || ps[0].VotePower != 10 {
		t.Fatalf("proposals %+v", ps)
	}
	h.must(vote(h, vs[0], x, 20, "")) // moves: 20 of 40 for power 20
	if ps := set(t, h.app).Proposals; len(ps) != 1 || ps[0].Power != 20 || ps[0].VotePower != 20 {
		t.Fatalf("proposals %+v", ps)
	}
	h.must(vote(h, vs[0], x, 0, ""), vote(h, vs[1], x, 0, "")) // withdraw both
	if ps := set(t, h.app).Proposals; len(ps) != 0 || len(h.app.Snapshot().Pending) != 0 {
		t.Fatalf("proposals after withdrawing %+v", ps)
	}
	// A validator can have MaxPendingVotes pending, no more.
	var txs [][]byte
	for i := 0; i < MaxPendingVotes; i++ {
		txs = append(txs, vote(h, vs[0], key(t, byte(160+i)), 1, ""))
	}
	h.must(txs...)
	expectCode(t, h.block(vote(h, vs[0], key(t, 200), 1, "")), CodeInvalidValidator, "votes pending")
}

// TestValidatorAddedAndRemovedInOneBlock: CometBFT hears of a key once per
// block, as the block left it; here, not at all.
func TestValidatorAddedAndRemovedInOneBlock(t *testing.T) {
	vs := valKeys(t, 3)
	x := key(t, 150)
	h := newHarnessWith(t, nil, genesis(key(t, 1), nil), genesisVals(vs))
	// 3 of 3 add x; then 40 of 40 remove it again (x votes too).
	h.must(vote(h, vs[0], x, 10, "x"), vote(h, vs[1], x, 10, ""), vote(h, vs[2], x, 10, ""),
		vote(h, vs[0], x, 0, ""), vote(h, vs[1], x, 0, ""), vote(h, x, x, 0, ""))
	if len(h.updates) != 0 || len(powersOf(h)) != 3 {
		t.Fatalf("updates %s, set %v", updatesString(h.updates), powersOf(h))
	}
	// Raised twice in one block: one update, the last power.
	h.must(vote(h, vs[0], vs[2], 20, ""), vote(h, vs[1], vs[2], 20, ""), vote(h, vs[2], vs[2], 20, ""),
		vote(h, vs[0], vs[2], 30, ""), vote(h, vs[1], vs[2], 30, ""), vote(h, vs[2], vs[2], 30, ""))
	if updatesString(h.updates) != fmt.Sprintf("%s=30", vs[2].Address()) {
		t.Fatalf("updates %s", updatesString(h.updates))
	}
}

// TestValidatorVotesDeterministic: a persistent app and an in-memory one
// fed the same blocks return the same app hashes and validator updates,
// and the persistent one reopens at the same hash with the same set.
func TestValidatorVotesDeterministic(t *testing.T) {
	vs := valKeys(t, 4)
	dir := filepath.Join(t.TempDir(), "app")
	disk, err := OpenApp(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	g := genesis(key(t, 1), map[*identity.Key]uint64{vs[0]: 100 * credit})
	a := newHarnessWith(t, nil, g, genesisVals(vs, 10, 20, 30, 40))
	b := newHarnessWith(t, disk, g, genesisVals(vs, 10, 20, 30, 40))
	var blocks [][][]byte
	x, y := key(t, 150), key(t, 151)
	// Powers 10, 20, 30, 40: a change needs 67. x carries in block 3
	// (90), vs[0]'s removal in block 4 (90 of 105), which drops its vote
	// for y.
	blocks = append(blocks,
		[][]byte{vote(a, vs[3], x, 5, "x"), vote(a, vs[0], y, 3, "y")},
		[][]byte{vote(a, vs[1], x, 5, ""), a.tx(vs[0], TypeTransfer, &Transfer{To: string(x.Address()), Amount: credit})},
		[][]byte{vote(a, vs[2], x, 5, ""), vote(a, vs[3], vs[0], 0, ""), vote(a, vs[2], vs[0], 0, ""), vote(a, vs[1], y, 3, "")},
		[][]byte{vote(a, vs[1], vs[0], 0, ""), vote(a, x, y, 3, "")},
	)
	// a's nonces were counted as if every tx commits; b replays the bytes.
	a.nonces = map[identity.Address]uint64{}
	for i, txs := range blocks {
		ra, rb := a.block(txs...), b.block(txs...)
		for j := range ra {
			if ra[j].Code != CodeOK || rb[j].Code != CodeOK {
				t.Fatalf("block %d tx %d: codes %d and %d", i, j, ra[j].Code, rb[j].Code)
			}
		}
		if !bytes.Equal(a.hash(), b.hash()) || updatesString(a.updates) != updatesString(b.updates) {
			t.Fatalf("block %d: apps differ: %X %s / %X %s", i, a.hash(), updatesString(a.updates), b.hash(), updatesString(b.updates))
		}
	}
	if p := powersOf(a); len(p) != 4 || p[string(x.Address())] != 5 || p[string(vs[0].Address())] != 0 {
		t.Fatalf("set %v", p)
	}
	if ps := set(t, a.app).Proposals; len(ps) != 1 || ps[0].VotePower != 25 || len(ps[0].Voters) != 2 {
		t.Fatalf("proposals %+v", ps)
	}
	want, wantSet := a.hash(), set(t, a.app)
	disk.Close()
	reopened, err := OpenApp(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer reopened.Close()
	if got := reopened.Snapshot(); !bytes.Equal(got.AppHash, want) {
		t.Fatalf("reopened at %X, want %X", got.AppHash, want)
	}
	if problems := reopened.Verify(); len(problems) > 0 {
		t.Fatalf("reopened: %v", problems)
	}
	if got := set(t, reopened); fmt.Sprint(got) != fmt.Sprint(wantSet) {
		t.Fatalf("reopened set %+v, want %+v", got, wantSet)
	}
}

func TestGenesisNamesValidators(t *testing.T) {
	vs := valKeys(t, 2)
	doc, err := NewGenesis(testChain, []GenesisValidator{{Name: "psu", PubKey: vs[0].Public(), Power: 10}, {Name: "osu", PubKey: vs[1].Public(), Power: 20}}, genesis(key(t, 1), nil))
	if err != nil {
		t.Fatal(err)
	}
	app := NewMemoryApp(nil)
	if _, err := app.InitChain(context.Background(), &abci.RequestInitChain{ChainId: testChain, InitialHeight: 1, AppStateBytes: doc.AppState, Validators: genesisVals(vs, 10, 20)}); err != nil {
		t.Fatal(err)
	}
	got := set(t, app)
	if len(got.Validators) != 2 || got.Validators[0].Name != "osu" || got.Validators[0].Power != 20 || got.Validators[1].Name != "psu" {
		t.Fatalf("set %+v", got)
	}
	// A name for a key that is not a genesis validator is an error.
	app = NewMemoryApp(nil)
	if _, err := app.InitChain(context.Background(), &abci.RequestInitChain{ChainId: testChain, InitialHeight: 1, AppStateBytes: doc.AppState, Validators: genesisVals(vs[:1])}); err == nil {
		t.Fatal("InitChain accepted a name for a key outside the set")
	}
	if _, err := NewGenesis(testChain, []GenesisValidator{{PubKey: vs[0].Public(), Power: MaxValidatorPower + 1}}, genesis(key(t, 1), nil)); err == nil {
		t.Fatal("NewGenesis accepted a power above the bound")
	}
}

func TestParseValidatorKey(t *testing.T) {
	pub := key(t, 150).Public()
	for _, s := range []string{
		base64.StdEncoding.EncodeToString(pub), base64.RawStdEncoding.EncodeToString(pub),
		hex.EncodeToString(pub), strings.ToUpper(hex.EncodeToString(pub)), " " + base64.StdEncoding.EncodeToString(pub) + "\n",
	} {
		got, err := ParseValidatorKey(s)
		if err != nil || !bytes.Equal(got, pub) {
			t.Errorf("%q: %x %v", s, got, err)
		}
	}
	for _, s := range []string{"", "zz", base64.StdEncoding.EncodeToString(pub[:31]), hex.EncodeToString(notAPoint), hex.EncodeToString(pub)[:62], string(identity.AddressOf(pub))} {
		if _, err := ParseValidatorKey(s); err == nil {
			t.Errorf("%q accepted", s)
		}
	}
}
