package storage

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync/atomic"
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
	root, err := os.Lstat(path)
	if err != nil {
		return Pin{}, fmt.Errorf("add: %w", err)
	}
	total, err := treeSize(path, root)
	if err != nil {
		return Pin{}, fmt.Errorf("add %s: %w", path, err)
	}

	s.gc.RLock()
	defer s.gc.RUnlock()
	im := &importer{
		ctx:   ctx,
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

type importer struct {
	ctx      context.Context
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
		return im.addFile(path)
	case fi.IsDir():
		return im.addDir(path)
	case fi.Mode()&fs.ModeSymlink != 0:
		target, err := os.Readlink(path)
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

func (im *importer) addFile(path string) (ipld.Node, error) {
	f, err := os.Open(path)
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

func (im *importer) addDir(path string) (ipld.Node, error) {
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil, err
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name() < entries[j].Name() })
	dir, err := uio.NewDirectory(batchDAG{im}, uio.WithCidBuilder(cidBuilder))
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			return nil, err
		}
		child, err := im.add(filepath.Join(path, e.Name()), fi)
		if err != nil {
			return nil, err
		}
		if err := dir.AddChild(im.ctx, e.Name(), child); err != nil {
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
func treeSize(path string, fi fs.FileInfo) (int64, error) {
	if !fi.IsDir() {
		if fi.Mode().IsRegular() {
			return fi.Size(), nil
		}
		return 0, nil
	}
	var total int64
	err := filepath.WalkDir(path, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			info, err := d.Info()
			if err != nil {
				return err
			}
			total += info.Size()
		}
		return nil
	})
	return total, err
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
