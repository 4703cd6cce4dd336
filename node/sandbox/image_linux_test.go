package sandbox

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deepmarket/deepmarket/node/image"
	"github.com/deepmarket/deepmarket/node/image/imagetest"
)

// shellImage unpacks, under base, an image holding the host's /bin/sh and
// the libraries it loads, a /var without tmp, base's top directory
// (empty), and /etc/image-marker; it returns the image's root.
func shellImage(t *testing.T, base string) string {
	t.Helper()
	top, _, _ := strings.Cut(strings.TrimPrefix(base, "/"), "/")
	img := imagetest.Shell(t, []string{"var/lib", top}, map[string]string{"etc/image-marker": "from-the-image\n"})
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

// TestGPUJobInAnImageGetsTheDriver: a job with a GPU in an image gets the
// host's driver (here a stand-in library and nvidia-smi, as no GPU is
// here) read-only under /usr/local/nvidia, on its LD_LIBRARY_PATH and
// PATH, as nvidia-container-toolkit gives a container; a job without a
// GPU in the same image gets none of it.
func TestGPUJobInAnImageGetsTheDriver(t *testing.T) {
	needRoot(t)
	base := readOnlyBase(t)
	root := shellImage(t, base)
	host := filepath.Join(base, "host-driver")
	os.MkdirAll(host, 0o755)
	lib, smi := filepath.Join(host, "libcuda.so.1"), filepath.Join(host, "nvidia-smi")
	if err := os.WriteFile(lib, []byte("the host's libcuda\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(smi, []byte("#!/bin/sh\necho 'GPU 0: the host driver'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	saved := driverFiles
	driverFiles = func() ([]string, []string) { return []string{lib}, []string{smi} }
	t.Cleanup(func() { driverFiles = saved })
	script := `read l < /usr/local/nvidia/lib64/libcuda.so.1 && echo "lib=$l"
nvidia-smi
echo "ld=$LD_LIBRARY_PATH"
(echo x > /usr/local/nvidia/lib64/libcuda.so.1) 2>/dev/null || echo driver-read-only
[ -e /usr/local/nvidia ] || echo no-driver`
	var out bytes.Buffer
	s := spec(t, &out, "/bin/sh", "-c", script)
	s.Root, s.Limits.GPUs = root, []int{0}
	s.Env = []string{"LD_LIBRARY_PATH=/opt/image-libs"}
	if e := run(t, s); e.Code != 0 {
		t.Fatalf("the GPU job: %+v\n%s", e, out.String())
	}
	got := out.String()
	for _, want := range []string{"lib=the host's libcuda", "GPU 0: the host driver", "ld=/usr/local/nvidia/lib64:/opt/image-libs", "driver-read-only"} {
		if !strings.Contains(got, want) {
			t.Errorf("the GPU job in its image printed %q; want %q in it", got, want)
		}
	}
	if b, _ := os.ReadFile(lib); string(b) != "the host's libcuda\n" {
		t.Errorf("the host's library became %q", b)
	}
	out.Reset()
	s = spec(t, &out, "/bin/sh", "-c", script)
	s.Root = root
	run(t, s)
	if got := out.String(); !strings.Contains(got, "no-driver") || strings.Contains(got, "host driver") {
		t.Errorf("a job without a GPU in the image printed %q; want no driver", got)
	}
}
