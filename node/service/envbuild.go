package service

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/ipfs/go-cid"

	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/envbuild"
	"github.com/deepmarket/deepmarket/node/fault"
	"github.com/deepmarket/deepmarket/node/image"
	"github.com/deepmarket/deepmarket/storage"
	"github.com/deepmarket/deepmarket/units"
)

// EnvBuild implements api.Data: it builds an image from a base and a
// project's Python packages, pip running in the job sandbox here (see
// package envbuild), then adds the image and records it, as `env add`
// does. progress gets the build's steps and pip's output, then the
// add's bytes.
func (d *Data) EnvBuild(ctx context.Context, req api.EnvBuildRequest, progress func(api.Progress)) (api.EnvImage, error) {
	if req.Name != "" {
		if err := api.CheckEnvName(req.Name); err != nil {
			return api.EnvImage{}, err
		}
	}
	if (req.Project == "") == (req.Venv == "") {
		return api.EnvImage{}, fault.New(fault.Invalid, "project", "a build needs a project or a virtualenv to pack, not both")
	}
	for field, p := range map[string]string{"project": req.Project, "venv": req.Venv, "wheels": req.Wheels} {
		if p == "" {
			continue
		}
		if !filepath.IsAbs(p) {
			return api.EnvImage{}, fault.New(fault.Invalid, field, "%s %q: want an absolute path", field, p)
		}
		if _, err := os.Stat(p); err != nil {
			return api.EnvImage{}, pathError(field, p, err)
		}
	}
	if req.Base == "" {
		return api.EnvImage{}, fault.New(fault.Invalid, "base", "a build needs a base image with python3 (--base)")
	}
	say := func(s string) {
		if progress != nil {
			progress(api.Progress{Step: s})
		}
	}
	work, err := os.MkdirTemp("", "deepmarket-envbuild-")
	if err != nil {
		return api.EnvImage{}, err
	}
	defer os.RemoveAll(work)
	if err := os.Chmod(work, 0o711); err != nil { // the sandbox's uid passes through
		return api.EnvImage{}, err
	}
	base, err := d.baseImage(ctx, req.Base, filepath.Join(work, "base"), say)
	if err != nil {
		return api.EnvImage{}, err
	}
	out := filepath.Join(work, "image")
	var res envbuild.Result
	if req.Venv != "" {
		res, err = envbuild.Pack(ctx, envbuild.PackRequest{Base: base, Venv: req.Venv, Work: work, Out: out, Say: say})
	} else {
		res, err = envbuild.Build(ctx, envbuild.Request{Base: base, Project: req.Project, Wheels: req.Wheels,
			HostPython: d.Python, Work: work, Out: out, Say: say})
	}
	if err != nil {
		if ctx.Err() != nil {
			return api.EnvImage{}, ctx.Err()
		}
		return api.EnvImage{}, fault.Wrap(fault.Invalid, "", fmt.Errorf("env build: %w", err))
	}
	digest, err := res.Image.Digest()
	if err != nil {
		return api.EnvImage{}, err
	}
	layers, err := res.Image.Layers()
	if err != nil {
		return api.EnvImage{}, err
	}
	say(fmt.Sprintf("built %s: %d files (%s) under %s; adding it", digest, res.Files, units.FormatSize(uint64(res.Bytes)), envbuild.Site))
	pin, err := d.Blocks.Add(ctx, out, storageProgress(progress))
	if err != nil {
		return api.EnvImage{}, err
	}
	return d.EnvRecord(ctx, api.EnvRecordRequest{Name: req.Name, CID: pin.CID.String(), Digest: digest.String(), Layers: len(layers), Size: pin.Size})
}

// baseImage is the image ref names: a CID or a name added here (laid
// out in dir), an image file or layout directory on this machine, or a
// registry reference, pulled.
func (d *Data) baseImage(ctx context.Context, ref, dir string, say func(string)) (v1.Image, error) {
	c, found, err := d.ResolveEnv(ctx, ref)
	if err != nil {
		return nil, err
	}
	if found {
		id, err := cid.Decode(c)
		if err != nil {
			return nil, err
		}
		say("laying out the base image " + c)
		if _, err := d.Blocks.FetchInto(ctx, id, dir, nil); err != nil {
			if errors.Is(err, storage.ErrStalled) {
				return nil, fault.New(fault.NotFound, "base", "base image %s: no peer has it (%v)", c, err)
			}
			return nil, err
		}
		return openBase(dir)
	}
	if filepath.IsAbs(ref) {
		if _, err := os.Stat(ref); err != nil {
			return nil, pathError("base", ref, err)
		}
		return openBase(ref)
	}
	if image.IsReference(ref) {
		say("pulling the base image " + ref)
		img, err := image.Pull(ctx, ref)
		if err != nil {
			return nil, fault.Wrap(fault.Invalid, "base", err)
		}
		return img, nil
	}
	return nil, fault.New(fault.NotFound, "base", "base image %q: no image of that name here (see `deepmarket env ls`), and not a path or a registry reference", ref)
}

func openBase(path string) (v1.Image, error) {
	img, err := image.Open(path)
	if err != nil {
		return nil, fault.Wrap(fault.Invalid, "base", err)
	}
	return img, nil
}
