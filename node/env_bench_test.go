package node

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/image"
	"github.com/deepmarket/deepmarket/node/image/imagetest"
	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/units"
)

// envFiller is the incompressible file that makes the bench's image the
// size of a small real environment.
const envFiller = 64 << 20

// BenchmarkEnv measures what a job's own image costs its start, on one
// lender of one core (in-process nodes on this machine): from submission
// to its worker running, a one-worker job without an image, the same job
// in an image the lender does not hold (cold: fetched over bitswap,
// checked, unpacked into the cache) and then in the same image again
// (warm: taken from the cache by its CID, nothing fetched). The image is
// added once beforehand, as `env add` does. Then the unpack of the image
// against tar -x of its layer. DM_BENCH_OUT names a JSON file for the
// results.
func BenchmarkEnv(b *testing.B) {
	py := genericPython(b)
	c := startJobClusterLending(b, py, 1, api.LendRequest{Cores: 1, MemBytes: 1 << 30})
	filler := make([]byte, envFiller)
	rand.Read(filler)
	img := imagetest.Shell(b, []string{"var/lib"}, map[string]string{"opt/filler": string(filler)})
	layout := imagetest.Layout(b, img)
	pin, err := c.sub.blocks.Add(context.Background(), layout, nil)
	if err != nil {
		b.Fatal(err)
	}
	bundle := b.TempDir()
	if err := os.WriteFile(filepath.Join(bundle, "job.py"), nil, 0o644); err != nil {
		b.Fatal(err)
	}
	start := func(name, image string) time.Duration {
		spec := jobs.File{Name: name, Framework: "generic", Bundle: bundle, Command: []string{"python3", "job.py"},
			Workers: 1, Cores: 1, Memory: "256MiB", MaxPrice: "5", MaxDuration: "10m"}
		if image != "" {
			spec.Image, spec.Command = image, []string{"/bin/sh", "-c", "true"}
		}
		t0 := time.Now()
		j, err := c.sub.client.Submit(context.Background(), api.SubmitRequest{Spec: spec, Yes: true})
		if err != nil {
			b.Fatal(err)
		}
		done := waitJob(b, c.sub, j.ID, 5*time.Minute)
		if done.State != jobs.Succeeded {
			b.Fatalf("%s: %s %s\n%s", name, done.State, done.Reason, jobLog(b, c.sub, j.ID))
		}
		return done.Runs[0].Workers[0].Started.Sub(t0)
	}
	start("warm-up", "") // the cluster's first job pays for its first connections
	none := start("no-image", "")
	cold := start("cold", pin.CID.String())
	warm := start("warm", pin.CID.String())
	none2 := start("no-image-again", "")
	base := (none + none2) / 2

	// The unpack against tar -x of the same layer, gzipped as it travels.
	layers, _ := img.Layers()
	blob, _ := layers[0].Digest()
	dest := b.TempDir()
	t0 := time.Now()
	if _, err := image.Unpack(img, filepath.Join(dest, "unpacked"), image.DefaultLimits); err != nil {
		b.Fatal(err)
	}
	unpack := time.Since(t0)
	tarDir := filepath.Join(dest, "tar")
	os.MkdirAll(tarDir, 0o755)
	t0 = time.Now()
	if out, err := exec.Command("tar", "-xzf", filepath.Join(layout, "blobs", blob.Algorithm, blob.Hex), "-C", tarDir).CombinedOutput(); err != nil {
		b.Fatalf("tar -x: %v\n%s", err, out)
	}
	untar := time.Since(t0)

	size, _ := layers[0].Size()
	fmt.Printf("\none generic job of one worker, submission to its worker running, one lender of one core (in-process nodes on this machine, %d CPUs)\n", runtime.NumCPU())
	fmt.Printf("  without an image:          %6.2fs (mean of two: %.2fs, %.2fs)\n", base.Seconds(), none.Seconds(), none2.Seconds())
	fmt.Printf("  image of %s, cold:   %6.2fs (%+.2fs)\n", units.FormatSize(uint64(pin.Size)), cold.Seconds(), (cold - base).Seconds())
	fmt.Printf("  the same image, warm:      %6.2fs (%+.2fs; goal: within 0.2 s of no image)\n", warm.Seconds(), (warm - base).Seconds())
	fmt.Printf("unpacking the image (a layer of %s gzipped): %.2fs; tar -xzf of its layer: %.2fs; %.2fx (goal: at most 1.5x)\n",
		units.FormatSize(uint64(size)), unpack.Seconds(), untar.Seconds(), unpack.Seconds()/untar.Seconds())
	if out := os.Getenv("DM_BENCH_OUT"); out != "" {
		doc := map[string]any{"date": time.Now().UTC().Format(time.RFC3339), "cpus": runtime.NumCPU(), "image_bytes": pin.Size,
			"start_s":           map[string]float64{"none": base.Seconds(), "cold": cold.Seconds(), "warm": warm.Seconds()},
			"warm_minus_none_s": (warm - base).Seconds(), "unpack_s": unpack.Seconds(), "tar_x_s": untar.Seconds(),
			"unpack_vs_tar": unpack.Seconds() / untar.Seconds()}
		data, _ := json.MarshalIndent(doc, "", "  ")
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			b.Error(err)
		}
		if err := os.WriteFile(out, append(data, '\n'), 0o644); err != nil {
			b.Error(err)
		}
	}
}
