package node

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/image/imagetest"
	"github.com/deepmarket/deepmarket/node/inventory"
	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/p2p"
)

// TestJobsRunInTheirImage: a job names its environment, an OCI image
// layout directory, in its spec. The submitter adds it to storage with
// the bundle; the lender fetches it by CID over bitswap, checks its
// layers, unpacks it into its image cache and runs the worker in it (the
// worker's log says how long the fetch and the unpack took): the worker
// runs the image's own shell, reads the image's files and does
// not see the lender's Python. Its machine's offer then lists the image.
// A second job in the same image, a torch job, goes to that machine,
// though it now asks 0.5% more than the other one (its quote says the
// machine is warm: no fetch), is run from the cache (the image is not
// unpacked again) and gets torchrun's contract.
func TestJobsRunInTheirImage(t *testing.T) {
	t.Parallel()
	py := jobPython(t)
	// Prices above the scheduler's base, so that each machine's is what
	// its workers cost.
	price := p2p.Prices{CoreHour: 10_000_000, MemGiBHour: 1_000_000}
	c := startJobClusterLending(t, py, 2, api.LendRequest{Cores: 1, MemBytes: 1 << 30, Price: &price})
	a := c.sub
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
			Workers: 1, Cores: 1, Memory: "256MiB", MaxPrice: "5", MaxDuration: "2m"}
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
	first := run("in-image", "generic", "torch: rank  of , local  of , master ", "checked and unpacked in")
	if first.ImageCID == "" || first.ImageBytes <= 0 {
		t.Fatalf("the job does not name its image's CID and size: %+v", first)
	}
	l := c.lenders[0]
	if first.Current().Workers[0].Machine != l.host.ID().String() {
		l = c.lenders[1]
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
	// The warm machine asks a little more: a job in the image still goes
	// there (a setup of a second or more is worth more than 0.5% of a
	// two-minute job), once every scheduler's book says so.
	dearer := p2p.Prices{CoreHour: price.CoreHour * 1005 / 1000, MemGiBHour: price.MemGiBHour * 1005 / 1000}
	if _, err := l.client.SetLend(t.Context(), api.LendRequest{Cores: 1, MemBytes: 1 << 30, Price: &dearer}); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "every book has the warm machine's new offer, free", func() bool {
		for _, n := range append([]*testNode{a}, c.lenders...) {
			offers, err := n.client.Offers(t.Context())
			if err != nil {
				return false
			}
			if !slices.ContainsFunc(offers, func(o api.Offer) bool {
				return o.Machine == l.host.ID().String() && o.Prices == dearer && slices.Contains(o.Images, first.ImageCID) &&
					o.Allocated.Cores == 0
			}) {
				return false
			}
		}
		return true
	})
	// Its offer says what is free where its workers and images go (the
	// work area, in /var/tmp), not in its home (a tmpfs under make test).
	offers, err := a.client.Offers(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range offers {
		if free := inventory.DiskFree(l.exec.Dir()); o.Machine == l.host.ID().String() && (o.DiskBytes > free+1<<30 || o.DiskBytes+1<<30 < free) {
			t.Errorf("the offer says %d bytes of disk, the work area has %d free", o.DiskBytes, free)
		}
	}
	second := run("in-image-again", "torch", "torch: rank 0 of 1, local 0 of 1, master ", "held here, nothing to fetch")
	if w := second.Current().Workers[0]; w.Machine != l.host.ID().String() {
		t.Errorf("the second job in the image ran on %s, not on the machine that holds it (%s)", w.Machine, l.host.ID())
	}
	if log := jobLog(t, a, second.ID); !strings.Contains(log, "1 of 1 machines already hold the image") {
		t.Errorf("the second job's log does not say its machine holds the image:\n%s", log)
	}
	if after := roots(); len(after) != 1 || !os.SameFile(before[0], after[0]) {
		t.Errorf("the second job's image was unpacked again (%d images)", len(after))
	}
}
