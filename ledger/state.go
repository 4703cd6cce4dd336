package ledger

import (
	"encoding/json"
	"fmt"
	"math/big"
	"math/bits"
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
}

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

// Claimed records what a payee has claimed from an escrow so far.
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
}

func (e *Escrow) clone() *Escrow {
	c := *e
	c.PayerKey = append([]byte(nil), e.PayerKey...)
	c.Payees = append([]string(nil), e.Payees...)
	c.Claimed = append([]Claimed(nil), e.Claimed...)
	return &c
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
}

// DefaultParams are used when genesis names none, and for each field a
// genesis leaves out.
func DefaultParams() Params {
	return Params{
		ClaimGrace: 3600, MaxEscrowTTL: 30 * 24 * 3600,
		MaxMachinesPerOwner: 256, ConsentBlocks: 3600, MinPayment: 10_000,
		MaxOpenEscrows: 1024, MinNewAccount: 1_000_000, MaxTxsPerBlock: 1000,
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
	Supply   uint64 // every grant ever issued, genesis balances included
	Params   Params
	Accounts map[string]*Account
	Issuers  map[string]*Issuer
	Members  map[string]*Member
	Links    map[string]*Link // by machine address
	Escrows  map[string]*Escrow
	Machines map[string]*MachineRecord
	// Validators is the validator set by hex key, as CometBFT will have it
	// once this block's updates apply; Pending, by hex key, the votes on
	// changing it (validators.go).
	Validators map[string]*Validator
	Pending    map[string]*PendingVotes

	linksOf   map[string]uint64 // owner -> machines linked to it, and those it left that still have an entry
	escrowsOf map[string]uint64 // payer -> escrows open
	unlinks   []unlink          // the entries unlinks left, oldest first: what pruneLinks removes
	books     Books             // kept from each block's changes (store.go)

	dirty map[string]bool // keys changed since the last commit
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

// Key prefixes in the store, one per collection (collections.go).
// keyMeta, in none, holds the chain ID, supply and params.
const (
	pAccount   = "a/"
	pIssuer    = "i/"
	pMember    = "n/"
	pLink      = "l/"
	pEscrow    = "e/"
	pMachine   = "m/"
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
func (s *State) account(addr string) *Account {
	a, ok := s.Accounts[addr]
	if !ok {
		a = &Account{}
		s.Accounts[addr] = a
	}
	s.touch(pAccount, addr)
	return a
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
func (s *State) setLink(machine, owner string, h int64) {
	l := s.link(machine)
	if was, ok := s.Links[machine]; ok {
		s.uncount(was.counted(machine))
	}
	next := &Link{Owner: owner, Changed: h}
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

func (s *State) closeEscrow(job string) {
	e := s.Escrows[job]
	delete(s.Escrows, job)
	if s.escrowsOf[e.Payer]--; s.escrowsOf[e.Payer] == 0 {
		delete(s.escrowsOf, e.Payer)
	}
	s.touch(pEscrow, job)
}

// derive rebuilds what the state keeps beside its entries: the per-owner
// and per-payer counts, the queue of unlinked machines' entries and the
// books.
func (s *State) derive() {
	s.linksOf, s.escrowsOf, s.unlinks = map[string]uint64{}, map[string]uint64{}, nil
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
	for _, e := range s.Escrows {
		s.escrowsOf[e.Payer]++
	}
	s.books = s.count()
}

// Books are the running totals the state keeps from every change: sums
// (big integers, so a broken state cannot hide behind an overflow) and
// counts.
type Books struct {
	Balances *big.Int
	Escrowed *big.Int
	Accounts int64
	Escrows  int64
	Members  int64
	Links    int64
}

func newBooks() Books { return Books{Balances: new(big.Int), Escrowed: new(big.Int)} }

func (b Books) clone() Books {
	c := b
	c.Balances, c.Escrowed = new(big.Int).Set(b.Balances), new(big.Int).Set(b.Escrowed)
	return c
}

func (b Books) String() string {
	return fmt.Sprintf("balances %s, escrowed %s, %d accounts, %d escrows, %d members, %d links",
		b.Balances, b.Escrowed, b.Accounts, b.Escrows, b.Members, b.Links)
}

// count is the books computed from every entry.
func (s *State) count() Books {
	b := newBooks()
	for _, a := range s.Accounts {
		b.Balances.Add(b.Balances, new(big.Int).SetUint64(a.Balance))
	}
	for _, e := range s.Escrows {
		b.Escrowed.Add(b.Escrowed, new(big.Int).SetUint64(e.Amount))
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
	Escrowed uint64 `json:"escrowed"`
}

// Totals are the state's books as kept from block to block.
func (s *State) Totals() Totals {
	t := Totals{Supply: s.Supply}
	if s.books.Balances.IsUint64() {
		t.Balances = s.books.Balances.Uint64()
	}
	if s.books.Escrowed.IsUint64() {
		t.Escrowed = s.books.Escrowed.Uint64()
	}
	return t
}

// CheckInvariants verifies the whole state, entry by entry (O(n); the
// per-block check is incremental, see store.go): supply = balances + open
// escrows (summed without overflow); no escrow holds more than it locked
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
	total := new(big.Int).Add(b.Balances, b.Escrowed)
	if !total.IsUint64() || total.Uint64() != s.Supply {
		bad("supply %d != balances %s + escrowed %s", s.Supply, b.Balances, b.Escrowed)
	}
	if b.String() != s.books.String() {
		bad("books kept block by block (%s) differ from the entries (%s)", s.books, b)
	}
	t := Totals{Supply: s.Supply}
	if b.Balances.IsUint64() {
		t.Balances = b.Balances.Uint64()
	}
	if b.Escrowed.IsUint64() {
		t.Escrowed = b.Escrowed.Uint64()
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
	return problems
}

func add(a, b uint64) (uint64, bool) {
	s, carry := bits.Add64(a, b, 0)
	return s, carry == 0
}

// clone is a deep copy, derived parts included.
func (s *State) clone() *State {
	c := NewState()
	c.ChainID, c.Height, c.Time, c.Supply, c.Params = s.ChainID, s.Height, s.Time, s.Supply, s.Params
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
	c.books = s.books.clone()
	return c
}
