package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/deepmarket/deepmarket/node/image/imagetest"
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
}
