// Package imagetest makes small real images for tests: the host's
// programs and the libraries they load, plus files of the test's own.
package imagetest

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Shell is an image of one layer holding the host's /bin/sh and the
// libraries it loads (regular files at their paths), the directories
// dirs (such as "var/lib") and files (path -> content).
func Shell(t testing.TB, dirs []string, files map[string]string) v1.Image {
	t.Helper()
	out, err := exec.Command("ldd", "/bin/sh").Output()
	if err != nil {
		t.Fatalf("ldd /bin/sh: %v", err)
	}
	host := map[string]string{"bin/sh": "/bin/sh"}
	for _, p := range regexp.MustCompile(`(/\S+\.so[.0-9]*)`).FindAllString(string(out), -1) {
		host[strings.TrimPrefix(p, "/")] = p
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(h tar.Header, body []byte) {
		h.Size = int64(len(body))
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(body); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range sortedKeys(host) {
		b, err := os.ReadFile(host[name])
		if err != nil {
			t.Fatal(err)
		}
		add(tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o755}, b)
	}
	for _, d := range dirs {
		add(tar.Header{Name: strings.TrimSuffix(d, "/") + "/", Typeflag: tar.TypeDir, Mode: 0o755}, nil)
	}
	for _, name := range sortedKeys(files) {
		add(tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644}, []byte(files[name]))
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return Image(t, LayerOf(t, buf.Bytes()))
}

// LayerOf is a layer of the tar archive data.
func LayerOf(t testing.TB, data []byte) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// Image is an image of layers, bottom first.
func Image(t testing.TB, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// Layout writes img as an OCI image layout directory in a temporary
// directory of t's and returns its path.
func Layout(t testing.TB, img v1.Image) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "oci")
	p, err := layout.Write(dir, empty.Index)
	if err == nil {
		err = p.AppendImage(img)
	}
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
