package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// fakeV2 lays out what the kernel shows at a unified hierarchy's root.
func fakeV2(t *testing.T, controllers string) string {
	t.Helper()
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "cgroup.controllers"), []byte(controllers+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

func readBack(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read back: %v", err)
	}
	return strings.TrimSpace(string(b))
}

func TestDetectFindsV2(t *testing.T) {
	root := fakeV2(t, "cpuset cpu io memory pids")
	h, err := detectHierarchy(root, "/nonexistent")
	if err != nil {
		t.Fatal(err)
	}
	if h.version() != 2 {
		t.Fatalf("version = %d, want 2", h.version())
	}
	if got, want := h.controllers(), []string{"cpu", "cpuset", "memory", "pids"}; !slices.Equal(got, want) {
		t.Fatalf("controllers = %v, want %v", got, want)
	}
}

func TestV2CreateWritesLimits(t *testing.T) {
	root := fakeV2(t, "cpuset cpu io memory pids hugetlb")
	h := &cgroupV2{root: root}
	cg, err := h.create("job1-w0", Limits{CPUs: []int{2, 5}, MemBytes: 64 << 20, Pids: 32})
	if err != nil {
		t.Fatal(err)
	}
	job := filepath.Join(root, parentCgroup, "job1-w0")
	want := map[string]string{
		filepath.Join(root, "cgroup.subtree_control"):               "+cpu +cpuset +memory +pids",
		filepath.Join(root, parentCgroup, "cgroup.subtree_control"): "+cpu +cpuset +memory +pids",
		filepath.Join(job, "cpuset.cpus"):                           "2,5",
		filepath.Join(job, "cpu.max"):                               "200000 100000",
		filepath.Join(job, "memory.max"):                            "67108864",
		filepath.Join(job, "memory.swap.max"):                       "0",
		filepath.Join(job, "memory.oom.group"):                      "1",
		filepath.Join(job, "pids.max"):                              "32",
	}
	for path, v := range want {
		if got := readBack(t, path); got != v {
			t.Errorf("%s = %q, want %q", path, got, v)
		}
	}
	if cg.cloneDir() != job || cg.joinFiles() != nil {
		t.Errorf("v2 jobs are cloned into %s, got cloneDir %q joinFiles %v", job, cg.cloneDir(), cg.joinFiles())
	}
}

func TestV2CoresQuotaAndDefaults(t *testing.T) {
	root := fakeV2(t, "cpu memory pids")
	cg, err := (&cgroupV2{root: root}).create("j", Limits{Cores: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	job := cg.cloneDir()
	if got := readBack(t, filepath.Join(job, "cpu.max")); got != "50000 100000" {
		t.Errorf("cpu.max = %q, want half a core", got)
	}
	if got := readBack(t, filepath.Join(job, "pids.max")); got != "512" {
		t.Errorf("pids.max = %q, want the default 512", got)
	}
	for _, f := range []string{"cpuset.cpus", "memory.max"} {
		if _, err := os.Stat(filepath.Join(job, f)); err == nil {
			t.Errorf("%s written although no limit asked for it", f)
		}
	}
}

func TestV2RefusesWithoutEssentialControllers(t *testing.T) {
	root := fakeV2(t, "cpu cpuset io")
	_, err := (&cgroupV2{root: root}).create("j", Limits{})
	if !errors.Is(err, ErrUnsupported) {
		t.Fatalf("err = %v, want ErrUnsupported", err)
	}
	_, err = (&cgroupV2{root: fakeV2(t, "memory pids")}).create("j", Limits{CPUs: []int{0}})
	if !errors.Is(err, ErrUnsupported) {
		t.Fatalf("pinning without cpuset: err = %v, want ErrUnsupported", err)
	}
}

func TestV2Stats(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"memory.events": "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n",
		"pids.events":   "max 7\n",
		"cpu.stat":      "usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n",
		"memory.peak":   "4096\n",
	}
	for f, v := range files {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got := (&cgroupV2Job{dir: dir}).stats()
	want := cgroupStats{oomKilled: true, pidsLimited: true, cpu: 1500 * time.Millisecond, peak: 4096}
	if got != want {
		t.Fatalf("stats = %+v, want %+v", got, want)
	}
}

func TestV1CreateWritesLimits(t *testing.T) {
	base := t.TempDir()
	mounts := map[string]string{}
	for _, c := range []string{"cpu", "cpuacct", "cpuset", "memory", "pids", "freezer"} {
		mounts[c] = filepath.Join(base, c)
	}
	mounts["cpuacct"] = mounts["cpu"] // co-mounted, as on many distros
	// What the kernel shows: the root cpuset filled in, a new one empty. A
	// leftover memory/deepmarket/j holding a task (here: a file) is busy.
	files := map[string]string{
		"cpuset/cpuset.cpus":            "0-7",
		"cpuset/cpuset.mems":            "0",
		"cpuset/deepmarket/cpuset.cpus": "",
		"cpuset/deepmarket/cpuset.mems": "",
		"memory/deepmarket/j/tasks":     "1234",
	}
	for f, v := range files {
		p := filepath.Join(base, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := (&cgroupV1{mounts: mounts}).create("j", Limits{}); err == nil {
		t.Fatal("create over a busy cgroup dir succeeded")
	}
	if err := os.RemoveAll(filepath.Join(base, "memory/deepmarket/j")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"cpuset", "cpu", "pids", "freezer"} {
		if _, err := os.Stat(filepath.Join(mounts[c], parentCgroup, "j")); err == nil {
			t.Fatalf("failed create left %s/j behind", c)
		}
	}
	cg, err := (&cgroupV1{mounts: mounts}).create("j", Limits{CPUs: []int{3}, MemBytes: 1 << 30, Pids: 64})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"cpuset/deepmarket/cpuset.cpus":             "0-7",
		"cpuset/deepmarket/cpuset.mems":             "0",
		"cpuset/deepmarket/j/cpuset.cpus":           "3",
		"cpuset/deepmarket/j/cpuset.mems":           "0",
		"cpu/deepmarket/j/cpu.cfs_period_us":        "100000",
		"cpu/deepmarket/j/cpu.cfs_quota_us":         "100000",
		"memory/deepmarket/j/memory.limit_in_bytes": "1073741824",
		"pids/deepmarket/j/pids.max":                "64",
	}
	for f, v := range want {
		if got := readBack(t, filepath.Join(base, f)); got != v {
			t.Errorf("%s = %q, want %q", f, got, v)
		}
	}
	// No memsw file (no swap accounting): swappiness 0 is the fallback.
	if got := readBack(t, filepath.Join(base, "memory/deepmarket/j/memory.swappiness")); got != "0" {
		t.Errorf("memory.swappiness = %q, want 0 without memsw", got)
	}
	joins := cg.joinFiles()
	if len(joins) != 5 { // cpu and cpuacct share one
		t.Errorf("joinFiles = %v, want one cgroup.procs per distinct hierarchy (5)", joins)
	}
}

func TestParseV1Mounts(t *testing.T) {
	mi := `24 30 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
25 24 0:23 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct
26 24 0:24 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
27 24 0:25 / /sys/fs/cgroup/pids rw,nosuid - cgroup cgroup rw,pids
28 24 0:26 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
29 24 0:27 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd
`
	got := parseV1Mounts(strings.NewReader(mi))
	want := map[string]string{
		"cpu": "/sys/fs/cgroup/cpu,cpuacct", "cpuacct": "/sys/fs/cgroup/cpu,cpuacct",
		"memory": "/sys/fs/cgroup/memory", "pids": "/sys/fs/cgroup/pids",
	}
	if len(got) != len(want) {
		t.Fatalf("mounts = %v, want %v", got, want)
	}
	for c, m := range want {
		if got[c] != m {
			t.Errorf("%s at %q, want %q", c, got[c], m)
		}
	}
}

func TestSanitizeName(t *testing.T) {
	for in, want := range map[string]string{
		"job-42.w0":        "job-42.w0",
		"../../etc/passwd": ".._.._etc_passwd",
		"a b/c":            "a_b_c",
	} {
		got, err := sanitizeName(in)
		if err != nil || got != want {
			t.Errorf("sanitizeName(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", ".", ".."} {
		if _, err := sanitizeName(bad); err == nil {
			t.Errorf("sanitizeName(%q) accepted a name that is not a directory", bad)
		}
	}
}

func TestBuildEnvIsCleanAndGPUsWin(t *testing.T) {
	t.Setenv("DEEPMARKET_API_TOKEN", "s3cret")
	s := Spec{Dir: "/jobs/j", Env: []string{"PATH=/venv/bin:/usr/bin", "CUDA_VISIBLE_DEVICES=0,1,2,3", "TF_CONFIG={}"},
		Limits: Limits{GPUs: []int{1}}}
	env := buildEnv(s)
	get := func(k string) string { return envValue(env, k) }
	if strings.Contains(strings.Join(env, "\n"), "s3cret") {
		t.Fatalf("node env leaked: %v", env)
	}
	checks := map[string]string{
		"PATH": "/venv/bin:/usr/bin", "HOME": "/jobs/j", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
		"TF_CONFIG": "{}", "CUDA_VISIBLE_DEVICES": "1", "NVIDIA_VISIBLE_DEVICES": "1",
	}
	for k, v := range checks {
		if get(k) != v {
			t.Errorf("%s = %q, want %q", k, get(k), v)
		}
	}
	none := buildEnv(Spec{Dir: "/j"})
	if !slices.Contains(none, "CUDA_VISIBLE_DEVICES=") || !slices.Contains(none, "NVIDIA_VISIBLE_DEVICES=") {
		t.Errorf("no GPUs must hide them all: %v", none)
	}
}

func envValue(env []string, key string) string {
	v := ""
	for _, kv := range env {
		if k, val, ok := strings.Cut(kv, "="); ok && k == key {
			v = val
		}
	}
	return v
}

// argIndex finds the option sequence opt... in args.
func argIndex(args []string, opt ...string) int {
	for i := range args {
		if i+len(opt) <= len(args) && slices.Equal(args[i:i+len(opt)], opt) {
			return i
		}
	}
	return -1
}

func TestBwrapArgsNesting(t *testing.T) {
	base := t.TempDir()
	for _, d := range []string{"home/alice/venv", "data/secret", "jobs/j/tmp"} {
		if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	home, venv := filepath.Join(base, "home/alice"), filepath.Join(base, "home/alice/venv")
	data, secret := filepath.Join(base, "data"), filepath.Join(base, "data/secret")
	dir := filepath.Join(base, "jobs/j")
	args := bwrapArgs("/usr/bin/bwrap", bwrapView{
		Dir:      dir,
		ReadOnly: []string{venv, data, home},
		Hide:     []string{home, secret, dir, "/root"},
	}, []string{"python3", "-c", "pass"})
	if argIndex(args, "--unshare-net") >= 0 {
		t.Error("a job given a network namespace must not get another")
	}
	if own := bwrapArgs("/usr/bin/bwrap", bwrapView{Dir: dir, OwnNet: true}, []string{"true"}); argIndex(own, "--unshare-net") < 0 {
		t.Error("a job given no network namespace must get one of its own, never the host's")
	}

	if args[0] != "/usr/bin/bwrap" || !slices.Equal(args[len(args)-4:], []string{"--", "python3", "-c", "pass"}) {
		t.Fatalf("command not at the end: %v", args)
	}
	roHome := argIndex(args, "--ro-bind", home, home)
	hideHome := argIndex(args, "--tmpfs", home)
	roVenv := argIndex(args, "--ro-bind", venv, venv)
	roData := argIndex(args, "--ro-bind", data, data)
	hideSecret := argIndex(args, "--tmpfs", secret)
	bindDir := argIndex(args, "--bind", dir, dir)
	hideDir := argIndex(args, "--tmpfs", dir)
	if roHome < 0 || hideHome < 0 || roVenv < 0 || roData < 0 || hideSecret < 0 || bindDir < 0 || hideDir < 0 {
		t.Fatalf("missing mounts in %v", args)
	}
	if !(roHome < hideHome && hideHome < roVenv) {
		t.Error("a home both read-only and hidden must end hidden, with a venv inside it still visible")
	}
	if !(roData < hideSecret) {
		t.Error("a hidden path inside a read-only dataset must be hidden after the dataset is mounted")
	}
	if !(hideDir < bindDir) {
		t.Error("the job dir must win over a Hide naming it")
	}
	if argIndex(args, "--tmpfs", "/root") >= 0 {
		t.Error("/root is not mounted at all, so it needs no tmpfs over it")
	}
	if argIndex(args, "--bind", filepath.Join(dir, "tmp"), "/tmp") < 0 || argIndex(args, "--bind", filepath.Join(dir, "tmp"), "/var/tmp") < 0 {
		t.Error("/tmp and /var/tmp must be the job's own, inside its dir")
	}
	for _, opt := range [][]string{{"--unshare-user"}, {"--disable-userns"}, {"--unshare-pid"}, {"--unshare-ipc"},
		{"--proc", "/proc"}, {"--dev", "/dev"}, {"--tmpfs", "/dev/shm"}, {"--remount-ro", "/"}, {"--new-session"}} {
		if argIndex(args, opt...) < 0 {
			t.Errorf("missing %v in %v", opt, args)
		}
	}
	if argIndex(args, "--die-with-parent") >= 0 {
		t.Error("--die-with-parent kills the job when the Go thread that started it exits")
	}
	// The host's sockets and runtime state are nowhere in the view.
	for _, p := range []string{"/run", "/var/run", "/run/systemd/resolve", "/home", "/root"} {
		if argIndex(args, "--ro-bind", p, p) >= 0 || argIndex(args, "--bind", p, p) >= 0 {
			t.Errorf("%s is mounted into the sandbox", p)
		}
	}
	// Mounts come before the job's own dir is bound, and the job's
	// program comes after everything.
	if argIndex(args, "--remount-ro", "/") > argIndex(args, "--chdir") {
		t.Error("the root must be read-only before the job starts")
	}
	if argIndex(args, "--dev-bind-try", "/dev/nvidiactl", "/dev/nvidiactl") >= 0 {
		t.Error("a job without GPUs must not get GPU device nodes")
	}
}

func TestDirUsageCountsBlocksOnce(t *testing.T) {
	dir := t.TempDir()
	data := make([]byte, 256<<10)
	for i := range data {
		data[i] = 1 // not sparse
	}
	if err := os.WriteFile(filepath.Join(dir, "a"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(dir, "a"), filepath.Join(dir, "b")); err != nil {
		t.Fatal(err)
	}
	got := dirUsage(dir)
	if got < 256<<10 || got >= 2*(256<<10) {
		t.Fatalf("usage = %d, want the 256 KiB file counted once", got)
	}
}

func TestCapabilitiesEssential(t *testing.T) {
	ok := Capabilities{Root: true, CgroupVersion: 1, Controllers: []string{"cpu", "memory", "pids"}, Bwrap: "/usr/bin/bwrap",
		Problems: []string{"swap is not limited"}}
	if err := ok.Essential(); err != nil {
		t.Fatalf("everything there: %v", err)
	}
	missing := Capabilities{Missing: []string{"bubblewrap (bwrap) is not installed: " + bwrapInstall}}
	err := missing.Essential()
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "apt-get install bubblewrap") {
		t.Errorf("err = %v, want ErrUnsupported saying how to install bubblewrap", err)
	}
}

func TestParseBwrapVersion(t *testing.T) {
	for in, want := range map[string][3]int{"bubblewrap 0.8.0\n": {0, 8, 0}, "bubblewrap 0.11.0": {0, 11, 0}, "bubblewrap 0.4": {0, 4, 0}} {
		if got, ok := parseBwrapVersion(in); !ok || got != want {
			t.Errorf("parseBwrapVersion(%q) = %v, %v; want %v", in, got, ok, want)
		}
	}
}

func TestCheckCgroup(t *testing.T) {
	v1 := "9:name=systemd:/\n8:pids:/deepmarket/j\n4:memory:/deepmarket/j\n2:cpu,cpuacct:/deepmarket/j\n0::/\n"
	if err := checkCgroup(v1, "/deepmarket/j", []string{"cpu", "cpuacct", "memory", "pids"}); err != nil {
		t.Errorf("joined every v1 hierarchy: %v", err)
	}
	if err := checkCgroup(v1, "/deepmarket/j", []string{"memory", "pids", "freezer"}); err == nil {
		t.Error("freezer hierarchy not joined, yet accepted")
	}
	if err := checkCgroup(strings.Replace(v1, "4:memory:/deepmarket/j", "4:memory:/", 1), "/deepmarket/j", []string{"memory"}); err == nil {
		t.Error("a job outside its memory cgroup was accepted")
	}
	if err := checkCgroup("0::/deepmarket/j\n", "/deepmarket/j", nil); err != nil {
		t.Errorf("v2 job in its cgroup: %v", err)
	}
	if err := checkCgroup("0::/user.slice\n", "/deepmarket/j", nil); err == nil {
		t.Error("v2 job outside its cgroup was accepted")
	}
}

// A job's /dev has the device nodes of its own GPUs only.
func TestDeviceArgsBindTheJobsGPUsOnly(t *testing.T) {
	args := strings.Join(deviceArgs([]int{1}), " ")
	if !strings.Contains(args, "/dev/nvidia1 /dev/nvidia1") || strings.Contains(args, "/dev/nvidia0") || !strings.Contains(args, "/dev/nvidiactl") {
		t.Fatalf("one GPU: %s", args)
	}
	if args := strings.Join(deviceArgs(nil), " "); strings.Contains(args, "nvidia") {
		t.Fatalf("no GPUs: %s", args)
	}
}

// TestCgroupArgs: a job's cgroup tree is its own cgroup alone: on v2 its
// dir at the root; on v1 its dir in each hierarchy at that hierarchy's
// mount point, a co-mounted hierarchy's other name kept as a link, over
// an empty read-only tmpfs that hides the rest.
func TestCgroupArgs(t *testing.T) {
	root := t.TempDir()
	if got, want := cgroupArgs(root, map[string]string{root: root + "/deepmarket/j"}), []string{"--ro-bind", root + "/deepmarket/j", root}; !slices.Equal(got, want) {
		t.Errorf("v2: %q, want %q", got, want)
	}
	for _, d := range []string{"cpu,cpuacct", "memory", "unified", "systemd"} {
		if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{"cpu": "cpu,cpuacct", "cpuacct": "cpu,cpuacct", "elsewhere": "/sys/fs/cgroup/memory"} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	h := &cgroupV1{mounts: map[string]string{"cpu": root + "/cpu,cpuacct", "cpuacct": root + "/cpu,cpuacct", "memory": root + "/memory"}}
	got := cgroupArgs(root, h.jobDirs("j"))
	want := []string{"--tmpfs", root,
		"--symlink", "cpu,cpuacct", root + "/cpu",
		"--ro-bind", root + "/cpu,cpuacct/deepmarket/j", root + "/cpu,cpuacct",
		"--symlink", "cpu,cpuacct", root + "/cpuacct",
		"--ro-bind", root + "/memory/deepmarket/j", root + "/memory",
		"--remount-ro", root}
	if !slices.Equal(got, want) {
		t.Errorf("v1:\n%q\nwant\n%q", got, want)
	}
}

// TestDriverLibsInDirs: where the linker's cache lists no driver, its
// libraries are found by name in the directories given (the first one's
// of each name); other files, directories and relative paths are not.
func TestDriverLibsInDirs(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	for _, f := range []string{filepath.Join(a, "libcuda.so.1"), filepath.Join(a, "libcudart.so.13"), filepath.Join(b, "libcuda.so.1"),
		filepath.Join(b, "libnvidia-ml.so.580.1")} {
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(b, "libcuda.so.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	got := driverLibsInDirs([]string{"relative", a, b, "/nonexistent"})
	want := []string{filepath.Join(a, "libcuda.so.1"), filepath.Join(b, "libnvidia-ml.so.580.1")}
	if !slices.Equal(got, want) {
		t.Errorf("driver libraries %q, want %q", got, want)
	}
}

// TestDriverLibsInLdconfig: the driver's 64-bit libraries are picked out
// of the dynamic linker's cache; other libraries and 32-bit ones are not.
func TestDriverLibsInLdconfig(t *testing.T) {
	cache := []byte(`1234 libs found in cache "/etc/ld.so.cache"
	libnvidia-ml.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1
	libcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1
	libcuda.so.1 (libc6) => /usr/lib/i386-linux-gnu/libcuda.so.1
	libcudart.so.12 (libc6,x86-64) => /usr/local/cuda/lib64/libcudart.so.12
	libc.so.6 (libc6,x86-64, OS ABI: Linux 3.2.0) => /lib/x86_64-linux-gnu/libc.so.6
`)
	got := driverLibsIn(cache)
	want := []string{"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"}
	if !slices.Equal(got, want) {
		t.Errorf("driver libraries %q, want %q", got, want)
	}
	for _, tc := range []struct{ ld, path, wantLD, wantPath string }{
		{"", "/usr/bin", "/usr/local/nvidia/lib64", "/usr/bin:/usr/local/nvidia/bin"},
		{"/usr/local/nvidia/lib:/usr/local/nvidia/lib64", "/usr/local/nvidia/bin:/usr/bin", "/usr/local/nvidia/lib:/usr/local/nvidia/lib64", "/usr/local/nvidia/bin:/usr/bin"},
	} {
		if ld, path := withDriverPaths(tc.ld, tc.path); ld != tc.wantLD || path != tc.wantPath {
			t.Errorf("withDriverPaths(%q, %q) = %q, %q; want %q, %q", tc.ld, tc.path, ld, path, tc.wantLD, tc.wantPath)
		}
	}
}
