package ledger

import (
	"crypto/sha256"
	"fmt"
	"math/big"
	"math/bits"
	"sort"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/wire"
)

// Account is a balance and the next nonce its key must sign with.
type Account struct {
	Balance uint64 `cbor:"balance" json:"balance"`
	Nonce   uint64 `cbor:"nonce" json:"nonce"`
}

// Issuer may grant credits up to its remaining quota.
type Issuer struct {
	Quota uint64 `cbor:"quota" json:"quota"`
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

// MachineRecord is a machine's track record, for the scheduler.
type MachineRecord struct {
	Completed uint64 `cbor:"completed" json:"completed"`
	Failed    uint64 `cbor:"failed" json:"failed"`
	Earned    uint64 `cbor:"earned" json:"earned"`
}

// Params are the chain's rules, fixed at genesis.
type Params struct {
	// ClaimGrace is how long after an escrow's expiry its payees may still
	// claim before the payer may Expire it (seconds).
	ClaimGrace int64 `cbor:"claim_grace" json:"claim_grace_s"`
	// MaxEscrowTTL bounds how far ahead an escrow may expire (seconds).
	MaxEscrowTTL int64 `cbor:"max_escrow_ttl" json:"max_escrow_ttl_s"`
}

// DefaultParams are used when genesis names none.
func DefaultParams() Params { return Params{ClaimGrace: 3600, MaxEscrowTTL: 30 * 24 * 3600} }

// State is the whole ledger.
type State struct {
	ChainID  string
	Height   int64
	Time     int64 // the last block's time, unix seconds
	AppHash  []byte
	Supply   uint64 // every grant ever issued, genesis balances included
	Params   Params
	Accounts map[string]*Account
	Issuers  map[string]*Issuer
	Links    map[string]string // machine address -> owner address
	Escrows  map[string]*Escrow
	Machines map[string]*MachineRecord
	// Validators is the validator set by hex key, as CometBFT will have it
	// once this block's updates apply; Pending, by hex key, the votes on
	// changing it (validators.go).
	Validators map[string]*Validator
	Pending    map[string]*PendingVotes

	dirty map[string]bool // keys changed since the last commit
}

// NewState returns an empty state.
func NewState() *State {
	return &State{
		Accounts: map[string]*Account{}, Issuers: map[string]*Issuer{}, Links: map[string]string{},
		Escrows: map[string]*Escrow{}, Machines: map[string]*MachineRecord{},
		Validators: map[string]*Validator{}, Pending: map[string]*PendingVotes{}, dirty: map[string]bool{},
	}
}

// Key prefixes in the store and in the canonical encoding.
const (
	pAccount   = "a/"
	pIssuer    = "i/"
	pLink      = "l/"
	pEscrow    = "e/"
	pMachine   = "m/"
	pValidator = "v/"
	pPending   = "p/"
)

func (s *State) touch(prefix, key string) { s.dirty[prefix+key] = true }

func (s *State) markAllDirty() {
	for k := range s.Accounts {
		s.touch(pAccount, k)
	}
	for k := range s.Issuers {
		s.touch(pIssuer, k)
	}
	for k := range s.Links {
		s.touch(pLink, k)
	}
	for k := range s.Escrows {
		s.touch(pEscrow, k)
	}
	for k := range s.Machines {
		s.touch(pMachine, k)
	}
	for k := range s.Validators {
		s.touch(pValidator, k)
	}
	for k := range s.Pending {
		s.touch(pPending, k)
	}
}

// balanceOf reads a balance without creating an account.
func (s *State) balanceOf(addr string) uint64 {
	if a, ok := s.Accounts[addr]; ok {
		return a.Balance
	}
	return 0
}

// account returns the account, creating an empty one (not yet dirty).
func (s *State) account(addr string) *Account {
	a, ok := s.Accounts[addr]
	if !ok {
		a = &Account{}
		s.Accounts[addr] = a
	}
	return a
}

// canonical is the state as sorted lists: the one encoding the app hash
// covers.
type canonical struct {
	_          struct{} `cbor:",toarray"`
	ChainID    string
	Supply     uint64
	Params     Params
	Accounts   []kv[Account]
	Issuers    []kv[Issuer]
	Links      []kv[string]
	Escrows    []kv[Escrow]
	Machines   []kv[MachineRecord]
	Validators []kv[Validator]
	Pending    []kv[PendingVotes]
}

type kv[T any] struct {
	_ struct{} `cbor:",toarray"`
	K string
	V T
}

func sortedPtr[T any](m map[string]*T) []kv[T] {
	out := make([]kv[T], 0, len(m))
	for k, v := range m {
		out = append(out, kv[T]{K: k, V: *v})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].K < out[j].K })
	return out
}

// Hash is the app hash: SHA-256 of the canonical encoding of the state.
// Height and block time are left out (the block header has them), so an
// empty block leaves the hash as it was and CometBFT needs no extra block
// to prove it; only transactions change it. Empty accounts (created by a lookup, never funded or used)
// are left out so a read can never change the hash.
func (s *State) Hash() []byte {
	accounts := make(map[string]*Account, len(s.Accounts))
	for k, a := range s.Accounts {
		if a.Balance != 0 || a.Nonce != 0 {
			accounts[k] = a
		}
	}
	links := make([]kv[string], 0, len(s.Links))
	for k, v := range s.Links {
		links = append(links, kv[string]{K: k, V: v})
	}
	sort.Slice(links, func(i, j int) bool { return links[i].K < links[j].K })
	b, err := wire.Marshal(canonical{
		ChainID: s.ChainID, Supply: s.Supply, Params: s.Params,
		Accounts: sortedPtr(accounts), Issuers: sortedPtr(s.Issuers), Links: links,
		Escrows: sortedPtr(s.Escrows), Machines: sortedPtr(s.Machines),
		Validators: sortedPtr(s.Validators), Pending: sortedPtr(s.Pending),
	})
	if err != nil {
		panic(fmt.Sprintf("encode canonical state: %v", err))
	}
	h := sha256.Sum256(b)
	return h[:]
}

// Totals are the books: what the supply is made of.
type Totals struct {
	Supply   uint64 `json:"supply"`
	Balances uint64 `json:"balances"`
	Escrowed uint64 `json:"escrowed"`
}

// CheckInvariants verifies the books: supply = balances + open escrows
// (summed without overflow), no escrow holds more than it locked or than
// its payees' claims left, and every stored address is well formed; and
// the validator set: keys and powers well formed, every pending vote cast
// by a current validator. It returns every problem found.
func (s *State) CheckInvariants() (Totals, []string) {
	var problems []string
	bal, esc := new(big.Int), new(big.Int)
	for addr, a := range s.Accounts {
		bal.Add(bal, new(big.Int).SetUint64(a.Balance))
		if a.Balance != 0 || a.Nonce != 0 {
			if _, err := identity.ParseAddress(addr); err != nil {
				problems = append(problems, fmt.Sprintf("account %q: %v", addr, err))
			}
		}
	}
	for job, e := range s.Escrows {
		esc.Add(esc, new(big.Int).SetUint64(e.Amount))
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
		if claimed > e.Total-e.Amount {
			problems = append(problems, fmt.Sprintf("escrow %s: %d claimed but only %d paid out", job, claimed, e.Total-e.Amount))
		}
	}
	problems = append(problems, s.checkValidators()...)
	total := new(big.Int).Add(bal, esc)
	if !total.IsUint64() || total.Uint64() != s.Supply {
		problems = append(problems, fmt.Sprintf("supply %d != balances %s + escrowed %s", s.Supply, bal, esc))
	}
	t := Totals{Supply: s.Supply}
	if bal.IsUint64() {
		t.Balances = bal.Uint64()
	}
	if esc.IsUint64() {
		t.Escrowed = esc.Uint64()
	}
	sort.Strings(problems)
	return t, problems
}

func add(a, b uint64) (uint64, bool) {
	s, carry := bits.Add64(a, b, 0)
	return s, carry == 0
}

// ownerOf returns the account a machine earns into.
func (s *State) ownerOf(machine string) string {
	if o, ok := s.Links[machine]; ok {
		return o
	}
	return machine
}
