package envbuild

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/deepmarket/deepmarket/node/image"
)

// DebianRequest makes a minimal Debian image with python3 locally.
type DebianRequest struct {
	Suite  string   // "bookworm"
	Mirror string   // "" is http://deb.debian.org/debian
	Apt    []string // packages beyond python3 (python3-numpy, python3-torch)
	// Out is where the image is written, as an OCI image layout
	// directory; it must not exist yet.
	Out string
	// Say receives mmdebstrap's output, a line at a time.
	Say func(string)
}

// DefaultMirror is Debian's own.
const DefaultMirror = "http://deb.debian.org/debian"

// Debian makes the image with mmdebstrap (Debian's tool for a root
// filesystem from a mirror, no container engine needed): the minbase
// variant, python3 and req.Apt, without recommended packages, manuals,
// translations or documentation (the copyright files stay). Device nodes
// are left out of its single layer and setuid and setgid bits dropped,
// as a lender would drop them. It returns the image, read from Out.
func Debian(ctx context.Context, req DebianRequest) (v1.Image, error) {
	say := req.Say
	if say == nil {
		say = func(string) {}
	}
	if _, err := exec.LookPath("mmdebstrap"); err != nil {
		return nil, errors.New("mmdebstrap is not installed (apt-get install mmdebstrap)")
	}
	if _, err := os.Lstat(req.Out); err == nil {
		return nil, fmt.Errorf("%s exists already", req.Out)
	}
	for _, p := range req.Apt {
		if p == "" || strings.HasPrefix(p, "-") || strings.ContainsAny(p, " ,\t\n") {
			return nil, fmt.Errorf("%q is not a package name", p)
		}
	}
	mirror := req.Mirror
	if mirror == "" {
		mirror = DefaultMirror
	}
	work, err := os.MkdirTemp(filepath.Dir(req.Out), ".debian-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	raw := filepath.Join(work, "rootfs.tar")
	args := []string{"--variant=minbase", "--include=" + strings.Join(append([]string{"python3"}, req.Apt...), ","),
		`--aptopt=APT::Install-Recommends "false"`,
		"--dpkgopt=path-exclude=/usr/share/man/*", "--dpkgopt=path-exclude=/usr/share/locale/*",
		"--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-include=/usr/share/doc/*/copyright",
		"--format=tar", req.Suite, raw, mirror}
	say("mmdebstrap " + strings.Join(args, " "))
	b := &build{say: say}
	cmd := exec.CommandContext(ctx, "mmdebstrap", args...)
	if err := b.sayLines(cmd, "mmdebstrap"); err != nil {
		return nil, err
	}
	say("writing the image")
	l, err := cleanRootfs(raw, filepath.Join(work, "layer.tar.zst"))
	if err != nil {
		return nil, err
	}
	os.Remove(raw)
	img, err := mutate.Append(empty.Image, mutate.Addendum{Layer: l, History: v1.History{
		CreatedBy: "deepmarket env debian: mmdebstrap --variant=minbase " + req.Suite, Created: v1.Time{Time: epoch}}})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"}
	cf.Config.Cmd = []string{"python3"}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, err
	}
	p, err := layout.Write(req.Out, empty.Index)
	if err == nil {
		err = p.AppendImage(img)
	}
	if err != nil {
		os.RemoveAll(req.Out)
		return nil, fmt.Errorf("write the image: %w", err)
	}
	return image.Open(req.Out)
}

// cleanRootfs writes the root filesystem tar src as a layer at dst,
// without its device nodes and FIFOs, and without setuid and setgid bits.
func cleanRootfs(src, dst string) (v1.Layer, error) {
	in, err := os.Open(src)
	if err != nil {
		return nil, err
	}
	defer in.Close()
	tw, err := newLayerFile(dst)
	if err != nil {
		return nil, err
	}
	tr := tar.NewReader(in)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			tw.abort()
			return nil, fmt.Errorf("mmdebstrap's tar: %w", err)
		}
		switch h.Typeflag {
		case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
			continue
		}
		h.Mode &^= 0o6000
		if err := tw.WriteHeader(h); err != nil {
			tw.abort()
			return nil, err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			tw.abort()
			return nil, err
		}
	}
	return tw.layer()
}
