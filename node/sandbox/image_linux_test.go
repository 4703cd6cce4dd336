package sandbox

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/deepmarket/deepmarket/node/image"
)

// shellImage unpacks, under base, an image holding the host's /bin/sh and
// the libraries it loads (as regular files, at their paths), a /var
// without tmp, base's top directory (empty), and /etc/image-marker; it
// returns the image's root.
func shellImage(t *testing.T, base string) string {
	t.Helper()
	out, err := exec.Command("ldd", "/bin/sh").Output()
	if err != nil {
		t.Fatalf("ldd /bin/sh: %v", err)
	}
	files := map[string]string{"bin/sh": "/bin/sh"}
	for _, p := range regexp.MustCompile(`(/\S+\.so[.0-9]*)`).FindAllString(string(out), -1) {
		files[strings.TrimPrefix(p, "/")] = p
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(h tar.Header, body []byte) {
		h.Size = int64(len(body))
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		tw.Write(body)
	}
	for name, host := range files {
		b, err := os.ReadFile(host)
		if err != nil {
			t.Fatal(err)
		}
		add(tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o755}, b)
	}
	add(tar.Header{Name: "var/lib/", Typeflag: tar.TypeDir, Mode: 0o755}, nil)
	top, _, _ := strings.Cut(strings.TrimPrefix(base, "/"), "/")
	add(tar.Header{Name: top + "/", Typeflag: tar.TypeDir, Mode: 0o755}, nil)
	add(tar.Header{Name: "etc/image-marker", Typeflag: tar.TypeReg, Mode: 0o644}, []byte("from-the-image\n"))
	tw.Close()
	data := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(base, "rootfs")
	if _, err := image.Unpack(img, root, image.DefaultLimits); err != nil {
		t.Fatal(err)
	}
	return root
}

// TestJobRunsInItsImage: a job given an image's root runs the image's
// programs, reads the image's files, does not see the host's system dirs
// (no /usr/bin/python3), still writes its own dir and /tmp, reads its
// read-only paths, and cannot write the image. The image gets only the
// empty mount points the job's own mounts need.
func TestJobRunsInItsImage(t *testing.T) {
	needRoot(t)
	base := readOnlyBase(t)
	root := shellImage(t, base)
	data := filepath.Join(base, "data")
	if err := os.MkdirAll(data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(data, "rows"), []byte("dataset-rows\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	s := spec(t, &out, "/bin/sh", "-c", `read m < /etc/image-marker; echo "marker=$m"
read d < "$1/rows"; echo "data=$d"
[ -e /usr/bin/python3 ] && echo host-python-visible
echo mine > out && read o < out && echo "dir=$o"
echo tmp > /tmp/x && echo tmp-ok
(echo no > /etc/image-marker) 2>/dev/null || echo image-read-only`, "sh", data)
	s.Root, s.ReadOnly = root, []string{data}
	e := run(t, s)
	got := out.String()
	t.Logf("the job printed %q (dir %s)", got, s.Dir)
	for _, want := range []string{"marker=from-the-image", "data=dataset-rows", "dir=mine", "tmp-ok", "image-read-only"} {
		if !strings.Contains(got, want) {
			t.Errorf("the job in its image printed %q; want %q in it", got, want)
		}
	}
	if strings.Contains(got, "host-python-visible") || e.Code != 0 {
		t.Errorf("the job saw the host's system dirs, or failed (%+v): %q", e, got)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "etc/image-marker")); string(b) != "from-the-image\n" {
		t.Errorf("the image's file became %q", b)
	}
	// The dataset's mount point, made under the image's copy of its top
	// directory (bwrap cannot make one in a read-only bind).
	if fi, err := os.Stat(filepath.Join(root, data)); err != nil || !fi.IsDir() {
		t.Errorf("no mount point for the read-only path in the image: %v", err)
	}
	if entries, _ := os.ReadDir(filepath.Join(root, data)); len(entries) != 0 {
		t.Errorf("the mount point in the image holds %v", entries)
	}
}
