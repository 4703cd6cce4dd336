package sandbox

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// systemDirs are the host dirs every job sees read-only: enough to run
// Python and TensorFlow, nothing that holds users' data. /etc is among them
// with its secrets hidden (etcSecrets); /run, /tmp, /var and the homes are
// not, so no host socket is reachable by path.
var systemDirs = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/sys"}

// etcSecrets are hidden under the read-only /etc. Their modes already keep
// them from a job's uid; this keeps them from a mode mistake too.
var etcSecrets = []string{
	"/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/security/opasswd",
	"/etc/ssh", "/etc/ssl/private", "/etc/sudoers", "/etc/sudoers.d", "/etc/krb5.keytab",
	"/etc/NetworkManager/system-connections", "/etc/wireguard", "/etc/openvpn", "/etc/ipsec.secrets",
	"/etc/ppp", "/etc/credstore", "/etc/credstore.encrypted", "/etc/machine-id", "/etc/deepmarket",
}

// gpuDevices are the device nodes a GPU job needs; jobs without GPUs get
// none of them, which is the one GPU restriction the kernel enforces.
var gpuDevices = []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset", "/dev/nvidia-caps"}

// minBwrap is the oldest bubblewrap with --disable-userns.
var minBwrap = [3]int{0, 8, 0}

// bwrapInstall is what to do when bubblewrap is missing or too old.
const bwrapInstall = "install bubblewrap 0.8 or later: apt-get install bubblewrap (dnf install bubblewrap), or run make deps"

// defaultHidden lists every home under /home plus /root and the secrets
// under /etc.
func defaultHidden() []string {
	hide := append([]string{"/root"}, etcSecrets...)
	entries, _ := os.ReadDir("/home")
	for _, e := range entries {
		hide = append(hide, filepath.Join("/home", e.Name()))
	}
	return hide
}

// bwrapView is the filesystem and namespaces a job gets.
type bwrapView struct {
	Dir      string
	Cwd      string // where the job starts; Dir when empty
	Root     string // an image's root filesystem, in place of the host's system dirs
	ReadOnly []string
	Hide     []string
	GPUs     []int // the GPUs whose device nodes the job gets
	// DriverLibs and DriverBins are the host's NVIDIA driver files a GPU
	// job in an image gets (driverArgs).
	DriverLibs, DriverBins []string
	// Cgroups maps each cgroup hierarchy's mount point to the job's
	// cgroup dir in it (hierarchy.jobDirs): all the job sees of cgroups.
	Cgroups    map[string]string
	OwnNet     bool  // a network namespace of its own (else the one the trampoline joined)
	SeccompFDs []int // the fds bwrap reads seccomp filters from
	// Env ("K=V") is the job's program's environment, which bwrap sets
	// inside the sandbox: bwrap's own is a PATH alone.
	Env []string
}

// mountOp is one bwrap option with its target path.
type mountOp struct {
	args   []string
	target string
}

// depth is how many levels below / the path p lies.
func depth(p string) int { return strings.Count(filepath.Clean(p), "/") }

// bwrapArgs builds the bwrap command line that runs argv in v. Paths keep
// their host names so that paths the node hands the job stay valid.
func bwrapArgs(bwrap string, v bwrapView, argv []string) []string {
	args := append([]string{bwrap}, namespaceArgs(v.OwnNet)...)
	sysArgs, visible := systemDirArgs()
	if v.Root != "" {
		sysArgs, visible = imageDirArgs(v.Root)
	}
	args = append(args, sysArgs...)
	args = append(args, cgroupArgs(cgroupRoot, v.Cgroups)...)
	args = append(args, deviceArgs(v.GPUs)...)
	if v.Root != "" && len(v.GPUs) > 0 {
		args = append(args, driverArgs(v.DriverLibs, v.DriverBins)...)
	}
	// /tmp and /var/tmp are the job's own, inside its dir so that the disk
	// bound covers them and they go with it.
	tmp := filepath.Join(v.Dir, "tmp")
	args = append(args, "--bind", tmp, "/tmp", "--bind", tmp, "/var/tmp")
	args = append(args, jobPathArgs(v, visible)...)
	// The root tmpfs that holds the mount points is read-only: the job
	// writes in its dir, its /tmp and /dev/shm, nowhere else.
	args = append(args, "--remount-ro", "/")
	for _, fd := range v.SeccompFDs {
		args = append(args, "--add-seccomp-fd", strconv.Itoa(fd))
	}
	cwd := v.Cwd
	if cwd == "" {
		cwd = v.Dir
	}
	args = append(args, "--clearenv")
	for _, kv := range v.Env {
		if k, val, ok := strings.Cut(kv, "="); ok {
			args = append(args, "--setenv", k, val)
		}
	}
	args = append(args, "--chdir", cwd, "--")
	return append(args, argv...)
}

// namespaceArgs are the bwrap options that give the job namespaces of its
// own: a network namespace too when ownNet.
func namespaceArgs(ownNet bool) []string {
	args := []string{
		"--new-session", // no controlling tty to push input into (TIOCSTI)
		// No --die-with-parent: its PR_SET_PDEATHSIG fires when the node's
		// thread that started the job exits, which Go does to threads a
		// goroutine locked (as entering a network namespace does). The
		// cgroup ends the job, and Reap after a node's death.
		// A user namespace in which the job keeps its own uid and no
		// capability, and may make no further one (no "unshare -r").
		"--unshare-user", "--disable-userns",
		"--unshare-pid", // pid 1 of the job dies last and takes all with it
		"--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
	}
	if ownNet {
		args = append(args, "--unshare-net")
	}
	return args
}

// systemDirArgs binds the systemDirs this host has read-only, keeping those
// that are symlinks as symlinks. visible are the dirs it bound.
func systemDirArgs() (args, visible []string) {
	for _, d := range systemDirs {
		fi, err := os.Lstat(d)
		switch {
		case err != nil:
		case fi.Mode()&os.ModeSymlink != 0:
			// Merged-/usr systems: /bin -> usr/bin must stay a link.
			if target, err := os.Readlink(d); err == nil {
				args = append(args, "--symlink", target, d)
			}
		case fi.IsDir():
			args = append(args, "--ro-bind", d, d)
			visible = append(visible, d)
		}
	}
	return args, visible
}

// imageSkipped are an image's top-level entries the sandbox makes itself
// (or leaves out): its /proc, /dev, /sys (the host's, read-only, for the
// job's cgroup), /tmp and /var/tmp, and /run.
var imageSkipped = []string{"proc", "dev", "sys", "tmp", "run"}

// imageDirArgs bind the top-level entries of an image's root filesystem
// read-only at /, symbolic links kept as such (a merged-/usr image's /bin
// -> usr/bin), and the host's /sys. visible are the paths they bound.
func imageDirArgs(root string) (args, visible []string) {
	entries, _ := os.ReadDir(root)
	for _, e := range entries {
		name := e.Name()
		if slices.Contains(imageSkipped, name) {
			continue
		}
		src, dst := filepath.Join(root, name), "/"+name
		fi, err := os.Lstat(src)
		switch {
		case err != nil:
		case fi.Mode()&os.ModeSymlink != 0:
			if target, err := os.Readlink(src); err == nil {
				args = append(args, "--symlink", target, dst)
			}
		case fi.IsDir():
			args = append(args, "--ro-bind", src, dst)
			visible = append(visible, dst)
		case fi.Mode().IsRegular():
			args = append(args, "--ro-bind", src, dst)
		}
	}
	if _, err := os.Stat("/sys"); err == nil {
		args = append(args, "--ro-bind", "/sys", "/sys")
	}
	// Nothing of the host's is under the image's dirs: the host paths
	// to hide there are not there to hide.
	return args, []string{"/sys"}
}

// imageMountpoints makes, inside an image's root, the empty directories
// (or files) the job's own mounts need where they fall under the image's
// read-only dirs (its dir at its host path, /var/tmp, its read-only
// paths): bwrap cannot make a mount point in a read-only bind. It works
// through an os.Root, so an image's link cannot lead it out.
func imageMountpoints(root string, targets []string) error {
	r, err := os.OpenRoot(root)
	if err != nil {
		return err
	}
	defer r.Close()
	for _, t := range targets {
		rel := strings.TrimPrefix(filepath.Clean(t), "/")
		top, _, _ := strings.Cut(rel, "/")
		if rel == "" || slices.Contains(imageSkipped, top) || strings.HasPrefix(rel, "var/tmp/") {
			continue // the job's own /tmp and /var/tmp are bound first: bwrap makes these there
		}
		if _, err := r.Lstat(top); err != nil {
			continue // not in the image: bwrap makes it in its own root
		}
		// A path not there yet (the job's dir, which Start makes) is a dir.
		if fi, err := os.Stat(t); err != nil || fi.IsDir() {
			err = r.MkdirAll(rel, 0o755)
		} else if err = r.MkdirAll(filepath.Dir(rel), 0o755); err == nil {
			var f *os.File
			if f, err = r.OpenFile(rel, os.O_CREATE|os.O_RDONLY, 0o644); err == nil {
				f.Close()
			}
		}
		if err != nil {
			return fmt.Errorf("a mount point for %s in the image: %w", t, err)
		}
	}
	return nil
}

// cgroupArgs replace, in the job's /sys, the host's cgroup tree at root
// (cgroupRoot), which lists every job's cgroup by name (a job ID's prefix
// and a piece of the lender's peer ID), with the job's own cgroup alone:
// each hierarchy mounted at or under root shows the job's dir in it (own:
// mount point -> that dir), read-only, and nothing else is left there. A
// reader that looks for its CPU quota or memory limit where a container's
// would (v1 /sys/fs/cgroup/cpu/cpu.cfs_quota_us, v2 /sys/fs/cgroup/cpu.max),
// as /proc/self/cgroup ("/" in the job's cgroup namespace) leads it,
// finds the job's own.
func cgroupArgs(root string, own map[string]string) []string {
	if _, err := os.Stat(root); err != nil {
		return nil // not there on the host: not in the job's /sys either
	}
	if dir, ok := own[root]; ok {
		return []string{"--ro-bind", dir, root} // v2: one hierarchy, at the root
	}
	args := []string{"--tmpfs", root}
	entries, _ := os.ReadDir(root)
	for _, e := range entries {
		p := filepath.Join(root, e.Name())
		if dir, ok := own[p]; ok {
			args = append(args, "--ro-bind", dir, p)
			continue
		}
		// Another name of a co-mounted hierarchy: cpu -> cpu,cpuacct.
		if target, err := os.Readlink(p); err == nil && filepath.IsLocal(target) && own[filepath.Join(root, target)] != "" {
			args = append(args, "--symlink", target, p)
		}
	}
	return append(args, "--remount-ro", root)
}

// deviceArgs give the job its own /proc (of its pid namespace), /dev (null,
// zero, random, tty, pts) and /dev/shm, nothing of the host's, plus, when
// it has GPUs, the driver's control nodes and the device node of each of
// its GPUs (/dev/nvidiaN, N its index), not the others': the one GPU
// restriction the kernel enforces.
func deviceArgs(gpus []int) []string {
	args := []string{"--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/dev/shm"}
	if len(gpus) > 0 {
		for _, d := range gpuDevices {
			args = append(args, "--dev-bind-try", d, d)
		}
		for _, g := range gpus {
			d := fmt.Sprintf("/dev/nvidia%d", g)
			args = append(args, "--dev-bind-try", d, d)
		}
	}
	return args
}

// jobPathArgs binds v's read-only paths and its dir and hides v.Hide, where
// visible (the system dirs bound) or those would show them. It applies the
// paths shallowest first, so that the more specific one wins where they
// nest: a venv inside a hidden home stays visible, a secret inside a
// read-only dataset stays hidden.
func jobPathArgs(v bwrapView, visible []string) []string {
	var ops []mountOp
	for _, p := range v.ReadOnly {
		if p = filepath.Clean(p); filepath.IsAbs(p) {
			ops = append(ops, mountOp{[]string{"--ro-bind", p, p}, p})
			visible = append(visible, p)
		}
	}
	visible = append(visible, v.Dir)
	ops = append(ops, hideOps(v.Hide, visible)...)
	// Last among equals: a Hide naming the job dir itself must not hide it.
	ops = append(ops, mountOp{[]string{"--bind", v.Dir, v.Dir}, v.Dir})
	slices.SortStableFunc(ops, func(a, b mountOp) int { return depth(a.target) - depth(b.target) })
	var args []string
	for _, op := range ops {
		args = append(args, op.args...)
	}
	return args
}

// hideOps cover each path of hide that lies under one of visible: a dir
// with an empty read-only tmpfs, anything else with /dev/null. A path not
// mounted into the sandbox is already absent.
func hideOps(hide, visible []string) []mountOp {
	var ops []mountOp
	for _, p := range hide {
		p = filepath.Clean(p)
		if !filepath.IsAbs(p) || !slices.ContainsFunc(visible, func(b string) bool { return under(p, b) }) {
			continue // not mounted into the sandbox: already absent
		}
		fi, err := os.Lstat(p)
		switch {
		case err != nil:
		case fi.IsDir():
			ops = append(ops, mountOp{[]string{"--tmpfs", p, "--remount-ro", p}, p})
		default:
			ops = append(ops, mountOp{[]string{"--ro-bind", "/dev/null", p}, p})
		}
	}
	return ops
}

// findBwrap returns the path of a bubblewrap recent enough for the
// sandbox, or an error that says how to install one.
func findBwrap() (string, error) {
	path, err := exec.LookPath("bwrap")
	if err != nil {
		for _, p := range []string{"/usr/bin/bwrap", "/bin/bwrap", "/usr/local/bin/bwrap"} {
			if _, err := os.Stat(p); err == nil {
				path = p
				break
			}
		}
	}
	if path == "" {
		return "", fmt.Errorf("bubblewrap (bwrap) is not installed: %s", bwrapInstall)
	}
	cmd := exec.Command(path, "--version")
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %v: %s", path, err, bwrapInstall)
	}
	v, ok := parseBwrapVersion(string(out))
	if !ok {
		return "", fmt.Errorf("%s --version said %q: %s", path, strings.TrimSpace(string(out)), bwrapInstall)
	}
	if slices.Compare(v[:], minBwrap[:]) < 0 {
		return "", fmt.Errorf("%s is bubblewrap %d.%d.%d, which cannot forbid user namespaces inside the sandbox: %s", path, v[0], v[1], v[2], bwrapInstall)
	}
	return path, nil
}

var bwrapVersionRE = regexp.MustCompile(`(\d+)\.(\d+)(?:\.(\d+))?`)

// parseBwrapVersion reads "bubblewrap 0.8.0".
func parseBwrapVersion(s string) ([3]int, bool) {
	m := bwrapVersionRE.FindStringSubmatch(s)
	if m == nil {
		return [3]int{}, false
	}
	var v [3]int
	for i := range 3 {
		v[i], _ = strconv.Atoi(m[i+1])
	}
	return v, true
}
