package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deepmarket/deepmarket/node/image"
	"github.com/deepmarket/deepmarket/node/image/imagetest"
	"github.com/deepmarket/deepmarket/node/sandbox/sandboxtest"
)

// TestEnvBuildCLI: `env build` installs a project's requirements from an
// offline wheelhouse onto a base image (a layout directory, then an
// image added here by name), in the node's sandbox, and adds and names
// the result; the image's config puts what pip installed on its
// PYTHONPATH. A build without --base, or one whose requirement the
// wheelhouse lacks, fails saying so and adds nothing.
func TestEnvBuildCLI(t *testing.T) {
	sandboxtest.Need(t)
	home := initHome(t)
	startNodeProcess(t, home)
	base := imagetest.Layout(t, imagetest.Python(t, nil))
	wheels := t.TempDir()
	imagetest.Wheel(t, wheels, "dmhello", "1.0", "import dmdep\ndef hello():\n    return 'hello, ' + dmdep.WHO\n", "dmdep>=2")
	imagetest.Wheel(t, wheels, "dmdep", "2.0", "WHO = 'wheelhouse'\n")
	imagetest.Wheel(t, wheels, "dmextra", "0.1", "X = 1\n")
	project := t.TempDir()
	os.WriteFile(filepath.Join(project, "requirements.txt"), []byte("dmhello==1.0\n"), 0o644)

	r := run(t, "env", "build", project, "--base", base, "--wheels", wheels, "--name", "hello", "--home", home)
	if r.code != 0 || !strings.Contains(r.stderr, "Successfully installed dmdep-2.0 dmhello-1.0") || !strings.Contains(r.stdout, "built image sha256:") {
		t.Fatalf("env build: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	var built envAdded
	if err := json.Unmarshal([]byte(mustRun(t, "env", "show", "hello", "--json", "--home", home)), &built); err != nil {
		t.Fatal(err)
	}
	if built.Layers != 2 || !strings.Contains(mustRun(t, "data", "ls", "--home", home), built.CID) {
		t.Errorf("the built image: %+v; want 2 layers, pinned here", built)
	}
	// On an image added here, by its name: one more layer, and both
	// layers' packages on the path.
	os.WriteFile(filepath.Join(project, "requirements.txt"), []byte("dmextra\n"), 0o644)
	var again envAdded
	if err := json.Unmarshal([]byte(mustRun(t, "env", "build", project, "--base", "hello", "--wheels", wheels, "--json", "--home", home)), &again); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "img")
	mustRun(t, "data", "get", again.CID, "-o", out, "--home", home)
	img, err := image.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	env, _ := image.Env(img)
	if again.Layers != 3 || !strings.Contains(strings.Join(env, " "), "PYTHONPATH=/opt/deepmarket/site:/opt/deepmarket/site") {
		t.Errorf("built on the named image: %d layers, env %q", again.Layers, env)
	}

	before := mustRun(t, "data", "ls", "--home", home)
	expectFail(t, 2, "--base is required", "env", "build", project, "--home", home)
	os.WriteFile(filepath.Join(project, "requirements.txt"), []byte("dmmissing\n"), 0o644)
	expectFail(t, 1, "dmmissing", "env", "build", project, "--base", base, "--wheels", wheels, "--home", home)
	expectFail(t, 1, "no image of that name", "env", "build", project, "--base", "nope", "--home", home)
	if after := mustRun(t, "data", "ls", "--home", home); after != before {
		t.Errorf("a failed build added data:\n%s\nwas\n%s", after, before)
	}
}
