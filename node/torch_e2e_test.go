package node

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/jobs"
)

// torchImage is the PyTorch base image `make deps` builds
// (scripts/torch-image.sh: Debian's python3-torch), an OCI layout
// directory, and the wheelhouse beside it (setuptools). Without them the
// test skips, unless DM_REQUIRE_TF says the end-to-end tests must run.
func torchImage(t *testing.T) (dir, wheels string) {
	t.Helper()
	dir, wheels = os.Getenv("DM_TORCH_IMAGE"), os.Getenv("DM_WHEELHOUSE")
	if dir == "" {
		dir = "/var/cache/deepmarket/images/torch"
	}
	if wheels == "" {
		wheels = "/var/cache/deepmarket/wheels"
	}
	_, err := os.Stat(filepath.Join(dir, "index.json"))
	if err == nil {
		_, err = os.Stat(filepath.Join(wheels, "setuptools-80.9.0-py3-none-any.whl"))
	}
	if err != nil {
		if os.Getenv("DM_REQUIRE_TF") != "" {
			t.Fatalf("no PyTorch base image or wheelhouse (DM_TORCH_IMAGE, DM_WHEELHOUSE): %v: run `make deps`", err)
		}
		t.Skip("no PyTorch base image: run `make deps` (make test does)")
	}
	return dir, wheels
}

// TestTorchDDPAcrossTwoLenders: the PyTorch example, as a user runs it.
// `env build` makes its image on the submitter's node: the torch base
// plus the example's own project (its pyproject.toml), pip building it
// in the sandbox from an offline wheelhouse (setuptools' wheel).
// The job names the image by the name the build recorded; each lender
// fetches and unpacks it, and the two workers, one per machine, train
// with DistributedDataParallel over gloo. Rank 0's address is a tunnel
// to its machine, the workers' namespaces have nothing but loopback, so
// the all-reduce crossed the tunnels: both ranks end with the same
// weights, and the model reaches 0.8 test accuracy. A second job in the
// image runs on both machines from their caches: each fetched and
// unpacked the image once.
func TestTorchDDPAcrossTwoLenders(t *testing.T) {
	base, wheels := torchImage(t)
	example, err := filepath.Abs("../examples/torch-fashion-mnist")
	if err != nil {
		t.Fatal(err)
	}
	c := startJobClusterLending(t, genericPython(t), 2, api.LendRequest{Cores: 1, MemBytes: 2 << 30})
	a := c.sub
	start := time.Now()
	img, err := a.client.EnvBuild(t.Context(), api.EnvBuildRequest{Project: example, Base: base, Wheels: wheels, Name: "fmnist-torch"}, nil)
	if err != nil {
		t.Fatalf("env build of the example: %v", err)
	}
	t.Logf("env build: %s (%d layers, %d bytes) in %s", img.CID, img.Layers, img.Size, time.Since(start).Round(time.Second))
	b, err := os.ReadFile(filepath.Join(example, "job.toml"))
	if err != nil {
		t.Fatal(err)
	}
	spec, err := jobs.DecodeFile(b)
	if err != nil {
		t.Fatal(err)
	}
	spec.MaxDuration = "8m"
	j, err := a.client.Submit(t.Context(), api.SubmitRequest{Spec: spec, BaseDir: example, Yes: true})
	if err != nil {
		t.Fatal(err)
	}
	done := waitJob(t, a, j.ID, 8*time.Minute)
	out := jobLog(t, a, j.ID)
	if done.State != jobs.Succeeded {
		t.Fatalf("the torch job: %s %s\n%s", done.State, done.Reason, out)
	}
	if done.ImageCID != img.CID {
		t.Errorf("the job ran in %q, want the built image %s", done.ImageCID, img.CID)
	}
	ws := done.Current().Workers
	if len(ws) != 2 || ws[0].Machine == ws[1].Machine {
		t.Fatalf("the workers ran on %+v: want one on each lender", ws)
	}
	for _, want := range []string{"rank 0 of 2: joined", "rank 1 of 2: joined"} {
		if !strings.Contains(out, want) {
			t.Errorf("the log lacks %q:\n%s", want, out)
		}
	}
	digests := regexp.MustCompile(`rank (\d): weights sha256 ([0-9a-f]+)`).FindAllStringSubmatch(out, -1)
	if len(digests) != 2 || digests[0][2] != digests[1][2] {
		t.Errorf("the ranks' weights differ or were not reported: %q\n%s", digests, out)
	}
	m := regexp.MustCompile(`test accuracy ([0-9.]+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no test accuracy in the log:\n%s", out)
	}
	if acc, _ := strconv.ParseFloat(m[1], 64); acc < 0.8 {
		t.Errorf("test accuracy %.4f, want at least 0.8:\n%s", acc, out)
	}
	t.Logf("%s; build to trained model %s", m[0], time.Since(start).Round(time.Second))

	// A second job in the image: each lender runs it from its cache,
	// fetching nothing and unpacking nothing again.
	spec.Name, spec.Command = "torch-again", []string{"python3", "-c", "import torch, fmnist_torch; print('torch', torch.__version__)"}
	j, err = a.client.Submit(t.Context(), api.SubmitRequest{Spec: spec, BaseDir: example, Yes: true})
	if err != nil {
		t.Fatal(err)
	}
	again := waitJob(t, a, j.ID, 3*time.Minute)
	out = jobLog(t, a, j.ID)
	if again.State != jobs.Succeeded || strings.Count(out, "held here, nothing to fetch") != 2 || strings.Count(out, "torch 1.") != 2 {
		t.Errorf("the second job in the image: %s %s; want both workers run from their machine's cache\n%s", again.State, again.Reason, out)
	}
	for _, l := range c.lenders {
		if roots, _ := filepath.Glob(filepath.Join(l.exec.Dir(), "images", "*.rootfs")); len(roots) != 1 {
			t.Errorf("%s's image cache holds %d images, want the job's one", l.host.ID(), len(roots))
		}
	}
}
