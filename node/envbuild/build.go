// Package envbuild makes a job's environment: a base image plus the
// Python packages a project asks for (its requirements.txt, or its
// pyproject.toml, the project itself with them). pip installs them in
// the job sandbox on the submitter's machine (its own uid, no network,
// the base image as its root filesystem), never on a lender, and what it
// installed becomes one more layer of the image.
//
// pip installs from wheels alone: a wheelhouse the user names, or wheels
// the node's own pip downloads first, outside the sandbox, binary only
// (--only-binary=:all:, so that no package's code runs there), for the
// base image's Python and platform. The new layer holds them under Site,
// which the image's PYTHONPATH and PATH name.
package envbuild

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/deepmarket/deepmarket/node/image"
	"github.com/deepmarket/deepmarket/node/sandbox"
)

// Site is where the image's new layer puts what pip installed.
const Site = "/opt/deepmarket/site"

// Request is one build.
type Request struct {
	// Base is the image the packages go on top of; it must have python3 on
	// its PATH.
	Base v1.Image
	// Project is a directory holding requirements.txt, pyproject.toml or
	// both (the project itself is then installed too).
	Project string
	// Wheels is a wheelhouse: pip installs from it alone. Empty: the
	// wheels are downloaded with HostPython's pip first.
	Wheels string
	// HostPython is the node's Python; the build runs its pip (a pure
	// Python package, copied into the sandbox), so the base image needs
	// no pip of its own.
	HostPython string
	// Work is a scratch directory, removed when the build ends; a job's
	// uid must be able to traverse it.
	Work string
	// Out is where the built image is written, as an OCI image layout
	// directory; it must not exist yet.
	Out string
	// Limits bound the sandbox; zero values take DefaultLimits.
	Limits sandbox.Limits
	// Say receives what the build does, a line at a time (pip's output
	// among it).
	Say func(string)
}

// DefaultLimits bound a build: 2 cores, 4 GiB, 8 GiB of files.
var DefaultLimits = sandbox.Limits{Cores: 2, MemBytes: 4 << 30, DiskBytes: 8 << 30, Pids: 512}

// Result is a built image, read from Out, and what pip installed into
// it.
type Result struct {
	Image v1.Image
	Files int
	Bytes int64
}

// Build installs the project's packages on req.Base and returns the new
// image.
func Build(ctx context.Context, req Request) (Result, error) {
	say := req.Say
	if say == nil {
		say = func(string) {}
	}
	reqs, pyproject, err := projectFiles(req.Project)
	if err != nil {
		return Result{}, err
	}
	env, err := image.Env(req.Base)
	if err != nil {
		return Result{}, err
	}
	work, err := os.MkdirTemp(req.Work, "envbuild-")
	if err != nil {
		return Result{}, err
	}
	defer os.RemoveAll(work)
	if req.Out == "" {
		return Result{}, errors.New("envbuild: no Out")
	}
	if _, err := os.Lstat(req.Out); err == nil {
		return Result{}, fmt.Errorf("%s exists already", req.Out)
	}
	if err := os.Chmod(work, 0o711); err != nil {
		return Result{}, err
	}
	b := &build{req: req, say: say, env: env, root: filepath.Join(work, "rootfs"), box: filepath.Join(work, "box")}
	say("unpacking the base image")
	if _, err := image.Unpack(req.Base, b.root, image.DefaultLimits); err != nil {
		return Result{}, fmt.Errorf("the base image: %w", err)
	}
	if err := b.stage(); err != nil {
		return Result{}, err
	}
	if req.Wheels == "" {
		if err := b.download(ctx, reqs, pyproject); err != nil {
			return Result{}, err
		}
	}
	if err := b.install(ctx, reqs, pyproject); err != nil {
		return Result{}, err
	}
	res, err := b.image(filepath.Join(work, "layer.tar.zst"), reqs, pyproject)
	if err != nil {
		return Result{}, err
	}
	return writeOut(res.Image, req.Out, res.Files, res.Bytes, say)
}

// projectFiles says which of requirements.txt and pyproject.toml dir
// holds: at least one.
func projectFiles(dir string) (reqs, pyproject bool, err error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return false, false, err
	}
	if !fi.IsDir() {
		return false, false, fmt.Errorf("%s is not a directory", dir)
	}
	_, err = os.Stat(filepath.Join(dir, "requirements.txt"))
	reqs = err == nil
	_, err = os.Stat(filepath.Join(dir, "pyproject.toml"))
	pyproject = err == nil
	if !reqs && !pyproject {
		return false, false, fmt.Errorf("%s holds neither requirements.txt nor pyproject.toml: nothing to install", dir)
	}
	return reqs, pyproject, nil
}

type build struct {
	req       Request
	say       func(string)
	env       []string // the base image's
	root, box string
}

// The sandbox's dir (box) holds the project, the wheels, the host's pip
// and, once pip is done, site: what it installed.
func (b *build) dir(name string) string { return filepath.Join(b.box, name) }

// stage copies into the sandbox's dir what pip reads there: the
// project, the wheelhouse and the host's pip.
func (b *build) stage() error {
	if err := os.MkdirAll(b.dir("site"), 0o755); err != nil {
		return err
	}
	if err := copyTree(b.req.Project, b.dir("project")); err != nil {
		return fmt.Errorf("copy the project: %w", err)
	}
	wheels := b.req.Wheels
	if wheels != "" {
		if err := copyTree(wheels, b.dir("wheels")); err != nil {
			return fmt.Errorf("copy the wheelhouse: %w", err)
		}
	} else if err := os.MkdirAll(b.dir("wheels"), 0o755); err != nil {
		return err
	}
	pip, err := hostPip(b.req.HostPython)
	if err != nil {
		return err
	}
	return copyTree(pip, filepath.Join(b.dir("pip"), "pip"))
}

// hostPip is the directory of python's pip package.
func hostPip(python string) (string, error) {
	out, err := exec.Command(python, "-c", "import os, pip; print(os.path.dirname(pip.__file__))").Output()
	if err != nil {
		return "", fmt.Errorf("the node's Python (%s) has no pip to build with: %w", python, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// download has the host's pip fetch the wheels the project needs, for
// the base image's Python and platform, binary only: no package's code
// runs outside the sandbox.
func (b *build) download(ctx context.Context, reqs, pyproject bool) error {
	py, libc, arch, err := b.python(ctx)
	if err != nil {
		return err
	}
	args := []string{"-m", "pip", "download", "--only-binary=:all:", "--disable-pip-version-check", "--progress-bar", "off",
		"--dest", b.dir("wheels"), "--python-version", py, "--implementation", "cp",
		"--abi", "cp" + strings.ReplaceAll(py, ".", ""), "--abi", "abi3", "--abi", "none"}
	for _, p := range platforms(libc, arch) {
		args = append(args, "--platform", p)
	}
	if reqs {
		file := filepath.Join(b.req.Project, "requirements.txt")
		if err := checkRequirements(file); err != nil {
			return err
		}
		args = append(args, "-r", file)
	}
	if pyproject {
		deps, err := pyprojectDeps(filepath.Join(b.req.Project, "pyproject.toml"))
		if err != nil {
			return err
		}
		for _, d := range deps {
			if err := checkRequirement(d); err != nil {
				return fmt.Errorf("pyproject.toml: %w", err)
			}
		}
		args = append(args, deps...)
	}
	b.say(fmt.Sprintf("downloading wheels for python %s (%s, glibc %s)", py, arch, libc))
	cmd := exec.CommandContext(ctx, b.req.HostPython, args...)
	cmd.Env = append(os.Environ(), "PIP_NO_INPUT=1")
	return b.sayLines(cmd, "download the wheels")
}

// python is the base image's python3: its version (3.11), glibc
// version and machine.
func (b *build) python(ctx context.Context) (py, libc, arch string, err error) {
	var out bytes.Buffer
	probe := `import sys, platform; print("%d.%d" % sys.version_info[:2], platform.libc_ver()[1] or "0.0", platform.machine())`
	if err := b.run(ctx, &out, "python3", "-c", probe); err != nil {
		return "", "", "", fmt.Errorf("the base image's python3: %w", err)
	}
	if _, err := fmt.Sscan(out.String(), &py, &libc, &arch); err != nil {
		return "", "", "", fmt.Errorf("the base image's python3 says %q: %w", out.String(), err)
	}
	return py, libc, arch, nil
}

// platforms are the wheel platform tags a Linux with glibc libc on arch
// runs: manylinux_2_N for every N up to libc's minor version, their
// legacy names, and plain linux.
func platforms(libc, arch string) []string {
	var major, minor int
	fmt.Sscanf(libc, "%d.%d", &major, &minor)
	var out []string
	if major == 2 {
		for n := minor; n >= 5; n-- {
			out = append(out, fmt.Sprintf("manylinux_2_%d_%s", n, arch))
		}
		legacy := map[int]string{17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
		for _, n := range []int{17, 12, 5} {
			if minor >= n {
				out = append(out, legacy[n]+"_"+arch)
			}
		}
	}
	return append(out, "linux_"+arch)
}

// install runs pip in the sandbox, from the wheels alone, into site.
func (b *build) install(ctx context.Context, reqs, pyproject bool) error {
	args := []string{"python3", "-m", "pip", "install", "--no-index", "--find-links", b.dir("wheels"),
		"--target", b.dir("site"), "--no-compile", "--disable-pip-version-check", "--no-warn-script-location",
		"--progress-bar", "off", "--no-cache-dir"}
	if reqs {
		args = append(args, "-r", filepath.Join(b.dir("project"), "requirements.txt"))
	}
	if pyproject {
		args = append(args, b.dir("project"))
	}
	b.say("installing in the sandbox: pip install " + installs(reqs, pyproject))
	return b.run(ctx, nil, args...)
}

// installs says what pip installs.
func installs(reqs, pyproject bool) string {
	switch {
	case reqs && pyproject:
		return "-r requirements.txt ./project"
	case reqs:
		return "-r requirements.txt"
	}
	return "./project"
}

// run runs argv in the sandbox: the base image's root, the box as its
// dir, no network; its output goes to out, or line by line to Say.
func (b *build) run(ctx context.Context, out io.Writer, argv ...string) error {
	lim := b.req.Limits
	if lim.MemBytes == 0 && lim.Cores == 0 && len(lim.CPUs) == 0 {
		lim = DefaultLimits
	}
	var log bytes.Buffer
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			line := sc.Text()
			if log.Len() < 64<<10 {
				log.WriteString(line + "\n")
			}
			if out == nil {
				b.say(line)
			}
		}
		io.Copy(io.Discard, pr)
	}()
	stdout := io.Writer(pw)
	if out != nil {
		stdout = out
	}
	env := append(append([]string{"PATH=/usr/local/bin:/usr/bin:/bin"}, b.env...),
		"PYTHONPATH="+b.dir("pip"), "PIP_NO_INPUT=1", "PIP_ROOT_USER_ACTION=ignore", "PYTHONDONTWRITEBYTECODE=1")
	p, err := sandbox.Start(ctx, sandbox.Spec{
		Name: "envbuild-" + filepath.Base(filepath.Dir(b.box)), Dir: b.box, Argv: argv, Env: env,
		Root: b.root, Limits: lim, Stdout: stdout, Stderr: pw,
	})
	if err != nil {
		pw.Close()
		<-done
		return err
	}
	exit, err := p.Wait()
	pw.Close()
	<-done
	if err != nil {
		return err
	}
	if exit.Code != 0 {
		why := fmt.Sprintf("exit status %d", exit.Code)
		switch {
		case exit.OOMKilled:
			why = fmt.Sprintf("out of memory (%d MiB)", lim.MemBytes>>20)
		case exit.DiskExceeded:
			why = fmt.Sprintf("out of disk (%d MiB)", lim.DiskBytes>>20)
		case exit.Signal != "":
			why = exit.Signal
		}
		return fmt.Errorf("%s failed in the sandbox (%s):\n%s", argv[0]+" "+strings.Join(argv[1:min(len(argv), 4)], " "), why, tail(log.String(), 20))
	}
	return nil
}

// sayLines runs cmd, its output line by line to Say, and names what
// failed with its last lines.
func (b *build) sayLines(cmd *exec.Cmd, what string) error {
	pr, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	var log strings.Builder
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		if log.Len() < 64<<10 {
			log.WriteString(sc.Text() + "\n")
		}
		b.say(sc.Text())
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("%s: %w:\n%s", what, err, tail(log.String(), 20))
	}
	return nil
}

// tail is s's last n lines.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// image is the base with what pip installed as one more layer, under
// Site.
func (b *build) image(layerPath string, reqs, pyproject bool) (Result, error) {
	layer, files, size, err := writeLayer(b.dir("site"), Site, layerPath)
	if err != nil {
		return Result{}, err
	}
	if files == 0 {
		return Result{}, errors.New("pip installed nothing")
	}
	img, err := withSite(b.req.Base, layer, "deepmarket env build: pip install "+installs(reqs, pyproject))
	return Result{Image: img, Files: files, Bytes: size}, err
}

// withSite is base with layer, which holds Site, on top, and Site on the
// image's PYTHONPATH and its bin on its PATH.
func withSite(base v1.Image, layer v1.Layer, createdBy string) (v1.Image, error) {
	img, err := mutate.Append(base, mutate.Addendum{Layer: layer, History: v1.History{
		CreatedBy: createdBy, Created: v1.Time{Time: epoch}, Comment: "installed under " + Site,
	}})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg := cf.Config
	cfg.Env = withEnv(slices.Clone(cfg.Env), "PYTHONPATH", Site, "")
	cfg.Env = withEnv(cfg.Env, "PATH", Site+"/bin", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	return mutate.Config(img, cfg)
}

// writeOut writes img as an OCI layout at out and reads it back from
// there.
func writeOut(img v1.Image, out string, files int, size int64, say func(string)) (Result, error) {
	say("writing the image")
	p, err := layout.Write(out, empty.Index)
	if err == nil {
		err = p.AppendImage(img)
	}
	if err == nil {
		img, err = image.Open(out)
	}
	if err != nil {
		os.RemoveAll(out)
		return Result{}, fmt.Errorf("write the image: %w", err)
	}
	return Result{Image: img, Files: files, Bytes: size}, nil
}

// withEnv puts dir first on env's list variable key (def when unset).
func withEnv(env []string, key, dir, def string) []string {
	for i, kv := range env {
		if v, ok := strings.CutPrefix(kv, key+"="); ok {
			if v == "" {
				env[i] = key + "=" + dir
			} else {
				env[i] = key + "=" + dir + ":" + v
			}
			return env
		}
	}
	if def == "" {
		return append(env, key+"="+dir)
	}
	return append(env, key+"="+dir+":"+def)
}

// epoch is the time every entry of a built layer bears, so that the
// same packages make the same layer.
var epoch = time.Unix(0, 0).UTC()

// writeLayer writes the tree at src as a layer at dst, under prefix:
// directories, regular files and symbolic links only, owned by root,
// without setuid, setgid or sticky bits, at epoch. It returns the layer,
// and the files and bytes it wrote.
func writeLayer(src, prefix, dst string) (v1.Layer, int, int64, error) {
	tw, err := newLayerFile(dst)
	if err != nil {
		return nil, 0, 0, err
	}
	files, size := 0, int64(0)
	// The prefix's own directories first.
	parts := strings.Split(strings.Trim(prefix, "/"), "/")
	for i := range parts {
		h := &tar.Header{Name: path.Join(parts[:i+1]...) + "/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: epoch}
		if err := tw.WriteHeader(h); err != nil {
			tw.abort()
			return nil, 0, 0, err
		}
	}
	err = filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == src {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		name := path.Join(strings.Trim(prefix, "/"), filepath.ToSlash(rel))
		fi, err := d.Info()
		if err != nil {
			return err
		}
		h := &tar.Header{Name: name, Mode: int64(fi.Mode().Perm()) | 0o644, ModTime: epoch, Format: tar.FormatPAX}
		switch {
		case d.IsDir():
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, name+"/", 0o755
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, target, 0o777
		case d.Type().IsRegular():
			h.Typeflag, h.Size = tar.TypeReg, fi.Size()
			if fi.Mode().Perm()&0o111 != 0 {
				h.Mode = 0o755
			}
		default:
			return nil // no devices, FIFOs or sockets
		}
		h.Mode &= 0o777
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if h.Typeflag == tar.TypeReg {
			r, err := os.Open(p)
			if err != nil {
				return err
			}
			n, err := io.Copy(tw, r)
			r.Close()
			if err != nil {
				return err
			}
			files++
			size += n
		}
		return nil
	})
	if err != nil {
		tw.abort()
		return nil, 0, 0, err
	}
	l, err := tw.layer()
	return l, files, size, err
}

// copyTree copies the directory src to dst: directories and regular
// files (symbolic links are copied as the files they name when those lie
// inside src, and skipped otherwise).
func copyTree(src, dst string) error {
	src = filepath.Clean(src)
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(to, 0o755)
		}
		if d.Type()&fs.ModeSymlink != 0 {
			target, err := filepath.EvalSymlinks(p)
			if err != nil || !strings.HasPrefix(target, src+string(filepath.Separator)) {
				return nil
			}
			if fi, err := os.Stat(target); err != nil || !fi.Mode().IsRegular() {
				return nil
			}
		} else if !d.Type().IsRegular() {
			return nil
		}
		return copyFile(p, to)
	})
}

func copyFile(src, dst string) error {
	r, err := os.Open(src)
	if err != nil {
		return err
	}
	defer r.Close()
	w, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(w, r); err != nil {
		w.Close()
		return err
	}
	return w.Close()
}

// pyprojectDeps are the requirements a pyproject.toml names: its
// build system's and its project's dependencies (optional ones aside).
func pyprojectDeps(file string) ([]string, error) {
	var p struct {
		BuildSystem struct {
			Requires []string `toml:"requires"`
		} `toml:"build-system"`
		Project struct {
			Dependencies []string `toml:"dependencies"`
		} `toml:"project"`
	}
	if _, err := toml.DecodeFile(file, &p); err != nil {
		return nil, fmt.Errorf("pyproject.toml: %w", err)
	}
	reqs := p.BuildSystem.Requires
	if len(reqs) == 0 { // pip's default backend
		reqs = []string{"setuptools>=40.8.0"}
	}
	return append(reqs, p.Project.Dependencies...), nil
}

// safeOptions are the requirements.txt options the node's pip may read
// outside the sandbox: where to find wheels.
var safeOptions = map[string]bool{"-i": true, "--index-url": true, "--extra-index-url": true, "-f": true, "--find-links": true,
	"--prefer-binary": true, "--only-binary": true}

// checkRequirements refuses a requirements.txt the node's pip must not
// download from, outside the sandbox: one whose lines would have it run
// a package's code there (checkRequirement), or name other files.
func checkRequirements(file string) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	text := strings.ReplaceAll(string(b), "\\\n", " ")
	for i, line := range strings.Split(text, "\n") {
		line, _, _ = strings.Cut(line, " #")
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(line, "-") {
			opt, _, _ := strings.Cut(strings.Fields(line)[0], "=")
			if !safeOptions[opt] {
				return fmt.Errorf("requirements.txt line %d: %s: the node downloads wheels alone, outside the sandbox; use --wheels DIR for this", i+1, opt)
			}
			continue
		}
		if err := checkRequirement(line); err != nil {
			return fmt.Errorf("requirements.txt line %d: %w", i+1, err)
		}
	}
	return nil
}

// checkRequirement refuses a requirement that pip would build from
// source to download it, running its code: a path, a VCS or archive URL.
// A name with versions and markers, or a direct reference to a wheel, is
// fine.
func checkRequirement(r string) error {
	name, ref, direct := strings.Cut(r, "@")
	ref = strings.TrimSpace(strings.Split(ref, ";")[0])
	switch {
	case direct && !strings.HasSuffix(ref, ".whl"):
		return fmt.Errorf("%q: a direct reference to something other than a wheel is built by running its code: build a wheel and use --wheels DIR", r)
	case strings.HasPrefix(name, ".") || strings.HasPrefix(name, "/") || strings.HasPrefix(name, "~") || strings.Contains(name, "://"):
		return fmt.Errorf("%q: a path or URL is built by running its code: build a wheel and use --wheels DIR", r)
	}
	return nil
}
