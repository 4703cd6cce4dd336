package service

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/ipfs/go-cid"

	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/fault"
	"github.com/deepmarket/deepmarket/storage"
)

// Records is the node's store of small documents (Store in package node).
type Records interface {
	Get(key string, v any) (found bool, err error)
	Put(key string, v any) error
	Each(prefix string, fn func(key string, doc []byte) error) error
	Delete(key string) error
}

// envPrefix keys the images added here: by name, or by CID when unnamed.
const envPrefix = "env/"

// EnvRecord implements api.Data: it records an image the CLI checked and
// added; its CID must be pinned here. A name given again moves to the new
// image (as a tag does).
func (d *Data) EnvRecord(ctx context.Context, req api.EnvRecordRequest) (api.EnvImage, error) {
	c, err := parseCID(req.CID)
	if err != nil {
		return api.EnvImage{}, err
	}
	if req.Name != "" {
		if err := api.CheckEnvName(req.Name); err != nil {
			return api.EnvImage{}, err
		}
	}
	if !strings.HasPrefix(req.Digest, "sha256:") || len(req.Digest) != len("sha256:")+64 || req.Layers < 1 || req.Size < 0 {
		return api.EnvImage{}, fault.New(fault.Invalid, "digest", "an image record needs its manifest's sha256 digest, its layers and its size")
	}
	if _, ok, err := d.Blocks.Pinned(ctx, c); err != nil {
		return api.EnvImage{}, err
	} else if !ok {
		return api.EnvImage{}, fault.New(fault.NotFound, "cid", "%s is not pinned here: add the image with `deepmarket env add`", c)
	}
	img := api.EnvImage{Name: req.Name, CID: c.String(), Digest: req.Digest, Layers: req.Layers, Size: req.Size, AddedAt: time.Now().UTC()}
	key := envPrefix + img.CID
	if img.Name != "" {
		key = envPrefix + img.Name
	}
	if err := d.Records.Put(key, img); err != nil {
		return api.EnvImage{}, err
	}
	if img.Name != "" { // an unnamed record of the same image is now this one
		if err := d.Records.Delete(envPrefix + img.CID); err != nil {
			return api.EnvImage{}, err
		}
	}
	d.Logger.Info("image recorded", "name", img.Name, "cid", img.CID, "digest", img.Digest)
	return img, nil
}

// EnvList implements api.Data: the images added here, newest first.
func (d *Data) EnvList(context.Context) ([]api.EnvImage, error) {
	var out []api.EnvImage
	err := d.Records.Each(envPrefix, func(key string, doc []byte) error {
		var img api.EnvImage
		if err := json.Unmarshal(doc, &img); err != nil {
			return fault.New(fault.Internal, "", "image record %s: %v", key, err)
		}
		out = append(out, img)
		return nil
	})
	slices.SortFunc(out, func(a, b api.EnvImage) int { return b.AddedAt.Compare(a.AddedAt) })
	return out, err
}

// EnvShow implements api.Data: one image, by name or CID.
func (d *Data) EnvShow(ctx context.Context, ref string) (api.EnvImage, error) {
	imgs, err := d.envsOf(ctx, ref)
	if err != nil {
		return api.EnvImage{}, err
	}
	return imgs[0], nil
}

// envsOf is the records ref names: the one of that name, or every record
// of that CID (newest first); a fault.NotFound when there is none.
func (d *Data) envsOf(ctx context.Context, ref string) ([]api.EnvImage, error) {
	if _, err := cid.Decode(ref); err == nil {
		all, err := d.EnvList(ctx)
		if err != nil {
			return nil, err
		}
		all = slices.DeleteFunc(all, func(img api.EnvImage) bool { return img.CID != ref })
		if len(all) > 0 {
			return all, nil
		}
	} else {
		var img api.EnvImage
		found, err := d.Records.Get(envPrefix+ref, &img)
		if err != nil {
			return nil, err
		}
		if found {
			return []api.EnvImage{img}, nil
		}
	}
	return nil, fault.New(fault.NotFound, "image", "no image %q here (see `deepmarket env ls`)", ref)
}

// EnvRemove implements api.Data: it forgets the image ref names (every
// name of it, for a CID) and unpins its CID unless another name still
// records it; `data gc` then frees its blocks.
func (d *Data) EnvRemove(ctx context.Context, ref string) (api.EnvImage, error) {
	imgs, err := d.envsOf(ctx, ref)
	if err != nil {
		return api.EnvImage{}, err
	}
	for _, img := range imgs {
		key := envPrefix + img.CID
		if img.Name != "" {
			key = envPrefix + img.Name
		}
		if err := d.Records.Delete(key); err != nil {
			return api.EnvImage{}, err
		}
	}
	img := imgs[0]
	left, err := d.envsOf(ctx, img.CID)
	if err == nil && len(left) > 0 {
		d.Logger.Info("image name removed", "name", img.Name, "cid", img.CID, "still_named", left[0].Name)
		return img, nil
	}
	c, _ := cid.Decode(img.CID)
	if err := d.Blocks.Unpin(ctx, c); err != nil && !errors.Is(err, storage.ErrNotPinned) {
		return api.EnvImage{}, err
	}
	d.Logger.Info("image removed", "name", img.Name, "cid", img.CID)
	return img, nil
}

// ResolveEnv is the CID of image ref: a CID as is, or the CID recorded
// under that name; found is false for a name not recorded here.
func (d *Data) ResolveEnv(ctx context.Context, ref string) (string, bool, error) {
	if _, err := cid.Decode(ref); err == nil {
		return ref, true, nil
	}
	if api.CheckEnvName(ref) != nil {
		return "", false, nil
	}
	var img api.EnvImage
	found, err := d.Records.Get(envPrefix+ref, &img)
	return img.CID, found, err
}
