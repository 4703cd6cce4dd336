package image

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/deepmarket/deepmarket/node/image/imagetest"
)

// entry is one tar entry of a test layer.
type entry struct {
	hdr  tar.Header
	body string
}

func file(name, body string, mode int64) entry {
	return entry{tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: mode, Size: int64(len(body))}, body}
}

func dir(name string) entry {
	return entry{hdr: tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: 0o755}}
}

func link(name, target string, typ byte) entry {
	return entry{hdr: tar.Header{Name: name, Typeflag: typ, Linkname: target, Mode: 0o777}}
}

// layerOf is a gzip layer holding entries, in order.
func layerOf(t *testing.T, entries ...entry) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.hdr
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, e.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return imagetest.LayerOf(t, buf.Bytes())
}

// imageOf is an image of layers, written as an OCI layout directory
// (its path returned) the way `env add` would be given one.
func imageOf(t *testing.T, layers ...v1.Layer) string {
	t.Helper()
	return imagetest.Layout(t, imagetest.Image(t, layers...))
}

func unpack(t *testing.T, src string, lim Limits) (string, Stats, error) {
	t.Helper()
	img, err := Open(src)
	if err != nil {
		t.Fatal(err)
	}
	dest := filepath.Join(t.TempDir(), "rootfs")
	st, err := Unpack(img, dest, lim)
	return dest, st, err
}

// TestUnpackAnImage: two layers, the second deleting a file of the first
// (a whiteout), emptying a directory of what the first put there (an
// opaque whiteout) and replacing a file; links inside the root, absolute
// symbolic links too, are kept. The image reads the same from a
// docker-save tarball.
func TestUnpackAnImage(t *testing.T) {
	base := layerOf(t, dir("usr/"), dir("usr/bin/"), file("usr/bin/python3", "#!py", 0o755), file("etc/old", "old", 0o644),
		file("etc/conf", "v1", 0o644), link("bin", "usr/bin", tar.TypeSymlink), link("etc/abs", "/usr/bin/python3", tar.TypeSymlink), file("opt/a", "", 0o644), file("opt/b", "", 0o644))
	top := layerOf(t, file("etc/.wh.old", "", 0o644), file("etc/conf", "v2", 0o600), link("usr/bin/python", "usr/bin/python3", tar.TypeLink),
		file("opt/c", "", 0o644), file("opt/.wh..wh..opq", "", 0o644))
	dest, st, err := unpack(t, imageOf(t, base, top), DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	// Every layer's bytes count, the replaced and deleted too: what
	// unpacking wrote, which the bounds bound.
	if st.Layers != 2 || st.Entries != 14 || st.Bytes != int64(len("#!py")+len("old")+len("v1")+len("v2")) {
		t.Errorf("stats %+v", st)
	}
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(dest, p))
		if err != nil {
			return "error: " + err.Error()
		}
		return string(b)
	}
	if got := read("etc/conf"); got != "v2" {
		t.Errorf("etc/conf = %q, want the top layer's", got)
	}
	if _, err := os.Lstat(filepath.Join(dest, "etc/old")); !os.IsNotExist(err) {
		t.Errorf("etc/old, deleted by the top layer's whiteout: %v", err)
	}
	if opt, err := os.ReadDir(filepath.Join(dest, "opt")); err != nil || len(opt) != 1 || opt[0].Name() != "c" {
		t.Errorf("opt after the top layer's opaque whiteout: %v %v; want c alone", opt, err)
	}
	if got := read("bin/python3"); got != "#!py" {
		t.Errorf("bin/python3 through the symbolic link = %q", got)
	}
	if got := read("usr/bin/python"); got != "#!py" {
		t.Errorf("the hard link = %q", got)
	}
	if target, err := os.Readlink(filepath.Join(dest, "etc/abs")); err != nil || target != "/usr/bin/python3" {
		t.Errorf("the absolute link: %q %v", target, err)
	}
	if fi, err := os.Stat(filepath.Join(dest, "usr/bin/python3")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("usr/bin/python3: %v %v", fi, err)
	}

	// The same image as `docker save` writes it.
	img, err := Open(imageOf(t, base, top))
	if err != nil {
		t.Fatal(err)
	}
	tarPath := filepath.Join(t.TempDir(), "image.tar")
	ref, _ := name.ParseReference("lab/train:1")
	if err := tarball.WriteToFile(tarPath, ref, img); err != nil {
		t.Fatal(err)
	}
	dest2, _, err := unpack(t, tarPath, DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dest2, "etc/conf")); string(b) != "v2" {
		t.Errorf("from the tarball, etc/conf = %q", b)
	}
}

// TestHostileImagesAreRefused: each hostile layer is refused, with an
// error naming what it carried, and leaves nothing behind: not the
// destination, not a half-written directory beside it, and nothing
// outside it.
func TestHostileImagesAreRefused(t *testing.T) {
	bomb := strings.Repeat("\x00", 8<<20)
	for _, c := range []struct {
		name  string
		layer []entry
		lim   Limits
		want  string
	}{
		{"traversal", []entry{file("../escaped", "x", 0o644)}, DefaultLimits, "leaves the image's root"},
		{"deep traversal", []entry{file("usr/../../escaped", "x", 0o644)}, DefaultLimits, "leaves the image's root"},
		{"device node", []entry{{hdr: tar.Header{Name: "dev/sda", Typeflag: tar.TypeBlock, Mode: 0o660, Devmajor: 8}}}, DefaultLimits, "device node"},
		{"char device", []entry{{hdr: tar.Header{Name: "dev/mem", Typeflag: tar.TypeChar, Mode: 0o660, Devmajor: 1, Devminor: 1}}}, DefaultLimits, "device node"},
		{"symbolic link out", []entry{link("etc/passwd", "../../../../etc/passwd", tar.TypeSymlink)}, DefaultLimits, "leaves the image's root"},
		{"write through a link", []entry{link("out", "/", tar.TypeSymlink), file("out/escaped", "x", 0o644)}, DefaultLimits, "escapes"},
		{"hard link out", []entry{link("passwd", "../../etc/passwd", tar.TypeLink)}, DefaultLimits, "leaves the image's root"},
		{"too many entries", []entry{file("a", "", 0o644), file("b", "", 0o644), file("c", "", 0o644)}, Limits{Entries: 2, Bytes: 1 << 20}, "more than 2 entries"},
		{"decompression bomb", []entry{file("zeros", bomb, 0o644)}, Limits{Entries: 10, Bytes: 1 << 20}, "more than 1048576 bytes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dest, _, err := unpack(t, imageOf(t, layerOf(t, c.layer...)), c.lim)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("unpack: %v; want an error saying %q", err, c.want)
			}
			left, _ := os.ReadDir(filepath.Dir(dest))
			if len(left) != 0 {
				t.Errorf("the refused unpack left %v behind", left)
			}
			if _, err := os.Lstat(filepath.Join(filepath.Dir(dest), "escaped")); !os.IsNotExist(err) {
				t.Errorf("a file escaped the root: %v", err)
			}
		})
	}
}

// TestSetuidBitsAreDropped: setuid and setgid files (a Debian image's
// su and wall) are kept without those bits: no file of an image runs as
// its owner on the lender's disk.
func TestSetuidBitsAreDropped(t *testing.T) {
	dest, st, err := unpack(t, imageOf(t, layerOf(t, file("usr/bin/su", "x", 0o4755), file("usr/bin/wall", "x", 0o2755))), DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"usr/bin/su", "usr/bin/wall"} {
		fi, err := os.Stat(filepath.Join(dest, f))
		if err != nil || fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 || fi.Mode().Perm() != 0o755 {
			t.Errorf("%s: %v %v; want mode 0755 without setuid or setgid", f, fi.Mode(), err)
		}
	}
	if st.Setuid != 2 {
		t.Errorf("the unpack counts %d setuid files, want 2", st.Setuid)
	}
}

// TestATamperedLayerIsRefused: a layer whose bytes no longer match the
// digest its manifest names is refused before anything is written.
func TestATamperedLayerIsRefused(t *testing.T) {
	src := imageOf(t, layerOf(t, file("etc/conf", strings.Repeat("honest ", 100), 0o644)))
	img, err := Open(src)
	if err != nil {
		t.Fatal(err)
	}
	layers, _ := img.Layers()
	d, _ := layers[0].Digest()
	blob := filepath.Join(src, "blobs", d.Algorithm, d.Hex)
	b, err := os.ReadFile(blob)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0xff
	if err := os.WriteFile(blob, b, 0o644); err != nil {
		t.Fatal(err)
	}
	dest, _, err := unpack(t, src, DefaultLimits)
	if err == nil || !strings.Contains(err.Error(), d.String()) {
		t.Fatalf("unpack of a tampered layer: %v; want it refused, naming the layer's digest", err)
	}
	if left, _ := os.ReadDir(filepath.Dir(dest)); len(left) != 0 {
		t.Errorf("the refused unpack left %v behind", left)
	}
}
