package sandbox

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/internal/testutil"
)

// These tests start real jobs in real sandboxes and so need root, cgroups
// and bubblewrap; under DM_REQUIRE_ROOT=1 they fail where these are
// missing. Each job runs as a uid of its own, leased from DefaultIDs.

var (
	probeOnce sync.Once
	probeErr  error
)

func needRoot(t testing.TB) {
	t.Helper()
	testutil.NeedRoot(t, func() error {
		probeOnce.Do(func() { probeErr = Probe().Essential() })
		return probeErr
	})
}

// jobDir makes a job dir the job's uid can reach: t.TempDir's own dir is
// 0700 root, which no job could enter.
func jobDir(t testing.TB) string {
	t.Helper()
	base, err := os.MkdirTemp("", "sandbox-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(base, "job")
}

// readOnlyBase makes a dir for data that jobs may be given read-only:
// not under /tmp, which CheckReadOnly refuses.
func readOnlyBase(t testing.TB) string {
	t.Helper()
	for _, parent := range []string{"/srv", "/var/cache", "/opt"} {
		if _, err := os.Stat(parent); err != nil {
			continue
		}
		base, err := os.MkdirTemp(parent, "deepmarket-sandbox-test-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(base) })
		if err := os.Chmod(base, 0o755); err != nil {
			t.Fatal(err)
		}
		return base
	}
	t.Fatal("no /srv, /var/cache or /opt to put read-only test data in")
	return ""
}

// spec is a job named after the test, with output captured in out.
func spec(t *testing.T, out *bytes.Buffer, argv ...string) Spec {
	s := Spec{
		Name: strings.NewReplacer("/", "-").Replace(t.Name()),
		Dir:  jobDir(t),
		Argv: argv,
	}
	if out != nil {
		s.Stdout, s.Stderr = out, out
	}
	return s
}

func run(t *testing.T, s Spec) Exit {
	t.Helper()
	p, err := Start(t.Context(), s)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	e, err := p.Wait()
	if err != nil {
		t.Fatalf("Wait: %v", err)
	}
	return e
}

// cgroupPaths are the job's cgroup dirs, all of which must be gone after Wait.
func cgroupPaths(p *Process) []string {
	switch cg := p.cg.(type) {
	case *cgroupV1Job:
		var ds []string
		for _, d := range cg.dirs {
			ds = append(ds, d)
		}
		return ds
	case *cgroupV2Job:
		return []string{cg.dir}
	}
	return nil
}

func assertCgroupGone(t *testing.T, p *Process) {
	t.Helper()
	for _, d := range cgroupPaths(p) {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("cgroup %s still exists after Wait", d)
		}
	}
}

// liveProcsOfUID lists the processes (zombies aside) running as uid.
func liveProcsOfUID(t *testing.T, uid int) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		var state string
		var ruid int
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "State:"); ok {
				state = strings.TrimSpace(v)
			}
			if v, ok := strings.CutPrefix(line, "Uid:"); ok {
				ruid, _ = strconv.Atoi(strings.Fields(v)[0])
			}
		}
		if ruid == uid && !strings.HasPrefix(state, "Z") {
			pids = append(pids, pid)
		}
	}
	return pids
}

func procStatus(t *testing.T, pid int, key string) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, key+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no %s in /proc/%d/status", key, pid)
	return ""
}

func TestProbe(t *testing.T) {
	needRoot(t)
	c := Probe()
	t.Logf("capabilities: %+v", c)
	if err := c.Essential(); err != nil {
		t.Fatalf("root with cgroups and bubblewrap, yet: %v", err)
	}
	if !c.Root || c.Bwrap == "" || c.CgroupVersion == 0 {
		t.Errorf("capabilities %+v: want root, cgroups and bubblewrap", c)
	}
}

func TestCPUPinningAndQuota(t *testing.T) {
	needRoot(t)
	// The highest online CPU: pinning there differs from the default.
	online := readOrEmpty("/sys/devices/system/cpu/online") // "0-1" or "0,2-3"
	last, err := strconv.Atoi(online[strings.LastIndexAny(online, "-,")+1:])
	if err != nil {
		t.Fatalf("parse online CPUs %q: %v", online, err)
	}
	var out bytes.Buffer
	s := spec(t, &out, "sleep", "600")
	s.Limits = Limits{CPUs: []int{last}, MemBytes: 256 << 20, Pids: 64}
	p, err := Start(t.Context(), s)
	if err != nil {
		t.Fatal(err)
	}
	// Start returns after the exec, so the job is already confined.
	pids, err := p.cg.pids()
	if err != nil || len(pids) == 0 {
		t.Fatalf("cgroup holds %v (%v), want the job", pids, err)
	}
	for _, pid := range pids {
		if got := procStatus(t, pid, "Cpus_allowed_list"); got != strconv.Itoa(last) {
			t.Errorf("pid %d Cpus_allowed_list = %q, want %d", pid, got, last)
		}
		if got := procStatus(t, pid, "Uid"); strings.Fields(got)[0] == "0" {
			t.Errorf("pid %d runs as root", pid)
		}
	}
	files := map[string]string{}
	switch cg := p.cg.(type) {
	case *cgroupV1Job:
		files[filepath.Join(cg.dirs["cpuset"], "cpuset.cpus")] = strconv.Itoa(last)
		files[filepath.Join(cg.dirs["cpu"], "cpu.cfs_quota_us")] = "100000"
		files[filepath.Join(cg.dirs["cpu"], "cpu.cfs_period_us")] = "100000"
		files[filepath.Join(cg.dirs["memory"], "memory.limit_in_bytes")] = strconv.Itoa(256 << 20)
		files[filepath.Join(cg.dirs["pids"], "pids.max")] = "64"
	case *cgroupV2Job:
		files[filepath.Join(cg.dir, "cpuset.cpus")] = strconv.Itoa(last)
		files[filepath.Join(cg.dir, "cpu.max")] = "100000 100000"
		files[filepath.Join(cg.dir, "memory.max")] = strconv.Itoa(256 << 20)
		files[filepath.Join(cg.dir, "pids.max")] = "64"
	}
	for f, want := range files {
		if got := readBack(t, f); got != want {
			t.Errorf("%s = %q, want %q", f, got, want)
		}
	}
	p.Stop(10 * time.Second)
	e, err := p.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if !e.Stopped || e.Signal != "SIGTERM" {
		t.Errorf("exit = %+v, want stopped by SIGTERM", e)
	}
	assertCgroupGone(t, p)
}

func readOrEmpty(path string) string {
	b, _ := os.ReadFile(path)
	return strings.TrimSpace(string(b))
}

func TestCoresQuotaWithoutPinning(t *testing.T) {
	needRoot(t)
	var out bytes.Buffer
	s := spec(t, &out, "sleep", "600")
	s.Limits = Limits{Cores: 1.5}
	p, err := Start(t.Context(), s)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Wait()
	defer p.Stop(0)
	switch cg := p.cg.(type) {
	case *cgroupV1Job:
		if got := readBack(t, filepath.Join(cg.dirs["cpu"], "cpu.cfs_quota_us")); got != "150000" {
			t.Errorf("cfs_quota_us = %s, want 1.5 cores", got)
		}
		if got, want := readBack(t, filepath.Join(cg.dirs["cpuset"], "cpuset.cpus")), readOrEmpty(filepath.Join(filepath.Dir(cg.dirs["cpuset"]), "cpuset.cpus")); got != want {
			t.Errorf("unpinned job cpuset = %q, want every CPU %q", got, want)
		}
	case *cgroupV2Job:
		if got := readBack(t, filepath.Join(cg.dir, "cpu.max")); got != "150000 100000" {
			t.Errorf("cpu.max = %s, want 1.5 cores", got)
		}
	}
}

func TestMemoryHogIsOOMKilled(t *testing.T) {
	needRoot(t)
	var out bytes.Buffer
	// dd fills a 512 MiB buffer from /dev/zero, touching every page.
	s := spec(t, &out, "dd", "if=/dev/zero", "of=/dev/null", "bs=512M", "count=1")
	s.Limits = Limits{MemBytes: 64 << 20}
	e := run(t, s)
	if !e.OOMKilled || e.Signal != "SIGKILL" {
		t.Fatalf("exit = %+v (output %q), want OOM-killed by SIGKILL", e, out.String())
	}
	if e.MaxRSS > 64<<20 {
		t.Errorf("peak memory %d exceeds the 64 MiB limit", e.MaxRSS)
	}
	// This test process, outside the job's cgroup, is evidently alive.
}

func TestForkBombHitsPidsLimit(t *testing.T) {
	needRoot(t)
	var out bytes.Buffer
	// The bomb saturates pids.max; the main shell then starts sleepers
	// until a fork fails, which ends it (sh exits on "Cannot fork") and
	// leaves the cgroup full of processes for Wait to kill.
	script := `b() { b | b & }; b; while :; do sleep 600 & done`
	s := spec(t, &out, "sh", "-c", script)
	s.Limits = Limits{Pids: 32, MemBytes: 512 << 20}
	p, err := Start(t.Context(), s)
	if err != nil {
		t.Fatal(err)
	}
	e, err := p.Wait()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("exit: %+v", e)
	if !e.PidsLimited {
		t.Errorf("exit = %+v, want PidsLimited", e)
	}
	assertCgroupGone(t, p)
	if left := liveProcsOfUID(t, p.UID()); len(left) > 0 {
		t.Errorf("processes of the job user survive the job: %v", left)
	}
}

func TestJobCannotReadOtherUsersFiles(t *testing.T) {
	needRoot(t)
	rootSecret := filepath.Join("/root", fmt.Sprintf("deepmarket-sandbox-secret-%d", os.Getpid()))
	if err := os.WriteFile(rootSecret, []byte("CONTENT-0f-root"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(rootSecret) })
	// Another user's private home, readable inside by mode, closed at the top.
	base := filepath.Dir(jobDir(t))
	home := filepath.Join(base, "alice")
	if err := os.Mkdir(home, 0o700); err != nil {
		t.Fatal(err)
	}
	homeSecret := filepath.Join(home, "notes")
	if err := os.WriteFile(homeSecret, []byte("CONTENT-0f-alice"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{home, homeSecret} {
		if err := os.Chown(p, 4242, 4242); err != nil {
			t.Fatal(err)
		}
	}
	for _, secret := range []string{rootSecret, homeSecret} {
		var out bytes.Buffer
		e := run(t, spec(t, &out, "cat", secret))
		if e.Code == 0 || strings.Contains(out.String(), "CONTENT-0f") {
			t.Errorf("cat %s: exit %+v, output %q; want a failure", secret, e, out.String())
		}
	}
}

func TestBwrapHidesPaths(t *testing.T) {
	needRoot(t)
	base := readOnlyBase(t)
	data := filepath.Join(base, "data")
	for _, d := range []string{filepath.Join(data, "private")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for f, v := range map[string]string{"data/train.csv": "rows", "data/private/key": "hidden-key"} {
		if err := os.WriteFile(filepath.Join(base, f), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	s := spec(t, &out, "sh", "-c",
		`cat "$1/train.csv"; echo; cat "$1/private/key"; echo; ls /home /root 2>&1; echo; cat /proc/1/cmdline; echo; touch /usr/x 2>&1`, "sh", data)
	s.ReadOnly = []string{data}
	s.Hide = []string{filepath.Join(data, "private")}
	e := run(t, s)
	got := out.String()
	if !strings.Contains(got, "rows") {
		t.Errorf("the read-only dataset is not readable: %q", got)
	}
	if strings.Contains(got, "hidden-key") {
		t.Errorf("a Hide path inside the dataset was readable: %q", got)
	}
	if strings.Contains(got, "cloudsdk") || !strings.Contains(got, "/root") {
		t.Errorf("homes must be absent: %q", got)
	}
	if !strings.Contains(got, "Read-only file system") && !strings.Contains(got, "Permission denied") {
		t.Errorf("/usr must be read-only: %q", got)
	}
	if e.Code == 0 {
		t.Errorf("exit = %+v, want the failed touch's status", e)
	}
}

func TestDiskBound(t *testing.T) {
	needRoot(t)
	t.Run("many files", func(t *testing.T) {
		var out bytes.Buffer
		// Each file fits RLIMIT_FSIZE; together they break the bound, and
		// only the watchdog can end the sleep.
		s := spec(t, &out, "sh", "-c",
			`for i in 1 2 3 4; do head -c 600000 /dev/zero > f$i; done; exec sleep 600`)
		s.Limits = Limits{DiskBytes: 1 << 20}
		e := run(t, s)
		if !e.DiskExceeded || e.Stopped || e.Signal != "SIGKILL" {
			t.Fatalf("exit = %+v (output %q), want killed for disk use", e, out.String())
		}
	})
	t.Run("one big file", func(t *testing.T) {
		var out bytes.Buffer
		s := spec(t, &out, "dd", "if=/dev/zero", "of=big", "bs=64K", "count=64")
		s.Limits = Limits{DiskBytes: 1 << 20}
		e := run(t, s)
		if !e.DiskExceeded || e.Signal != "SIGXFSZ" {
			t.Fatalf("exit = %+v (output %q), want SIGXFSZ", e, out.String())
		}
		fi, err := os.Stat(filepath.Join(s.Dir, "big"))
		if err != nil || fi.Size() > 1<<20 {
			t.Fatalf("big file: %v, %v; want at most 1 MiB", fi, err)
		}
	})
}

func TestEnvDoesNotLeak(t *testing.T) {
	needRoot(t)
	t.Setenv("DEEPMARKET_API_TOKEN", "tok-should-not-leak")
	var out bytes.Buffer
	s := spec(t, &out, "env")
	s.Env = []string{"TF_CONFIG={\"task\":0}"}
	s.Limits.GPUs = []int{0, 2}
	e := run(t, s)
	got := out.String()
	if e.Code != 0 {
		t.Fatalf("env failed: %+v %q", e, got)
	}
	if strings.Contains(got, "tok-should-not-leak") || strings.Contains(got, "DEEPMARKET_API_TOKEN") || strings.Contains(got, trampolineEnv) {
		t.Errorf("the node's environment leaked into the job:\n%s", got)
	}
	for _, want := range []string{"HOME=" + s.Dir + "\n", "TMPDIR=/tmp\n", "TF_CONFIG={\"task\":0}\n", "CUDA_VISIBLE_DEVICES=0,2\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("job env lacks %q:\n%s", want, got)
		}
	}
}

func TestStopKillsDoubleForkedProcess(t *testing.T) {
	needRoot(t)
	var out bytes.Buffer
	// Everything ignores SIGTERM, so only the SIGKILL after the grace
	// ends it. The inner shell starts a sleep and exits, so that sleep is
	// reparented away from the job's tree.
	s := spec(t, &out, "sh", "-c",
		`trap "" TERM; sh -c 'sleep 600 & echo up > ready'; exec sleep 600`)
	p, err := Start(t.Context(), s)
	if err != nil {
		t.Fatal(err)
	}
	waitForFile(t, filepath.Join(s.Dir, "ready"))
	before, _ := p.cg.pids()
	if len(before) < 2 {
		t.Fatalf("cgroup holds %v, want the job and its daemon", before)
	}
	stopKillsWhole(t, p, before)
}

func TestStopGivesTheJobItsGrace(t *testing.T) {
	needRoot(t)
	var out bytes.Buffer
	// A worker that saves its state on SIGTERM; under bwrap the SIGTERM
	// must reach it, not the bwrap processes whose death would end it.
	s := spec(t, &out, "sh", "-c",
		`trap 'echo saved > state; exit 0' TERM; echo up > ready; sleep 600 & wait`)
	p, err := Start(t.Context(), s)
	if err != nil {
		t.Fatal(err)
	}
	waitForFile(t, filepath.Join(s.Dir, "ready"))
	p.Stop(time.Minute)
	e, err := p.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if !e.Stopped || e.Code != 0 || e.Signal != "" {
		t.Errorf("exit = %+v, want a clean exit from the job's SIGTERM handler", e)
	}
	if got := readOrEmpty(filepath.Join(s.Dir, "state")); got != "saved" {
		t.Errorf("state = %q, want the handler's output", got)
	}
}

// waitForFile polls until path exists; the test's own timeout bounds it.
func waitForFile(t *testing.T, path string) {
	t.Helper()
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestWaitKillsLeftovers(t *testing.T) {
	needRoot(t)
	var out bytes.Buffer
	// The main process exits at once, leaving a daemon behind.
	s := spec(t, &out, "sh", "-c", `(trap "" TERM HUP; exec sleep 600) & echo started`)
	p, err := Start(t.Context(), s)
	if err != nil {
		t.Fatal(err)
	}
	e, err := p.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if e.Code != 0 || !strings.Contains(out.String(), "started") {
		t.Fatalf("exit = %+v, output %q", e, out.String())
	}
	if left := liveProcsOfUID(t, p.UID()); len(left) > 0 {
		t.Errorf("the job's daemon outlived Wait: %v", left)
	}
}

func procStateOrZ(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return "Z" // gone
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "State:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "Z"
}

func TestStartErrors(t *testing.T) {
	needRoot(t)
	// A program that does not exist fails inside the sandbox, as the job.
	var out bytes.Buffer
	e := run(t, spec(t, &out, "no-such-program-xyz"))
	if e.Code == 0 || !strings.Contains(out.String(), "No such file") {
		t.Errorf("exit = %+v, output %q; want the program not found", e, out.String())
	}
	// A job dir under root's 0700 home is unreachable for a job's uid.
	bad := Spec{Name: "bad", Dir: filepath.Join("/root", fmt.Sprintf("deepmarket-job-%d", os.Getpid())), Argv: []string{"true"}}
	t.Cleanup(func() { os.RemoveAll(bad.Dir) })
	if _, err := Start(t.Context(), bad); err == nil || !strings.Contains(err.Error(), "not reachable") {
		t.Errorf("err = %v, want the job dir reported unreachable", err)
	}
	h, _ := machine()
	if v1, ok := h.(*cgroupV1); ok {
		for _, d := range v1.dirs("bad") {
			if _, err := os.Stat(d); err == nil {
				t.Errorf("failed Start left cgroup %s", d)
			}
		}
	}
	// A read-only path that would unmask the host is refused.
	for _, ro := range []string{"/", "/proc", "/run", "/tmp", "/home"} {
		s := spec(t, &out, "true")
		s.ReadOnly = []string{ro}
		if _, err := Start(t.Context(), s); err == nil {
			t.Errorf("ReadOnly %s: Start succeeded", ro)
		}
	}
}

func TestContextCancelStopsJob(t *testing.T) {
	needRoot(t)
	var out bytes.Buffer
	ctx, cancel := contextWithCancel(t)
	p, err := Start(ctx, spec(t, &out, "sleep", "600"))
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	e, err := p.Wait()
	if err != nil || !e.Stopped || e.Signal != "SIGTERM" {
		t.Fatalf("exit = %+v, %v; want stopped by SIGTERM", e, err)
	}
}

func contextWithCancel(t *testing.T) (context.Context, context.CancelFunc) {
	return context.WithCancel(t.Context())
}

// TestNetNSKeepsListenersOffTheNetwork: a job that binds every interface
// (as TensorFlow's gRPC server does) is reachable only through its
// namespace's loopback, never from the host's addresses.
func TestNetNSKeepsListenersOffTheNetwork(t *testing.T) {
	needRoot(t)
	ns, err := NewNetNS()
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	var out bytes.Buffer
	port := 20000 + int(time.Now().UnixNano()%10000)
	s := spec(t, &out, "python3", "-c", fmt.Sprintf(
		"import socket,time\ns=socket.socket(socket.AF_INET6)\ns.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)\n"+
			"s.bind(('::', %d)); s.listen(); print('listening', flush=True)\nc,_=s.accept(); c.sendall(b'hi'); c.close(); time.sleep(1)", port))
	s.NetNS = ns
	p, err := Start(t.Context(), s)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop(time.Second)
	// The node's own network cannot reach it, on any address.
	var c *net.TCPConn
	for range 50 {
		if c, err = ns.DialTCP(t.Context(), port); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("inside the namespace the job's port does not answer: %v (%s)", err, out.String())
	}
	b := make([]byte, 2)
	if _, err := io.ReadFull(c, b); err != nil || string(b) != "hi" {
		t.Errorf("read %q %v", b, err)
	}
	c.Close()
	addrs, _ := net.InterfaceAddrs()
	for _, a := range append(addrs, &net.IPNet{IP: net.IPv4(127, 0, 0, 1)}) {
		ip := a.(*net.IPNet).IP
		if hc, err := net.DialTimeout("tcp", net.JoinHostPort(ip.String(), strconv.Itoa(port)), time.Second); err == nil {
			hc.Close()
			t.Errorf("the job's port answers on the host's %s", ip)
		}
	}
	p.Wait()
}

// TestJobOutlivesTheThreadThatStartedIt: Go ends an OS thread whose
// goroutine locked it and returned (as entering a network namespace
// does); a job started from that thread must run on, which a parent-death
// signal (bwrap's --die-with-parent) would not let it.
func TestJobOutlivesTheThreadThatStartedIt(t *testing.T) {
	needRoot(t)
	var out lockedBuffer
	s := spec(t, nil, "sh", "-c", "echo up > ready; sleep 2; echo survived")
	s.Stdout, s.Stderr = &out, &out
	started := make(chan *Process, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		p, err := Start(context.Background(), s)
		if err != nil {
			t.Error(err)
		}
		if err == nil {
			waitForFile(t, filepath.Join(s.Dir, "ready")) // bwrap is set up
		}
		started <- p
	}()
	p := <-started
	if p == nil {
		t.FailNow()
	}
	e, err := p.Wait()
	if err != nil || e.Code != 0 || !strings.Contains(out.String(), "survived") {
		t.Errorf("exit = %+v, %v, output %q; want the job to finish", e, err, out.String())
	}
}

// stopKillsWhole stops p with a short grace and checks that the SIGKILL
// after it ended the whole job: every process its cgroup held before
// (before), every process of its user, and the cgroup itself.
func stopKillsWhole(t *testing.T, p *Process, before []int) {
	t.Helper()
	p.Stop(200 * time.Millisecond)
	e, err := p.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if !e.Stopped || e.Signal != "SIGKILL" {
		t.Errorf("exit = %+v, want Stopped by SIGKILL", e)
	}
	for _, pid := range before {
		if err := syscall.Kill(pid, 0); err == nil && !strings.HasPrefix(procStateOrZ(pid), "Z") {
			t.Errorf("pid %d of the job survived Stop", pid)
		}
	}
	if left := liveProcsOfUID(t, p.UID()); len(left) > 0 {
		t.Errorf("processes of the job user survive Stop: %v", left)
	}
	assertCgroupGone(t, p)
}

// A machine of known size keeps its jobs under its own cgroup: with a
// nested parent the job's cgroup is made under it, on every hierarchy
// (v1's cpuset levels filled in on the way), and holds the job.
func TestJobsUnderANestedParent(t *testing.T) {
	needRoot(t)
	nested := "deepmarket-test-machine/m1/deepmarket"
	if err := SetCgroupParent(nested); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		parentCgroup = DefaultCgroupParent
		h, _ := machine()
		for root := range h.jobDirs("x") { // keyed by mount point
			for _, p := range []string{nested, "deepmarket-test-machine/m1", "deepmarket-test-machine"} {
				_ = syscall.Rmdir(filepath.Join(root, p))
			}
		}
	})
	for _, bad := range []string{"", "/abs", "a/../b", "a//b", "a/cgroup.procs", "."} {
		if err := SetCgroupParent(bad); err == nil {
			t.Errorf("SetCgroupParent(%q) accepted", bad)
		}
	}
	if parentCgroup != nested {
		t.Fatalf("a refused parent changed it to %q", parentCgroup)
	}
	// The machine has half a core; the job asks for one: v1 refuses a
	// child's quota above its parent's, so the job gets the machine's.
	h, err := machine()
	if err != nil {
		t.Fatal(err)
	}
	var machineQuota string
	if v1, ok := h.(*cgroupV1); ok {
		m := filepath.Join(v1.mounts["cpu"], "deepmarket-test-machine", "m1")
		if err := os.MkdirAll(m, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := writeFile(filepath.Join(m, "cpu.cfs_quota_us"), "50000"); err != nil {
			t.Fatal(err)
		}
		machineQuota = "50000"
	}
	var out bytes.Buffer
	s := spec(t, &out, "sleep", "600")
	s.Limits.Cores = 1
	p, err := Start(t.Context(), s)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Wait()
	defer p.Stop(0)
	if cg, ok := p.cg.(*cgroupV1Job); ok && machineQuota != "" {
		if got := readBack(t, filepath.Join(cg.dirs["cpu"], "cpu.cfs_quota_us")); got != machineQuota {
			t.Errorf("the job's quota is %s, want its machine's %s", got, machineQuota)
		}
	}
	var dirs []string
	switch cg := p.cg.(type) {
	case *cgroupV1Job:
		for _, d := range cg.dirs {
			dirs = append(dirs, d)
		}
	case *cgroupV2Job:
		dirs = append(dirs, cg.dir)
	}
	if len(dirs) == 0 {
		t.Fatal("the job has no cgroup dirs")
	}
	for _, d := range dirs {
		if !strings.Contains(d, "/"+nested+"/") {
			t.Errorf("job cgroup %s is not under %s", d, nested)
		}
	}
	pids, err := p.cg.pids()
	if err != nil || len(pids) == 0 {
		t.Fatalf("the nested job cgroup holds %v (%v), want the job", pids, err)
	}
}
