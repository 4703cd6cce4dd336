package ledger

import (
	"math"
	"math/bits"
	"sort"
	"strconv"

	abci "github.com/cometbft/cometbft/abci/types"

	"github.com/deepmarket/deepmarket/identity"
)

// EventType is the ABCI event every ledger transaction emits; its indexed
// attributes let `ledger history` find what moved credits for an account:
// tx_search "dm.account='dm1...'".
const EventType = "dm"

// Event is what a committed transaction's ledger event says, read back
// (ParseEvent): its type, the accounts it touched and its other
// attributes in order (a key may repeat: a settlement's "paid", a vote's
// "carried").
type Event struct {
	Type     string
	Accounts []string
	Attrs    [][2]string
}

// ParseEvent reads the ledger's event among a transaction's events (the
// zero Event when it has none): the one reader of what event.abci writes.
func ParseEvent(events []abci.Event) Event {
	var e Event
	for _, ev := range events {
		if ev.Type != EventType {
			continue
		}
		for _, a := range ev.Attributes {
			switch a.Key {
			case "type":
				e.Type = a.Value
			case "account":
				e.Accounts = append(e.Accounts, a.Value)
			default:
				e.Attrs = append(e.Attrs, [2]string{a.Key, a.Value})
			}
		}
	}
	return e
}

// Get is key's last value ("" when absent).
func (e Event) Get(key string) string {
	v := ""
	for _, a := range e.Attrs {
		if a[0] == key {
			v = a[1]
		}
	}
	return v
}

// All is every value of key, in order.
func (e Event) All(key string) []string {
	var out []string
	for _, a := range e.Attrs {
		if a[0] == key {
			out = append(out, a[1])
		}
	}
	return out
}

type event struct {
	typ      string   // the transaction's type: execute sets it from its kind
	accounts []string // every account the transaction touched
	attrs    [][2]string
}

func (e *event) abci() []abci.Event {
	attrs := []abci.EventAttribute{{Key: "type", Value: e.typ, Index: true}}
	seen := map[string]bool{}
	for _, a := range e.accounts {
		if !seen[a] {
			seen[a] = true
			attrs = append(attrs, abci.EventAttribute{Key: "account", Value: a, Index: true})
		}
	}
	for _, kv := range e.attrs {
		attrs = append(attrs, abci.EventAttribute{Key: kv[0], Value: kv[1], Index: kv[0] == "job"})
	}
	return []abci.Event{{Type: EventType, Attributes: attrs}}
}

func u(v uint64) string { return strconv.FormatUint(v, 10) }

// call is one transaction being checked against the state.
type call struct {
	d       *decoded
	signer  string
	balance uint64 // the signer's balance the checks count on
	now     int64  // block time, unix seconds
}

// effect makes the changes of a transaction whose checks all passed; it
// cannot fail.
type effect func() *event

// execute checks d against the state at block time now and, only if every
// check passes, applies it and spends the signer's nonce. A rejected
// transaction changes nothing.
func (s *State) execute(d *decoded, now int64) (*event, error) {
	signer := string(d.signer)
	var acct Account
	if a, ok := s.Accounts[signer]; ok {
		acct = *a
	}
	if d.tx.Nonce != acct.Nonce {
		return nil, reject(CodeBadNonce, "nonce %d, account %s expects %d", d.tx.Nonce, signer, acct.Nonce)
	}
	if err := s.standing(d); err != nil {
		return nil, err
	}
	apply, err := d.kind.handle(s, &call{d: d, signer: signer, balance: acct.Balance, now: now})
	if err != nil {
		return nil, err
	}
	ev := apply()
	ev.typ = d.kind.typ
	s.account(signer).Nonce++
	return ev, nil
}

// check runs every check of execute without changing anything (CheckTx),
// with nonce as the signer's next one.
func (s *State) check(d *decoded, now int64, nonce uint64) error {
	if d.tx.Nonce != nonce {
		return reject(CodeBadNonce, "nonce %d, account %s expects %d", d.tx.Nonce, d.signer, nonce)
	}
	if err := s.standing(d); err != nil {
		return err
	}
	_, err := d.kind.handle(s, &call{d: d, signer: string(d.signer), balance: s.balanceOf(string(d.signer)), now: now})
	return err
}

// standing checks that the signer may sign at all: it is a member, or its
// transaction's kind admits it otherwise (txKinds: a claim by a payee of
// an open escrow, whose payer is the member that vouched for it; a
// validator's vote).
func (s *State) standing(d *decoded) error {
	if s.isMember(string(d.signer)) {
		return nil
	}
	if d.kind.standing != nil {
		return d.kind.standing(s, d)
	}
	return notMember(d.signer)
}

func notMember(signer identity.Address) error {
	return reject(CodeNotMember, "%s is not a member: only accounts an issuer admitted (with a grant or an admit) sign transactions", signer)
}

// payeeStanding admits a claim by a payee of an open escrow.
func (s *State) payeeStanding(d *decoded, m *Claim) error {
	return s.isPayee(d, m.Receipt.Job)
}

// disputeStanding admits a dispute by a payee of an open escrow.
func (s *State) disputeStanding(d *decoded, m *Dispute) error {
	return s.isPayee(d, m.Job)
}

func (s *State) isPayee(d *decoded, job string) error {
	if e, ok := s.Escrows[job]; ok && e.hasPayee(string(d.signer)) {
		return nil
	}
	return notMember(d.signer)
}

// voterStanding admits a vote by a current validator, and refuses anyone
// else's as CodeNotValidator.
func (s *State) voterStanding(d *decoded, _ *ValidatorVote) error {
	if _, ok := s.Validators[keyOf(d.tx.Signer)]; ok {
		return nil
	}
	return reject(CodeNotValidator, "%s is not a validator: only the current validators vote on the set", d.signer)
}

// The handlers, one per entry of txKinds: each checks its transaction
// against the state, refusing it with a typed code, and returns the
// effect that makes it.

func (s *State) transfer(c *call, m *Transfer) (effect, error) {
	if err := checkAddress("to", m.To); err != nil {
		return nil, err
	}
	if m.Amount == 0 {
		return nil, reject(CodeInvalidAmount, "transfer of zero")
	}
	if len(m.Memo) > 256 {
		return nil, reject(CodeMalformed, "memo longer than 256 bytes")
	}
	if c.balance < m.Amount {
		return nil, reject(CodeInsufficientFunds, "balance %d, transfer %d", c.balance, m.Amount)
	}
	if m.To != c.signer {
		if err := s.canCredit(m.To, m.Amount); err != nil {
			return nil, err
		}
		if !s.exists(m.To) && m.Amount < s.Params.MinNewAccount {
			return nil, reject(CodeInvalidAmount, "%s has no account yet: a transfer that opens one moves at least %d, not %d",
				m.To, s.Params.MinNewAccount, m.Amount)
		}
	}
	return func() *event {
		s.debit(c.signer, m.Amount)
		s.credit(m.To, m.Amount)
		return &event{accounts: []string{c.signer, m.To},
			attrs: [][2]string{{"from", c.signer}, {"to", m.To}, {"amount", u(m.Amount)}, {"memo", m.Memo}}}
	}, nil
}

func (s *State) grant(c *call, m *Grant) (effect, error) {
	iss, ok := s.Issuers[c.signer]
	if !ok {
		return nil, reject(CodeNotIssuer, "%s is not an issuer", c.signer)
	}
	if err := checkAddress("to", m.To); err != nil {
		return nil, err
	}
	if m.Amount == 0 {
		return nil, reject(CodeInvalidAmount, "grant of zero")
	}
	if m.Amount > iss.Quota {
		return nil, reject(CodeQuotaExceeded, "grant %d exceeds remaining quota %d", m.Amount, iss.Quota)
	}
	if _, ok := add(s.Supply, m.Amount); !ok {
		return nil, reject(CodeOverflow, "supply would overflow")
	}
	if err := s.canCredit(m.To, m.Amount); err != nil {
		return nil, err
	}
	return func() *event {
		iss.Quota -= m.Amount
		s.touch(pIssuer, c.signer)
		s.Supply += m.Amount
		s.dirty[keyMeta] = true
		s.credit(m.To, m.Amount)
		s.admit(m.To, c.signer)
		return &event{accounts: []string{c.signer, m.To},
			attrs: [][2]string{{"from", c.signer}, {"to", m.To}, {"amount", u(m.Amount)}}}
	}, nil
}

// admitTx admits or revokes a member. An issuer revokes only the members
// it admitted; genesis members stay.
func (s *State) admitTx(c *call, m *Admit) (effect, error) {
	if _, ok := s.Issuers[c.signer]; !ok {
		return nil, reject(CodeNotIssuer, "%s is not an issuer: only issuers admit members", c.signer)
	}
	if err := checkAddress("account", m.Account); err != nil {
		return nil, err
	}
	ev := &event{accounts: []string{c.signer, m.Account},
		attrs: [][2]string{{"issuer", c.signer}, {"member", m.Account}}}
	mem, member := s.Members[m.Account]
	if !m.Revoke {
		if member {
			return nil, reject(CodeAlreadyMember, "%s is a member already (admitted by %s)", m.Account, mem.By)
		}
		return func() *event {
			s.admit(m.Account, c.signer)
			return ev
		}, nil
	}
	if !member {
		return nil, reject(CodeNotMember, "%s is not a member: nothing to revoke", m.Account)
	}
	if mem.By != c.signer {
		return nil, reject(CodeNotIssuer, "%s was admitted by %s: only the issuer that admitted a member revokes it", m.Account, mem.By)
	}
	return func() *event {
		delete(s.Members, m.Account)
		s.touch(pMember, m.Account)
		if _, ok := s.Payers[m.Account]; ok {
			delete(s.Payers, m.Account)
			s.touch(pPayer, m.Account)
		}
		// A machine has a record only while it is backed: as a member, or
		// by its link entry (pruneLinks).
		if _, linked := s.Links[m.Account]; !linked {
			if _, ok := s.Machines[m.Account]; ok {
				delete(s.Machines, m.Account)
				s.touch(pMachine, m.Account)
			}
		}
		ev.attrs = append(ev.attrs, [2]string{"revoked", "true"})
		return ev
	}, nil
}

// linkMachine moves a machine to the owner its consent names. The consent
// names the link as it is (owner) and a height since its last change,
// within ConsentBlocks of this block: the change moves the link's height
// past the consent's, so a consent serves for one change only, and no
// consent outlives the ConsentBlocks that an unlinked machine's entry is
// kept.
func (s *State) linkMachine(c *call, m *LinkMachine) (effect, error) {
	con := m.Consent
	if len(con.Machine) != 32 || len(con.Sig) != 64 {
		return nil, reject(CodeMalformed, "machine key or consent signature missing")
	}
	if err := checkAddress("owner", con.Owner); err != nil {
		return nil, err
	}
	machine := string(identity.AddressOf(con.Machine))
	cur := s.link(machine)
	block := s.Height + 1 // the block this transaction runs in (or, for CheckTx, the earliest)
	switch {
	case con.Current != cur.Owner || con.Height < cur.Changed:
		return nil, reject(CodeBadNonce, "the consent was given at height %d for owner %s; machine %s is with %s since height %d: "+
			"ask the machine for a fresh consent", con.Height, con.Current, machine, cur.Owner, cur.Changed)
	case con.Height > s.Height:
		return nil, reject(CodeBadNonce, "the consent names height %d, the ledger is at %d: a consent names a height its machine saw "+
			"(is this node behind the machine's? try again once it catches up)", con.Height, s.Height)
	case block-con.Height > s.Params.ConsentBlocks:
		return nil, reject(CodeExpired, "the consent names height %d, more than %d blocks before this one: ask the machine for a fresh consent",
			con.Height, s.Params.ConsentBlocks)
	}
	if c.now > con.Expiry {
		return nil, reject(CodeExpired, "the consent expired at %d, block time %d", con.Expiry, c.now)
	}
	if con.Expiry > c.now+MaxConsentTTL {
		return nil, reject(CodeExpired, "the consent expires at %d, more than %ds after block time %d", con.Expiry, MaxConsentTTL, c.now)
	}
	if con.Owner == cur.Owner {
		return nil, reject(CodeMalformed, "machine %s earns for %s already", machine, cur.Owner)
	}
	unlink := con.Owner == machine
	switch {
	case !unlink && c.signer != con.Owner:
		return nil, reject(CodeBadSignature, "signed by %s: the new owner %s signs a link", c.signer, con.Owner)
	case unlink && c.signer != cur.Owner && c.signer != machine:
		return nil, reject(CodeBadSignature, "signed by %s: an unlink is signed by the owner %s or the machine", c.signer, cur.Owner)
	}
	// The new owner's limit counts the machines it left in the last
	// ConsentBlocks too: their entries are still kept.
	if n := s.linksOf[con.Owner]; !unlink && n >= s.Params.MaxMachinesPerOwner && (cur.Former != con.Owner || !cur.unlinked(machine)) {
		return nil, reject(CodeLimitReached, "%s has %d machines linked (or unlinked in the last %d blocks), the most allowed",
			con.Owner, n, s.Params.ConsentBlocks)
	}
	if !verify(con.Machine, con.signBytes(s.ChainID), con.Sig) {
		return nil, reject(CodeBadSignature, "the machine's consent does not verify")
	}
	// A link locks the new owner's stake, unless the machine is a member
	// (an issuer vouched for it). An unlink's entry keeps the stake the
	// link locked until the entry goes; a stake left by the machine's
	// previous link or unlink comes back when another owner links it.
	var lock uint64
	if !unlink && !s.isMember(machine) {
		lock = s.Params.LinkStake
		if s.balanceOf(con.Owner) < lock {
			return nil, reject(CodeInsufficientFunds, "linking a machine locks a stake of %d, and %s holds %d", lock, con.Owner, s.balanceOf(con.Owner))
		}
	}
	prev, hadEntry := s.Links[machine]
	stake := lock
	if unlink && hadEntry {
		stake = prev.Stake
	}
	refund := !unlink && hadEntry && prev.Stake > 0
	if refund {
		if err := s.canCredit(prev.staker(machine), prev.Stake); err != nil {
			return nil, err
		}
	}
	return func() *event {
		if refund {
			s.credit(prev.staker(machine), prev.Stake)
		}
		s.debit(con.Owner, lock)
		s.setLink(machine, con.Owner, block, stake)
		return &event{accounts: []string{c.signer, machine, cur.Owner, con.Owner},
			attrs: [][2]string{{"owner", con.Owner}, {"machine", machine}, {"previous", cur.Owner}, {"height", strconv.FormatInt(block, 10)},
				{"stake", u(lock)}}}
	}, nil
}

func (s *State) openEscrowTx(c *call, m *OpenEscrow) (effect, error) {
	if err := checkJob(m.Job); err != nil {
		return nil, err
	}
	if _, ok := s.Escrows[m.Job]; ok {
		return nil, reject(CodeEscrowExists, "escrow for job %s is already open", m.Job)
	}
	if m.Amount == 0 {
		return nil, reject(CodeInvalidAmount, "escrow of zero")
	}
	if m.Expiry <= c.now || m.Expiry > c.now+s.Params.MaxEscrowTTL {
		return nil, reject(CodeExpired, "expiry %d must be after block time %d and within %ds", m.Expiry, c.now, s.Params.MaxEscrowTTL)
	}
	if len(m.Payees) == 0 || len(m.Payees) > 1024 {
		return nil, reject(CodeMalformed, "%d payees; want 1 to 1024", len(m.Payees))
	}
	seen := map[string]bool{}
	for _, p := range m.Payees {
		if err := checkAddress("payee", p); err != nil {
			return nil, err
		}
		if seen[p] {
			return nil, reject(CodeMalformed, "payee %s listed twice", p)
		}
		seen[p] = true
		if owner, ok := s.registered(p); !ok {
			return nil, reject(CodeNotRegistered, "payee %s is not a registered machine (it earns for %s, which is not a member)", p, owner)
		}
	}
	// What an escrow stores grows with its payees: it locks at least
	// MinPayment for each, so a member's open escrows take state in
	// proportion to the credits it has locked.
	if hi, least := bits.Mul64(s.Params.MinPayment, uint64(len(m.Payees))); hi != 0 || m.Amount < least {
		return nil, reject(CodeInvalidAmount, "escrow of %d for %d payees: an escrow locks at least %d per payee it names",
			m.Amount, len(m.Payees), s.Params.MinPayment)
	}
	if n := s.escrowsOf[c.signer]; n >= s.Params.MaxOpenEscrows {
		return nil, reject(CodeLimitReached, "%s has %d escrows open, the most allowed", c.signer, n)
	}
	if c.balance < m.Amount {
		return nil, reject(CodeInsufficientFunds, "balance %d, escrow %d", c.balance, m.Amount)
	}
	return func() *event {
		s.debit(c.signer, m.Amount)
		payees := append([]string(nil), m.Payees...)
		sort.Strings(payees)
		s.openEscrow(m.Job, &Escrow{Payer: c.signer, PayerKey: append([]byte(nil), c.d.tx.Signer...), Total: m.Amount,
			Amount: m.Amount, Expiry: m.Expiry, Payees: payees})
		return &event{accounts: []string{c.signer},
			attrs: [][2]string{{"job", m.Job}, {"from", c.signer}, {"amount", u(m.Amount)}, {"expiry", strconv.FormatInt(m.Expiry, 10)}}}
	}, nil
}

// settle pays each machine what the payer names, at once, and opens the
// escrow's dispute window: its payees may lodge their latest receipts
// until it closes (claim), a payee marked failed may dispute the mark
// (dispute), and the first block past the window refunds the rest to the
// payer (closeSettled). The payer's word alone pays no less than its
// receipts: what it signed binds it.
func (s *State) settle(c *call, m *Settle) (effect, error) {
	e, err := s.payerEscrow(m.Job, c.signer)
	if err != nil {
		return nil, err
	}
	if e.Settled != 0 {
		return nil, reject(CodeSettled, "job %s was settled at %d; its escrow closes at %d", m.Job, e.Settled, e.Closes)
	}
	if c.now > math.MaxInt64-s.Params.DisputeWindow {
		return nil, reject(CodeOverflow, "block time %d: the dispute window would overflow", c.now)
	}
	closes := c.now + s.Params.DisputeWindow
	owed := map[string]uint64{}
	var total, withheld uint64
	var ok bool
	seen := map[string]bool{}
	for _, p := range m.Payments {
		if !e.hasPayee(p.Machine) {
			return nil, reject(CodeNotPayee, "%s is not a payee of job %s", p.Machine, m.Job)
		}
		if seen[p.Machine] {
			return nil, reject(CodeMalformed, "machine %s paid twice", p.Machine)
		}
		if p.Refused > p.Rounds || p.Rounds > MaxRounds {
			return nil, reject(CodeMalformed, "machine %s: %d rounds refused of %d; want at most the rounds, and at most %d rounds", p.Machine, p.Refused, p.Rounds, MaxRounds)
		}
		if p.Withheld > 0 && p.Refused == 0 && !p.Failed {
			return nil, reject(CodeMalformed, "machine %s: %d withheld for no refused round and no forfeit", p.Machine, p.Withheld)
		}
		if withheld, ok = add(withheld, p.Withheld); !ok {
			return nil, reject(CodeInvalidAmount, "withheld amounts overflow")
		}
		seen[p.Machine] = true
		if total, ok = add(total, p.Amount); !ok || total > e.Total {
			return nil, reject(CodeInvalidAmount, "payments exceed the %d locked for job %s", e.Total, m.Job)
		}
		// What a machine already claimed counts toward what it is owed.
		if claimed := e.claimed(p.Machine); p.Amount > claimed {
			owed[p.Machine] = p.Amount - claimed
		}
	}
	var pay uint64
	for _, v := range owed {
		pay += v // bounded by total
	}
	if pay > e.Amount || withheld > e.Amount-pay {
		return nil, reject(CodeInvalidAmount, "settlement pays %d and withholds %d but the escrow holds %d", pay, withheld, e.Amount)
	}
	// Owners paid twice (two machines, one owner) are credited in turn:
	// check the sums each would reach.
	credits := map[string]uint64{}
	for _, p := range m.Payments {
		credits[s.ownerOf(p.Machine)] += owed[p.Machine] // bounded by total
	}
	for owner, amount := range credits {
		if err := s.canCredit(owner, amount); err != nil {
			return nil, err
		}
	}
	return func() *event {
		ev := &event{accounts: []string{c.signer}, attrs: [][2]string{{"job", m.Job}, {"from", c.signer}}}
		for _, p := range m.Payments {
			owner := s.ownerOf(p.Machine)
			s.credit(owner, owed[p.Machine])
			if owed[p.Machine] > 0 {
				e.setClaimed(p.Machine, e.claimed(p.Machine)+owed[p.Machine], 0)
			}
			if p.Failed {
				e.Marks = append(e.Marks, Mark{Machine: p.Machine})
			}
			if p.Withheld > 0 {
				e.Withheld = append(e.Withheld, Withheld{Payee: p.Machine, Amount: p.Withheld})
				ev.attrs = append(ev.attrs, [2]string{"withheld", p.Machine + "=" + u(p.Withheld)})
			}
			if s.countsFor(p.Machine, c.signer, owed[p.Machine]) {
				rec := s.machine(p.Machine)
				rec.Earned = satAdd(rec.Earned, owed[p.Machine])
				rec.Rounds, rec.Refused = satAdd(rec.Rounds, uint64(p.Rounds)), satAdd(rec.Refused, uint64(p.Refused))
			}
			if p.Rounds > 0 {
				pr := s.payer(c.signer)
				pr.Rounds, pr.Refused = satAdd(pr.Rounds, uint64(p.Rounds)), satAdd(pr.Refused, uint64(p.Refused))
			}
			ev.accounts = append(ev.accounts, owner)
			ev.attrs = append(ev.attrs, [2]string{"paid", p.Machine + "=" + u(owed[p.Machine])})
		}
		sort.Slice(e.Marks, func(i, j int) bool { return e.Marks[i].Machine < e.Marks[j].Machine })
		sort.Slice(e.Withheld, func(i, j int) bool { return e.Withheld[i].Payee < e.Withheld[j].Payee })
		e.Amount -= pay
		e.Settled, e.Closes, e.SettledPaid = c.now, closes, e.Total-e.Amount
		s.touch(pEscrow, m.Job)
		s.closing = append(s.closing, closing{at: closes, job: m.Job})
		// The refund is what the escrow holds once the window closes, less
		// what payees lodge meanwhile.
		ev.attrs = append(ev.attrs, [2]string{"refund", u(e.Amount)}, [2]string{"closes", strconv.FormatInt(closes, 10)})
		return ev
	}, nil
}

// claim pays a payee what the payer's latest receipt says it earned,
// less what it was paid already: once the escrow expired unsettled, or
// in the dispute window a settlement opened (a payee lodging its
// receipt against a settlement that paid it less).
func (s *State) claim(c *call, m *Claim) (effect, error) {
	r := m.Receipt
	if err := checkJob(r.Job); err != nil {
		return nil, err
	}
	e, ok := s.Escrows[r.Job]
	if !ok {
		return nil, reject(CodeUnknownEscrow, "no open escrow for job %s", r.Job)
	}
	if r.Payee != c.signer {
		return nil, reject(CodeNotPayee, "receipt is for %s, claimed by %s", r.Payee, c.signer)
	}
	if !e.hasPayee(c.signer) {
		return nil, reject(CodeNotPayee, "%s is not a payee of job %s", c.signer, r.Job)
	}
	if e.Settled == 0 && c.now < e.Expiry {
		return nil, reject(CodeNotExpired, "escrow expires at %d, block time %d: claims open then, or once the payer settles", e.Expiry, c.now)
	}
	if len(r.Sig) != 64 || !verify(e.PayerKey, receiptBytes(s.ChainID, r), r.Sig) {
		return nil, reject(CodeBadReceipt, "receipt is not signed by the payer %s", e.Payer)
	}
	already := e.claimed(c.signer)
	if r.Amount <= already {
		return nil, reject(CodeBadReceipt, "receipt covers %d, already paid %d", r.Amount, already)
	}
	amount := min(r.Amount-already, e.Amount)
	if amount == 0 {
		return nil, reject(CodeInsufficientFunds, "escrow for job %s is empty", r.Job)
	}
	owner := s.ownerOf(c.signer)
	if err := s.canCredit(owner, amount); err != nil {
		return nil, err
	}
	return func() *event {
		e.Amount -= amount
		e.setClaimed(c.signer, already+amount, r.Seq)
		s.touch(pEscrow, r.Job)
		s.credit(owner, amount)
		if s.countsFor(c.signer, e.Payer, amount) {
			rec := s.machine(c.signer)
			rec.Earned = satAdd(rec.Earned, amount)
		}
		ev := &event{accounts: []string{c.signer, owner, e.Payer},
			attrs: [][2]string{{"job", r.Job}, {"to", owner}, {"amount", u(amount)}}}
		if e.Settled != 0 {
			// Lodged against the settlement: it comes out of the payer's refund.
			ev.attrs = append(ev.attrs, [2]string{"from", e.Payer}, [2]string{"lodged", "true"})
		}
		return ev
	}, nil
}

// dispute is a payee contesting the failed mark a settlement gave it, in
// the escrow's dispute window: a disputed mark does not count in its
// record, and counts in the payer's as disputed.
func (s *State) dispute(c *call, m *Dispute) (effect, error) {
	if err := checkJob(m.Job); err != nil {
		return nil, err
	}
	e, ok := s.Escrows[m.Job]
	if !ok {
		return nil, reject(CodeUnknownEscrow, "no open escrow for job %s", m.Job)
	}
	if e.Settled == 0 {
		return nil, reject(CodeNotSettled, "job %s is not settled: there is no mark to dispute yet", m.Job)
	}
	i := e.markIndex(c.signer)
	switch {
	case i < 0:
		return nil, reject(CodeNotPayee, "the settlement of job %s did not mark %s failed", m.Job, c.signer)
	case e.Marks[i].Disputed:
		return nil, reject(CodeAlreadyVoted, "%s disputed its mark on job %s already", c.signer, m.Job)
	}
	if j := e.caseOf(c.signer); j >= 0 && e.Cases[j].Verdict != "" {
		return nil, reject(CodeClosedAppeal, "the referees decided the appeal of %s on job %s: %s", c.signer, m.Job, e.Cases[j].Verdict)
	}
	return func() *event {
		e.Marks[i].Disputed = true
		s.touch(pEscrow, m.Job)
		return &event{accounts: []string{c.signer, e.Payer},
			attrs: [][2]string{{"job", m.Job}, {"machine", c.signer}, {"payer", e.Payer}}}
	}, nil
}

func (s *State) expire(c *call, m *Expire) (effect, error) {
	e, err := s.payerEscrow(m.Job, c.signer)
	if err != nil {
		return nil, err
	}
	if e.Settled != 0 {
		return nil, reject(CodeSettled, "job %s is settled: its escrow closes by itself at %d", m.Job, e.Closes)
	}
	if c.now < e.Expiry+s.Params.ClaimGrace {
		return nil, reject(CodeNotExpired, "escrow can be expired from %d (expiry + %ds for claims), block time %d",
			e.Expiry+s.Params.ClaimGrace, s.Params.ClaimGrace, c.now)
	}
	if err := s.canCredit(c.signer, e.Amount); err != nil {
		return nil, err
	}
	return func() *event {
		refund := s.closeEscrow(m.Job)
		return &event{accounts: []string{c.signer},
			attrs: [][2]string{{"job", m.Job}, {"refund", u(refund)}}}
	}, nil
}

func (s *State) payerEscrow(job, signer string) (*Escrow, error) {
	if err := checkJob(job); err != nil {
		return nil, err
	}
	e, ok := s.Escrows[job]
	if !ok {
		return nil, reject(CodeUnknownEscrow, "no open escrow for job %s", job)
	}
	if e.Payer != signer {
		return nil, reject(CodeNotPayer, "job %s is paid by %s, not %s", job, e.Payer, signer)
	}
	return e, nil
}

// countsFor reports whether paying machine amount, from payer, counts in
// the machine's record: a machine's record counts only work it was paid
// for, by someone else. The payment is at least MinPayment, so a record
// costs whoever moves it (a payer who names a machine it never used and
// marks it failed pays it for each mark); the payer is neither the machine
// nor its owner, whose payment would come back to it (a member cannot
// rate its own machines); and the machine is registered, so that records
// exist only for machines a member backs (they go with the link entry,
// pruneLinks).
func (s *State) countsFor(machine, payer string, amount uint64) bool {
	owner, registered := s.registered(machine)
	return registered && amount >= s.Params.MinPayment && owner != payer && machine != payer
}

// satAdd is a+b, or the largest uint64 if that overflows: records are
// counts and sums over all time, not balances.
func satAdd(a, b uint64) uint64 {
	if v, ok := add(a, b); ok {
		return v
	}
	return math.MaxUint64
}

func (s *State) machine(addr string) *MachineRecord { return entry(s, s.Machines, pMachine, addr) }

func (e *Escrow) hasPayee(p string) bool {
	i := sort.SearchStrings(e.Payees, p)
	return i < len(e.Payees) && e.Payees[i] == p
}

// markIndex is where p's mark is in e.Marks, or -1.
func (e *Escrow) markIndex(p string) int {
	i := sort.Search(len(e.Marks), func(i int) bool { return e.Marks[i].Machine >= p })
	if i < len(e.Marks) && e.Marks[i].Machine == p {
		return i
	}
	return -1
}

// mark is p's mark, if the settlement gave it one.
func (e *Escrow) mark(p string) (Mark, bool) {
	if i := e.markIndex(p); i >= 0 {
		return e.Marks[i], true
	}
	return Mark{}, false
}

func (e *Escrow) claimed(p string) uint64 {
	for _, c := range e.Claimed {
		if c.Payee == p {
			return c.Amount
		}
	}
	return 0
}

func (e *Escrow) setClaimed(p string, amount, seq uint64) {
	for i := range e.Claimed {
		if e.Claimed[i].Payee == p {
			e.Claimed[i].Amount, e.Claimed[i].Seq = amount, seq
			return
		}
	}
	e.Claimed = append(e.Claimed, Claimed{Payee: p, Amount: amount, Seq: seq})
	sort.Slice(e.Claimed, func(i, j int) bool { return e.Claimed[i].Payee < e.Claimed[j].Payee })
}
