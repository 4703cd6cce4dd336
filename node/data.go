package node

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"

	"github.com/ipfs/go-cid"

	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/storage"
)

// The node reads and writes the paths of `data add` and `data get` itself,
// as the user it runs as: the CLI passes absolute paths on this machine.

// DataAdd implements api.Data.
func (n *Node) DataAdd(ctx context.Context, req api.DataAddRequest, progress func(api.Progress)) (api.DataPin, error) {
	if !filepath.IsAbs(req.Path) {
		return api.DataPin{}, &api.Error{Status: http.StatusUnprocessableEntity, Field: "path", Message: fmt.Sprintf("path %q: want an absolute path", req.Path)}
	}
	if _, err := os.Lstat(req.Path); err != nil {
		return api.DataPin{}, pathError("path", req.Path, err)
	}
	p, err := n.blocks.Add(ctx, req.Path, storageProgress(progress))
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			return api.DataPin{}, pathError("path", pe.Path, pe.Err)
		}
		return api.DataPin{}, err
	}
	n.log.Info("data added", "cid", p.CID, "name", p.Name, "size", p.Size)
	return apiPin(p), nil
}

// DataGet implements api.Data.
func (n *Node) DataGet(ctx context.Context, req api.DataGetRequest, progress func(api.Progress)) (api.DataGetResult, error) {
	c, err := parseCID(req.CID)
	if err != nil {
		return api.DataGetResult{}, err
	}
	if !filepath.IsAbs(req.Out) {
		return api.DataGetResult{}, &api.Error{Status: http.StatusUnprocessableEntity, Field: "out", Message: fmt.Sprintf("out %q: want an absolute path", req.Out)}
	}
	if _, err := os.Stat(filepath.Dir(req.Out)); err != nil {
		return api.DataGetResult{}, pathError("out", filepath.Dir(req.Out), err)
	}
	path, p, err := n.blocks.Get(ctx, c, req.Out, storageProgress(progress))
	if err != nil {
		if errors.Is(err, storage.ErrStalled) {
			return api.DataGetResult{}, &api.Error{Status: http.StatusGatewayTimeout, Message: err.Error()}
		}
		return api.DataGetResult{}, err
	}
	n.log.Info("data fetched", "cid", c, "size", p.Size, "path", path)
	return api.DataGetResult{DataPin: apiPin(p), Path: path}, nil
}

// DataList implements api.Data.
func (n *Node) DataList(ctx context.Context) ([]api.DataPin, error) {
	pins, err := n.blocks.Pins(ctx)
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
func (n *Node) DataRemove(ctx context.Context, s string) error {
	c, err := parseCID(s)
	if err != nil {
		return err
	}
	if err := n.blocks.Unpin(ctx, c); err != nil {
		if errors.Is(err, storage.ErrNotPinned) {
			return &api.Error{Status: http.StatusNotFound, Message: fmt.Sprintf("%s is not pinned here (see `deepmarket data ls`)", c)}
		}
		return err
	}
	return nil
}

// DataGC implements api.Data.
func (n *Node) DataGC(ctx context.Context) (api.DataGCResult, error) {
	r, err := n.blocks.GC(ctx)
	if err != nil {
		return api.DataGCResult{}, err
	}
	out := api.DataGCResult{RemovedBlocks: r.Removed, RemovedBytes: r.RemovedBytes, ReclaimedBytes: r.ReclaimedBytes, KeptBlocks: r.Kept}
	for _, c := range r.Incomplete {
		out.Incomplete = append(out.Incomplete, c.String())
	}
	n.log.Info("data gc", "removed_blocks", r.Removed, "removed_bytes", r.RemovedBytes, "kept_blocks", r.Kept)
	return out, nil
}

func parseCID(s string) (cid.Cid, error) {
	c, err := cid.Decode(s)
	if err != nil {
		return cid.Undef, &api.Error{Status: http.StatusUnprocessableEntity, Field: "cid", Message: fmt.Sprintf("cid %q: %v", s, err)}
	}
	return c, nil
}

func pathError(field, path string, err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return &api.Error{Status: http.StatusUnprocessableEntity, Field: field, Message: fmt.Sprintf("%s: no such file or directory", path)}
	case errors.Is(err, fs.ErrPermission):
		return &api.Error{Status: http.StatusUnprocessableEntity, Field: field,
			Message: fmt.Sprintf("%s: permission denied to the node, which runs as user %d (make it readable to that user)", path, os.Getuid())}
	default:
		return &api.Error{Status: http.StatusUnprocessableEntity, Field: field, Message: fmt.Sprintf("%s: %v", path, err)}
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

var _ api.Data = (*Node)(nil)
