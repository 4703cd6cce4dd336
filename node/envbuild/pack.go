package envbuild

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/deepmarket/deepmarket/node/image"
)

// PackRequest packs a virtualenv that works here into an image: its
// site-packages as one layer on a base whose python3 is the same
// version, as conda-pack does for conda environments. Nothing runs but
// the base's python3, once, to say its version.
type PackRequest struct {
	Base v1.Image
	// Venv is the virtualenv's directory (its lib/python3.X/site-packages
	// is packed; its bin, whose scripts name this machine's interpreter,
	// is not).
	Venv      string
	Work, Out string
	Say       func(string)
}

// Pack returns the base with the venv's site-packages under Site, read
// from Out.
func Pack(ctx context.Context, req PackRequest) (Result, error) {
	say := req.Say
	if say == nil {
		say = func(string) {}
	}
	sites, _ := filepath.Glob(filepath.Join(req.Venv, "lib", "python3*", "site-packages"))
	if len(sites) != 1 {
		return Result{}, fmt.Errorf("%s is not a virtualenv: want one lib/python3.X/site-packages in it, found %d", req.Venv, len(sites))
	}
	want := strings.TrimPrefix(filepath.Base(filepath.Dir(sites[0])), "python")
	if req.Out == "" {
		return Result{}, errors.New("envbuild: no Out")
	}
	env, err := image.Env(req.Base)
	if err != nil {
		return Result{}, err
	}
	work, err := os.MkdirTemp(req.Work, "envpack-")
	if err != nil {
		return Result{}, err
	}
	defer os.RemoveAll(work)
	if err := os.Chmod(work, 0o711); err != nil {
		return Result{}, err
	}
	b := &build{req: Request{Base: req.Base}, say: say, env: env, root: filepath.Join(work, "rootfs"), box: filepath.Join(work, "box")}
	say("unpacking the base image")
	if _, err := image.Unpack(req.Base, b.root, image.DefaultLimits); err != nil {
		return Result{}, fmt.Errorf("the base image: %w", err)
	}
	if err := os.MkdirAll(b.box, 0o755); err != nil {
		return Result{}, err
	}
	py, _, _, err := b.python(ctx)
	if err != nil {
		return Result{}, err
	}
	if py != want {
		return Result{}, fmt.Errorf("the virtualenv is for Python %s, the base image's python3 is %s: its compiled packages would not load", want, py)
	}
	say(fmt.Sprintf("packing %s (python %s)", sites[0], py))
	layer, files, size, err := writeLayer(sites[0], Site, filepath.Join(work, "layer.tar.zst"))
	if err != nil {
		return Result{}, err
	}
	img, err := withSite(req.Base, layer, "deepmarket env pack: "+req.Venv)
	if err != nil {
		return Result{}, err
	}
	return writeOut(img, req.Out, files, size, say)
}
