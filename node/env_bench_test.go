package node

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
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
// against tar -x of its layer, and the cold job's fetch (as its worker's
// log times it) against the other lender's plain bitswap fetch of the same
// layout (`data get`), on a second node that lends nothing. Last, the
// TensorFlow example's training rate (examples/s of its epochs after the
// first) in the lender's virtualenv and in an image of that virtualenv
// (`env pack` onto the host's python3), two runs of each in turn.
// DM_BENCH_OUT names a JSON file for the results.
func BenchmarkEnv(b *testing.B) {
	py := jobPython(b)
	c := startJobClusterLending(b, py, 2, api.LendRequest{Cores: 1, MemBytes: 2 << 30})
	// The second machine lends nothing: the jobs start on the first, and
	// the second fetches the image plainly at the end.
	other := c.lenders[1]
	if _, err := other.client.StopLend(context.Background()); err != nil {
		b.Fatal(err)
	}
	eventually(b, time.Minute, "the second machine's withdrawal", func() bool {
		return !slices.ContainsFunc(c.sub.Offers(), func(o api.Offer) bool { return o.Machine == other.host.ID().String() })
	})
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
	var coldJob *jobs.Job
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
		if name == "cold" {
			coldJob = done
		}
		return done.Runs[0].Workers[0].Started.Sub(t0)
	}
	start("warm-up", "") // the cluster's first job pays for its first connections
	// Starts vary by a few tenths of a second (the schedulers race for
	// the machine's hold): the medians of three, taken in turn.
	var nones, warms []time.Duration
	nones = append(nones, start("no-image", ""))
	cold := start("cold", pin.CID.String())
	for i := range 3 {
		warms = append(warms, start(fmt.Sprint("warm-", i), pin.CID.String()))
		if i < 2 {
			nones = append(nones, start(fmt.Sprint("no-image-", i), ""))
		}
	}
	median := func(ds []time.Duration) time.Duration {
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	base, warm := median(slices.Clone(nones)), median(slices.Clone(warms))

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

	// The cold fetch, as the lender's note in its worker's log times it,
	// against the other lender's plain fetch of the same layout.
	m := regexp.MustCompile(`fetched \S+ \S+ in (\S+), checked`).FindStringSubmatch(jobLog(b, c.sub, coldJob.ID))
	if m == nil {
		b.Fatalf("the cold job's log does not time its fetch:\n%s", jobLog(b, c.sub, coldJob.ID))
	}
	fetch, err := time.ParseDuration(m[1])
	if err != nil {
		b.Fatal(err)
	}
	t0 = time.Now()
	if _, err := other.client.DataGet(context.Background(), pin.CID.String(), filepath.Join(b.TempDir(), "layout"), nil); err != nil {
		b.Fatal(err)
	}
	raw := time.Since(t0)

	venvRate, imageRate := trainingRates(b, c, py)

	size, _ := layers[0].Size()
	fmt.Printf("\none generic job of one worker, submission to its worker running, one lender of one core (in-process nodes on this machine, %d CPUs)\n", runtime.NumCPU())
	fmt.Printf("  without an image:          %6.2fs (median of %s)\n", base.Seconds(), seconds(nones))
	fmt.Printf("  image of %s, cold:   %6.2fs (%+.2fs)\n", units.FormatSize(uint64(pin.Size)), cold.Seconds(), (cold - base).Seconds())
	fmt.Printf("  the same image, warm:      %6.2fs (%+.2fs; goal: within 0.2 s of no image; median of %s)\n", warm.Seconds(), (warm - base).Seconds(), seconds(warms))
	fmt.Printf("fetching it cold: %.2fs (the worker's log); another node's data get of the same layout: %.2fs; %.2fx the raw rate (goal: at least 0.8x)\n",
		fetch.Seconds(), raw.Seconds(), raw.Seconds()/fetch.Seconds())
	fmt.Printf("unpacking the image (a layer of %s gzipped): %.2fs; tar -xzf of its layer: %.2fs; %.2fx (goal: at most 1.5x)\n",
		units.FormatSize(uint64(size)), unpack.Seconds(), untar.Seconds(), unpack.Seconds()/untar.Seconds())
	fmt.Printf("the TensorFlow example on one worker of one core: %.0f examples/s in the lender's virtualenv, %.0f in an image of it; %+.1f%% (goal: within 3%%)\n",
		venvRate, imageRate, 100*(imageRate/venvRate-1))
	if out := os.Getenv("DM_BENCH_OUT"); out != "" {
		doc := map[string]any{"date": time.Now().UTC().Format(time.RFC3339), "cpus": runtime.NumCPU(), "image_bytes": pin.Size,
			"start_s":           map[string]float64{"none": base.Seconds(), "cold": cold.Seconds(), "warm": warm.Seconds()},
			"warm_minus_none_s": (warm - base).Seconds(), "unpack_s": unpack.Seconds(), "tar_x_s": untar.Seconds(),
			"unpack_vs_tar": unpack.Seconds() / untar.Seconds(), "fetch_s": fetch.Seconds(), "data_get_s": raw.Seconds(),
			"fetch_vs_raw_rate": raw.Seconds() / fetch.Seconds(),
			"examples_per_s":    map[string]float64{"venv": venvRate, "image": imageRate}, "image_vs_venv_rate": imageRate / venvRate}
		data, _ := json.MarshalIndent(doc, "", "  ")
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			b.Error(err)
		}
		if err := os.WriteFile(out, append(data, '\n'), 0o644); err != nil {
			b.Error(err)
		}
	}
}

// seconds lists ds as "0.61s, 0.83s, 0.63s".
func seconds(ds []time.Duration) string {
	var out []string
	for _, d := range ds {
		out = append(out, fmt.Sprintf("%.2fs", d.Seconds()))
	}
	return strings.Join(out, ", ")
}

// trainingRates runs the TensorFlow example, one worker for 4 epochs of
// 100 steps, in the lender's virtualenv and in an image of it, twice
// each in turn, and returns the medians of their epochs' examples/s
// after the first (which pays for tracing).
func trainingRates(b *testing.B, c *jobCluster, py string) (venv, img float64) {
	venvDir := filepath.Dir(filepath.Dir(py))
	sites, _ := filepath.Glob(filepath.Join(venvDir, "lib", "python3*", "site-packages"))
	base := imagetest.Layout(b, imagetest.PythonFor(b, sites...))
	packed, err := c.sub.client.EnvBuild(context.Background(), api.EnvBuildRequest{Venv: venvDir, Base: base}, nil)
	if err != nil {
		b.Fatal(err)
	}
	bundle, _ := filepath.Abs("../examples/fashion-mnist")
	epoch := regexp.MustCompile(`epoch (\d+)/\d+: .* ([0-9.]+) examples/s`)
	rates := map[string][]float64{}
	for i := range 4 {
		which := [2]string{"venv", "image"}[i%2]
		spec := jobs.File{Name: "rate-" + which, Framework: "tensorflow", Bundle: bundle, Dataset: "/usr/share/datasets/fashion-mnist",
			Command: []string{"python3", "train.py", "--epochs", "4", "--steps-per-epoch", "100"},
			Workers: 1, Cores: 1, Memory: "2GiB", MaxPrice: "5", MaxDuration: "15m"}
		if which == "image" {
			spec.Image = packed.CID
		}
		j, err := c.sub.client.Submit(context.Background(), api.SubmitRequest{Spec: spec, Yes: true})
		if err != nil {
			b.Fatal(err)
		}
		done := waitJob(b, c.sub, j.ID, 10*time.Minute)
		log := jobLog(b, c.sub, j.ID)
		if done.State != jobs.Succeeded {
			b.Fatalf("%s: %s %s\n%s", spec.Name, done.State, done.Reason, log)
		}
		for _, m := range epoch.FindAllStringSubmatch(log, -1) {
			if m[1] != "1" {
				var r float64
				fmt.Sscan(m[2], &r)
				rates[which] = append(rates[which], r)
			}
		}
	}
	med := func(xs []float64) float64 {
		if len(xs) == 0 {
			b.Fatal("no epoch rates in the jobs' logs")
		}
		slices.Sort(xs)
		return xs[len(xs)/2]
	}
	return med(rates["venv"]), med(rates["image"])
}
