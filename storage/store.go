package storage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/ipfs/boxo/blockservice"
	"github.com/ipfs/boxo/blockstore"
	"github.com/ipfs/boxo/exchange"
	"github.com/ipfs/boxo/ipld/merkledag"
	blocks "github.com/ipfs/go-block-format"
	"github.com/ipfs/go-cid"
	ds "github.com/ipfs/go-datastore"
	"github.com/ipfs/go-datastore/query"
	badger4 "github.com/ipfs/go-ds-badger4"
	ipld "github.com/ipfs/go-ipld-format"

	"github.com/deepmarket/deepmarket/internal/badgerlock"
)

// DefaultChunkSize is the size of a file's leaf blocks. 1 MiB moves a
// gigabyte with a quarter of the blocks, wants and hashes of 256 KiB (see
// `make bench-storage`) and stays within bitswap's 2 MiB block limit and
// kubo's `--chunker=size-1048576`.
const DefaultChunkSize = 1 << 20

// Errors callers branch on.
var (
	ErrNotPinned = errors.New("not pinned")
	ErrLocked    = errors.New("blockstore is in use by another process")
	ErrStalled   = errors.New("no peer delivered a block")
)

// Options tune a Store. The zero value gives the documented defaults.
type Options struct {
	// ChunkSize is the leaf size for imports; default DefaultChunkSize.
	ChunkSize int
	// Window is how many bytes of blocks (by their links' sizes) a fetch
	// keeps requested at once; default 32 MiB: enough to keep a loopback
	// or LAN link busy with 256 KiB or 1 MiB blocks, and what bounds a
	// fetch's memory.
	Window int
	// StallTimeout fails a fetch when no block arrives for this long;
	// default 1 minute.
	StallTimeout time.Duration
	// ValueThreshold is the block size from which badger keeps a block in
	// its value log rather than in the LSM tree; default 4 KiB.
	ValueThreshold int64
	Logger         *slog.Logger
	Metrics        *Metrics
}

func (o *Options) defaults() {
	if o.ChunkSize == 0 {
		o.ChunkSize = DefaultChunkSize
	}
	if o.Window == 0 {
		o.Window = 32 << 20
	}
	if o.StallTimeout == 0 {
		o.StallTimeout = time.Minute
	}
	if o.ValueThreshold == 0 {
		o.ValueThreshold = 4 << 10
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Pin is a root the store keeps, with what `data ls` shows about it.
type Pin struct {
	CID  cid.Cid `json:"cid"`
	Name string  `json:"name,omitempty"`
	// Kind is "file", "directory" or "symlink".
	Kind string `json:"kind"`
	// Size is the bytes of all the root's blocks (the DAG size).
	Size  int64     `json:"size"`
	Added time.Time `json:"added_at"`
	// Partial marks a fetch that has not finished: its blocks are kept
	// and a new `data get` resumes from them, but it is not pinned yet.
	Partial bool `json:"partial,omitempty"`
}

// Progress reports a long operation: Done of Total bytes (Total is 0 when
// not yet known).
type Progress struct {
	Done   int64
	Total  int64
	Blocks int
}

// Store is the node's blockstore with pins and, once attached to a libp2p
// host, bitswap.
type Store struct {
	opts  Options
	ds    *badger4.Datastore
	packs *packBlockstore
	bs    blockstore.Blockstore

	// gc is held for reading by adds and fetches (whose blocks are not
	// pinned until they finish) and for writing by GC.
	gc sync.RWMutex

	exch      atomic.Pointer[exchangeBox]
	router    Router
	provideCh chan cid.Cid
	pinMu     sync.Mutex
}

type exchangeBox struct{ exchange.Interface }

// Open opens (creating if needed) the blockstore in dir. It is offline
// until Attach gives it a libp2p host.
func Open(dir string, opts Options) (*Store, error) {
	opts.defaults()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("open blockstore: %w", err)
	}
	bo := badger4.DefaultOptions
	bo.GcInterval = 0 // Maintain runs the value-log GC
	bo.Options = badger.DefaultOptions(dir).
		WithLogger(badgerLogger{opts.Logger}).
		WithValueThreshold(opts.ValueThreshold).
		// Entries are small (large blocks live in packs): small tables.
		WithMemTableSize(4 << 20).
		WithNumMemtables(2).
		WithNumLevelZeroTables(2).
		WithNumLevelZeroTablesStall(16).
		WithBlockCacheSize(4 << 20).
		WithIndexCacheSize(4 << 20).
		WithValueLogFileSize(64 << 20).
		// Compactors cost an idle node CPU for nothing; Maintain
		// compacts level 0 when it grows.
		WithNumCompactors(0)
	d, err := badgerlock.Open(func() (*badger4.Datastore, error) { return badger4.NewDatastore(dir, &bo) })
	if err != nil {
		if badgerlock.Locked(err) {
			return nil, fmt.Errorf("%w (%s)", ErrLocked, dir)
		}
		return nil, fmt.Errorf("open blockstore %s: %w", dir, err)
	}
	packs, err := openPacks(d, filepath.Join(dir, "packs"))
	if err != nil {
		d.Close()
		return nil, fmt.Errorf("open blockstore packs: %w", err)
	}
	s := &Store{opts: opts, ds: d, packs: packs, provideCh: make(chan cid.Cid, 64)}
	s.bs = blockstore.NewIdStore(&checkedBlockstore{Blockstore: packs, store: s})
	return s, nil
}

// Close stops bitswap (if attached) and closes the blockstore.
func (s *Store) Close() error {
	var errs []error
	if e := s.exch.Swap(nil); e != nil {
		errs = append(errs, e.Close())
	}
	errs = append(errs, s.packs.Close(), s.ds.Close())
	return errors.Join(errs...)
}

// Blockstore is the store's hash-checked blockstore.
func (s *Store) Blockstore() blockstore.Blockstore { return s.bs }

// blockService is online once Attach has run.
func (s *Store) blockService() blockservice.BlockService {
	var ex exchange.Interface
	if e := s.exch.Load(); e != nil {
		ex = e.Interface
	}
	return blockservice.New(s.bs, ex)
}

// offlineDAG reads only what is on this node's disk.
func (s *Store) offlineDAG() ipld.DAGService {
	return merkledag.NewDAGService(blockservice.New(s.bs, nil))
}

// Has reports whether the block c is on this node's disk.
func (s *Store) Has(ctx context.Context, c cid.Cid) (bool, error) { return s.bs.Has(ctx, c) }

// checkedBlockstore drops every block whose bytes no longer match (a bad
// disk, a stray write: see packBlockstore.Get for the check) and reports
// it as missing, so it is never served and a fetch gets it again.
type checkedBlockstore struct {
	blockstore.Blockstore
	store *Store
}

func (c *checkedBlockstore) Get(ctx context.Context, k cid.Cid) (blocks.Block, error) {
	b, err := c.Blockstore.Get(ctx, k)
	if ipld.IsNotFound(err) && isEmptyBlock(k) {
		return blocks.NewBlockWithCid(nil, k)
	}
	if errors.Is(err, errCorrupt) {
		c.store.opts.Logger.Warn("block on disk does not match its CID; dropped, it will be fetched again", "cid", k)
		c.store.opts.Metrics.incCorrupt()
		if err := c.Blockstore.DeleteBlock(ctx, k); err != nil {
			return nil, fmt.Errorf("drop corrupt block %s: %w", k, err)
		}
		return nil, ipld.ErrNotFound{Cid: k}
	}
	return b, err
}

func (c *checkedBlockstore) Has(ctx context.Context, k cid.Cid) (bool, error) {
	ok, err := c.Blockstore.Has(ctx, k)
	if err == nil && !ok {
		ok = isEmptyBlock(k)
	}
	return ok, err
}

// GetSize reports a block's size, but 1 for the empty block: boxo's
// bitswap server takes size 0 for "not here" (blockstoreManager keeps only
// non-zero sizes), so without this no bitswap peer (kubo included) could
// get an empty file's block from us. The size only feeds accounting.
func (c *checkedBlockstore) GetSize(ctx context.Context, k cid.Cid) (int, error) {
	n, err := c.Blockstore.GetSize(ctx, k)
	if (err == nil && n == 0) || (ipld.IsNotFound(err) && isEmptyBlock(k)) {
		return 1, nil
	}
	return n, err
}

// isEmptyBlock reports whether k names zero bytes (an empty file's only
// block). Every node has it, so nobody needs to send it; bitswap servers
// do not send empty blocks.
func isEmptyBlock(k cid.Cid) bool {
	sum, err := k.Prefix().Sum(nil)
	return err == nil && sum.Equals(k)
}

var pinPrefix = ds.NewKey("/deepmarket/pins")

func pinKey(c cid.Cid) ds.Key { return pinPrefix.ChildString(c.String()) }

func (s *Store) putPin(ctx context.Context, p Pin) error {
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	// The pinned blocks are durable before the pin is.
	if err := s.packs.Sync(ctx); err != nil {
		return err
	}
	if err := s.ds.Put(ctx, pinKey(p.CID), b); err != nil {
		return fmt.Errorf("pin %s: %w", p.CID, err)
	}
	return s.ds.Sync(ctx, pinKey(p.CID))
}

// Pinned returns the pin record for c, if any (partial fetches included).
func (s *Store) Pinned(ctx context.Context, c cid.Cid) (Pin, bool, error) {
	b, err := s.ds.Get(ctx, pinKey(c))
	if errors.Is(err, ds.ErrNotFound) {
		return Pin{}, false, nil
	}
	if err != nil {
		return Pin{}, false, err
	}
	var p Pin
	if err := json.Unmarshal(b, &p); err != nil {
		return Pin{}, false, fmt.Errorf("pin record %s: %w", c, err)
	}
	return p, true, nil
}

// Pins lists the pinned roots (and unfinished fetches), newest first.
func (s *Store) Pins(ctx context.Context) ([]Pin, error) {
	res, err := s.ds.Query(ctx, query.Query{Prefix: pinPrefix.String()})
	if err != nil {
		return nil, err
	}
	defer res.Close()
	var pins []Pin
	for r := range res.Next() {
		if r.Error != nil {
			return nil, r.Error
		}
		var p Pin
		if err := json.Unmarshal(r.Value, &p); err != nil {
			return nil, fmt.Errorf("pin record %s: %w", r.Key, err)
		}
		pins = append(pins, p)
	}
	sort.Slice(pins, func(i, j int) bool { return pins[i].Added.After(pins[j].Added) })
	return pins, nil
}

// Unpin stops keeping c; its blocks go at the next GC unless another pin
// shares them.
func (s *Store) Unpin(ctx context.Context, c cid.Cid) error {
	s.pinMu.Lock()
	defer s.pinMu.Unlock()
	if _, ok, err := s.Pinned(ctx, c); err != nil {
		return err
	} else if !ok {
		return fmt.Errorf("%s: %w", c, ErrNotPinned)
	}
	if err := s.ds.Delete(ctx, pinKey(c)); err != nil {
		return fmt.Errorf("unpin %s: %w", c, err)
	}
	return s.ds.Sync(ctx, pinKey(c))
}

// Maintain compacts badger's level 0 once it holds a few tables (there
// are no background compactors) and reclaims value-log space freed by GC.
func (s *Store) Maintain() error {
	db := s.ds.DB
	if l := db.Levels(); len(l) > 0 && l[0].NumTables >= 2 {
		if err := db.Flatten(1); err != nil {
			return fmt.Errorf("compact blockstore: %w", err)
		}
	}
	for db.RunValueLogGC(0.5) == nil {
	}
	return nil
}

// DiskUsage is the blockstore's size on disk in bytes.
func (s *Store) DiskUsage(ctx context.Context) (uint64, error) { return s.ds.DiskUsage(ctx) }

type badgerLogger struct{ log *slog.Logger }

func (l badgerLogger) Errorf(f string, a ...any) {
	l.log.Error(strings.TrimSpace(fmt.Sprintf(f, a...)), "module", "badger")
}
func (l badgerLogger) Warningf(f string, a ...any) {
	l.log.Warn(strings.TrimSpace(fmt.Sprintf(f, a...)), "module", "badger")
}
func (l badgerLogger) Infof(f string, a ...any) {
	l.log.Debug(strings.TrimSpace(fmt.Sprintf(f, a...)), "module", "badger")
}
func (l badgerLogger) Debugf(f string, a ...any) {}

// countingReader reports bytes read through it.
type countingReader struct {
	r  io.Reader
	fn func(int)
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 {
		c.fn(n)
	}
	return n, err
}
