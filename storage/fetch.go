package storage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/ipfs/boxo/blockservice"
	"github.com/ipfs/boxo/ipld/merkledag"
	ft "github.com/ipfs/boxo/ipld/unixfs"
	uio "github.com/ipfs/boxo/ipld/unixfs/io"
	blocks "github.com/ipfs/go-block-format"
	"github.com/ipfs/go-cid"
	ipld "github.com/ipfs/go-ipld-format"

	"github.com/deepmarket/deepmarket/units"
)

// Fetch makes every block of the DAG under root present on this node,
// taking what is already on disk (so an interrupted fetch resumes) and
// asking peers for the rest, Window bytes at a time. Until it finishes
// the root is recorded as a partial pin, which GC keeps; when it finishes
// the root is pinned. If no block arrives for StallTimeout it fails with
// ErrStalled, keeping what it has.
func (s *Store) Fetch(ctx context.Context, root cid.Cid, progress func(Progress)) (Pin, error) {
	s.gc.RLock()
	defer s.gc.RUnlock()
	// A pinned root is walked too: its blocks are read and checked, and
	// any dropped as corrupt since are fetched again.
	p, pinned, err := s.Pinned(ctx, root)
	if err != nil {
		return Pin{}, err
	}
	if !pinned || p.Partial {
		p = Pin{CID: root, Kind: "file", Added: time.Now().UTC(), Partial: true}
		if err := s.putPin(ctx, p); err != nil {
			return Pin{}, err
		}
	}

	f := &fetcher{store: s, progress: progress, lastBlock: time.Now()}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	f.cancel = cancel
	f.renew = make(chan struct{}, 1)
	go f.watchdog(ctx, s.opts.StallTimeout)
	rootNode, err := f.run(ctx, root)
	if err != nil {
		if cause := context.Cause(ctx); errors.Is(cause, ErrStalled) {
			err = cause
		}
		done, total, n := f.snapshot()
		return Pin{}, fmt.Errorf("fetch %s: %w (kept %d blocks, %s of %s; fetching it again resumes from them)",
			root, err, n, humanBytes(done), humanBytes(total))
	}
	p.Kind, p.Partial = kindOf(rootNode), false
	p.Size, _, _ = f.snapshot()
	s.opts.Metrics.addBytes("fetch", p.Size)
	s.pinMu.Lock()
	defer s.pinMu.Unlock()
	if err := s.putPin(ctx, p); err != nil {
		return Pin{}, err
	}
	s.announce(p.CID)
	return p, nil
}

type fetcher struct {
	store    *Store
	progress func(Progress)
	cancel   context.CancelCauseFunc
	renew    chan struct{}

	mu        sync.Mutex
	done      int64
	total     int64
	blocks    int
	lastBlock time.Time
	lastShown time.Time
}

func (f *fetcher) snapshot() (done, total int64, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.done, f.total, f.blocks
}

// got counts a block in; the root (the first, nd non-nil) sets the total.
func (f *fetcher) got(b blocks.Block, nd ipld.Node) {
	f.mu.Lock()
	if f.blocks == 0 {
		f.total = int64(len(b.RawData()))
		if nd != nil {
			for _, l := range nd.Links() {
				f.total += int64(l.Size)
			}
		}
	}
	f.done += int64(len(b.RawData()))
	f.blocks++
	f.lastBlock = time.Now()
	show := f.progress != nil && time.Since(f.lastShown) > 100*time.Millisecond
	if show {
		f.lastShown = f.lastBlock
	}
	p := Progress{Done: f.done, Total: f.total, Blocks: f.blocks}
	f.mu.Unlock()
	if show {
		f.progress(p)
	}
}

// renewAfter is how long a fetch waits for a block before it starts a
// new bitswap session: a session keeps asking the peers it learned about,
// and a fresh one asks every peer connected now (and the router) again.
const renewAfter = 3 * time.Second

// watchdog renews the session when blocks stop arriving, and cancels the
// fetch when none has arrived for limit.
func (f *fetcher) watchdog(ctx context.Context, limit time.Duration) {
	t := time.NewTicker(min(limit/4, renewAfter/3))
	defer t.Stop()
	lastRenew := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f.mu.Lock()
			idle := time.Since(f.lastBlock)
			f.mu.Unlock()
			if idle > limit {
				f.cancel(fmt.Errorf("%w for %s", ErrStalled, limit.Round(time.Second)))
				return
			}
			if idle > renewAfter && time.Since(lastRenew) > renewAfter {
				lastRenew = time.Now()
				select {
				case f.renew <- struct{}{}:
				default:
				}
			}
		}
	}
}

// session is one bitswap session and the context its requests run in.
type session struct {
	*blockservice.Session
	ctx    context.Context
	cancel context.CancelFunc
}

func (f *fetcher) newSession(ctx context.Context) *session {
	sctx, cancel := context.WithCancel(ctx)
	return &session{blockservice.NewSession(sctx, f.store.blockService()), sctx, cancel}
}

// fetched is one block's outcome in run.
type fetched struct {
	want  want
	block blocks.Block
	links []want
	retry bool // its session was renewed: ask again
	err   error
}

func (f *fetcher) get(ctx context.Context, s *session, w want, results chan<- fetched) {
	b, err := s.GetBlock(s.ctx, w.c)
	if err != nil {
		retry := s.ctx.Err() != nil && ctx.Err() == nil
		results <- fetched{want: w, retry: retry, err: fmt.Errorf("block %s: %w", w.c, err)}
		return
	}
	if w.c.Type() == cid.Raw {
		f.got(b, nil)
		results <- fetched{want: w, block: b}
		return
	}
	nd, err := decodeNode(b)
	if err != nil {
		results <- fetched{want: w, err: fmt.Errorf("decode %s: %w", w.c, err)}
		return
	}
	f.got(b, nd)
	results <- fetched{want: w, block: b, links: linksOf(nd)}
}

// run walks the DAG breadth first, keeping up to Window bytes of blocks
// (at least one block, at most maxWanted) wanted.
func (f *fetcher) run(ctx context.Context, root cid.Cid) (ipld.Node, error) {
	sess := f.newSession(ctx)
	defer func() { sess.cancel() }()
	results := make(chan fetched, maxWanted)
	var rootNode ipld.Node
	queue := []want{{c: root}}
	window := int64(f.store.opts.Window)
	inflight, inflightBytes := 0, int64(0)
	for len(queue) > 0 || inflight > 0 {
		for len(queue) > 0 && inflight < maxWanted && (inflight == 0 || inflightBytes+queue[0].size <= window) {
			w := queue[0]
			queue = queue[1:]
			inflight++
			inflightBytes += w.size
			go f.get(ctx, sess, w, results)
		}
		var r fetched
		select {
		case r = <-results:
		case <-f.renew:
			sess.cancel()
			sess = f.newSession(ctx)
			continue
		}
		inflight--
		inflightBytes -= r.want.size
		switch {
		case r.retry:
			queue = append([]want{r.want}, queue...)
			continue
		case r.err != nil:
			for ; inflight > 0; inflight-- {
				<-results
			}
			return nil, r.err
		}
		if r.want.c.Equals(root) {
			rootNode, _ = decodeNode(r.block)
		}
		queue = append(queue, r.links...)
	}
	if f.progress != nil {
		d, t, n := f.snapshot()
		f.progress(Progress{Done: d, Total: t, Blocks: n})
	}
	return rootNode, nil
}

// decodeNode decodes the two codecs UnixFS uses.
func decodeNode(b blocks.Block) (ipld.Node, error) {
	switch b.Cid().Type() {
	case cid.Raw:
		return merkledag.DecodeRawBlock(b)
	case cid.DagProtobuf:
		return merkledag.DecodeProtobufBlock(b)
	default:
		return nil, fmt.Errorf("unsupported codec %#x (only UnixFS: dag-pb and raw)", b.Cid().Type())
	}
}

// maxWanted caps the blocks a fetch asks for at once, however small.
const maxWanted = 512

// want is a block to fetch and the size its parent's link gives (the
// whole subtree's for an inner node, so a window counts it generously).
type want struct {
	c    cid.Cid
	size int64
}

func linksOf(nd ipld.Node) []want {
	ls := nd.Links()
	out := make([]want, len(ls))
	for i, l := range ls {
		out[i] = want{l.Cid, int64(min(l.Size, 2<<20))}
	}
	return out
}

// Get fetches root (see Fetch), pins it, and writes it to out: a file root
// becomes the file out, a directory root the directory out. out must not
// exist yet, except that a file root may be written into an existing
// directory (as out/<cid>). It returns the path written.
func (s *Store) Get(ctx context.Context, root cid.Cid, out string, progress func(Progress)) (string, Pin, error) {
	if out == "" {
		out = root.String()
	}
	p, err := s.Fetch(ctx, root, progress)
	if err != nil {
		return "", Pin{}, err
	}
	path, err := s.Export(ctx, root, out)
	return path, p, err
}

// FetchInto fetches root (see Fetch), pins it, and writes it into the
// directory dir, creating dir if needed: a directory root's entries become
// dir's entries, a file root becomes dir/<cid>. It refuses to overwrite
// anything already in dir. This is what the executor uses to lay out a
// job's inputs.
func (s *Store) FetchInto(ctx context.Context, root cid.Cid, dir string, progress func(Progress)) (Pin, error) {
	p, err := s.Fetch(ctx, root, progress)
	if err != nil {
		return Pin{}, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Pin{}, err
	}
	if p.Kind != "directory" {
		_, err := s.Export(ctx, root, filepath.Join(dir, root.String()))
		return p, err
	}
	tmp, err := os.MkdirTemp(dir, ".fetch-")
	if err != nil {
		return Pin{}, err
	}
	defer os.RemoveAll(tmp)
	staged, err := s.Export(ctx, root, filepath.Join(tmp, "root"))
	if err != nil {
		return Pin{}, err
	}
	entries, err := os.ReadDir(staged)
	if err != nil {
		return Pin{}, err
	}
	for _, e := range entries {
		if _, err := os.Lstat(filepath.Join(dir, e.Name())); err == nil {
			return Pin{}, fmt.Errorf("fetch %s into %s: %s already exists", root, dir, e.Name())
		}
	}
	for _, e := range entries {
		if err := os.Rename(filepath.Join(staged, e.Name()), filepath.Join(dir, e.Name())); err != nil {
			return Pin{}, err
		}
	}
	return p, nil
}

// Export writes root, whose blocks must all be on this node, to out (see
// Get). It writes into a temporary name beside out and renames it into
// place, so out appears whole or not at all.
func (s *Store) Export(ctx context.Context, root cid.Cid, out string) (string, error) {
	dag := s.offlineDAG()
	nd, err := dag.Get(ctx, root)
	if err != nil {
		return "", fmt.Errorf("export %s: %w", root, err)
	}
	if fi, err := os.Stat(out); err == nil {
		if !fi.IsDir() || kindOf(nd) == "directory" {
			return "", fmt.Errorf("export %s: %s already exists", root, out)
		}
		out = filepath.Join(out, root.String())
		if _, err := os.Lstat(out); err == nil {
			return "", fmt.Errorf("export %s: %s already exists", root, out)
		}
	}
	tmp := filepath.Join(filepath.Dir(out), "."+filepath.Base(out)+".partial")
	if err := os.RemoveAll(tmp); err != nil {
		return "", err
	}
	ex := &exporter{ctx: ctx, dag: dag, store: s}
	if err := ex.write(nd, tmp); err != nil {
		os.RemoveAll(tmp)
		return "", fmt.Errorf("export %s: %w", root, err)
	}
	if err := os.Rename(tmp, out); err != nil {
		os.RemoveAll(tmp)
		return "", fmt.Errorf("export %s: %w", root, err)
	}
	s.opts.Metrics.addBytes("export", ex.bytes)
	return out, nil
}

type exporter struct {
	ctx   context.Context
	dag   ipld.DAGService
	store *Store
	bytes int64
}

func (ex *exporter) write(nd ipld.Node, path string) error {
	if err := ex.ctx.Err(); err != nil {
		return err
	}
	switch kindOf(nd) {
	case "directory":
		if err := os.Mkdir(path, 0o755); err != nil {
			return err
		}
		dir, err := uio.NewDirectoryFromNode(ex.dag, nd)
		if err != nil {
			return err
		}
		return dir.ForEachLink(ex.ctx, func(l *ipld.Link) error {
			if err := checkName(l.Name); err != nil {
				return err
			}
			child, err := l.GetNode(ex.ctx, ex.dag)
			if err != nil {
				return err
			}
			return ex.write(child, filepath.Join(path, l.Name))
		})
	case "symlink":
		fsn, err := ft.FSNodeFromBytes(nd.(*merkledag.ProtoNode).Data())
		if err != nil {
			return err
		}
		target := string(fsn.Data())
		if filepath.IsAbs(target) || strings.HasPrefix(filepath.Clean(target), "..") {
			return fmt.Errorf("%s: refusing a symbolic link that points outside the dataset (%q)", path, target)
		}
		return os.Symlink(target, path)
	default:
		r, err := uio.NewDagReader(ex.ctx, nd, ex.dag)
		if err != nil {
			return err
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return err
		}
		n, err := io.Copy(f, r)
		ex.bytes += n
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return err
	}
}

// checkName refuses directory entries that would write outside the
// output directory.
func checkName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
		return fmt.Errorf("refusing directory entry %q", name)
	}
	return nil
}

func humanBytes(n int64) string { return units.FormatSize(uint64(max(n, 0))) }
