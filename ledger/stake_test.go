package ledger

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/identity"
)

// The tests here are a greedy member's: one with 1 credit, signing raw
// transactions through whole blocks, tries to grow the state for nothing
// and to write other machines' records. Each measures what it gets.

// storeBytes is what the state's leaves hold, keys and values.
func storeBytes(t testing.TB, app *App) int {
	t.Helper()
	n := 0
	if _, err := app.store.tree.Iterate(func(k, v []byte) bool {
		n += len(k) + len(v)
		return false
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// seededKeys are n keys from a label, none admitted.
func seededKeys(t testing.TB, label string, n int) []*identity.Key {
	out := make([]*identity.Key, n)
	for i := range out {
		k, err := identity.KeyFromSeed([]byte(fmt.Sprintf("%-16s%016d", label, i)))
		if err != nil {
			t.Fatal(err)
		}
		out[i] = k
	}
	return out
}

// TestLinkChurnIsBounded: a member links fresh machine keys and unlinks
// them again, as fast as blocks take its transactions (each unlink in the
// block after its link: a consent names a height the machine saw). An
// unlinked machine's entry counts against the owner it left until it
// goes, so the member holds at most MaxMachinesPerOwner entries however
// many keys it churns, and spends nothing either way. (Before: every
// link-and-unlink left an entry for ever; 4,000 transactions left 2,000.)
func TestLinkChurnIsBounded(t *testing.T) {
	issuer, member := key(t, 1), key(t, 2)
	h := newHarness(t, nil, genesis(issuer, map[*identity.Key]uint64{member: credit}))
	limit := int(h.app.Snapshot().Params.MaxMachinesPerOwner)
	base := storeBytes(t, h.app)
	machines := seededKeys(t, "churn", 2000)
	accepted, sent, next := 0, 0, 0
	var linked []*identity.Key // linked in the last block, unlinked in this one
	for next < len(machines) || len(linked) > 0 {
		var txs [][]byte
		for _, m := range linked {
			txs = append(txs, h.tx(member, TypeLinkMachine, &LinkMachine{Consent: h.consent(m, m.Address())}))
		}
		var trying []*identity.Key
		for ; next < len(machines) && len(txs) < 1000; next++ {
			txs = append(txs, h.tx(member, TypeLinkMachine, &LinkMachine{Consent: h.consent(machines[next], member.Address())}))
			trying = append(trying, machines[next])
		}
		ok := 0
		for _, r := range h.block(txs...) {
			if r.Code == CodeOK {
				ok++
			}
		}
		accepted, sent = accepted+ok, sent+len(txs)
		st := h.app.Snapshot()
		linked = nil
		for _, m := range trying {
			if l := st.Links[string(m.Address())]; l != nil && l.Owner == string(member.Address()) {
				linked = append(linked, m)
			}
		}
	}
	st := h.app.Snapshot()
	added := storeBytes(t, h.app) - base
	t.Logf("%d link changes sent, %d accepted: %d link entries, %d bytes, %d micro-credits spent",
		sent, accepted, len(st.Links), added, credit-h.balance(member.Address()))
	if len(st.Links) > limit || accepted > 2*limit || h.balance(member.Address()) != credit {
		t.Fatalf("%d entries after %d accepted link changes (limit %d)", len(st.Links), accepted, limit)
	}
}

// TestEscrowStateBoundedByStake: a member with 1 credit opens as many
// escrows as it can, each naming as many registered machines as it can,
// at the least amount the ledger takes (1 micro-credit first; if refused,
// the least it accepts), and the state it adds is measured. An escrow
// locks MinPayment for each payee it names, so what a member's open
// escrows store grows with what it has locked. (Before: 1,024 escrows of 1
// micro-credit naming 375 machines each added 16.7 MB for up to 30 days.)
func TestEscrowStateBoundedByStake(t *testing.T) {
	const most = 40_000 // bytes a member with 1 credit may add this way
	issuer, member := key(t, 1), key(t, 2)
	pool := seededKeys(t, "payee", 400)
	g := genesis(issuer, map[*identity.Key]uint64{member: credit}, pool...)
	var payees []string
	for _, k := range pool {
		payees = append(payees, string(k.Address()))
	}
	perTx := 0 // the most payees one transaction can name
	for perTx < len(payees) {
		b, _ := NewTx(member, testChain, TypeOpenEscrow, 0, &OpenEscrow{Job: job(0), Amount: 1, Expiry: 1 << 40, Payees: payees[:perTx+1]})
		if len(b) > MaxTxSize {
			break
		}
		perTx++
	}
	worst := 0
	for _, k := range []int{1, 10, 100, perTx} {
		h := newHarness(t, nil, g)
		minPay := h.app.Snapshot().Params.MinPayment
		base := storeBytes(t, h.app)
		amount, opened := uint64(1), 0
		for n := 0; opened < 2000; n++ {
			var txs [][]byte
			for range 500 {
				txs = append(txs, h.tx(member, TypeOpenEscrow, &OpenEscrow{Job: fmt.Sprintf("%064x", n*1000+len(txs)+1), Amount: amount,
					Expiry: h.now.Unix() + 29*24*3600, Payees: payees[:k]}))
			}
			ok, tooSmall := 0, 0
			for _, r := range h.block(txs...) {
				switch r.Code {
				case CodeOK:
					ok++
				case CodeInvalidAmount:
					tooSmall++
				}
			}
			opened += ok
			if added := storeBytes(t, h.app) - base; added > most {
				t.Fatalf("%d payees each: %d escrows of %d added %d bytes, more than %d", k, opened, amount, added, most)
			}
			if ok == 0 && tooSmall > 0 && amount == 1 {
				amount = uint64(k) * minPay // the least it takes
				continue
			}
			if ok == 0 {
				break
			}
		}
		added := storeBytes(t, h.app) - base
		t.Logf("%d payees each: %d escrows of %d micro-credits, %d bytes added", k, opened, amount, added)
		worst = max(worst, added)
	}
	t.Logf("the most state a member with 1 credit adds with escrows: %d bytes", worst)
}

// recordsGenesis: an attacker with 1 credit and its own machine, a victim
// machine (a member), an owner with a linked machine, and a pool of
// registered machines; unlinked entries go after 5 blocks.
func recordsGenesis(issuer, attacker, victim, owner *identity.Key, pool []*identity.Key) GenesisState {
	g := genesis(issuer, map[*identity.Key]uint64{attacker: credit}, append([]*identity.Key{victim, owner}, pool...)...)
	p := DefaultParams()
	p.LinkStake = 0 // the count bounds alone here; TestLinksLockAStake prices links
	p.ConsentBlocks = 5
	g.Params = &p
	return g
}

// TestRecordsCountOnlyPaidWork: a member cannot write a machine's record
// for nothing. It names a victim machine in escrows it settles paying
// nothing and marking it failed (40 times), and names 50 machines it never
// used in one such settlement: no record is written, and it spends
// nothing. A failure counts when the victim is paid at least MinPayment
// for it, so each mark costs the attacker that much, paid to the victim.
// It pays its own machine and itself for "completed" work: nothing
// counts. A record goes with the machine's link entry. (Before: 40 free
// settlements marked the victim "failed": 40; a settlement paying 0 wrote
// a permanent record for every payee.)
func TestRecordsCountOnlyPaidWork(t *testing.T) {
	issuer, att, victim, owner, own, linked := key(t, 1), key(t, 2), key(t, 3), key(t, 4), key(t, 5), key(t, 6)
	pool := seededKeys(t, "unused", 50)
	h := newHarness(t, nil, recordsGenesis(issuer, att, victim, owner, pool))
	minPay := h.app.Snapshot().Params.MinPayment
	h.must(h.tx(att, TypeLinkMachine, &LinkMachine{Consent: h.consent(own, att.Address())}),
		h.tx(owner, TypeLinkMachine, &LinkMachine{Consent: h.consent(linked, owner.Address())}))
	exp := h.now.Unix() + 3600
	v := string(victim.Address())

	// 40 escrows naming the victim, settled paying nothing, "failed"; and
	// one naming 50 machines the attacker never used.
	var open, settle [][]byte
	for i := range 40 {
		open = append(open, h.tx(att, TypeOpenEscrow, &OpenEscrow{Job: fmt.Sprintf("%064x", i+1), Amount: minPay, Expiry: exp, Payees: []string{v}}))
	}
	var unused []string
	var zero []Payment
	for _, k := range pool {
		unused = append(unused, string(k.Address()))
		zero = append(zero, Payment{Machine: string(k.Address()), Failed: true})
	}
	open = append(open, h.tx(att, TypeOpenEscrow, &OpenEscrow{Job: job(1), Amount: 50 * minPay, Expiry: exp, Payees: unused}))
	h.must(open...)
	for i := range 40 {
		settle = append(settle, h.tx(att, TypeSettle, &Settle{Job: fmt.Sprintf("%064x", i+1), Payments: []Payment{{Machine: v, Failed: true}}}))
	}
	settle = append(settle, h.tx(att, TypeSettle, &Settle{Job: job(1), Payments: zero}))
	h.must(settle...)
	h.closeWindows()
	if st := h.app.Snapshot(); len(st.Machines) != 0 || h.balance(att.Address()) != credit {
		t.Fatalf("after 41 settlements paying nothing: records %v, attacker holds %d", st.Machines, h.balance(att.Address()))
	}

	// A payment below MinPayment counts nothing; each one of at least
	// MinPayment counts, and the victim keeps it.
	marks := []Payment{{Machine: v, Amount: minPay - 1, Failed: true}, {Machine: v, Amount: minPay, Failed: true}, {Machine: v, Amount: minPay, Failed: true}}
	for i, p := range marks {
		j := fmt.Sprintf("%064x", 100+i)
		h.must(h.tx(att, TypeOpenEscrow, &OpenEscrow{Job: j, Amount: minPay, Expiry: exp, Payees: []string{v}}))
		h.must(h.tx(att, TypeSettle, &Settle{Job: j, Payments: []Payment{p}}))
	}
	h.closeWindows()
	spent := credit - h.balance(att.Address())
	if rec := h.app.Snapshot().Machines[v]; rec == nil || rec.Failed != 2 || rec.Completed != 0 || spent != 3*minPay-1 || h.balance(victim.Address()) != spent {
		t.Fatalf("victim's record %+v after 3 paid marks; the attacker spent %d, the victim holds %d", rec, spent, h.balance(victim.Address()))
	}
	t.Logf("a failure mark costs the attacker %d micro-credits, paid to the victim: %d marks per credit", minPay, credit/minPay)

	// Paying its own machine, or itself, counts nothing: the credits come
	// back to it.
	self := []string{string(own.Address()), string(att.Address())}
	h.must(h.tx(att, TypeOpenEscrow, &OpenEscrow{Job: job(2), Amount: 4 * minPay, Expiry: exp, Payees: self}))
	h.must(h.tx(att, TypeSettle, &Settle{Job: job(2), Payments: []Payment{{Machine: self[0], Amount: 2 * minPay}, {Machine: self[1], Amount: 2 * minPay}}}))
	if st := h.app.Snapshot(); st.Machines[self[0]] != nil || st.Machines[self[1]] != nil {
		t.Fatalf("self-dealing wrote records: %+v %+v", st.Machines[self[0]], st.Machines[self[1]])
	}

	// Paid work on another owner's linked machine counts; its record goes
	// with the link entry once the machine is unlinked.
	l := string(linked.Address())
	h.must(h.tx(att, TypeOpenEscrow, &OpenEscrow{Job: job(3), Amount: minPay, Expiry: exp, Payees: []string{l}}))
	h.must(h.tx(att, TypeSettle, &Settle{Job: job(3), Payments: []Payment{{Machine: l, Amount: minPay}}}))
	h.closeWindows()
	if rec := h.app.Snapshot().Machines[l]; rec == nil || rec.Completed != 1 || rec.Earned != minPay || h.balance(owner.Address()) != minPay {
		t.Fatalf("linked machine's record %+v, its owner holds %d", rec, h.balance(owner.Address()))
	}
	h.must(h.tx(owner, TypeLinkMachine, &LinkMachine{Consent: h.consent(linked, linked.Address())}))
	for range 5 {
		h.block()
	}
	if st := h.app.Snapshot(); st.Machines[l] != nil || st.Links[l] != nil {
		t.Fatalf("unlinked machine %s still has record %+v and link %+v", l, st.Machines[l], st.Links[l])
	}
}

// TestNothingForFreeOverRPC: the same attacker against a real node, raw
// signed transactions over CometBFT's RPC: settlements paying nothing
// leave the victim's record (as /machine/ reads it) empty, and link churn
// stops at the owner's limit, while unlinked machines' entries are kept,
// until they go; machines consent through the client as a node does.
func TestNothingForFreeOverRPC(t *testing.T) {
	issuer, att, victim := key(t, 1), key(t, 2), key(t, 3)
	g := genesis(issuer, map[*identity.Key]uint64{att: credit}, victim)
	p := DefaultParams()
	p.LinkStake = 0 // the count bounds alone here; TestLinksLockAStake prices links
	p.MaxMachinesPerOwner, p.ConsentBlocks = 2, 10
	g.Params = &p
	c := startRPCChain(t, key(t, 99), g)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cl := NewClient(c.http, att, testChain)
	nonce := uint64(0)
	commit := func(typ string, msg any) uint32 {
		t.Helper()
		b, err := NewTx(att, testChain, typ, nonce, msg)
		if err != nil {
			t.Fatal(err)
		}
		res, err := c.http.BroadcastTxCommit(ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		if res.CheckTx.Code != CodeOK {
			return res.CheckTx.Code
		}
		nonce++
		return res.TxResult.Code
	}
	v := string(victim.Address())
	for i := range 3 {
		j := fmt.Sprintf("%064x", i+1)
		if code := commit(TypeOpenEscrow, &OpenEscrow{Job: j, Amount: p.MinPayment, Expiry: time.Now().Unix() + 600, Payees: []string{v}}); code != CodeOK {
			t.Fatalf("open escrow: code %d", code)
		}
		if code := commit(TypeSettle, &Settle{Job: j, Payments: []Payment{{Machine: v, Failed: true}}}); code != CodeOK {
			t.Fatalf("settle: code %d", code)
		}
	}
	if rec, err := cl.MachineRecord(ctx, v); err != nil || !reflect.DeepEqual(rec, MachineRecord{}) {
		t.Fatalf("victim's record after 3 settlements paying nothing: %+v %v", rec, err)
	}

	machines := seededKeys(t, "rpc-machine", 3)
	consent := func(m *identity.Key, owner identity.Address) LinkConsent {
		t.Helper()
		con, err := NewClient(c.http, m, testChain).ConsentTo(ctx, owner, 10*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return con
	}
	var unlinked int64
	for _, m := range machines[:2] {
		if code := commit(TypeLinkMachine, &LinkMachine{Consent: consent(m, att.Address())}); code != CodeOK {
			t.Fatalf("link: code %d", code)
		}
		if code := commit(TypeLinkMachine, &LinkMachine{Consent: consent(m, m.Address())}); code != CodeOK {
			t.Fatalf("unlink: code %d", code)
		}
		reg, err := cl.Registration(ctx, m.Address())
		if err != nil {
			t.Fatal(err)
		}
		unlinked = reg.Changed
	}
	if code := commit(TypeLinkMachine, &LinkMachine{Consent: consent(machines[2], att.Address())}); code != CodeLimitReached {
		t.Fatalf("a third link with two machines just unlinked: code %d, want %d", code, CodeLimitReached)
	}
	if err := c.chain.WaitHeight(ctx, unlinked+p.ConsentBlocks); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.LinkMachine(ctx, consent(machines[2], att.Address())); err != nil {
		t.Fatalf("link once the unlinked entries went: %v", err)
	}
	for _, m := range machines[:2] {
		if reg, err := cl.Registration(ctx, m.Address()); err != nil || reg.Changed != 0 || reg.Owner != string(m.Address()) {
			t.Fatalf("registration of an unlinked machine %d blocks on: %+v %v", p.ConsentBlocks, reg, err)
		}
	}
}

// TestLinksLockAStake: each machine an owner links locks Params.LinkStake
// of its balance, so a member with 2.5 credits links two fake machines,
// not 256; an unlink keeps the stake locked until its entry goes; a
// machine another owner links returns the first owner's stake at once; a
// machine that is a member itself (an issuer vouched for it) links free.
// The books (checked after every block) count the stakes.
func TestLinksLockAStake(t *testing.T) {
	issuer, owner, other, m1, m2, m3, member := key(t, 1), key(t, 2), key(t, 3), key(t, 4), key(t, 5), key(t, 6), key(t, 7)
	g := genesis(issuer, map[*identity.Key]uint64{owner: 5 * credit / 2, other: 5 * credit}, owner, other, member)
	p := DefaultParams()
	p.ConsentBlocks = 4
	g.Params = &p
	h := newHarness(t, nil, g)
	stake := p.LinkStake
	bal := func(k *identity.Key) uint64 { return h.app.Snapshot().balanceOf(string(k.Address())) }
	h.must(h.tx(owner, TypeLinkMachine, &LinkMachine{Consent: h.consent(m1, owner.Address())}))
	h.must(h.tx(owner, TypeLinkMachine, &LinkMachine{Consent: h.consent(m2, owner.Address())}))
	expectCode(t, h.block(h.tx(owner, TypeLinkMachine, &LinkMachine{Consent: h.consent(m3, owner.Address())})), CodeInsufficientFunds, "stake")
	if got := bal(owner); got != 5*credit/2-2*stake {
		t.Fatalf("owner holds %d after two links, want %d", got, 5*credit/2-2*stake)
	}
	if tot, _ := h.app.Snapshot().CheckInvariants(); tot.Staked != 2*stake {
		t.Fatalf("staked %d, want %d", tot.Staked, 2*stake)
	}
	// Unlinked: locked until the entry goes, ConsentBlocks later.
	h.must(h.tx(owner, TypeLinkMachine, &LinkMachine{Consent: h.consent(m1, m1.Address())}))
	if got := bal(owner); got != 5*credit/2-2*stake {
		t.Fatalf("owner holds %d right after the unlink, want the stake still locked", got)
	}
	for range p.ConsentBlocks {
		h.block()
	}
	if got := bal(owner); got != 5*credit/2-stake {
		t.Fatalf("owner holds %d once the unlink's entry went, want the stake back (%d)", got, 5*credit/2-stake)
	}
	// Linked by another owner: the first owner's stake comes back now.
	h.must(h.tx(other, TypeLinkMachine, &LinkMachine{Consent: h.consent(m2, other.Address())}))
	if bal(owner) != 5*credit/2 || bal(other) != 5*credit-stake {
		t.Fatalf("after the machine moved: owner %d, other %d", bal(owner), bal(other))
	}
	// A member machine links free.
	h.must(h.tx(owner, TypeLinkMachine, &LinkMachine{Consent: h.consent(member, owner.Address())}))
	if bal(owner) != 5*credit/2 {
		t.Fatalf("linking a member machine cost %d", 5*credit/2-bal(owner))
	}
	if tot, problems := h.app.Snapshot().CheckInvariants(); tot.Staked != stake || len(problems) != 0 {
		t.Fatalf("staked %d (want %d), problems %v", tot.Staked, stake, problems)
	}
}
