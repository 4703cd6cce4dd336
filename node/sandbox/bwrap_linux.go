package sandbox

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// systemDirs are the host dirs every job sees read-only: enough to run
// Python and TensorFlow, nothing that holds users' data.
var systemDirs = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/sys", "/run/systemd/resolve"}

// gpuDevices are the device nodes a GPU job needs; jobs without GPUs get
// none of them, which is the one GPU restriction the kernel enforces.
var gpuDevices = []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset", "/dev/nvidia-caps"}

// defaultHidden lists every home under /home plus /root.
func defaultHidden() []string {
	hide := []string{"/root"}
	entries, _ := os.ReadDir("/home")
	for _, e := range entries {
		hide = append(hide, filepath.Join("/home", e.Name()))
	}
	return hide
}

// bwrapView is the filesystem a job sees.
type bwrapView struct {
	Dir      string
	Cwd      string // where the job starts; Dir when empty
	ReadOnly []string
	Hide     []string
	GPU      bool
}

// mountOp is one bwrap option with its target path.
type mountOp struct {
	args   []string
	target string
}

func depth(p string) int { return strings.Count(filepath.Clean(p), "/") }

// under reports whether p is base or inside it.
func under(p, base string) bool {
	p, base = filepath.Clean(p), filepath.Clean(base)
	return p == base || base == "/" || strings.HasPrefix(p, base+"/")
}

// bwrapArgs builds the bwrap command line that runs argv in v. Paths keep
// their host names so that paths the node hands the job stay valid.
func bwrapArgs(bwrap string, v bwrapView, argv []string) []string {
	args := []string{bwrap,
		"--new-session", // no controlling tty to push input into (TIOCSTI)
		"--unshare-pid", // pid 1 of the job dies last and takes all with it
		"--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
	}
	// The network namespace is shared on purpose: another package filters it.
	var visible []string
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
	args = append(args, "--proc", "/proc", "--dev", "/dev")
	if v.GPU {
		for _, d := range gpuDevices {
			args = append(args, "--dev-bind-try", d, d)
		}
		nodes, _ := filepath.Glob("/dev/nvidia[0-9]*")
		for _, d := range nodes {
			args = append(args, "--dev-bind", d, d)
		}
	}
	// /tmp is the job's own, inside its dir so that the disk bound covers it.
	args = append(args, "--bind", filepath.Join(v.Dir, "tmp"), "/tmp")

	// Apply the job's paths shallowest first, so that the more specific one
	// wins where they nest: a venv inside a hidden home stays visible, a
	// secret inside a read-only dataset stays hidden.
	var ops []mountOp
	for _, p := range v.ReadOnly {
		if p = filepath.Clean(p); filepath.IsAbs(p) {
			ops = append(ops, mountOp{[]string{"--ro-bind-try", p, p}, p})
			visible = append(visible, p)
		}
	}
	visible = append(visible, v.Dir)
	for _, p := range v.Hide {
		p = filepath.Clean(p)
		if !filepath.IsAbs(p) || !slices.ContainsFunc(visible, func(b string) bool { return under(p, b) }) {
			continue // not mounted into the sandbox: already absent
		}
		fi, err := os.Stat(p)
		switch {
		case err != nil:
		case fi.IsDir():
			ops = append(ops, mountOp{[]string{"--tmpfs", p, "--remount-ro", p}, p})
		default:
			ops = append(ops, mountOp{[]string{"--ro-bind", "/dev/null", p}, p})
		}
	}
	// Last among equals: a Hide naming the job dir itself must not hide it.
	ops = append(ops, mountOp{[]string{"--bind", v.Dir, v.Dir}, v.Dir})
	slices.SortStableFunc(ops, func(a, b mountOp) int { return depth(a.target) - depth(b.target) })
	for _, op := range ops {
		args = append(args, op.args...)
	}
	cwd := v.Cwd
	if cwd == "" {
		cwd = v.Dir
	}
	args = append(args, "--chdir", cwd, "--")
	return append(args, argv...)
}

// findBwrap returns bwrap's path when it can build a sandbox as id here; a
// bwrap that is installed but cannot (no unprivileged user namespaces) is
// no use, and Start then runs without it.
func findBwrap(id identity) string {
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
		return ""
	}
	cmd := exec.Command(path, "--unshare-pid", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--", "true")
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	cmd.Dir = "/"
	if id.switchUser {
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Credential: &syscall.Credential{Uid: uint32(id.uid), Gid: uint32(id.gid), Groups: []uint32{}},
		}
	}
	if err := cmd.Run(); err != nil {
		return ""
	}
	return path
}
