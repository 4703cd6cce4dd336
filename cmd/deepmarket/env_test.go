package main

import (
	"encoding/json"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/image/imagetest"
	"github.com/deepmarket/deepmarket/node/jobs"
)

// TestEnvAddCLI: one image, as a docker-save tarball and as an OCI
// layout directory, is added with the same CID and manifest digest, and
// the node holds it; a file that is no image, and an image with a
// tampered layer, are refused and add nothing.
func TestEnvAddCLI(t *testing.T) {
	home := initHome(t)
	startNodeProcess(t, home)
	img, err := random.Image(4096, 2)
	if err != nil {
		t.Fatal(err)
	}
	digest, _ := img.Digest()
	dir := imagetest.Layout(t, img)
	tarPath := filepath.Join(t.TempDir(), "train.tar")
	ref, _ := name.ParseReference("lab/train:1")
	if err := tarball.WriteToFile(tarPath, ref, img); err != nil {
		t.Fatal(err)
	}
	var fromTar, fromLayout envAdded
	if err := json.Unmarshal([]byte(mustRun(t, "env", "add", tarPath, "--json", "--home", home)), &fromTar); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(mustRun(t, "env", "add", dir, "--json", "--home", home)), &fromLayout); err != nil {
		t.Fatal(err)
	}
	if fromTar.CID == "" || fromTar != fromLayout || fromTar.Digest != digest.String() || fromTar.Layers != 2 {
		t.Errorf("env add: from the tarball %+v, from the layout %+v; want one CID, digest %s, 2 layers", fromTar, fromLayout, digest)
	}
	if out := mustRun(t, "data", "ls", "--home", home); !strings.Contains(out, fromTar.CID) {
		t.Errorf("the node does not hold the image:\n%s", out)
	}

	junk := filepath.Join(t.TempDir(), "junk.tar")
	os.WriteFile(junk, []byte("not an image"), 0o644)
	expectFail(t, 2, "not a docker or podman save tarball", "env", "add", junk, "--home", home)
	layers, _ := img.Layers()
	d, _ := layers[0].Digest()
	blob := filepath.Join(dir, "blobs", d.Algorithm, d.Hex)
	b, _ := os.ReadFile(blob)
	b[len(b)/2] ^= 0xff
	os.WriteFile(blob, b, 0o644)
	expectFail(t, 1, d.String(), "env", "add", dir, "--home", home)
	if out := mustRun(t, "data", "ls", "--home", home); strings.Count(out, "bafy") != 1 {
		t.Errorf("a refused image was added:\n%s", out)
	}

	// Names: a job names the image as env add recorded it.
	var named envAdded
	if err := json.Unmarshal([]byte(mustRun(t, "env", "add", tarPath, "--name", "train", "--json", "--home", home)), &named); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "env", "add", tarPath, "--name", "train-copy", "--home", home)
	expectFail(t, 2, "image name", "env", "add", tarPath, "--name", "lab/train", "--home", home)
	var listed []api.EnvImage
	if err := json.Unmarshal([]byte(mustRun(t, "env", "ls", "--json", "--home", home)), &listed); err != nil {
		t.Fatal(err)
	}
	if named.CID != fromTar.CID || len(listed) != 2 || listed[0].Name != "train-copy" || listed[1].Name != "train" || listed[1].CID != fromTar.CID {
		t.Errorf("env ls after naming the image twice: %+v (added %+v)", listed, named)
	}
	if out := mustRun(t, "env", "show", "train", "--home", home); !strings.Contains(out, fromTar.CID) || !strings.Contains(out, digest.String()) {
		t.Errorf("env show train:\n%s", out)
	}
	expectFail(t, 1, "no image", "env", "show", "nope", "--home", home)

	bundle := t.TempDir()
	os.WriteFile(filepath.Join(bundle, "job.py"), []byte("print('hi')\n"), 0o644)
	spec := func(image string) string {
		p := filepath.Join(bundle, "job.toml")
		os.WriteFile(p, []byte(`name = "in-image"
framework = "generic"
image = "`+image+`"
command = ["/bin/sh", "-c", "true"]
bundle = "."
workers = 1
cores = 1
memory = "128MiB"
max_price = "1"
max_duration = "1m"
max_wait = "1s"
`), 0o644)
		return p
	}
	expectFail(t, 2, "no such directory, CID or image name", "submit", spec("nope"), "--yes", "--home", home)
	// A layout with a tampered layer, named by path: the submitting node
	// checks it before it bids, and the job fails naming the layer.
	expectFail(t, 1, d.String(), "submit", spec(dir), "--yes", "--home", home)
	// No machine lends here: the job fails its wait, with the named
	// image's CID (the node resolves the name too, for API clients).
	var sub struct {
		ID string `json:"job_id"`
	}
	if err := json.Unmarshal([]byte(run(t, "submit", spec("train"), "--yes", "--json", "--home", home).stdout), &sub); err != nil || sub.ID == "" {
		t.Fatalf("submit with a named image: %+v %v", sub, err)
	}
	if out := mustRun(t, "jobs", "show", sub.ID, "--home", home); !strings.Contains(out, "image "+fromTar.CID) {
		t.Errorf("jobs show of a job in the named image:\n%s", out)
	}
	// An API client's spec names it too: the node resolves the name.
	cl, err := (&cli{homeDir: home}).client()
	if err != nil {
		t.Fatal(err)
	}
	f, err := jobs.DecodeFile(must(os.ReadFile(spec("train-copy"))))
	if err != nil {
		t.Fatal(err)
	}
	if j, err := cl.Submit(t.Context(), api.SubmitRequest{Spec: f, BaseDir: bundle, Yes: true}); err != nil {
		t.Errorf("a job naming its image through the API: %v", err)
	} else if j.ImageCID != fromTar.CID {
		t.Errorf("a job naming its image through the API runs in %q, want %s", j.ImageCID, fromTar.CID)
	}

	// rm: a name goes; the image stays pinned while another name records
	// it, and is unpinned with the last.
	mustRun(t, "env", "rm", "train", "--home", home)
	if out := mustRun(t, "data", "ls", "--home", home); !strings.Contains(out, fromTar.CID) {
		t.Errorf("the image was unpinned while another name records it:\n%s", out)
	}
	mustRun(t, "env", "rm", fromTar.CID, "--home", home)
	if out := mustRun(t, "data", "ls", "--home", home); strings.Contains(out, fromTar.CID) {
		t.Errorf("the image is still pinned after its last name went:\n%s", out)
	}
	if out := mustRun(t, "env", "ls", "--home", home); !strings.Contains(out, "no images") {
		t.Errorf("env ls after rm:\n%s", out)
	}
}

// TestEnvAddPullsFromARegistry: an image pushed to a real registry (go-
// containerregistry's, over HTTP on loopback) is pulled by its reference
// and added, with the CID the same image gets from a tarball; a reference
// the registry does not have fails, naming it; a bare name that is no
// file is refused, not looked for on Docker Hub.
func TestEnvAddPullsFromARegistry(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	img, err := random.Image(4096, 2)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(host + "/lab/train:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	tarPath := filepath.Join(t.TempDir(), "train.tar")
	if err := tarball.WriteToFile(tarPath, ref, img); err != nil {
		t.Fatal(err)
	}
	home := initHome(t)
	startNodeProcess(t, home)
	var pulled, fromTar envAdded
	if err := json.Unmarshal([]byte(mustRun(t, "env", "add", host+"/lab/train:1", "--name", "train", "--json", "--home", home)), &pulled); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(mustRun(t, "env", "add", tarPath, "--json", "--home", home)), &fromTar); err != nil {
		t.Fatal(err)
	}
	digest, _ := img.Digest()
	if pulled.CID == "" || pulled.CID != fromTar.CID || pulled.Digest != digest.String() || pulled.Layers != 2 || pulled.Name != "train" {
		t.Errorf("pulled %+v; from the tarball %+v; want one CID, digest %s", pulled, fromTar, digest)
	}
	expectFail(t, 1, "lab/missing", "env", "add", host+"/lab/missing:1", "--home", home)
	expectFail(t, 2, "no such file", "env", "add", "lab/train:1", "--home", home)
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
