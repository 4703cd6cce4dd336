package service

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/ipfs/go-cid"

	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/fault"
	"github.com/deepmarket/deepmarket/storage"
)

// Data answers /data: datasets by content address. The node reads and
// writes the paths of `data add` and `data get` itself, as the user it
// runs as: the CLI passes absolute paths on this machine.
type Data struct {
	Blocks *storage.Store
	// Records keeps the images added here (env add), by name or CID.
	Records Records
	// Python is the node's Python ([inventory] python), whose pip builds
	// images (env build).
	Python string
	Logger *slog.Logger
}

// DataAdd implements api.Data.
func (d *Data) DataAdd(ctx context.Context, req api.DataAddRequest, progress func(api.Progress)) (api.DataPin, error) {
	if !filepath.IsAbs(req.Path) {
		return api.DataPin{}, fault.New(fault.Invalid, "path", "path %q: want an absolute path", req.Path)
	}
	if _, err := os.Lstat(req.Path); err != nil {
		return api.DataPin{}, pathError("path", req.Path, err)
	}
	p, err := d.Blocks.Add(ctx, req.Path, storageProgress(progress))
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			return api.DataPin{}, pathError("path", pe.Path, pe.Err)
		}
		return api.DataPin{}, err
	}
	d.Logger.Info("data added", "cid", p.CID, "name", p.Name, "size", p.Size)
	return apiPin(p), nil
}

// DataGet implements api.Data.
func (d *Data) DataGet(ctx context.Context, req api.DataGetRequest, progress func(api.Progress)) (api.DataGetResult, error) {
	c, err := parseCID(req.CID)
	if err != nil {
		return api.DataGetResult{}, err
	}
	if !filepath.IsAbs(req.Out) {
		return api.DataGetResult{}, fault.New(fault.Invalid, "out", "out %q: want an absolute path", req.Out)
	}
	if _, err := os.Stat(filepath.Dir(req.Out)); err != nil {
		return api.DataGetResult{}, pathError("out", filepath.Dir(req.Out), err)
	}
	path, p, err := d.Blocks.Get(ctx, c, req.Out, storageProgress(progress))
	if err != nil {
		if errors.Is(err, storage.ErrStalled) {
			return api.DataGetResult{}, fault.Wrap(fault.Timeout, "", err)
		}
		return api.DataGetResult{}, err
	}
	d.Logger.Info("data fetched", "cid", c, "size", p.Size, "path", path)
	return api.DataGetResult{DataPin: apiPin(p), Path: path}, nil
}

// DataList implements api.Data.
func (d *Data) DataList(ctx context.Context) ([]api.DataPin, error) {
	pins, err := d.Blocks.Pins(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]api.DataPin, len(pins))
	for i, p := range pins {
		out[i] = apiPin(p)
	}
	return out, nil
}

// DataRemove implements api.Data.
func (d *Data) DataRemove(ctx context.Context, s string) error {
	c, err := parseCID(s)
	if err != nil {
		return err
	}
	if err := d.Blocks.Unpin(ctx, c); err != nil {
		if errors.Is(err, storage.ErrNotPinned) {
			return fault.New(fault.NotFound, "cid", "%s is not pinned here (see `deepmarket data ls`)", c)
		}
		return err
	}
	return nil
}

// DataGC implements api.Data.
func (d *Data) DataGC(ctx context.Context) (api.DataGCResult, error) {
	r, err := d.Blocks.GC(ctx)
	if err != nil {
		return api.DataGCResult{}, err
	}
	out := api.DataGCResult{RemovedBlocks: r.Removed, RemovedBytes: r.RemovedBytes, ReclaimedBytes: r.ReclaimedBytes, KeptBlocks: r.Kept}
	for _, c := range r.Incomplete {
		out.Incomplete = append(out.Incomplete, c.String())
	}
	d.Logger.Info("data gc", "removed_blocks", r.Removed, "removed_bytes", r.RemovedBytes, "kept_blocks", r.Kept)
	return out, nil
}

func parseCID(s string) (cid.Cid, error) {
	c, err := cid.Decode(s)
	if err != nil {
		return cid.Undef, fault.New(fault.Invalid, "cid", "cid %q: %v", s, err)
	}
	return c, nil
}

func pathError(field, path string, err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fault.New(fault.Invalid, field, "%s: no such file or directory", path)
	case errors.Is(err, fs.ErrPermission):
		return fault.New(fault.Invalid, field,
			"%s: permission denied to the node, which runs as user %d (make it readable to that user)", path, os.Getuid())
	default:
		return fault.New(fault.Invalid, field, "%s: %v", path, err)
	}
}

func apiPin(p storage.Pin) api.DataPin {
	return api.DataPin{CID: p.CID.String(), Name: p.Name, Kind: p.Kind, Size: p.Size, AddedAt: p.Added, Partial: p.Partial}
}

func storageProgress(fn func(api.Progress)) func(storage.Progress) {
	if fn == nil {
		return nil
	}
	return func(p storage.Progress) { fn(api.Progress{Done: p.Done, Total: p.Total, Blocks: p.Blocks}) }
}

var _ api.Data = (*Data)(nil)
