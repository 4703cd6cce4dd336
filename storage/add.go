package storage

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync/atomic"
	"syscall"
	"time"

	chunker "github.com/ipfs/boxo/chunker"
	"github.com/ipfs/boxo/ipld/merkledag"
	ft "github.com/ipfs/boxo/ipld/unixfs"
	"github.com/ipfs/boxo/ipld/unixfs/importer/balanced"
	ihelper "github.com/ipfs/boxo/ipld/unixfs/importer/helpers"
	uio "github.com/ipfs/boxo/ipld/unixfs/io"
	"github.com/ipfs/go-cid"
	ipld "github.com/ipfs/go-ipld-format"
	mh "github.com/multiformats/go-multihash"
)

// cidBuilder makes CIDv1 with sha2-256, as `ipfs add --cid-version=1`.
var cidBuilder = cid.Prefix{Version: 1, Codec: cid.DagProtobuf, MhType: mh.SHA2_256, MhLength: -1}

// Add imports the file or directory tree at path, pins it and returns the
// pin. progress (may be nil) is called as bytes are read. Hidden files are
// included; symbolic links are stored as links, not followed; other
// special files are an error.
func (s *Store) Add(ctx context.Context, path string, progress func(Progress)) (Pin, error) {
	return s.add(ctx, pathSource{}, path, progress)
}

// AddFrom imports the tree at path beneath root (see Add), reading nothing
// outside root whatever happens to the tree meanwhile: every name is
// resolved beneath root, symbolic links are stored as links, and a file or
// directory that is swapped for another while it is read fails the import
// rather than being read. This is how a node imports a tree that someone
// else controls, such as the output dir of a job it ran.
func (s *Store) AddFrom(ctx context.Context, root *os.Root, path string, progress func(Progress)) (Pin, error) {
	return s.add(ctx, rootSource{root}, path, progress)
}

func (s *Store) add(ctx context.Context, src source, path string, progress func(Progress)) (Pin, error) {
	root, err := src.lstat(path)
	if err != nil {
		return Pin{}, fmt.Errorf("add: %w", err)
	}
	total, err := treeSize(src, path, root)
	if err != nil {
		return Pin{}, fmt.Errorf("add %s: %w", path, err)
	}

	s.gc.RLock()
	defer s.gc.RUnlock()
	im := &importer{
		ctx:   ctx,
		src:   src,
		store: s,
		batch: ipld.NewBatch(ctx, merkledag.NewDAGService(s.blockService()),
			ipld.MaxSizeBatchOption(16<<20), ipld.MaxNodesBatchOption(64)),
		total:    total,
		progress: progress,
	}
	nd, err := im.add(path, root)
	if err == nil {
		err = im.batch.Commit()
	}
	if err != nil {
		return Pin{}, fmt.Errorf("add %s: %w", path, err)
	}
	im.report()
	s.opts.Metrics.addBytes("add", im.done.Load())

	size, err := nd.Size()
	if err != nil {
		return Pin{}, err
	}
	p := Pin{CID: nd.Cid(), Name: filepath.Base(filepath.Clean(path)), Kind: kindOf(nd),
		Size: int64(size), Added: time.Now().UTC()}
	s.pinMu.Lock()
	defer s.pinMu.Unlock()
	if old, ok, err := s.Pinned(ctx, p.CID); err != nil {
		return Pin{}, err
	} else if ok && !old.Partial {
		return old, nil
	}
	if err := s.putPin(ctx, p); err != nil {
		return Pin{}, err
	}
	s.announce(p.CID)
	return p, nil
}

// errChanged reports an entry swapped for another while it was imported.
var errChanged = errors.New("changed while being added")

// source is the tree an import reads.
type source interface {
	lstat(name string) (fs.FileInfo, error)
	readlink(name string) (string, error)
	// readDir lists the directory name, which must still be the one
	// described by fi.
	readDir(name string, fi fs.FileInfo) ([]string, error)
	// open opens the regular file name, which must still be the one
	// described by fi.
	open(name string, fi fs.FileInfo) (*os.File, error)
}

// pathSource reads paths as they are (Add).
type pathSource struct{}

func (pathSource) lstat(name string) (fs.FileInfo, error) { return os.Lstat(name) }
func (pathSource) readlink(name string) (string, error)   { return os.Readlink(name) }

func (pathSource) readDir(name string, fi fs.FileInfo) ([]string, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readNames(f, fi)
}

func (pathSource) open(name string, fi fs.FileInfo) (*os.File, error) {
	return openChecked(func(flag int) (*os.File, error) { return os.OpenFile(name, flag, 0) }, fi)
}

// rootSource reads names beneath a root (AddFrom).
type rootSource struct{ r *os.Root }

func (s rootSource) lstat(name string) (fs.FileInfo, error) { return s.r.Lstat(name) }
func (s rootSource) readlink(name string) (string, error)   { return s.r.Readlink(name) }

func (s rootSource) readDir(name string, fi fs.FileInfo) ([]string, error) {
	f, err := s.r.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readNames(f, fi)
}

func (s rootSource) open(name string, fi fs.FileInfo) (*os.File, error) {
	return openChecked(func(flag int) (*os.File, error) { return s.r.OpenFile(name, flag, 0) }, fi)
}

// readNames lists the open directory f, sorted, if it is the one fi
// describes.
func readNames(f *os.File, fi fs.FileInfo) ([]string, error) {
	got, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !got.IsDir() || !os.SameFile(got, fi) {
		return nil, fmt.Errorf("%s: %w", f.Name(), errChanged)
	}
	names, err := f.Readdirnames(-1)
	sort.Strings(names)
	return names, err
}

// openChecked opens a regular file without blocking (a FIFO swapped in
// would hang a blocking open) and keeps it only if it is the file fi
// describes.
func openChecked(open func(flag int) (*os.File, error), fi fs.FileInfo) (*os.File, error) {
	f, err := open(os.O_RDONLY | syscall.O_NONBLOCK)
	if err != nil {
		return nil, err
	}
	got, err := f.Stat()
	if err == nil && (!got.Mode().IsRegular() || !os.SameFile(got, fi)) {
		err = fmt.Errorf("%s: %w", f.Name(), errChanged)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

type importer struct {
	ctx      context.Context
	src      source
	store    *Store
	batch    *ipld.Batch
	total    int64
	done     atomic.Int64
	blocks   int
	progress func(Progress)
	last     time.Time
}

func (im *importer) read(n int) {
	im.done.Add(int64(n))
	if im.progress != nil && time.Since(im.last) > 100*time.Millisecond {
		im.last = time.Now()
		im.report()
	}
}

func (im *importer) report() {
	if im.progress != nil {
		im.progress(Progress{Done: im.done.Load(), Total: im.total, Blocks: im.blocks})
	}
}

func (im *importer) add(path string, fi fs.FileInfo) (ipld.Node, error) {
	if err := im.ctx.Err(); err != nil {
		return nil, err
	}
	switch {
	case fi.Mode().IsRegular():
		return im.addFile(path, fi)
	case fi.IsDir():
		return im.addDir(path, fi)
	case fi.Mode()&fs.ModeSymlink != 0:
		target, err := im.src.readlink(path)
		if err != nil {
			return nil, err
		}
		data, err := ft.SymlinkData(target)
		if err != nil {
			return nil, err
		}
		nd := merkledag.NodeWithData(data)
		if err := nd.SetCidBuilder(cidBuilder); err != nil {
			return nil, err
		}
		return nd, im.batch.Add(im.ctx, nd)
	default:
		return nil, fmt.Errorf("%s: cannot add a %s (only files, directories and symbolic links)", path, fi.Mode().Type())
	}
}

func (im *importer) addFile(path string, fi fs.FileInfo) (ipld.Node, error) {
	f, err := im.src.open(path, fi)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	params := ihelper.DagBuilderParams{
		Maxlinks:   ihelper.DefaultLinksPerBlock,
		RawLeaves:  true,
		CidBuilder: cidBuilder,
		Dagserv:    batchDAG{im},
	}
	db, err := params.New(chunker.NewSizeSplitter(&countingReader{r: f, fn: im.read}, int64(im.store.opts.ChunkSize)))
	if err != nil {
		return nil, err
	}
	return balanced.Layout(db)
}

func (im *importer) addDir(path string, fi fs.FileInfo) (ipld.Node, error) {
	names, err := im.src.readDir(path, fi)
	if err != nil {
		return nil, err
	}
	dir, err := uio.NewDirectory(batchDAG{im}, uio.WithCidBuilder(cidBuilder))
	if err != nil {
		return nil, err
	}
	for _, name := range names {
		p := filepath.Join(path, name)
		cfi, err := im.src.lstat(p)
		if err != nil {
			return nil, err
		}
		child, err := im.add(p, cfi)
		if err != nil {
			return nil, err
		}
		if err := dir.AddChild(im.ctx, name, child); err != nil {
			return nil, err
		}
	}
	nd, err := dir.GetNode()
	if err != nil {
		return nil, err
	}
	return nd, im.batch.Add(im.ctx, nd)
}

// batchDAG writes through the importer's batch, counting blocks, and
// reads what is already committed (directory sharding may read).
type batchDAG struct{ im *importer }

func (d batchDAG) Get(ctx context.Context, k cid.Cid) (ipld.Node, error) {
	return d.im.store.offlineDAG().Get(ctx, k)
}
func (d batchDAG) GetMany(ctx context.Context, ks []cid.Cid) <-chan *ipld.NodeOption {
	return d.im.store.offlineDAG().GetMany(ctx, ks)
}
func (d batchDAG) Add(ctx context.Context, nd ipld.Node) error {
	d.im.blocks++
	return d.im.batch.Add(ctx, nd)
}
func (d batchDAG) AddMany(ctx context.Context, nds []ipld.Node) error {
	d.im.blocks += len(nds)
	return d.im.batch.AddMany(ctx, nds)
}
func (d batchDAG) Remove(context.Context, cid.Cid) error       { return nil }
func (d batchDAG) RemoveMany(context.Context, []cid.Cid) error { return nil }

// treeSize is the bytes of regular files under path, for progress.
func treeSize(src source, path string, fi fs.FileInfo) (int64, error) {
	switch {
	case fi.Mode().IsRegular():
		return fi.Size(), nil
	case !fi.IsDir():
		return 0, nil
	}
	names, err := src.readDir(path, fi)
	if err != nil {
		return 0, err
	}
	var total int64
	for _, name := range names {
		p := filepath.Join(path, name)
		cfi, err := src.lstat(p)
		if err != nil {
			return 0, err
		}
		n, err := treeSize(src, p, cfi)
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}

// kindOf names what a root is, for `data ls`.
func kindOf(nd ipld.Node) string {
	pn, ok := nd.(*merkledag.ProtoNode)
	if !ok {
		return "file" // a raw block is a file's bytes
	}
	fsn, err := ft.FSNodeFromBytes(pn.Data())
	if err != nil {
		return "dag-pb"
	}
	switch fsn.Type() {
	case ft.TDirectory, ft.THAMTShard:
		return "directory"
	case ft.TSymlink:
		return "symlink"
	default:
		return "file"
	}
}
