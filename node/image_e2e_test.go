package node

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/image/imagetest"
	"github.com/deepmarket/deepmarket/node/jobs"
)

// TestJobsRunInTheirImage: a job names its environment, an OCI image
// layout directory, in its spec. The submitter adds it to storage with
// the bundle; the lender fetches it by CID over bitswap, checks its
// layers, unpacks it into its image cache and runs the worker in it: the
// worker runs the image's own shell, reads the image's files and does
// not see the lender's Python. A second job in the same image, a torch
// job, is run from the cache (the image is not unpacked again) and gets
// torchrun's contract.
func TestJobsRunInTheirImage(t *testing.T) {
	t.Parallel()
	py := jobPython(t)
	c := startJobClusterLending(t, py, 1, api.LendRequest{Cores: 1, MemBytes: 1 << 30})
	a, l := c.sub, c.lenders[0]
	bundle := t.TempDir()
	if err := os.WriteFile(filepath.Join(bundle, "README"), []byte("the job's files"), 0o644); err != nil {
		t.Fatal(err)
	}
	img := imagetest.Layout(t, imagetest.Shell(t, []string{"var/lib"}, map[string]string{"etc/image-marker": "from-the-image\n"}))
	run := func(name, framework string, want ...string) *jobs.Job {
		spec := jobs.File{Name: name, Framework: framework, Image: img, Bundle: bundle,
			Command: []string{"/bin/sh", "-c", `read m < /etc/image-marker; echo "marker=$m"; read r < README; echo "bundle=$r"
[ -e ` + py + ` ] || echo no-lender-python
echo "torch: rank $RANK of $WORLD_SIZE, local $LOCAL_RANK of $LOCAL_WORLD_SIZE, master $MASTER_ADDR:$MASTER_PORT"`},
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
		for _, want := range append([]string{"marker=from-the-image", "bundle=the job's files", "no-lender-python"}, want...) {
			if !strings.Contains(out, want) {
				t.Errorf("%s's log lacks %q:\n%s", name, want, out)
			}
		}
		return done
	}
	first := run("in-image", "generic", "torch: rank  of , local  of , master ")
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
	// The cache knows the image by its layout's CID: the next launch
	// naming it takes the root without fetching the layout.
	recs, _ := filepath.Glob(filepath.Join(l.exec.Dir(), "images", "*.json"))
	if len(recs) != 1 {
		t.Fatalf("the lender's image cache has %d records", len(recs))
	}
	if b, err := os.ReadFile(recs[0]); err != nil || !strings.Contains(string(b), first.ImageCID) {
		t.Errorf("the cache's record does not name the layout's CID %s: %s %v", first.ImageCID, b, err)
	}
	run("in-image-again", "torch", "torch: rank 0 of 1, local 0 of 1, master ")
	if after := roots(); len(after) != 1 || !os.SameFile(before[0], after[0]) {
		t.Errorf("the second job's image was unpacked again (%d images)", len(after))
	}
}
