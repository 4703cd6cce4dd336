package envbuild

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deepmarket/deepmarket/node/image"
	"github.com/deepmarket/deepmarket/node/image/imagetest"
	"github.com/deepmarket/deepmarket/node/sandbox"
	"github.com/deepmarket/deepmarket/node/sandbox/sandboxtest"
)

func TestMain(m *testing.M) {
	// The sandbox starts by re-executing this test binary.
	sandbox.MaybeRunTrampoline()
	os.Exit(m.Run())
}

// hostPython is the Python whose pip builds: the tests' virtualenv's.
func hostPython(t *testing.T) string {
	if p := os.Getenv("DM_PYTHON"); p != "" {
		return p
	}
	if os.Getenv("DM_REQUIRE_ROOT") == "1" {
		t.Fatal("DM_PYTHON is not set: `make test` sets it to the virtualenv's python3")
	}
	return "python3"
}

// runIn runs python3 code in img, as a worker would, and returns what
// it printed.
func runIn(t *testing.T, res Result, code string) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "rootfs")
	if _, err := image.Unpack(res.Image, root, image.DefaultLimits); err != nil {
		t.Fatal(err)
	}
	env, err := image.Env(res.Image)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	p, err := sandbox.Start(context.Background(), sandbox.Spec{
		Name: "envbuild-test", Dir: filepath.Join(workDir(t), "job"), Root: root, Env: env,
		Argv: []string{"python3", "-c", code}, Stdout: &out, Stderr: &out, Limits: DefaultLimits,
	})
	if err != nil {
		t.Fatal(err)
	}
	if exit, err := p.Wait(); err != nil || exit.Code != 0 {
		t.Fatalf("python3 in the built image: %+v %v\n%s", exit, err, out.String())
	}
	return out.String()
}

// TestBuildFromAWheelhouse: a requirements.txt naming a package of a
// local wheelhouse, which needs another of it, is installed by pip in
// the sandbox into one new layer, under Site alone; the image's Python
// imports both with no path of its own. A requirement the wheelhouse
// lacks fails the build, saying which.
func TestBuildFromAWheelhouse(t *testing.T) {
	sandboxtest.Need(t)
	base := imagetest.Python(t, nil)
	wheels := t.TempDir()
	imagetest.Wheel(t, wheels, "dmhello", "1.0", "import dmdep\ndef hello():\n    return 'hello, ' + dmdep.WHO\n", "dmdep>=2")
	imagetest.Wheel(t, wheels, "dmdep", "2.0", "WHO = 'wheelhouse'\n")
	project := t.TempDir()
	os.WriteFile(filepath.Join(project, "requirements.txt"), []byte("dmhello==1.0\n"), 0o644)
	var said []string
	res, err := Build(context.Background(), Request{
		Base: base, Project: project, Wheels: wheels, HostPython: hostPython(t), Work: workDir(t), Out: filepath.Join(t.TempDir(), "oci"),
		Say: func(s string) { said = append(said, s) },
	})
	if err != nil {
		t.Fatalf("build: %v\n%s", err, strings.Join(said, "\n"))
	}
	if !strings.Contains(strings.Join(said, "\n"), "Successfully installed dmdep-2.0 dmhello-1.0") {
		t.Errorf("pip's output does not say what it installed:\n%s", strings.Join(said, "\n"))
	}
	baseLayers, _ := base.Layers()
	layers, _ := res.Image.Layers()
	if len(layers) != len(baseLayers)+1 || res.Files == 0 {
		t.Fatalf("built %d layers (%d files) on a base of %d: want one more", len(layers), res.Files, len(baseLayers))
	}
	if got := runIn(t, res, "import dmhello, sys; print(dmhello.hello(), dmhello.__file__)"); !strings.HasPrefix(got, "hello, wheelhouse "+Site+"/dmhello/") {
		t.Errorf("the built image's python3 says %q", got)
	}
	// The new layer holds Site's tree alone.
	rc, err := layers[len(layers)-1].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	names, err := tarNames(rc)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if !strings.HasPrefix("/"+n, Site) && !strings.HasPrefix(Site, "/"+strings.TrimSuffix(n, "/")) {
			t.Errorf("the new layer writes %s, outside %s", n, Site)
		}
	}

	os.WriteFile(filepath.Join(project, "requirements.txt"), []byte("dmhello==1.0\ndmmissing\n"), 0o644)
	_, err = Build(context.Background(), Request{Base: base, Project: project, Wheels: wheels, HostPython: hostPython(t), Work: workDir(t), Out: filepath.Join(t.TempDir(), "oci")})
	if err == nil || !strings.Contains(err.Error(), "dmmissing") || !strings.Contains(err.Error(), "in the sandbox") {
		t.Errorf("a requirement the wheelhouse lacks: %v", err)
	}
	if _, err := Build(context.Background(), Request{Base: base, Project: t.TempDir(), Wheels: wheels, HostPython: hostPython(t), Work: workDir(t), Out: filepath.Join(t.TempDir(), "oci")}); err == nil ||
		!strings.Contains(err.Error(), "neither requirements.txt nor pyproject.toml") {
		t.Errorf("a project with nothing to install: %v", err)
	}
}

func tarNames(r io.Reader) ([]string, error) {
	tr := tar.NewReader(r)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return names, nil
		}
		if err != nil {
			return nil, err
		}
		names = append(names, h.Name)
	}
}

// workDir is a scratch dir a job's uid can traverse.
func workDir(t *testing.T) string {
	d := t.TempDir()
	for _, p := range []string{filepath.Dir(d), d} {
		if err := os.Chmod(p, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// TestRequirementsTheNodeMustNotDownload: lines of a requirements.txt
// that would have the node's pip, outside the sandbox, build a package
// (running its code) or read other files are refused before any
// download; names, versions, markers, index options and wheels pass.
func TestRequirementsTheNodeMustNotDownload(t *testing.T) {
	for _, ok := range []string{"numpy==1.26.4", "torch==2.1.0+cpu ; python_version >= '3.9'", "six", "tf @ https://h.example/tf-2.0-py3-none-any.whl",
		"--index-url https://pypi.lab.example/simple", "--extra-index-url=https://x.example", "# a comment", "Jinja2>=3  # inline"} {
		if err := checkRequirementsOf(t, ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"-e git+https://github.com/x/y#egg=y", "git+https://github.com/x/y", "./local-pkg", "/abs/pkg", "y @ git+https://github.com/x/y",
		"z @ https://h.example/z-1.0.tar.gz", "-r other.txt", "-c constraints.txt", "--editable ./x", "--no-binary :all:"} {
		if err := checkRequirementsOf(t, bad); err == nil {
			t.Errorf("%q was accepted", bad)
		}
	}
}

func checkRequirementsOf(t *testing.T, line string) error {
	f := filepath.Join(t.TempDir(), "requirements.txt")
	os.WriteFile(f, []byte("six\n"+line+"\n"), 0o644)
	return checkRequirements(f)
}

// TestPackAVirtualenv: a virtualenv's site-packages are packed as they
// are onto a base whose python3 is the same version, and import there;
// a virtualenv of another Python version is refused, saying both.
func TestPackAVirtualenv(t *testing.T) {
	sandboxtest.Need(t)
	base := imagetest.Python(t, nil)
	out, err := exec.Command("/usr/bin/python3", "-c", `import sys; print("%d.%d" % sys.version_info[:2])`).Output()
	if err != nil {
		t.Fatal(err)
	}
	venv := t.TempDir()
	site := filepath.Join(venv, "lib", "python"+strings.TrimSpace(string(out)), "site-packages", "dmpacked")
	os.MkdirAll(site, 0o755)
	os.WriteFile(filepath.Join(site, "__init__.py"), []byte("WHERE = __file__\n"), 0o644)
	res, err := Pack(context.Background(), PackRequest{Base: base, Venv: venv, Work: workDir(t), Out: filepath.Join(t.TempDir(), "oci")})
	if err != nil {
		t.Fatal(err)
	}
	if got := runIn(t, res, "import dmpacked; print(dmpacked.WHERE)"); strings.TrimSpace(got) != Site+"/dmpacked/__init__.py" {
		t.Errorf("the packed package imports from %q", got)
	}
	other := t.TempDir()
	os.MkdirAll(filepath.Join(other, "lib", "python3.99", "site-packages"), 0o755)
	_, err = Pack(context.Background(), PackRequest{Base: base, Venv: other, Work: workDir(t), Out: filepath.Join(t.TempDir(), "oci")})
	if err == nil || !strings.Contains(err.Error(), "for Python 3.99") {
		t.Errorf("a virtualenv of another Python: %v", err)
	}
}
