package ledger

import (
	"encoding/json"
	"fmt"
	"math/big"
	"math/bits"
	"slices"
	"sort"

	"github.com/deepmarket/deepmarket/identity"
)

// Account is a balance and the next nonce its key must sign with.
type Account struct {
	Balance uint64 `cbor:"balance" json:"balance"`
	Nonce   uint64 `cbor:"nonce" json:"nonce"`
}

// live reports whether the account is an entry of the state: it holds
// credits or has signed. One looked up and never used is none.
func (a *Account) live() bool { return a.Balance != 0 || a.Nonce != 0 }

// Issuer may grant credits up to its remaining quota.
type Issuer struct {
	Quota uint64 `cbor:"quota" json:"quota"`
}

// Member is an account an issuer admitted: only members sign transactions.
type Member struct {
	By string `cbor:"by" json:"admitted_by"` // the issuer's account, or GenesisAdmitter
}

// GenesisAdmitter is Member.By for the members genesis made.
const GenesisAdmitter = "genesis"

// Link is whom a machine earns for, and when that last changed. A machine
// has an entry while it is linked to an owner, and for Params.ConsentBlocks
// after it is unlinked (Owner is then the machine itself and Former the
// owner it left, whose limit still counts it): as long as a consent given
// before the unlink could still be used. Then the entry goes.
type Link struct {
	Owner string `cbor:"owner" json:"owner"`
	// Changed is the height of the block that last changed the link. A
	// consent names a height at or after it, so a consent given before a
	// change never serves after it.
	Changed int64 `cbor:"changed" json:"changed"`
	// Former is, in the entry an unlink leaves, the owner it left.
	Former string `cbor:"former,omitempty" json:"former,omitempty"`
	// Stake is what the owner (or, in an unlink's entry, the owner it
	// left) locked to link the machine (Params.LinkStake): returned when
	// another owner links the machine, or when an unlink's entry goes.
	Stake uint64 `cbor:"stake,omitempty" json:"stake,omitempty"`
}

// staker is who gets l's stake back.
func (l *Link) staker(machine string) string { return l.counted(machine) }

// unlinked reports whether l is the entry an unlink leaves (machine is its
// key).
func (l *Link) unlinked(machine string) bool { return l.Owner == machine }

// counted is the owner whose limit counts a machine's entry: the owner it
// is linked to, or the one it left while the entry stays.
func (l *Link) counted(machine string) string {
	if l.unlinked(machine) {
		return l.Former
	}
	return l.Owner
}

// Claimed records what a payee has been paid from an escrow so far: by
// claims, by the settlement and by receipts lodged in its dispute window.
type Claimed struct {
	Payee  string `cbor:"payee" json:"payee"`
	Amount uint64 `cbor:"amount" json:"amount"`
	Seq    uint64 `cbor:"seq" json:"seq"`
}

// Escrow holds a job's maximum price.
type Escrow struct {
	Payer    string    `cbor:"payer" json:"payer"`
	PayerKey []byte    `cbor:"payer_key" json:"payer_key"` // verifies the payer's receipts
	Total    uint64    `cbor:"total" json:"total"`         // locked at opening
	Amount   uint64    `cbor:"amount" json:"amount"`       // still held
	Expiry   int64     `cbor:"expiry" json:"expiry"`       // unix seconds
	Payees   []string  `cbor:"payees" json:"payees"`
	Claimed  []Claimed `cbor:"claimed,omitempty" json:"claimed,omitempty"`
	// Settled is the block time of the payer's settlement, 0 before it.
	// A settlement pays what it names at once and opens a dispute window:
	// until Closes (Settled + Params.DisputeWindow) each payee may lodge
	// the latest receipt the payer signed it (a Claim) and is paid up to
	// it from what the escrow still holds, and a payee the settlement
	// marked failed may dispute the mark. The first block at or after
	// Closes refunds the rest to the payer and closes the escrow.
	Settled int64 `cbor:"settled,omitempty" json:"settled,omitempty"`
	Closes  int64 `cbor:"closes,omitempty" json:"closes,omitempty"`
	// SettledPaid is what had been paid out of the escrow once the
	// settlement paid: the payer's own word, against which its record
	// counts what its receipts made it owe (PayerRecord).
	SettledPaid uint64 `cbor:"settled_paid,omitempty" json:"settled_paid,omitempty"`
	// Marks are the payees the settlement said failed, and whether each
	// disputed it in the window: an undisputed mark counts in the
	// machine's record when the escrow closes, a disputed one does not.
	Marks []Mark `cbor:"marks,omitempty" json:"marks,omitempty"`
	// Cases are the payees' appeals against the settlement, by
	// appellant (appeal.go). The escrow stays open until every one is
	// decided or past its deadline.
	Cases []Case `cbor:"cases,omitempty" json:"cases,omitempty"`
	// Withheld is, per payee, what the settlement said its refused
	// rounds or its forfeit would have paid (Payment.Withheld): burned when
	// the escrow closes, less what an overturned appeal paid the payee,
	// unless an appeal of its upheld the refusal.
	Withheld []Withheld `cbor:"withheld,omitempty" json:"withheld,omitempty"`
}

// Withheld is a payee's share of an escrow its refused rounds would have
// paid.
type Withheld struct {
	Payee  string `cbor:"payee" json:"payee"`
	Amount uint64 `cbor:"amount" json:"amount"`
}

// Mark is a settlement's statement that a payee failed the job.
type Mark struct {
	Machine  string `cbor:"machine" json:"machine"`
	Disputed bool   `cbor:"disputed,omitempty" json:"disputed,omitempty"`
}

func (e *Escrow) clone() *Escrow {
	c := *e
	c.PayerKey = append([]byte(nil), e.PayerKey...)
	c.Payees = append([]string(nil), e.Payees...)
	c.Claimed = append([]Claimed(nil), e.Claimed...)
	c.Marks = append([]Mark(nil), e.Marks...)
	c.Withheld = append([]Withheld(nil), e.Withheld...)
	c.Cases = make([]Case, len(e.Cases))
	for i, k := range e.Cases {
		c.Cases[i] = k.clone()
	}
	if e.Cases == nil {
		c.Cases = nil
	}
	return &c
}

// PayerRecord is a payer's track record, for the machines it would pay:
// lenders read it in quotes and may refuse a payer by it. It counts the
// escrows that closed (settled, or expired unsettled), what the payer's
// own settlements paid against what it owed (what its payees were paid
// in all, their receipts lodged in the window and claims after expiry
// included), the failed marks it gave and how many of them the machine
// disputed. The record goes with the payer's membership.
type PayerRecord struct {
	Closed   uint64 `cbor:"closed" json:"closed"`
	Paid     uint64 `cbor:"paid" json:"paid"`
	Owed     uint64 `cbor:"owed" json:"owed"`
	Marks    uint64 `cbor:"marks,omitempty" json:"marks"`
	Disputed uint64 `cbor:"disputed,omitempty" json:"disputed"`
	// Rounds are its held jobs' rounds it settled, Refused those its
	// holders refused: its refusal rate, by its own settlements.
	Rounds  uint64 `cbor:"rounds,omitempty" json:"rounds"`
	Refused uint64 `cbor:"refused,omitempty" json:"refused"`
	// AppealsLost counts the appeals against its settlements that
	// referees decided for the appellant.
	AppealsLost uint64 `cbor:"appeals_lost,omitempty" json:"appeals_lost"`
}

// MachineRecord is a machine's track record, for the scheduler. It counts
// only paid work: a settlement that pays the machine at least
// Params.MinPayment, from a payer other than the machine and its owner,
// while the machine is registered (State.countsFor). The record goes
// with the machine's link entry (pruneLinks), or for a machine that is a
// member and has none, with its membership.
type MachineRecord struct {
	Completed uint64 `cbor:"completed" json:"completed"`
	Failed    uint64 `cbor:"failed" json:"failed"`
	Earned    uint64 `cbor:"earned" json:"earned"`
	// Rounds are its workers' rounds in held jobs and Refused those the
	// holders refused: a statistic of their own, not failures.
	Rounds  uint64 `cbor:"rounds,omitempty" json:"rounds"`
	Refused uint64 `cbor:"refused,omitempty" json:"refused"`
	// MarkedBy counts, by payer (sorted), the failed marks that payer's
	// settlements gave the machine and it did not dispute. Failed counts
	// at most MaxMarksPerPayer of each payer's: one account cannot price
	// a machine out of the market with cheap marks.
	MarkedBy []PayerMarks `cbor:"marked_by,omitempty" json:"marked_by,omitempty"`
	// AppealsLost counts its appeals the referees decided against it.
	AppealsLost uint64 `cbor:"appeals_lost,omitempty" json:"appeals_lost"`
}

func (r *MachineRecord) clone() *MachineRecord {
	c := *r
	c.MarkedBy = slices.Clone(r.MarkedBy)
	return &c
}

// PayerMarks is one payer's undisputed failed marks on a machine.
type PayerMarks struct {
	Payer string `cbor:"payer" json:"payer"`
	Marks uint64 `cbor:"marks" json:"marks"`
}

// MaxMarksPerPayer is how many of one payer's failed marks count in a
// machine's record (MachineRecord.Failed): with the scheduler's prior
// (a failure rate of 0.1 weighing as 10 jobs), one payer can move a new
// machine's risk multiplier from 1.11 to at most 1.33, whatever it pays
// for its marks.
const MaxMarksPerPayer = 2

// markBy counts one more undisputed mark from payer and reports whether
// it counts in Failed (the payer's first MaxMarksPerPayer do).
func (r *MachineRecord) markBy(payer string) bool {
	i := sort.Search(len(r.MarkedBy), func(i int) bool { return r.MarkedBy[i].Payer >= payer })
	if i == len(r.MarkedBy) || r.MarkedBy[i].Payer != payer {
		r.MarkedBy = slices.Insert(r.MarkedBy, i, PayerMarks{Payer: payer})
	}
	r.MarkedBy[i].Marks = satAdd(r.MarkedBy[i].Marks, 1)
	return r.MarkedBy[i].Marks <= MaxMarksPerPayer
}

// Params are the chain's rules, fixed at genesis. A genesis that leaves a
// field out gets its default (DefaultParams).
type Params struct {
	// ClaimGrace is how long after an escrow's expiry its payees may still
	// claim before the payer may Expire it (seconds). Default 3600.
	ClaimGrace int64 `cbor:"claim_grace" json:"claim_grace_s"`
	// MaxEscrowTTL bounds how far ahead an escrow may expire (seconds).
	// Default 30 days.
	MaxEscrowTTL int64 `cbor:"max_escrow_ttl" json:"max_escrow_ttl_s"`
	// MaxMachinesPerOwner bounds the machines linked to one account, a
	// machine it unlinked counting for ConsentBlocks more. Default 256.
	MaxMachinesPerOwner uint64 `cbor:"max_machines_per_owner" json:"max_machines_per_owner"`
	// ConsentBlocks is how many blocks a machine's link consent may be
	// used after the height it names, and so how long an unlinked
	// machine's entry is kept. Default 3,600.
	ConsentBlocks int64 `cbor:"consent_blocks" json:"consent_blocks"`
	// MinPayment is the least an escrow locks for each payee it names,
	// and the least a settlement pays a machine for the job to count in
	// its record (micro-credits). Default 10,000 (0.01 credit).
	MinPayment uint64 `cbor:"min_payment" json:"min_payment"`
	// MaxOpenEscrows bounds the escrows one payer has open. Default 1,024.
	MaxOpenEscrows uint64 `cbor:"max_open_escrows" json:"max_open_escrows"`
	// MinNewAccount is the least a Transfer to an account that does not
	// exist yet must move (micro-credits). Default 1 credit.
	MinNewAccount uint64 `cbor:"min_new_account" json:"min_new_account"`
	// MaxTxsPerBlock bounds one signer's transactions in a block, and in
	// the mempool at once. Default 1,000.
	MaxTxsPerBlock uint64 `cbor:"max_txs_per_block" json:"max_txs_per_block"`
	// DisputeWindow is how long a settled escrow stays open for its
	// payees to lodge their receipts and dispute failed marks (seconds).
	// Default 600.
	DisputeWindow int64 `cbor:"dispute_window" json:"dispute_window_s"`
	// Referees is how many validators judge an appeal (fewer when fewer
	// are not party to it). Default 3.
	Referees uint64 `cbor:"referees" json:"referees"`
	// AppealBond is what an appellant's owner locks with an appeal: the
	// referees' pay if they uphold the refusal, returned if they
	// overturn it (the payer then pays them as much) or do not decide
	// (micro-credits). Default 100,000 (0.1 credit).
	AppealBond uint64 `cbor:"appeal_bond" json:"appeal_bond"`
	// VerdictWindow is how long the referees have to decide an appeal
	// (seconds). Default 300.
	VerdictWindow int64 `cbor:"verdict_window" json:"verdict_window_s"`
	// LinkStake is what an owner locks for each machine it links that is
	// not a member itself (an issuer admitted members; a machine key is
	// free), returned when the machine's entry goes ConsentBlocks after an
	// unlink, or at once when another owner links it (micro-credits).
	// Default 1,000,000 (1 credit): a fake machine costs a credit locked.
	LinkStake uint64 `cbor:"link_stake" json:"link_stake"`
}

// DefaultParams are used when genesis names none, and for each field a
// genesis leaves out.
func DefaultParams() Params {
	return Params{
		ClaimGrace: 3600, MaxEscrowTTL: 30 * 24 * 3600,
		MaxMachinesPerOwner: 256, ConsentBlocks: 3600, MinPayment: 10_000,
		MaxOpenEscrows: 1024, MinNewAccount: 1_000_000, MaxTxsPerBlock: 1000,
		DisputeWindow: 600, Referees: 3, AppealBond: 100_000, VerdictWindow: 300, LinkStake: 1_000_000,
	}
}

// UnmarshalJSON starts from DefaultParams, so a genesis written before a
// field existed keeps its meaning.
func (p *Params) UnmarshalJSON(b []byte) error {
	type plain Params
	v := plain(DefaultParams())
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*p = Params(v)
	return nil
}

func (p Params) validate() error {
	switch {
	case p.ClaimGrace < 0:
		return fmt.Errorf("claim_grace_s must be >= 0")
	case p.MaxEscrowTTL <= 0:
		return fmt.Errorf("max_escrow_ttl_s must be > 0")
	case p.MaxOpenEscrows == 0:
		return fmt.Errorf("max_open_escrows must be > 0")
	case p.MaxTxsPerBlock == 0:
		return fmt.Errorf("max_txs_per_block must be > 0")
	case p.ConsentBlocks <= 0:
		return fmt.Errorf("consent_blocks must be > 0")
	case p.DisputeWindow <= 0 || p.DisputeWindow > p.MaxEscrowTTL:
		return fmt.Errorf("dispute_window_s must be > 0 and at most max_escrow_ttl_s")
	case p.Referees == 0 || p.Referees > MaxReferees:
		return fmt.Errorf("referees must be 1 to %d", MaxReferees)
	case p.VerdictWindow <= 0 || p.VerdictWindow > p.MaxEscrowTTL:
		return fmt.Errorf("verdict_window_s must be > 0 and at most max_escrow_ttl_s")
	}
	return nil
}

// State is the whole ledger. The exported maps are its entries, each a
// leaf of the authenticated store (store.go), and each has its entry in
// collections (collections.go); the rest is derived from them and rebuilt
// when the store is opened.
type State struct {
	ChainID  string
	Height   int64
	Time     int64 // the last block's time, unix seconds
	AppHash  []byte
	Supply   uint64 // every grant ever issued, genesis balances included, less Burned
	Burned   uint64 // withheld for refused rounds and burned (Escrow.Withheld)
	Params   Params
	Accounts map[string]*Account
	Issuers  map[string]*Issuer
	Members  map[string]*Member
	Links    map[string]*Link // by machine address
	Escrows  map[string]*Escrow
	Machines map[string]*MachineRecord
	Payers   map[string]*PayerRecord
	// Validators is the validator set by hex key, as CometBFT will have it
	// once this block's updates apply; Pending, by hex key, the votes on
	// changing it (validators.go).
	Validators map[string]*Validator
	Pending    map[string]*PendingVotes

	linksOf   map[string]uint64 // owner -> machines linked to it, and those it left that still have an entry
	escrowsOf map[string]uint64 // payer -> escrows open
	unlinks   []unlink          // the entries unlinks left, oldest first: what pruneLinks removes
	closing   []closing         // the settled escrows, earliest Closes first: what closeSettled closes
	books     Books             // kept from each block's changes (store.go)

	dirty map[string]bool // keys changed since the last commit
	// seed is what the block being finalized draws referees with: its
	// hash, beside the state's app hash and height.
	seed []byte
}

// NewState returns an empty state.
func NewState() *State {
	s := &State{linksOf: map[string]uint64{}, escrowsOf: map[string]uint64{}, books: newBooks(), dirty: map[string]bool{}}
	for _, c := range collections {
		c.init(s)
	}
	return s
}

// unlink is an entry an unlink left, in the queue of those to remove.
type unlink struct {
	changed int64
	machine string
}

// closing is a settled escrow, in the queue of those to close.
type closing struct {
	at  int64 // its Closes
	job string
}

// Key prefixes in the store, one per collection (collections.go).
// keyMeta, in none, holds the chain ID, supply and params.
const (
	pAccount   = "a/"
	pIssuer    = "i/"
	pMember    = "n/"
	pLink      = "l/"
	pEscrow    = "e/"
	pMachine   = "m/"
	pPayer     = "y/"
	pValidator = "v/"
	pPending   = "p/"
	keyMeta    = "c"
)

func (s *State) touch(prefix, key string) { s.dirty[prefix+key] = true }

func (s *State) markAllDirty() {
	s.dirty[keyMeta] = true
	for _, c := range collections {
		for k := range c.keys(s) {
			s.touch(c.prefix, k)
		}
	}
}

// balanceOf reads a balance without creating an account.
func (s *State) balanceOf(addr string) uint64 {
	if a, ok := s.Accounts[addr]; ok {
		return a.Balance
	}
	return 0
}

// exists reports whether an account holds credits or has signed.
func (s *State) exists(addr string) bool {
	a, ok := s.Accounts[addr]
	return ok && a.live()
}

// account returns the account, creating an empty one, and marks it
// changed.
func (s *State) account(addr string) *Account { return entry(s, s.Accounts, pAccount, addr) }

// entry returns m's entry under key, creating an empty one, and marks it
// changed (the leaf prefix+key).
func entry[T any](s *State, m map[string]*T, prefix, key string) *T {
	v, ok := m[key]
	if !ok {
		v = new(T)
		m[key] = v
	}
	s.touch(prefix, key)
	return v
}

func (s *State) credit(addr string, amount uint64) {
	s.account(addr).Balance += amount // callers check overflow first
}

func (s *State) debit(addr string, amount uint64) {
	s.account(addr).Balance -= amount // callers check the balance first
}

func (s *State) canCredit(addr string, amount uint64) error {
	if _, ok := add(s.balanceOf(addr), amount); !ok {
		return reject(CodeOverflow, "crediting %d would overflow %s's balance", amount, addr)
	}
	return nil
}

func (s *State) isMember(addr string) bool {
	_, ok := s.Members[addr]
	return ok
}

func (s *State) admit(addr, by string) {
	if _, ok := s.Members[addr]; !ok {
		s.Members[addr] = &Member{By: by}
		s.touch(pMember, addr)
	}
}

// link returns a machine's link: its own address, changed at height 0,
// if it has no entry.
func (s *State) link(machine string) Link {
	if l, ok := s.Links[machine]; ok {
		return *l
	}
	return Link{Owner: machine}
}

// ownerOf returns the account a machine earns into.
func (s *State) ownerOf(machine string) string { return s.link(machine).Owner }

// registered reports whether a machine is backed by a member: it is one,
// or it is linked to one.
func (s *State) registered(machine string) (owner string, ok bool) {
	owner = s.ownerOf(machine)
	return owner, s.isMember(owner)
}

// setLink points machine at owner at height h, keeping the per-owner
// counts. An unlink keeps the entry, counted for the owner it left, until
// pruneLinks removes it.
func (s *State) setLink(machine, owner string, h int64, stake uint64) {
	l := s.link(machine)
	if was, ok := s.Links[machine]; ok {
		s.uncount(was.counted(machine))
	}
	next := &Link{Owner: owner, Changed: h, Stake: stake}
	if owner == machine {
		next.Former = l.Owner
		s.unlinks = append(s.unlinks, unlink{changed: h, machine: machine})
	}
	s.linksOf[next.counted(machine)]++
	s.Links[machine] = next
	s.touch(pLink, machine)
}

// uncount takes one entry off owner's count.
func (s *State) uncount(owner string) {
	if s.linksOf[owner]--; s.linksOf[owner] == 0 {
		delete(s.linksOf, owner)
	}
}

// pruneLinks removes, at the start of block h, the entries unlinks left
// that no consent can use any more (ConsentBlocks after the unlink), and
// with each the machine's record unless the machine is a member: records
// are kept for the machines members back, not for every key ever paid.
func (s *State) pruneLinks(h int64) {
	for len(s.unlinks) > 0 && s.unlinks[0].changed+s.Params.ConsentBlocks <= h {
		u := s.unlinks[0]
		s.unlinks = s.unlinks[1:]
		l, ok := s.Links[u.machine]
		if !ok || !l.unlinked(u.machine) || l.Changed != u.changed {
			continue // linked again since
		}
		s.uncount(l.Former)
		s.credit(l.Former, l.Stake) // the stake comes back with the entry
		delete(s.Links, u.machine)
		s.touch(pLink, u.machine)
		if _, ok := s.Machines[u.machine]; ok && !s.isMember(u.machine) {
			delete(s.Machines, u.machine)
			s.touch(pMachine, u.machine)
		}
	}
	if len(s.unlinks) == 0 {
		s.unlinks = nil // let the backing array go
	}
}

func (s *State) openEscrow(job string, e *Escrow) {
	s.Escrows[job] = e
	s.escrowsOf[e.Payer]++
	s.touch(pEscrow, job)
}

// closeEscrow burns what the escrow still withholds for refused rounds
// (at most what it holds), refunds the rest to its payer, counts the
// escrow in its payer's record and its payees' (closeRecords), and
// removes it.
func (s *State) closeEscrow(job string) (refund uint64) {
	e := s.Escrows[job]
	s.lapse(e)
	var withheld uint64
	for _, w := range e.Withheld {
		withheld = satAdd(withheld, w.Amount)
	}
	if burn := min(withheld, e.Amount); burn > 0 {
		e.Amount -= burn
		s.Supply -= burn // the escrow held it: within the supply
		s.Burned = satAdd(s.Burned, burn)
		s.dirty[keyMeta] = true
	}
	refund = e.Amount
	s.credit(e.Payer, refund) // supply bounds every balance: no overflow
	s.closeRecords(e)
	delete(s.Escrows, job)
	if s.escrowsOf[e.Payer]--; s.escrowsOf[e.Payer] == 0 {
		delete(s.escrowsOf, e.Payer)
	}
	s.touch(pEscrow, job)
	return refund
}

// closeRecords counts a closing escrow in the records. The payer's:
// what its settlement paid (nothing, if it never settled) against what
// its payees were paid in all. The payees': a mark the machine did not
// dispute counts it failed, and a payee paid without a mark counts it
// completed; either counts only a payment State.countsFor counts.
func (s *State) closeRecords(e *Escrow) {
	paid := e.Total - e.Amount
	settled := min(e.SettledPaid, paid)
	if e.Settled == 0 {
		settled = 0
	}
	if s.isMember(e.Payer) {
		r := s.payer(e.Payer)
		r.Closed = satAdd(r.Closed, 1)
		r.Paid, r.Owed = satAdd(r.Paid, settled), satAdd(r.Owed, paid)
		for _, m := range e.Marks {
			r.Marks = satAdd(r.Marks, 1)
			if m.Disputed {
				r.Disputed = satAdd(r.Disputed, 1)
			}
		}
	}
	if e.Settled == 0 {
		return // an expired escrow's claims counted as they were paid
	}
	for _, c := range e.Claimed {
		if !s.countsFor(c.Payee, e.Payer, c.Amount) {
			continue
		}
		rec := s.machine(c.Payee)
		switch m, marked := e.mark(c.Payee); {
		case !marked:
			rec.Completed = satAdd(rec.Completed, 1)
		case !m.Disputed && rec.markBy(e.Payer):
			rec.Failed = satAdd(rec.Failed, 1)
		}
	}
}

// payer returns a payer's record, creating it, and marks it changed.
func (s *State) payer(addr string) *PayerRecord { return entry(s, s.Payers, pPayer, addr) }

// closeSettled closes, at the start of a block at time now, the settled
// escrows whose dispute window has ended.
func (s *State) closeSettled(now int64) {
	for len(s.closing) > 0 && s.closing[0].at <= now {
		c := s.closing[0]
		s.closing = s.closing[1:]
		if e, ok := s.Escrows[c.job]; ok && e.Settled != 0 && e.Closes == c.at {
			s.closeEscrow(c.job)
		}
	}
	if len(s.closing) == 0 {
		s.closing = nil // let the backing array go
	}
}

// derive rebuilds what the state keeps beside its entries: the per-owner
// and per-payer counts, the queue of unlinked machines' entries and the
// books.
func (s *State) derive() {
	s.linksOf, s.escrowsOf, s.unlinks, s.closing = map[string]uint64{}, map[string]uint64{}, nil, nil
	for m, l := range s.Links {
		s.linksOf[l.counted(m)]++
		if l.unlinked(m) {
			s.unlinks = append(s.unlinks, unlink{changed: l.Changed, machine: m})
		}
	}
	sort.Slice(s.unlinks, func(i, j int) bool {
		a, b := s.unlinks[i], s.unlinks[j]
		return a.changed < b.changed || (a.changed == b.changed && a.machine < b.machine)
	})
	for job, e := range s.Escrows {
		s.escrowsOf[e.Payer]++
		if e.Settled != 0 {
			s.closing = append(s.closing, closing{at: e.Closes, job: job})
		}
	}
	sortClosing(s.closing)
	s.books = s.count()
}

// sortClosing orders the queue of settled escrows: by when each closes,
// then by job (the order they close in within a block changes nothing:
// each only adds to balances and records).
func sortClosing(q []closing) {
	sort.Slice(q, func(i, j int) bool { return q[i].at < q[j].at || (q[i].at == q[j].at && q[i].job < q[j].job) })
}

// Books are the running totals the state keeps from every change: sums
// (big integers, so a broken state cannot hide behind an overflow) and
// counts.
type Books struct {
	Balances *big.Int
	Escrowed *big.Int
	Staked   *big.Int // link stakes
	Accounts int64
	Escrows  int64
	Members  int64
	Links    int64
}

func newBooks() Books {
	return Books{Balances: new(big.Int), Escrowed: new(big.Int), Staked: new(big.Int)}
}

// locked is what the books hold outside balances: escrows, appeal bonds
// and link stakes.
func (b Books) locked() *big.Int { return new(big.Int).Add(b.Escrowed, b.Staked) }

func (b Books) clone() Books {
	c := b
	c.Balances, c.Escrowed, c.Staked = new(big.Int).Set(b.Balances), new(big.Int).Set(b.Escrowed), new(big.Int).Set(b.Staked)
	return c
}

func (b Books) String() string {
	return fmt.Sprintf("balances %s, escrowed %s, staked %s, %d accounts, %d escrows, %d members, %d links",
		b.Balances, b.Escrowed, b.Staked, b.Accounts, b.Escrows, b.Members, b.Links)
}

// count is the books computed from every entry.
func (s *State) count() Books {
	b := newBooks()
	for _, a := range s.Accounts {
		b.Balances.Add(b.Balances, new(big.Int).SetUint64(a.Balance))
	}
	for _, e := range s.Escrows {
		b.Escrowed.Add(b.Escrowed, new(big.Int).SetUint64(e.Amount))
		b.Escrowed.Add(b.Escrowed, new(big.Int).SetUint64(e.bonds()))
	}
	for _, l := range s.Links {
		b.Staked.Add(b.Staked, new(big.Int).SetUint64(l.Stake))
	}
	for _, c := range collections {
		if c.tally == nil {
			continue
		}
		n := c.tally(&b)
		for k := range c.keys(s) {
			if _, leaf := c.leaf(s, k); leaf {
				*n++
			}
		}
	}
	return b
}

// Totals are the books: what the supply is made of.
type Totals struct {
	Supply   uint64 `json:"supply"`
	Balances uint64 `json:"balances"`
	Escrowed uint64 `json:"escrowed"` // escrows and appeal bonds
	Staked   uint64 `json:"staked"`   // link stakes
	Burned   uint64 `json:"burned"`   // withheld for refused rounds, out of the supply
}

// Totals are the state's books as kept from block to block.
func (s *State) Totals() Totals {
	t := Totals{Supply: s.Supply, Burned: s.Burned}
	if s.books.Balances.IsUint64() {
		t.Balances = s.books.Balances.Uint64()
	}
	if s.books.Escrowed.IsUint64() {
		t.Escrowed = s.books.Escrowed.Uint64()
	}
	if s.books.Staked.IsUint64() {
		t.Staked = s.books.Staked.Uint64()
	}
	return t
}

// CheckInvariants verifies the whole state, entry by entry (O(n); the
// per-block check is incremental, see store.go): supply = balances + open
// escrows, appeal bonds and link stakes (summed without overflow); no escrow holds more than it locked
// or than its payees' claims left; every stored address well formed;
// every link and escrow payer counted, every linked owner within its
// limit; the validator set well formed; and the books kept from block to
// block equal to the ones counted here. It returns every problem found.
func (s *State) CheckInvariants() (Totals, []string) {
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	for _, c := range collections {
		if !c.addressKeys {
			continue
		}
		for k := range c.keys(s) {
			if _, leaf := c.leaf(s, k); !leaf {
				continue
			}
			if _, err := identity.ParseAddress(k); err != nil {
				bad("%s %q: %v", c.name, k, err)
			}
		}
	}
	links := map[string]uint64{}
	for m, l := range s.Links {
		if l.Changed <= 0 || l.Changed > s.Height {
			bad("link of %s: changed at height %d, the state is at %d", m, l.Changed, s.Height)
		}
		switch {
		case !l.unlinked(m) && l.Former != "":
			bad("link of %s: linked to %s, yet names a former owner %s", m, l.Owner, l.Former)
		case l.unlinked(m) && (l.Former == "" || l.Former == m):
			bad("link of %s: unlinked without the owner it left", m)
		case l.unlinked(m) && l.Changed+s.Params.ConsentBlocks <= s.Height:
			bad("link of %s: unlinked at height %d, kept past %d", m, l.Changed, l.Changed+s.Params.ConsentBlocks)
		}
		links[l.counted(m)]++
	}
	for owner, n := range links {
		if n != s.linksOf[owner] {
			bad("owner %s: %d machines linked or left, %d counted", owner, n, s.linksOf[owner])
		}
		if n > s.Params.MaxMachinesPerOwner {
			bad("owner %s: %d machines linked or left, at most %d", owner, n, s.Params.MaxMachinesPerOwner)
		}
	}
	if len(links) != len(s.linksOf) {
		bad("%d owners have linked machines, %d counted", len(links), len(s.linksOf))
	}
	for m := range s.Machines {
		if _, linked := s.Links[m]; !linked && !s.isMember(m) {
			bad("machine record of %s, which is neither a member nor has a link entry", m)
		}
	}
	payers := map[string]uint64{}
	for job, e := range s.Escrows {
		payers[e.Payer]++
		problems = append(problems, checkEscrow(job, e)...)
	}
	for payer, n := range payers {
		if n != s.escrowsOf[payer] {
			bad("payer %s: %d escrows open, %d counted", payer, n, s.escrowsOf[payer])
		}
	}
	if len(payers) != len(s.escrowsOf) {
		bad("%d payers have escrows open, %d counted", len(payers), len(s.escrowsOf))
	}
	problems = append(problems, s.checkValidators()...)
	b := s.count()
	total := new(big.Int).Add(b.Balances, b.locked())
	if !total.IsUint64() || total.Uint64() != s.Supply {
		bad("supply %d != balances %s + escrowed %s + staked %s", s.Supply, b.Balances, b.Escrowed, b.Staked)
	}
	if b.String() != s.books.String() {
		bad("books kept block by block (%s) differ from the entries (%s)", s.books, b)
	}
	t := Totals{Supply: s.Supply, Burned: s.Burned}
	if b.Balances.IsUint64() {
		t.Balances = b.Balances.Uint64()
	}
	if b.Escrowed.IsUint64() {
		t.Escrowed = b.Escrowed.Uint64()
	}
	if b.Staked.IsUint64() {
		t.Staked = b.Staked.Uint64()
	}
	sort.Strings(problems)
	return t, problems
}

// checkEscrow is the invariants of one escrow.
func checkEscrow(job string, e *Escrow) []string {
	var problems []string
	if e.Amount > e.Total {
		problems = append(problems, fmt.Sprintf("escrow %s holds %d, more than the %d locked", job, e.Amount, e.Total))
	}
	var claimed uint64
	for _, c := range e.Claimed {
		var carry uint64
		claimed, carry = bits.Add64(claimed, c.Amount, 0)
		if carry != 0 {
			problems = append(problems, fmt.Sprintf("escrow %s: claims overflow", job))
		}
	}
	if e.Amount <= e.Total && claimed > e.Total-e.Amount {
		problems = append(problems, fmt.Sprintf("escrow %s: %d claimed but only %d paid out", job, claimed, e.Total-e.Amount))
	}
	if _, err := identity.ParseAddress(e.Payer); err != nil {
		problems = append(problems, fmt.Sprintf("escrow %s: payer: %v", job, err))
	}
	if (e.Settled == 0) != (e.Closes == 0) || e.Closes < e.Settled {
		problems = append(problems, fmt.Sprintf("escrow %s: settled at %d, closes at %d", job, e.Settled, e.Closes))
	}
	for _, m := range e.Marks {
		if !e.hasPayee(m.Machine) {
			problems = append(problems, fmt.Sprintf("escrow %s: %s marked failed is not a payee", job, m.Machine))
		}
	}
	problems = append(problems, checkCases(job, e)...)
	return problems
}

func add(a, b uint64) (uint64, bool) {
	s, carry := bits.Add64(a, b, 0)
	return s, carry == 0
}

// clone is a deep copy, derived parts included.
func (s *State) clone() *State {
	c := NewState()
	c.ChainID, c.Height, c.Time, c.Supply, c.Burned, c.Params = s.ChainID, s.Height, s.Time, s.Supply, s.Burned, s.Params
	c.AppHash = append([]byte(nil), s.AppHash...)
	for _, col := range collections {
		col.copyTo(c, s)
	}
	for k, v := range s.linksOf {
		c.linksOf[k] = v
	}
	for k, v := range s.escrowsOf {
		c.escrowsOf[k] = v
	}
	c.unlinks = append([]unlink(nil), s.unlinks...)
	c.closing = append([]closing(nil), s.closing...)
	c.books = s.books.clone()
	return c
}
