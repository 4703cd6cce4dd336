package storage

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/ipfs/boxo/blockstore"
	"github.com/ipfs/boxo/datastore/dshelp"
	blocks "github.com/ipfs/go-block-format"
	"github.com/ipfs/go-cid"
	ds "github.com/ipfs/go-datastore"
	"github.com/ipfs/go-datastore/query"
	badger4 "github.com/ipfs/go-ds-badger4"
	ipld "github.com/ipfs/go-ipld-format"
)

const (
	// packThreshold: blocks this large or larger (file leaves) go to
	// pack files; smaller ones (directory and file nodes, small files)
	// stay inside their badger entry.
	packThreshold = 16 << 10
	// packSize is when the pack being written is closed and a new one
	// started; GC rewrites packs that are mostly garbage.
	packSize = 256 << 20

	entryInline = 'i'
	entryPacked = 'p'
)

var blockPrefix = ds.NewKey("/blocks")

// packBlockstore keeps every block's entry in badger (through
// go-ds-badger4) under /blocks/<multihash>: small blocks inline, large ones
// as a pointer (pack, offset, length) into append-only pack files.
//
// It is badger's own key-value separation, done with write(2) and
// pread(2): badger writes its value log through a shared memory mapping,
// and on this kind of machine faulting fresh file pages in costs several
// times a write(2) of the same bytes (see bench/storage); the mapping also
// makes every byte that passes through count as the process's resident
// memory.
//
// Crash safety: a block's bytes are written before its entry is
// committed, and packs are fsynced before a pin is recorded (Sync). An
// entry whose bytes were lost in a crash reads back wrong, which the
// checked blockstore above detects: the block is dropped and fetched
// again.
type packBlockstore struct {
	ds  *badger4.Datastore
	dir string

	mu      sync.Mutex // serializes appends and rotation
	files   sync.Map   // uint32 -> *packReader, every pack
	w       *packWriter
	curID   uint32
	curSize int64
	buf     []byte // 4 KiB-aligned staging for appends
}

var _ blockstore.Blockstore = (*packBlockstore)(nil)

func openPacks(d *badger4.Datastore, dir string) (*packBlockstore, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	p := &packBlockstore{ds: d, dir: dir, buf: alignedBuffer(4 << 20)}
	ids, err := p.packIDs()
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		r, err := openPackReader(p.packPath(id))
		if err != nil {
			p.Close()
			return nil, err
		}
		p.files.Store(id, r)
	}
	if len(ids) == 0 {
		return p, p.rotate()
	}
	p.curID = ids[len(ids)-1]
	fi, err := os.Stat(p.packPath(p.curID))
	if err != nil {
		p.Close()
		return nil, err
	}
	// Bytes past the last aligned block are a torn append: write after.
	p.curSize = int64(alignUp(int(fi.Size())))
	if p.w, err = openPackWriter(p.packPath(p.curID)); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

func (p *packBlockstore) packPath(id uint32) string {
	return filepath.Join(p.dir, fmt.Sprintf("%08d.pack", id))
}

func (p *packBlockstore) packIDs() ([]uint32, error) {
	ents, err := os.ReadDir(p.dir)
	if err != nil {
		return nil, err
	}
	var ids []uint32
	for _, e := range ents {
		if n, ok := strings.CutSuffix(e.Name(), ".pack"); ok {
			if id, err := strconv.ParseUint(n, 10, 32); err == nil {
				ids = append(ids, uint32(id))
			}
		}
	}
	slices.Sort(ids)
	return ids, nil
}

// rotate starts a new pack; p.mu must be held (or p not yet shared).
func (p *packBlockstore) rotate() error {
	if p.w != nil {
		if err := p.w.Close(); err != nil {
			return fmt.Errorf("close pack: %w", err)
		}
	}
	id := p.curID + 1
	f, err := os.OpenFile(p.packPath(id), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("new pack: %w", err)
	}
	f.Close()
	r, err := openPackReader(p.packPath(id))
	if err != nil {
		return err
	}
	p.files.Store(id, r)
	if p.w, err = openPackWriter(p.packPath(id)); err != nil {
		return err
	}
	p.curID, p.curSize = id, 0
	return nil
}

// Close closes the pack files.
func (p *packBlockstore) Close() error {
	var errs []error
	if p.w != nil {
		errs = append(errs, p.w.Close())
	}
	p.files.Range(func(_, r any) bool {
		errs = append(errs, r.(*packReader).Close())
		return true
	})
	return errors.Join(errs...)
}

// Sync makes every block put so far durable.
func (p *packBlockstore) Sync(ctx context.Context) error {
	p.mu.Lock()
	err := p.w.Sync()
	p.mu.Unlock()
	if err != nil {
		return fmt.Errorf("sync pack: %w", err)
	}
	return p.ds.Sync(ctx, blockPrefix)
}

// packWriter appends to a pack. It writes with O_DIRECT where the file
// system allows it: a dataset passing through then costs neither the
// page cache of the lab machine it lands on (whose owner is using it) nor
// the CPU of copying into fresh page-cache pages, which on a virtual
// machine is several times the cost of the copy itself. Reads go through
// a separate, buffered descriptor; Linux keeps the two coherent.
type packWriter struct {
	f      *os.File
	direct bool
}

func openPackWriter(path string) (*packWriter, error) {
	if oDirect != 0 {
		if f, err := os.OpenFile(path, os.O_WRONLY|oDirect, 0); err == nil {
			return &packWriter{f: f, direct: true}, nil
		}
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("open pack for writing: %w", err)
	}
	return &packWriter{f: f}, nil
}

func (w *packWriter) writeAt(b []byte, off int64) error {
	_, err := w.f.WriteAt(b, off)
	if err != nil && w.direct && errors.Is(err, syscall.EINVAL) {
		// The file system refused O_DIRECT after all: go buffered.
		f, ferr := os.OpenFile(w.f.Name(), os.O_WRONLY, 0)
		if ferr != nil {
			return err
		}
		w.f.Close()
		w.f, w.direct = f, false
		_, err = w.f.WriteAt(b, off)
	}
	return err
}

func (w *packWriter) Sync() error  { return w.f.Sync() }
func (w *packWriter) Close() error { return errors.Join(w.f.Sync(), w.f.Close()) }

const pageSize = 4096

func alignUp(n int) int { return (n + pageSize - 1) &^ (pageSize - 1) }

// alignedBuffer returns n bytes starting on a page boundary, as O_DIRECT
// requires.
func alignedBuffer(n int) []byte {
	b := make([]byte, n+pageSize)
	off := int(uintptr(unsafe.Pointer(&b[0])) & (pageSize - 1))
	if off != 0 {
		off = pageSize - off
	}
	return b[off : off+n : off+n]
}

func blockKey(c cid.Cid) ds.Key { return blockPrefix.Child(dshelp.MultihashToDsKey(c.Hash())) }

// pointer locates a packed block. crc is the CRC-32C of its bytes,
// taken when they were written (by then checked against the CID: by the
// importer that hashed them, or by bitswap on receipt).
type pointer struct {
	pack   uint32
	offset int64
	length int
	crc    uint32
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errCorrupt: the bytes on disk are not the block's.
var errCorrupt = errors.New("block on disk does not match its CID")

func encodePointer(ptr pointer) []byte {
	b := []byte{entryPacked}
	b = binary.AppendUvarint(b, uint64(ptr.pack))
	b = binary.AppendUvarint(b, uint64(ptr.offset))
	b = binary.AppendUvarint(b, uint64(ptr.length))
	return binary.AppendUvarint(b, uint64(ptr.crc))
}

// decodeEntry returns the inline bytes, or the pointer.
func decodeEntry(e []byte) (inline []byte, ptr pointer, packed bool, err error) {
	if len(e) == 0 {
		return nil, pointer{}, false, errors.New("empty block entry")
	}
	switch e[0] {
	case entryInline:
		return e[1:], pointer{}, false, nil
	case entryPacked:
		r := e[1:]
		var vals [4]uint64
		for i := range vals {
			v, n := binary.Uvarint(r)
			if n <= 0 {
				return nil, pointer{}, false, errors.New("bad block pointer")
			}
			vals[i], r = v, r[n:]
		}
		if vals[0] > 1<<32-1 || vals[1] > 1<<62 || vals[2] > 1<<30 || vals[3] > 1<<32-1 {
			return nil, pointer{}, false, errors.New("bad block pointer")
		}
		return nil, pointer{uint32(vals[0]), int64(vals[1]), int(vals[2]), uint32(vals[3])}, true, nil
	default:
		return nil, pointer{}, false, fmt.Errorf("unknown block entry kind %q", e[0])
	}
}

// appendBlocks writes the large blocks' bytes to the current pack and
// returns every block's entry. Each packed block starts on a 4 KiB
// boundary so that the pack can be written with O_DIRECT (see packWriter).
func (p *packBlockstore) appendBlocks(bs []blocks.Block) ([][]byte, error) {
	entries := make([][]byte, len(bs))
	p.mu.Lock()
	defer p.mu.Unlock()
	pending := 0 // bytes laid out in p.buf, to be written at p.curSize
	flush := func() error {
		if pending == 0 {
			return nil
		}
		if err := p.w.writeAt(p.buf[:pending], p.curSize); err != nil {
			return fmt.Errorf("write pack: %w", err)
		}
		p.curSize += int64(pending)
		pending = 0
		return nil
	}
	for i, b := range bs {
		data := b.RawData()
		if len(data) < packThreshold {
			entries[i] = append([]byte{entryInline}, data...)
			continue
		}
		size := alignUp(len(data))
		if pending+size > len(p.buf) {
			if err := flush(); err != nil {
				return nil, err
			}
		}
		if p.curSize+int64(pending+size) > packSize && p.curSize+int64(pending) > 0 {
			if err := flush(); err != nil {
				return nil, err
			}
			if err := p.rotate(); err != nil {
				return nil, err
			}
		}
		if size > len(p.buf) {
			p.buf = alignedBuffer(size)
		}
		copy(p.buf[pending:], data)
		clear(p.buf[pending+len(data) : pending+size])
		entries[i] = encodePointer(pointer{p.curID, p.curSize + int64(pending), len(data), crc32.Checksum(data, castagnoli)})
		pending += size
	}
	return entries, flush()
}

func (p *packBlockstore) Put(ctx context.Context, b blocks.Block) error {
	return p.PutMany(ctx, []blocks.Block{b})
}

func (p *packBlockstore) PutMany(ctx context.Context, bs []blocks.Block) error {
	var fresh []blocks.Block
	for _, b := range bs {
		if ok, err := p.ds.Has(ctx, blockKey(b.Cid())); err != nil {
			return err
		} else if !ok {
			fresh = append(fresh, b)
		}
	}
	if len(fresh) == 0 {
		return nil
	}
	entries, err := p.appendBlocks(fresh)
	if err != nil {
		return err
	}
	batch, err := p.ds.Batch(ctx)
	if err != nil {
		return err
	}
	for i, b := range fresh {
		if err := batch.Put(ctx, blockKey(b.Cid()), entries[i]); err != nil {
			return err
		}
	}
	return batch.Commit(ctx)
}

func (p *packBlockstore) entry(ctx context.Context, c cid.Cid) ([]byte, error) {
	e, err := p.ds.Get(ctx, blockKey(c))
	if errors.Is(err, ds.ErrNotFound) {
		return nil, ipld.ErrNotFound{Cid: c}
	}
	return e, err
}

// Get returns the block, checking its bytes as they come off the disk:
// packed blocks against the CRC-32C taken when they were written (a
// hardware instruction, a tenth of the cost of SHA-256, and what catches
// bit rot, torn writes and stray writes), inline ones against their CID.
// A mismatch is errCorrupt.
func (p *packBlockstore) Get(ctx context.Context, c cid.Cid) (blocks.Block, error) {
	e, err := p.entry(ctx, c)
	if err != nil {
		return nil, err
	}
	inline, ptr, packed, err := decodeEntry(e)
	if err != nil {
		return nil, fmt.Errorf("block %s: %w", c, err)
	}
	if !packed {
		if got, err := c.Prefix().Sum(inline); err != nil || !got.Equals(c) {
			return nil, errCorrupt
		}
		return blocks.NewBlockWithCid(inline, c)
	}
	data, err := p.readPacked(ptr)
	if err != nil {
		return nil, fmt.Errorf("read block %s: %w", c, err)
	}
	if crc32.Checksum(data, castagnoli) != ptr.crc {
		return nil, errCorrupt
	}
	return blocks.NewBlockWithCid(data, c)
}

// readPacked returns a packed block's bytes. Bytes missing from a pack
// (lost in a crash) read as zeros, which fail the check.
func (p *packBlockstore) readPacked(ptr pointer) ([]byte, error) {
	r, ok := p.files.Load(ptr.pack)
	if !ok {
		return make([]byte, ptr.length), nil
	}
	return r.(*packReader).read(ptr)
}

// packReader reads blocks from a pack with O_DIRECT where it can, into
// a fresh buffer straight from the disk, for the reasons packWriter
// writes that way; else through the page cache.
type packReader struct {
	buffered *os.File
	direct   atomic.Pointer[os.File]
}

func openPackReader(path string) (*packReader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open pack: %w", err)
	}
	r := &packReader{buffered: f}
	if oDirect != 0 {
		if d, err := os.OpenFile(path, os.O_RDONLY|oDirect, 0); err == nil {
			r.direct.Store(d)
		}
	}
	return r, nil
}

// read returns the block's bytes. Bytes missing from the pack (lost in a
// crash) read as zeros, which fail the hash check.
func (r *packReader) read(ptr pointer) ([]byte, error) {
	if d := r.direct.Load(); d != nil {
		buf := alignedBuffer(alignUp(ptr.length))
		n, err := d.ReadAt(buf, ptr.offset)
		if err == nil || errors.Is(err, io.EOF) {
			clear(buf[min(n, len(buf)):])
			return buf[:ptr.length], nil
		}
		if !errors.Is(err, syscall.EINVAL) {
			return nil, err
		}
		r.direct.Store(nil) // the file system refused O_DIRECT
		d.Close()
	}
	data := make([]byte, ptr.length)
	n, err := r.buffered.ReadAt(data, ptr.offset)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	clear(data[n:])
	return data, nil
}

func (r *packReader) Close() error {
	if d := r.direct.Swap(nil); d != nil {
		d.Close()
	}
	return r.buffered.Close()
}

func (p *packBlockstore) Has(ctx context.Context, c cid.Cid) (bool, error) {
	return p.ds.Has(ctx, blockKey(c))
}

func (p *packBlockstore) GetSize(ctx context.Context, c cid.Cid) (int, error) {
	e, err := p.entry(ctx, c)
	if err != nil {
		return -1, err
	}
	inline, ptr, packed, err := decodeEntry(e)
	if err != nil {
		return -1, err
	}
	if packed {
		return ptr.length, nil
	}
	return len(inline), nil
}

// DeleteBlock removes the block's entry; its pack bytes are reclaimed
// when GC rewrites the pack.
func (p *packBlockstore) DeleteBlock(ctx context.Context, c cid.Cid) error {
	return p.ds.Delete(ctx, blockKey(c))
}

// AllKeysChan lists every block as a raw CIDv1 of its multihash (the
// store keys by multihash, not by codec).
func (p *packBlockstore) AllKeysChan(ctx context.Context) (<-chan cid.Cid, error) {
	res, err := p.ds.Query(ctx, query.Query{Prefix: blockPrefix.String(), KeysOnly: true})
	if err != nil {
		return nil, err
	}
	out := make(chan cid.Cid, 64)
	go func() {
		defer close(out)
		defer res.Close()
		for r := range res.Next() {
			if r.Error != nil {
				return
			}
			c, err := dshelp.DsKeyToCidV1(ds.NewKey(ds.RawKey(r.Key).BaseNamespace()), cid.Raw)
			if err != nil {
				continue
			}
			select {
			case out <- c:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// compact rewrites each closed pack whose live bytes are under half its
// size into the current pack, then deletes it. An entry is repointed
// only after its bytes are written (and synced), and a pack is deleted
// only after none points into it, so a crash leaves at worst dead bytes.
func (p *packBlockstore) compact(ctx context.Context) (reclaimed int64, err error) {
	live := map[uint32]int64{}
	var all []struct {
		key ds.Key
		ptr pointer
	}
	res, err := p.ds.Query(ctx, query.Query{Prefix: blockPrefix.String()})
	if err != nil {
		return 0, err
	}
	for r := range res.Next() {
		if r.Error != nil {
			res.Close()
			return 0, r.Error
		}
		if _, ptr, packed, err := decodeEntry(r.Value); err == nil && packed {
			live[ptr.pack] += int64(ptr.length)
			all = append(all, struct {
				key ds.Key
				ptr pointer
			}{ds.RawKey(r.Key), ptr})
		}
	}
	res.Close()

	p.mu.Lock()
	cur := p.curID
	p.mu.Unlock()
	ids, err := p.packIDs()
	if err != nil {
		return 0, err
	}
	for _, id := range ids {
		if id == cur {
			continue
		}
		fi, err := os.Stat(p.packPath(id))
		if err != nil {
			return reclaimed, err
		}
		if live[id]*2 >= fi.Size() {
			continue
		}
		var keys []ds.Key
		var moved []blocks.Block
		for _, e := range all {
			if e.ptr.pack != id {
				continue
			}
			data, err := p.readPacked(e.ptr)
			if err != nil {
				return reclaimed, err
			}
			c, err := dshelp.DsKeyToCidV1(ds.NewKey(e.key.BaseNamespace()), cid.Raw)
			if err != nil {
				return reclaimed, err
			}
			if crc32.Checksum(data, castagnoli) != e.ptr.crc {
				// Corrupt: drop it rather than bless it with a new CRC.
				if err := p.ds.Delete(ctx, e.key); err != nil {
					return reclaimed, err
				}
				continue
			}
			b, _ := blocks.NewBlockWithCid(data, c)
			keys, moved = append(keys, e.key), append(moved, b)
		}
		entries, err := p.appendBlocks(moved)
		if err != nil {
			return reclaimed, err
		}
		if err := p.Sync(ctx); err != nil {
			return reclaimed, err
		}
		batch, err := p.ds.Batch(ctx)
		if err != nil {
			return reclaimed, err
		}
		for i, k := range keys {
			if err := batch.Put(ctx, k, entries[i]); err != nil {
				return reclaimed, err
			}
		}
		if err := batch.Commit(ctx); err != nil {
			return reclaimed, err
		}
		if err := p.ds.Sync(ctx, blockPrefix); err != nil {
			return reclaimed, err
		}
		if r, ok := p.files.LoadAndDelete(id); ok {
			r.(*packReader).Close()
		}
		if err := os.Remove(p.packPath(id)); err != nil {
			return reclaimed, err
		}
		reclaimed += fi.Size() - live[id]
	}
	return reclaimed, nil
}
