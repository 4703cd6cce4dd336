// Package imagetest makes small real images for tests: the host's
// programs and the libraries they load, plus files of the test's own.
package imagetest

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
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
	return Image(t, hostLayer(t, host, dirs, files))
}

// hostLayer is a layer of the host's files (path in the layer -> path
// here, executable), the directories dirs and files (path -> content).
func hostLayer(t testing.TB, host map[string]string, dirs []string, files map[string]string) v1.Layer {
	t.Helper()
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
	return LayerOf(t, buf.Bytes())
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

// Python is an image of one layer holding the host's python3 (the
// interpreter, the libraries it loads and its standard library, less its
// tests) as /usr/bin/python3, the host's /bin/sh, and files (path ->
// content). It is small (about 40 MB) and runs the host's Python version.
func Python(t testing.TB, files map[string]string) v1.Image {
	t.Helper()
	return python(t, files, nil)
}

// PythonFor is Python with the host's libraries that the shared objects
// under dirs load (a virtualenv's site-packages: TensorFlow's need
// libstdc++), for packing those dirs onto it.
func PythonFor(t testing.TB, dirs ...string) v1.Image {
	t.Helper()
	var objs []string
	for _, d := range dirs {
		filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
			if err == nil && e.Type().IsRegular() && strings.Contains(e.Name(), ".so") {
				objs = append(objs, p)
			}
			return nil
		})
	}
	return python(t, nil, objs)
}

func python(t testing.TB, files map[string]string, objs []string) v1.Image {
	t.Helper()
	exe, err := filepath.EvalSymlinks("/usr/bin/python3")
	if err != nil {
		t.Fatalf("the host's python3: %v", err)
	}
	stdlib := filepath.Join("/usr/lib", filepath.Base(exe)) // /usr/lib/python3.11
	host := map[string]string{"usr/bin/python3": exe, "bin/sh": "/bin/sh"}
	lib := regexp.MustCompile(`=> (/\S+\.so[.0-9]*)`)
	dynload, _ := filepath.Glob(filepath.Join(stdlib, "lib-dynload", "*.so")) // _ctypes needs libffi
	for _, bin := range append(append([]string{exe, "/bin/sh"}, dynload...), objs...) {
		out, _ := exec.Command("ldd", bin).Output() // not every .so file is an object
		for _, m := range lib.FindAllStringSubmatch(string(out), -1) {
			if !slices.ContainsFunc(objs, func(o string) bool { return filepath.Dir(o) == filepath.Dir(m[1]) }) && !strings.Contains(m[1], "site-packages") {
				host[strings.TrimPrefix(m[1], "/")] = m[1]
			}
		}
		if bin == exe || bin == "/bin/sh" {
			for _, p := range regexp.MustCompile(`(/lib64/\S+\.so[.0-9]*)`).FindAllString(string(out), -1) {
				host[strings.TrimPrefix(p, "/")] = p // the loader
			}
		}
	}
	skip := map[string]bool{"test": true, "idlelib": true, "tkinter": true, "ensurepip": true, "lib2to3": true, "__pycache__": true, "turtledemo": true}
	err = filepath.WalkDir(stdlib, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && skip[d.Name()] {
			return filepath.SkipDir
		}
		if d.Type().IsRegular() {
			host[strings.TrimPrefix(p, "/")] = p
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return Image(t, hostLayer(t, host, nil, files))
}

// Wheel writes a pure-Python wheel of package name at version, whose
// module holds code, requiring requires, into dir.
func Wheel(t testing.TB, dir, name, version, code string, requires ...string) {
	t.Helper()
	info := fmt.Sprintf("%s-%s.dist-info", name, version)
	meta := fmt.Sprintf("Metadata-Version: 2.1\nName: %s\nVersion: %s\n", name, version)
	for _, r := range requires {
		meta += "Requires-Dist: " + r + "\n"
	}
	files := [][2]string{
		{name + "/__init__.py", code},
		{info + "/METADATA", meta},
		{info + "/WHEEL", "Wheel-Version: 1.0\nGenerator: deepmarket-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	var record strings.Builder
	for _, f := range files {
		w, _ := zw.Create(f[0])
		w.Write([]byte(f[1]))
		sum := sha256.Sum256([]byte(f[1]))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f[0], base64.RawURLEncoding.EncodeToString(sum[:]), len(f[1]))
	}
	fmt.Fprintf(&record, "%s/RECORD,,\n", info)
	w, _ := zw.Create(info + "/RECORD")
	w.Write([]byte(record.String()))
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-%s-py3-none-any.whl", name, version)), buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}
