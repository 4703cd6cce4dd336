package node

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
	"time"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/jobs"
)

// shellLayout writes an OCI image layout of a tiny image: the host's
// /bin/sh and the libraries it loads, a /var, and /etc/image-marker.
func shellLayout(t *testing.T) string {
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
	dir := filepath.Join(t.TempDir(), "image")
	p, err := layout.Write(dir, empty.Index)
	if err == nil {
		err = p.AppendImage(img)
	}
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestJobsRunInTheirImage: a job names its environment, an OCI image
// layout directory, in its spec. The submitter adds it to storage with
// the bundle; the lender fetches it by CID over bitswap, checks its
// layers, unpacks it into its image cache and runs the worker in it: the
// worker runs the image's own shell, reads the image's files and does
// not see the lender's Python. A second job in the same image is run from
// the cache: the image is not unpacked again.
func TestJobsRunInTheirImage(t *testing.T) {
	t.Parallel()
	py := jobPython(t)
	c := startJobClusterLending(t, py, 1, api.LendRequest{Cores: 1, MemBytes: 1 << 30})
	a, l := c.sub, c.lenders[0]
	bundle := t.TempDir()
	if err := os.WriteFile(filepath.Join(bundle, "README"), []byte("the job's files"), 0o644); err != nil {
		t.Fatal(err)
	}
	img := shellLayout(t)
	run := func(name string) *jobs.Job {
		spec := jobs.File{Name: name, Framework: "generic", Image: img, Bundle: bundle,
			Command: []string{"/bin/sh", "-c", `read m < /etc/image-marker; echo "marker=$m"; read r < README; echo "bundle=$r"
[ -e ` + py + ` ] || echo no-lender-python`},
			Workers: 1, Cores: 1, Memory: "256MiB", MaxPrice: "5", MaxDuration: "10m"}
		j, err := a.client.Submit(t.Context(), api.SubmitRequest{Spec: spec, Yes: true})
		if err != nil {
			t.Fatal(err)
		}
		done := waitJob(t, a, j.ID, 4*time.Minute)
		out := jobLog(t, a, j.ID)
		if done.State != jobs.Succeeded {
			t.Fatalf("%s: %s %s\n%s", name, done.State, done.Reason, out)
		}
		for _, want := range []string{"marker=from-the-image", "bundle=the job's files", "no-lender-python"} {
			if !strings.Contains(out, want) {
				t.Errorf("%s's log lacks %q:\n%s", name, want, out)
			}
		}
		return done
	}
	first := run("in-image")
	if first.ImageCID == "" {
		t.Errorf("the job does not name its image's CID: %+v", first)
	}
	roots := func() []os.FileInfo {
		dirs, _ := filepath.Glob(filepath.Join(l.exec.Dir(), "images", "*.rootfs"))
		var fis []os.FileInfo
		for _, d := range dirs {
			if fi, err := os.Stat(filepath.Join(d, "etc/image-marker")); err == nil {
				fis = append(fis, fi)
			}
		}
		return fis
	}
	before := roots()
	if len(before) != 1 {
		t.Fatalf("the lender's image cache holds %d images, want the job's", len(before))
	}
	run("in-image-again")
	if after := roots(); len(after) != 1 || !os.SameFile(before[0], after[0]) {
		t.Errorf("the second job's image was unpacked again (%d images)", len(after))
	}
}
