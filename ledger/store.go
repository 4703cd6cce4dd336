package ledger

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/big"
	"os"
	"path/filepath"
	"sort"

	corestore "cosmossdk.io/core/store"
	"github.com/cosmos/iavl"
	idb "github.com/cosmos/iavl/db"
	"github.com/syndtr/goleveldb/leveldb/filter"
	"github.com/syndtr/goleveldb/leveldb/opt"

	"github.com/deepmarket/deepmarket/wire"
)

// The ledger's store is an IAVL tree (github.com/cosmos/iavl): every entry
// of the state is a leaf under its key (an account under "a/ADDR", ...;
// the chain ID, supply and params under "c"), the value its canonical
// encoding, and the tree's root hash is the app hash. A block writes only
// the leaves its transactions changed, in key order, so its cost grows
// with what it changed and the logarithm of the state's size, not with
// the state. Each Commit saves the tree as version = height in one atomic
// write, and versions older than storeKeep are pruned a few at a time.
//
// The tree's hash commits to its history as well as to its leaves (a
// node's hash covers the version that wrote it), which every replica
// replays identically: an empty block writes nothing and leaves the hash
// as it was.

const (
	// storeKeep is how many versions (heights) the store keeps.
	storeKeep = 100
	// pruneEvery is how many blocks pass between prunings.
	pruneEvery = 10
	// nodeCacheSize is how many tree nodes the store caches in memory.
	nodeCacheSize = 1_000_000
	stateDBName   = "state" // the database directory under the ledger's dir: state.db
)

// ErrOldStateFormat means the ledger's directory holds state written by an
// earlier release (badger; app version 1).
var ErrOldStateFormat = errors.New("ledger state written by an earlier release")

// treeStore is the ledger's authenticated store.
type treeStore struct {
	db   corestore.KVStoreWithBatch // the tree under "t", the last blocks' times under "h"
	tree *iavl.MutableTree
}

// unsized gives IAVL batches that grow as they need and are written in one
// piece: the store asks for no flushing within a version (see openStore),
// goleveldb would preallocate the size IAVL asks for, and a goleveldb
// batch grown record by record copies itself over and over (a genesis of a
// million accounts spent most of its time there).
type unsized struct{ corestore.KVStoreWithBatch }

func (u unsized) NewBatch() corestore.Batch            { return &bufBatch{db: u.KVStoreWithBatch} }
func (u unsized) NewBatchWithSize(int) corestore.Batch { return u.NewBatch() }

// bufBatch keeps a batch's writes and hands them to the database's own
// batch, sized once, when written.
type bufBatch struct {
	db   corestore.KVStoreWithBatch
	ops  []bufOp
	size int
}

type bufOp struct {
	key, value []byte
	del        bool
}

func (b *bufBatch) Set(key, value []byte) error {
	b.ops = append(b.ops, bufOp{key: bytes.Clone(key), value: bytes.Clone(value)})
	b.size += len(key) + len(value) + 2*binary.MaxVarintLen32 + 1
	return nil
}

func (b *bufBatch) Delete(key []byte) error {
	b.ops = append(b.ops, bufOp{key: bytes.Clone(key), del: true})
	b.size += len(key) + binary.MaxVarintLen32 + 1
	return nil
}

func (b *bufBatch) write(sync bool) error {
	batch := b.db.NewBatchWithSize(b.size)
	defer batch.Close()
	for _, op := range b.ops {
		var err error
		if op.del {
			err = batch.Delete(op.key)
		} else {
			err = batch.Set(op.key, op.value)
		}
		if err != nil {
			return err
		}
	}
	b.ops, b.size = nil, 0
	if sync {
		return batch.WriteSync()
	}
	return batch.Write()
}

func (b *bufBatch) Write() error              { return b.write(false) }
func (b *bufBatch) WriteSync() error          { return b.write(true) }
func (b *bufBatch) Close() error              { b.ops = nil; return nil }
func (b *bufBatch) GetByteSize() (int, error) { return b.size, nil }

// openStore opens the tree in db at its latest version. A version is
// written in one batch (no flush threshold), so a process killed at any
// moment leaves the last version whole or absent.
func openStore(db corestore.KVStoreWithBatch, durable bool) (*treeStore, error) {
	tree := iavl.NewMutableTree(idb.NewPrefixDB(unsized{db}, []byte("t")), nodeCacheSize, true, iavl.NewNopLogger(),
		iavl.FlushThresholdOption(math.MaxInt), iavl.SyncOption(durable))
	if _, err := tree.Load(); err != nil {
		return nil, fmt.Errorf("load ledger state tree: %w", err)
	}
	return &treeStore{db: db, tree: tree}, nil
}

// openDiskStore opens (creating) the store in dir.
func openDiskStore(dir string) (*treeStore, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("ledger state dir: %w", err)
	}
	for _, name := range []string{"MANIFEST", "KEYREGISTRY"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
			return nil, fmt.Errorf("%w (badger, app version 1) in %s: this release keeps the state in an IAVL tree whose "+
				"app hashes the old chain's blocks do not carry, so the old chain cannot be continued. A network upgrades "+
				"together onto a new genesis: make this node's home again with `deepmarket init --force` (and the new "+
				"network's --genesis), or run the earlier release", ErrOldStateFormat, dir)
		}
	}
	db, err := idb.NewGoLevelDBWithOpts(stateDBName, dir, &opt.Options{
		Filter:             filter.NewBloomFilter(10),
		WriteBuffer:        16 << 20,
		BlockCacheCapacity: 32 << 20,
	})
	if err != nil {
		return nil, fmt.Errorf("open ledger state %s: %w", dir, err)
	}
	st, err := openStore(db, true)
	if err != nil {
		db.Close()
		return nil, err
	}
	return st, nil
}

func (st *treeStore) close() error { return st.db.Close() }

// version is the height of the last saved version (0: none).
func (st *treeStore) version() int64 { return st.tree.Version() }

// hash is the root hash of the last saved version.
func (st *treeStore) hash() []byte {
	if st.tree.Version() == 0 {
		return nil
	}
	return st.tree.Hash()
}

// blockTimes is what the store keeps of the last blocks' times: the
// tree's hash leaves them out (a block's time is in its header), and
// CheckTx needs the last one. Written just before a version is saved, it
// holds the time of the block before too, for a process killed in
// between.
type blockTimes struct {
	Height int64 `cbor:"height"`
	Time   int64 `cbor:"time"`
	Prev   int64 `cbor:"prev"`
}

var keyBlockTimes = []byte("h")

// load reads the latest version into a new state.
func (st *treeStore) load() (*State, error) {
	s := NewState()
	var bad error
	if _, err := st.tree.Iterate(func(k, v []byte) bool {
		bad = s.decodeEntry(string(k), v)
		return bad != nil
	}); err != nil {
		return nil, fmt.Errorf("load ledger state: %w", err)
	}
	if bad != nil {
		return nil, fmt.Errorf("load ledger state: %w", bad)
	}
	s.Height, s.AppHash = st.version(), st.hash()
	if s.Height > 0 {
		raw, err := st.db.Get(keyBlockTimes)
		if err != nil {
			return nil, fmt.Errorf("load ledger state: block time: %w", err)
		}
		var bt blockTimes
		if raw != nil {
			if err := wire.Unmarshal(raw, &bt); err != nil {
				return nil, fmt.Errorf("load ledger state: block time: %w", err)
			}
		}
		switch bt.Height {
		case s.Height:
			s.Time = bt.Time
		case s.Height + 1: // killed after writing the times, before saving the version
			s.Time = bt.Prev
		default:
			return nil, fmt.Errorf("load ledger state: block times are for height %d, the tree is at %d: the store is corrupt", bt.Height, s.Height)
		}
	}
	s.derive()
	return s, nil
}

// decodeEntry sets the entry a leaf holds.
func (s *State) decodeEntry(key string, val []byte) error {
	var err error
	if c, name, ok := collectionOf(key); ok {
		err = c.decode(s, name, val)
	} else if key == keyMeta {
		var m chainMeta
		if err = wire.Unmarshal(val, &m); err == nil {
			s.ChainID, s.Supply, s.Burned, s.Params = m.ChainID, m.Supply, m.Burned, m.Params
		}
	} else {
		return fmt.Errorf("unknown key %q", key)
	}
	if err != nil {
		return fmt.Errorf("key %q: %w", key, err)
	}
	return nil
}

// chainMeta is the leaf under keyMeta.
type chainMeta struct {
	ChainID string `cbor:"chain_id"`
	Supply  uint64 `cbor:"supply"`
	Params  Params `cbor:"params"`
	Burned  uint64 `cbor:"burned,omitempty"`
}

// encode is the leaf a key should hold now; false if none (an account
// that holds nothing and never signed is no entry).
func (s *State) encode(key string) ([]byte, bool) {
	if key == keyMeta {
		return mustEncode(&chainMeta{ChainID: s.ChainID, Supply: s.Supply, Params: s.Params, Burned: s.Burned}), true
	}
	c, name, ok := collectionOf(key)
	if !ok {
		return nil, false
	}
	v, ok := c.leaf(s, name)
	if !ok {
		return nil, false
	}
	return mustEncode(v), true
}

func mustEncode(v any) []byte {
	b, err := wire.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("encode %T: %v", v, err))
	}
	return b
}

// write puts the block's changed entries into the tree, in key order, and
// keeps the books from what changed: each changed leaf's old value is
// read from the tree, so the books move by what the leaves moved, however
// the state got there. It checks the invariants of what changed (O(changes)):
// supply = balances + escrowed, every changed escrow, new addresses, the
// validator set if it changed. It returns the problems found; an error is
// a store that failed.
func (st *treeStore) write(s *State) ([]string, error) {
	keys := make([]string, 0, len(s.dirty))
	for k := range s.dirty {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	w := &blockWrite{s: s, books: &s.books}
	for _, key := range keys {
		c, name, inCollection := collectionOf(key)
		if inCollection {
			c.forget(s, name)
		}
		val, present := s.encode(key)
		old, err := st.tree.Get([]byte(key))
		if err != nil {
			return nil, fmt.Errorf("read %q: %w", key, err)
		}
		if (present && bytes.Equal(old, val)) || (!present && old == nil) {
			continue
		}
		if inCollection {
			if err := w.changed(c, leafChange{key: name, old: old, removed: !present}); err != nil {
				return nil, fmt.Errorf("%q: %w", key, err)
			}
		}
		if present {
			_, err = st.tree.Set([]byte(key), val)
		} else {
			_, _, err = st.tree.Remove([]byte(key))
		}
		if err != nil {
			return nil, fmt.Errorf("write %q: %w", key, err)
		}
	}
	if w.validators {
		w.problems = append(w.problems, s.checkValidators()...)
	}
	b := w.books
	if b.Balances.Sign() < 0 || b.Escrowed.Sign() < 0 || b.Staked.Sign() < 0 {
		w.bad("books went negative: %s", b)
	}
	if total := new(big.Int).Add(b.Balances, b.locked()); !total.IsUint64() || total.Uint64() != s.Supply {
		w.bad("supply %d != balances %s + escrowed %s + staked %s", s.Supply, b.Balances, b.Escrowed, b.Staked)
	}
	sort.Strings(w.problems)
	return w.problems, nil
}

func decodeLeaf(b []byte, v any) error {
	if b == nil {
		return nil
	}
	return wire.Unmarshal(b, v)
}

// workingHash is the root hash with the block's writes.
func (st *treeStore) workingHash() []byte { return st.tree.WorkingHash() }

// workingVersion is the version the next save makes.
func (st *treeStore) workingVersion() int64 { return st.tree.WorkingVersion() }

// setInitialVersion makes an empty store's first version h.
func (st *treeStore) setInitialVersion(h int64) {
	if h > 1 {
		st.tree.SetInitialVersion(uint64(h))
	}
}

// save stores the block at height with its time: the times first, then
// the version (with the prunings due) in one atomic write.
func (st *treeStore) save(height, time, prev int64) error {
	b := st.db.NewBatch()
	defer b.Close()
	if err := b.Set(keyBlockTimes, mustEncode(&blockTimes{Height: height, Time: time, Prev: prev})); err != nil {
		return fmt.Errorf("write block time: %w", err)
	}
	if err := b.WriteSync(); err != nil {
		return fmt.Errorf("write block time: %w", err)
	}
	if to := height - storeKeep; to > 0 && height%pruneEvery == 0 {
		if err := st.tree.DeleteVersionsTo(to); err != nil {
			return fmt.Errorf("prune versions to %d: %w", to, err)
		}
	}
	_, v, err := st.tree.SaveVersion()
	if err != nil {
		return fmt.Errorf("save version %d: %w", height, err)
	}
	if v != height {
		return fmt.Errorf("saved version %d for block %d", v, height)
	}
	return nil
}

// verify compares every leaf with the entry it should hold: a full
// (O(n)) check that every change reached the tree.
func (st *treeStore) verify(s *State) []string {
	var problems []string
	leaves := 0
	want := map[string]bool{keyMeta: true}
	for _, c := range collections {
		for k := range c.keys(s) {
			if _, leaf := c.leaf(s, k); leaf {
				want[c.prefix+k] = true
			}
		}
	}
	_, err := st.tree.Iterate(func(k, v []byte) bool {
		leaves++
		key := string(k)
		if !want[key] {
			problems = append(problems, fmt.Sprintf("store holds %q, the state has no such entry", key))
			return false
		}
		delete(want, key)
		if val, _ := s.encode(key); !bytes.Equal(val, v) {
			problems = append(problems, fmt.Sprintf("store's %q differs from the state's", key))
		}
		return false
	})
	if err != nil {
		problems = append(problems, fmt.Sprintf("read the store: %v", err))
	}
	for k := range want {
		problems = append(problems, fmt.Sprintf("state's %q is not in the store", k))
	}
	sort.Strings(problems)
	return problems
}
