package ledger

import (
	"fmt"
	"iter"
	"maps"
	"math/big"
	"strings"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/wire"
)

// collections is every map of entries in the State, in a fixed order, and
// everything done to all of them: each entry is a leaf of the store under
// the collection's prefix and the entry's key, so each is part of the app
// hash. NewState makes the maps, markAllDirty marks every entry, the store
// encodes, decodes, writes (moving the books) and verifies leaves,
// CheckInvariants checks keys and clone copies entries, all from this
// table. A new collection is a map in State and an entry here.
var collections = []collection{
	{
		name: "account", prefix: pAccount, addressKeys: true,
		tally: func(b *Books) *int64 { return &b.Accounts }, changed: accountChanged,
		entries: mapOf[Account]{field: func(s *State) *map[string]*Account { return &s.Accounts }, live: (*Account).live},
	},
	{
		name: "issuer", prefix: pIssuer, addressKeys: true,
		entries: mapOf[Issuer]{field: func(s *State) *map[string]*Issuer { return &s.Issuers }},
	},
	{
		name: "member", prefix: pMember, addressKeys: true,
		tally:   func(b *Books) *int64 { return &b.Members },
		entries: mapOf[Member]{field: func(s *State) *map[string]*Member { return &s.Members }},
	},
	{
		name: "link", prefix: pLink, addressKeys: true,
		tally: func(b *Books) *int64 { return &b.Links }, changed: linkChanged,
		entries: mapOf[Link]{field: func(s *State) *map[string]*Link { return &s.Links }},
	},
	{
		name: "escrow", prefix: pEscrow, // keyed by job
		tally: func(b *Books) *int64 { return &b.Escrows }, changed: escrowChanged,
		entries: mapOf[Escrow]{field: func(s *State) *map[string]*Escrow { return &s.Escrows }, clone: (*Escrow).clone},
	},
	{
		name: "machine record", prefix: pMachine, addressKeys: true,
		entries: mapOf[MachineRecord]{field: func(s *State) *map[string]*MachineRecord { return &s.Machines }, clone: (*MachineRecord).clone},
	},
	{
		name: "payer record", prefix: pPayer, addressKeys: true,
		entries: mapOf[PayerRecord]{field: func(s *State) *map[string]*PayerRecord { return &s.Payers }},
	},
	{
		name: "validator", prefix: pValidator, // keyed by hex key
		changed: validatorsChanged,
		entries: mapOf[Validator]{field: func(s *State) *map[string]*Validator { return &s.Validators }, clone: (*Validator).clone},
	},
	{
		name: "pending vote", prefix: pPending, // keyed by hex key
		changed: validatorsChanged,
		entries: mapOf[PendingVotes]{field: func(s *State) *map[string]*PendingVotes { return &s.Pending }, clone: (*PendingVotes).clone},
	},
}

// collection is an entry of collections.
type collection struct {
	name   string // an entry of it, in problems
	prefix string // its leaves' keys are prefix + the entry's key
	// addressKeys: its entries are keyed by account addresses, which the
	// store checks when an entry is made and CheckInvariants always.
	addressKeys bool
	// tally is the books' count of its entries; nil: they keep none.
	tally func(b *Books) *int64
	// changed moves the books by a changed leaf of it, beyond its count,
	// and checks what a change must keep; nil: nothing to do.
	changed func(w *blockWrite, ch leafChange) error
	entries
}

// entries is a collection's map in the State, whatever its entries' type
// (mapOf).
type entries interface {
	// init makes the map, empty.
	init(s *State)
	// keys are the map's keys, leaves or not, in no order.
	keys(s *State) iter.Seq[string]
	// leaf is what the entry's leaf holds, to encode; false if it is no
	// leaf (absent, or an account that holds nothing and never signed).
	leaf(s *State, key string) (any, bool)
	// forget drops the entry if it is in the map but is no leaf (an
	// account looked up, never funded or used).
	forget(s *State, key string)
	// decode sets the entry a leaf holds.
	decode(s *State, key string, leaf []byte) error
	// copyTo puts a deep copy of src's entries into dst's map.
	copyTo(dst, src *State)
}

// mapOf is the entries of a map[string]*T in the State.
type mapOf[T any] struct {
	field func(s *State) *map[string]*T
	// live reports whether an entry is a leaf; nil: every entry is.
	live func(v *T) bool
	// clone is a deep copy; nil: a copy of the struct is one.
	clone func(v *T) *T
}

func (m mapOf[T]) init(s *State) { *m.field(s) = map[string]*T{} }

func (m mapOf[T]) keys(s *State) iter.Seq[string] { return maps.Keys(*m.field(s)) }

func (m mapOf[T]) leaf(s *State, key string) (any, bool) {
	v, ok := (*m.field(s))[key]
	if !ok || (m.live != nil && !m.live(v)) {
		return nil, false
	}
	return v, true
}

func (m mapOf[T]) forget(s *State, key string) {
	if v, ok := (*m.field(s))[key]; ok && m.live != nil && !m.live(v) {
		delete(*m.field(s), key)
	}
}

func (m mapOf[T]) decode(s *State, key string, leaf []byte) error {
	var v T
	if err := wire.Unmarshal(leaf, &v); err != nil {
		return err
	}
	(*m.field(s))[key] = &v
	return nil
}

func (m mapOf[T]) copyTo(dst, src *State) {
	to := *m.field(dst)
	for k, v := range *m.field(src) {
		if m.clone != nil {
			to[k] = m.clone(v)
			continue
		}
		c := *v
		to[k] = &c
	}
}

// byPrefix finds a collection by its prefix.
var byPrefix = func() map[string]*collection {
	out := make(map[string]*collection, len(collections))
	for i := range collections {
		c := &collections[i]
		if _, dup := out[c.prefix]; dup || !strings.HasSuffix(c.prefix, "/") || strings.Count(c.prefix, "/") != 1 {
			panic(fmt.Sprintf("ledger: collection prefix %q is not one name and a slash, or is used twice", c.prefix))
		}
		out[c.prefix] = c
	}
	return out
}()

// collectionOf returns the collection a store key is in, and the entry's
// key; false for a key in none (keyMeta).
func collectionOf(key string) (*collection, string, bool) {
	prefix, name, ok := strings.Cut(key, "/")
	if !ok {
		return nil, "", false
	}
	c, ok := byPrefix[prefix+"/"]
	return c, name, ok
}

// blockWrite is a block's write into the store (treeStore.write): the
// books move by each changed leaf, and problems collect.
type blockWrite struct {
	s          *State
	books      *Books
	problems   []string
	validators bool // a leaf of the validator set changed: check it whole
}

func (w *blockWrite) bad(format string, args ...any) {
	w.problems = append(w.problems, fmt.Sprintf(format, args...))
}

// changed moves the books by a changed leaf of c: its count, and what
// c.changed does.
func (w *blockWrite) changed(c *collection, ch leafChange) error {
	if ch.old == nil && c.addressKeys {
		if _, err := identity.ParseAddress(ch.key); err != nil {
			w.bad("%s%s: %v", c.prefix, ch.key, err)
		}
	}
	if c.tally != nil {
		switch n := c.tally(w.books); {
		case ch.old == nil:
			*n++
		case ch.removed:
			*n--
		}
	}
	if c.changed == nil {
		return nil
	}
	return c.changed(w, ch)
}

// leafChange is a leaf a block changed.
type leafChange struct {
	key     string // the entry's key, without the prefix
	old     []byte // the leaf before the block; nil if new
	removed bool   // the entry is no leaf any more
}

func accountChanged(w *blockWrite, ch leafChange) error {
	var was, is Account
	if err := decodeLeaf(ch.old, &was); err != nil {
		return err
	}
	if !ch.removed {
		is = *w.s.Accounts[ch.key]
	}
	w.books.Balances.Add(w.books.Balances, new(big.Int).Sub(new(big.Int).SetUint64(is.Balance), new(big.Int).SetUint64(was.Balance)))
	if is.Nonce < was.Nonce {
		w.bad("account %s: nonce went back from %d to %d", ch.key, was.Nonce, is.Nonce)
	}
	return nil
}

func escrowChanged(w *blockWrite, ch leafChange) error {
	var was Escrow
	if err := decodeLeaf(ch.old, &was); err != nil {
		return err
	}
	held := new(big.Int)
	if !ch.removed {
		e := w.s.Escrows[ch.key]
		held.Add(new(big.Int).SetUint64(e.Amount), new(big.Int).SetUint64(e.bonds()))
		w.problems = append(w.problems, checkEscrow(ch.key, e)...)
	}
	held.Sub(held, new(big.Int).SetUint64(was.Amount))
	held.Sub(held, new(big.Int).SetUint64(was.bonds()))
	w.books.Escrowed.Add(w.books.Escrowed, held)
	return nil
}

func linkChanged(w *blockWrite, ch leafChange) error {
	s := w.s
	var before Link
	if err := decodeLeaf(ch.old, &before); err != nil {
		return err
	}
	var stake uint64
	if l, ok := s.Links[ch.key]; ok && !ch.removed {
		stake = l.Stake
	}
	w.books.Staked.Add(w.books.Staked, new(big.Int).Sub(new(big.Int).SetUint64(stake), new(big.Int).SetUint64(before.Stake)))
	if !ch.removed {
		if is := s.Links[ch.key]; is.Changed != s.Height {
			w.bad("link of %s changed at height %d but says %d", ch.key, s.Height, is.Changed)
		}
		return nil
	}
	// Only an unlinked machine's entry goes, once no consent given
	// before its unlink can be used.
	var was Link
	if err := decodeLeaf(ch.old, &was); err != nil {
		return err
	}
	if !was.unlinked(ch.key) || was.Changed+s.Params.ConsentBlocks > s.Height {
		w.bad("link of %s (%s since height %d) removed at height %d: only an unlinked machine's entry goes, %d blocks after",
			ch.key, was.Owner, was.Changed, s.Height, s.Params.ConsentBlocks)
	}
	return nil
}

func validatorsChanged(w *blockWrite, _ leafChange) error {
	w.validators = true
	return nil
}
