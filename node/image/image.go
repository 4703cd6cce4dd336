// Package image reads a job's environment, an OCI image, and unpacks it
// into a root filesystem for the worker's sandbox, refusing what a
// stranger's image could do to the lender's machine while it unpacks.
//
// An image comes as an OCI image layout directory or as a `docker save`
// or `podman save` tarball (go-containerregistry reads both). Unpack
// first checks every layer's bytes against the digest its manifest
// names, then writes its layers bottom to top (whiteouts applied)
// through an os.Root, so that no entry, link or later write can reach
// outside the directory, and refuses before anything is kept:
//
//   - an entry whose name leaves the root ("../", an absolute path after
//     the leading slash) or a hard link to one;
//   - a relative symbolic link that climbs above the root (an absolute
//     one is kept: it resolves inside the image in the sandbox);
//   - device nodes and FIFOs;
//   - more entries, or more bytes of file content, than its Limits (a
//     layer that decompresses into a bomb stops at the bound).
//
// Setuid and setgid bits are dropped: the files are kept without them
// (Debian-based images carry su, mount and passwd), so that no file of a
// stranger's image on the lender's disk runs as its owner for a local
// user who finds it.
//
// The image is unpacked into a directory beside the destination and
// renamed into place once whole: a refused or interrupted unpack leaves
// nothing behind.
package image

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Limits bound what an image may unpack into.
type Limits struct {
	Entries int   // entries of the flattened filesystem
	Bytes   int64 // bytes of file content, in all
}

// DefaultLimits are a lender's bounds for one image.
var DefaultLimits = Limits{Entries: 500_000, Bytes: 32 << 30}

// Stats say what an unpack wrote.
type Stats struct {
	Layers  int
	Entries int
	Bytes   int64
	// Setuid counts the files whose setuid or setgid bit was dropped.
	Setuid int
}

// Open reads the image at path: an OCI image layout directory (its
// index's first image) or a docker/podman save tarball (its only image).
func Open(path string) (v1.Image, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		img, err := tarball.ImageFromPath(path, nil)
		if err != nil {
			return nil, fmt.Errorf("%s: not a docker or podman save tarball: %w", path, err)
		}
		return img, nil
	}
	idx, err := layout.ImageIndexFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("%s: not an OCI image layout: %w", path, err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for _, d := range m.Manifests {
		if d.MediaType.IsImage() {
			return idx.Image(d.Digest)
		}
	}
	return nil, fmt.Errorf("%s: the layout's index names no image", path)
}

// Verify reads every layer of img and checks it against the digest its
// manifest names; it returns how many layers it checked.
func Verify(img v1.Image) (int, error) {
	layers, err := img.Layers()
	if err != nil {
		return 0, fmt.Errorf("the image's layers: %w", err)
	}
	for i, l := range layers {
		want, err := l.Digest()
		if err != nil {
			return i, fmt.Errorf("layer %d: %w", i, err)
		}
		rc, err := l.Compressed()
		if err != nil {
			return i, fmt.Errorf("layer %d (%s): %w", i, want, err)
		}
		h := sha256.New()
		_, err = io.Copy(h, rc)
		rc.Close()
		// go-containerregistry checks the digest as it reads too, and
		// says so in its error: either way the layer is refused.
		if err != nil {
			return i, fmt.Errorf("layer %d (%s): %w", i, want, err)
		}
		if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); want.Algorithm != "sha256" || got != want.String() {
			return i, fmt.Errorf("layer %d: its bytes hash to %s, not the manifest's %s", i, got, want)
		}
	}
	return len(layers), nil
}

// Unpack checks img's layers (Verify) and writes them, bottom to top,
// into dest, which must not exist yet, within lim.
func Unpack(img v1.Image, dest string, lim Limits) (Stats, error) {
	var st Stats
	if _, err := os.Lstat(dest); err == nil {
		return st, fmt.Errorf("%s exists already", dest)
	}
	n, err := Verify(img)
	if err != nil {
		return st, err
	}
	st.Layers = n
	tmp, err := os.MkdirTemp(filepath.Dir(dest), "."+filepath.Base(dest)+".unpacking-")
	if err != nil {
		return st, err
	}
	done := false
	defer func() {
		if !done {
			os.RemoveAll(tmp)
		}
	}()
	root, err := os.OpenRoot(tmp)
	if err != nil {
		return st, err
	}
	defer root.Close()
	layers, err := img.Layers()
	if err != nil {
		return st, fmt.Errorf("the image's layers: %w", err)
	}
	for i, l := range layers {
		if err := applyLayer(root, l, lim, &st); err != nil {
			return st, fmt.Errorf("layer %d: %w", i, err)
		}
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return st, err
	}
	if err := os.Rename(tmp, dest); err != nil {
		return st, err
	}
	done = true
	return st, nil
}

// applyLayer writes layer l over what root holds (the layers below it),
// as the OCI image spec says: a ".wh.NAME" entry deletes NAME, a
// ".wh..wh..opq" entry empties its directory of what the layers below put
// there, and an entry replaces what was at its name unless both are
// directories.
func applyLayer(root *os.Root, l v1.Layer, lim Limits, st *Stats) error {
	rc, err := l.Uncompressed()
	if err != nil {
		return err
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	written := map[string]bool{} // this layer's names: an opaque whiteout keeps them
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if st.Entries++; st.Entries > lim.Entries {
			return fmt.Errorf("the image has more than %d entries", lim.Entries)
		}
		name, err := entryName(h.Name)
		if err != nil {
			return err
		}
		dir, base := path.Split(name)
		switch {
		case base == ".wh..wh..opq":
			if err := emptyDir(root, path.Clean("./"+dir), written); err != nil {
				return fmt.Errorf("entry %q: %w", h.Name, err)
			}
			continue
		case strings.HasPrefix(base, ".wh."):
			if err := root.RemoveAll(path.Join(dir, strings.TrimPrefix(base, ".wh."))); err != nil {
				return fmt.Errorf("entry %q: %w", h.Name, err)
			}
			continue
		}
		if name != "." {
			if fi, err := root.Lstat(name); err == nil && !(fi.IsDir() && h.Typeflag == tar.TypeDir) {
				if err := root.RemoveAll(name); err != nil {
					return fmt.Errorf("entry %q: %w", h.Name, err)
				}
			}
		}
		if err := writeEntry(root, name, h, tr, lim, st); err != nil {
			return err
		}
		written[name] = true
	}
}

// emptyDir removes what dir holds in root, but what this layer wrote.
func emptyDir(root *os.Root, dir string, keep map[string]bool) error {
	f, err := root.Open(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return err
	}
	for _, n := range names {
		if p := path.Join(dir, n); !keep[p] {
			if err := root.RemoveAll(p); err != nil {
				return err
			}
		}
	}
	return nil
}

// entryName is an entry's name inside the root ("." for the root
// itself), or an error when it leaves it. A leading slash is dropped, as
// image builders write some names with one.
func entryName(name string) (string, error) {
	trimmed := strings.TrimLeft(name, "/")
	if trimmed == "" {
		return ".", nil
	}
	if !filepath.IsLocal(trimmed) {
		return "", fmt.Errorf("entry %q leaves the image's root", name)
	}
	return path.Clean(trimmed), nil
}

// writeEntry writes entry h, at name, into root.
func writeEntry(root *os.Root, name string, h *tar.Header, r io.Reader, lim Limits, st *Stats) error {
	mode := os.FileMode(h.Mode) & os.ModePerm
	if h.Mode&(0o4000|0o2000) != 0 && h.Typeflag != tar.TypeDir {
		st.Setuid++ // mode keeps the permission bits alone
	}
	if dir := path.Dir(name); dir != "." {
		if err := root.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("entry %q: %w", h.Name, err)
		}
	}
	switch h.Typeflag {
	case tar.TypeDir:
		if name == "." {
			return nil
		}
		if err := root.MkdirAll(name, 0o755); err != nil {
			return fmt.Errorf("entry %q: %w", h.Name, err)
		}
		return root.Chmod(name, mode|0o700)
	case tar.TypeReg, tar.TypeRegA: //nolint:staticcheck // old archives use TypeRegA
		if h.Size > lim.Bytes-st.Bytes {
			return fmt.Errorf("the image holds more than %d bytes of files (at %q)", lim.Bytes, h.Name)
		}
		f, err := root.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, mode|0o600)
		if err != nil {
			return fmt.Errorf("entry %q: %w", h.Name, err)
		}
		n, err := io.Copy(f, io.LimitReader(r, h.Size))
		st.Bytes += n
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("entry %q: %w", h.Name, err)
		}
		return nil
	case tar.TypeSymlink:
		if !path.IsAbs(h.Linkname) && !filepath.IsLocal(path.Join(path.Dir(name), h.Linkname)) {
			return fmt.Errorf("symbolic link %q -> %q leaves the image's root", h.Name, h.Linkname)
		}
		return root.Symlink(h.Linkname, name)
	case tar.TypeLink:
		target, err := entryName(h.Linkname)
		if err != nil || target == "." {
			return fmt.Errorf("hard link %q -> %q leaves the image's root", h.Name, h.Linkname)
		}
		if err := root.Link(target, name); err != nil {
			return fmt.Errorf("hard link %q -> %q: %w", h.Name, h.Linkname, err)
		}
		return nil
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return fmt.Errorf("entry %q is a device node or FIFO (type %q): images may not carry them", h.Name, h.Typeflag)
	case tar.TypeXGlobalHeader:
		return nil
	}
	return fmt.Errorf("entry %q has type %q, which an image may not carry", h.Name, h.Typeflag)
}
