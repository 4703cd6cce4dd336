package sandbox

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/sys/unix"
)

// The hostile suite: real jobs, through the real sandbox, trying what a
// borrower's job must not do on a lender, each test asserting what
// happened on the host. Memory, pids and disk bounds are attacked by
// TestMemoryHogIsOOMKilled, TestForkBombHitsPidsLimit and TestDiskBound.

// randomSecret is a string that appears nowhere unless a test put it there.
func randomSecret(t testing.TB, what string) string {
	t.Helper()
	b := make([]byte, 12)
	rand.Read(b)
	return what + "-" + hex.EncodeToString(b)
}

// runOut runs a job to its end and returns its output.
func runOut(t *testing.T, s Spec) (Exit, string) {
	t.Helper()
	var out lockedBuffer
	s.Stdout, s.Stderr = &out, &out
	e := run(t, s)
	return e, out.String()
}

// lockedBuffer is a bytes.Buffer that a test may read while the job writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startVictim runs another job that holds secrets in its dir and its
// environment, as a concurrent job on the same lender does.
func startVictim(t *testing.T, fileSecret, envSecret string) (*Process, Spec) {
	t.Helper()
	s := Spec{Name: strings.ReplaceAll(t.Name(), "/", "-") + "-victim", Dir: jobDir(t),
		Argv: []string{"sh", "-c", "echo up > ready; exec sleep 600"}, Env: []string{"VICTIM_SECRET=" + envSecret}}
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.Dir, "secret"), []byte(fileSecret), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := Start(t.Context(), s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Stop(0)
		p.Wait()
	})
	waitForFile(t, filepath.Join(s.Dir, "ready"))
	return p, s
}

// TestHostileReads: a job reads the node's home (hidden inside a path it
// may read), /root, /etc/shadow, another job's dir and environment and the
// node's environment, and gets none of them.
func TestHostileReads(t *testing.T) {
	needRoot(t)
	base := readOnlyBase(t)
	home := filepath.Join(base, "node-home")
	venv := filepath.Join(home, "venv")
	if err := os.MkdirAll(venv, 0o755); err != nil {
		t.Fatal(err)
	}
	keySecret, rootSecret := randomSecret(t, "NODEKEY"), randomSecret(t, "ROOTFILE")
	fileSecret, envSecret := randomSecret(t, "VICTIMFILE"), randomSecret(t, "VICTIMENV")
	nodeEnvSecret := randomSecret(t, "NODEENV")
	t.Setenv("DEEPMARKET_API_TOKEN", nodeEnvSecret)
	// World-readable by mode: only the sandbox keeps them from the job.
	for path, v := range map[string]string{filepath.Join(home, "node.key"): keySecret, filepath.Join(venv, "ok"): "VENV-READABLE"} {
		if err := os.WriteFile(path, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	rootFile := filepath.Join("/root", fmt.Sprintf("deepmarket-hostile-%d", os.Getpid()))
	if err := os.WriteFile(rootFile, []byte(rootSecret), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(rootFile) })
	victim, vs := startVictim(t, fileSecret, envSecret)

	targets := []string{filepath.Join(venv, "ok"), filepath.Join(home, "node.key"), rootFile, "/etc/shadow", "/etc/gshadow",
		filepath.Join(vs.Dir, "secret"), fmt.Sprintf("/proc/%d/environ", victim.Pid()), fmt.Sprintf("/proc/%d/environ", os.Getpid()),
		fmt.Sprintf("/proc/%d/root/etc/hostname", os.Getpid())}
	keys, _ := filepath.Glob("/etc/ssh/ssh_host_*_key")
	targets = append(targets, keys...)
	s := Spec{Name: strings.ReplaceAll(t.Name(), "/", "-"), Dir: jobDir(t), ReadOnly: []string{venv}, Hide: []string{home},
		Argv: append([]string{"sh", "-c", `for f in "$@"; do echo "== $f"; cat "$f" 2>&1; echo; done
echo "== every environ"; cat /proc/[0-9]*/environ 2>/dev/null | tr '\0' '\n'
echo "== processes"; ls -d /proc/[0-9]* | wc -l`, "sh"}, targets...)}
	_, out := runOut(t, s)
	if !strings.Contains(out, "VENV-READABLE") {
		t.Fatalf("the job could not read even its read-only venv, so the test shows nothing:\n%s", out)
	}
	for what, secret := range map[string]string{"the node's key": keySecret, "a file in /root": rootSecret,
		"another job's file": fileSecret, "another job's environment": envSecret, "the node's environment": nodeEnvSecret} {
		if strings.Contains(out, secret) {
			t.Errorf("the job read %s:\n%s", what, out)
		}
	}
	if shadow, err := os.ReadFile("/etc/shadow"); err == nil {
		if first, _, _ := strings.Cut(string(shadow), "\n"); first != "" && strings.Contains(out, first) {
			t.Errorf("the job read /etc/shadow:\n%s", out)
		}
	}
	for _, k := range keys {
		if b, err := os.ReadFile(k); err == nil && len(b) > 40 && strings.Contains(out, string(b[40:80])) {
			t.Errorf("the job read %s", k)
		}
	}
	if err := syscall.Kill(victim.Pid(), 0); err != nil {
		t.Errorf("the other job died: %v", err)
	}
}

// TestHostileWrites: a job writes everywhere it can think of; nothing
// appears outside its dir, and its /tmp, /var/tmp and /dev/shm are its own.
func TestHostileWrites(t *testing.T) {
	needRoot(t)
	name := fmt.Sprintf("dm-hostile-%d", os.Getpid())
	open := filepath.Join(filepath.Dir(jobDir(t)), "world-writable")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(open, 0o1777)
	places := []string{"/", "/usr", "/usr/local", "/etc", "/root", "/home", "/opt", "/srv", "/var", "/var/lib", "/run", "/sys/fs/cgroup", "/proc", open}
	s := spec(t, nil, "sh", "-c", `n=$1; shift
for p in "$@"; do touch "$p/$n" 2>/dev/null && echo "WROTE $p"; mkdir "$p/$n.d" 2>/dev/null && echo "WROTE $p"; done
echo x > /tmp/$n && echo x > /var/tmp/$n && echo x > /dev/shm/$n && mkfifo /tmp/$n.fifo && echo PRIVATE-OK`, "sh", name)
	s.Argv = append(s.Argv, places...)
	e, out := runOut(t, s)
	if !strings.Contains(out, "PRIVATE-OK") {
		t.Fatalf("the job could not use its own /tmp, /var/tmp and /dev/shm: %+v\n%s", e, out)
	}
	if strings.Contains(out, "WROTE") {
		t.Errorf("the job wrote outside its dir:\n%s", out)
	}
	for _, p := range append(places, "/tmp", "/var/tmp", "/dev/shm") {
		for _, n := range []string{name, name + ".d", name + ".fifo"} {
			if _, err := os.Lstat(filepath.Join(p, n)); err == nil {
				t.Errorf("%s is on the host", filepath.Join(p, n))
				os.RemoveAll(filepath.Join(p, n))
			}
		}
	}
	// What it wrote to its /tmp is in its dir, and root's again.
	fi, err := os.Stat(filepath.Join(s.Dir, "tmp", name))
	if err != nil {
		t.Fatalf("the job's /tmp is not its dir's tmp: %v", err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 0 {
		t.Errorf("after Wait the job's files belong to %d, not root", st.Uid)
	}
}

// TestHostileSockets: a job dials the host's unix sockets (in /run and
// /tmp, and abstract) and the host's TCP ports, from a network namespace
// of its own and from one the node gives it; none answers.
func TestHostileSockets(t *testing.T) {
	needRoot(t)
	name := fmt.Sprintf("dm-hostile-%d", os.Getpid())
	var reached atomic.Int32
	serve := func(ln net.Listener) {
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				reached.Add(1)
				c.Write([]byte("HOST-ANSWERED\n"))
				c.Close()
			}
		}()
	}
	var unixPaths []string
	for _, dir := range []string{"/run", "/tmp", "/var/tmp"} {
		p := filepath.Join(dir, name+".sock")
		os.Remove(p)
		ln, err := net.Listen("unix", p)
		if err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, 0o777)
		t.Cleanup(func() { os.Remove(p) })
		serve(ln)
		unixPaths = append(unixPaths, p)
	}
	abs, err := net.Listen("unix", "@"+name)
	if err != nil {
		t.Fatal(err)
	}
	serve(abs)
	tcp, err := net.Listen("tcp", ":0") // every host address
	if err != nil {
		t.Fatal(err)
	}
	serve(tcp)
	port := tcp.Addr().(*net.TCPAddr).Port
	hosts := []string{"127.0.0.1", "::1"}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if ip := a.(*net.IPNet).IP; !ip.IsLoopback() && !ip.IsLinkLocalUnicast() {
			hosts = append(hosts, ip.String())
		}
	}
	script := `import json, socket, sys
cfg = json.loads(sys.argv[1])
def tryc(fam, addr):
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        s.connect(addr); print("REACHED", addr, s.recv(64)); 
    except OSError as e:
        print("refused", addr, e)
for p in cfg["unix"]: tryc(socket.AF_UNIX, p)
tryc(socket.AF_UNIX, "\0" + cfg["abstract"])
for h in cfg["hosts"]: tryc(socket.AF_INET6 if ":" in h else socket.AF_INET, (h, cfg["port"]))
import os
print("run:", os.path.exists("/run"), "var/run:", os.path.exists("/var/run"))
`
	cfg, _ := json.Marshal(map[string]any{"unix": unixPaths, "abstract": name, "hosts": hosts, "port": port})
	ns, err := NewNetNS()
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	for _, netns := range []*NetNS{nil, ns} {
		s := spec(t, nil, "python3", "-c", script, string(cfg))
		s.NetNS = netns
		_, out := runOut(t, s)
		if strings.Contains(out, "REACHED") || strings.Contains(out, "HOST-ANSWERED") {
			t.Errorf("a job (own netns: %v) reached a host socket:\n%s", netns == nil, out)
		}
		if !strings.Contains(out, "run: False var/run: False") {
			t.Errorf("the job sees /run:\n%s", out)
		}
		if strings.Count(out, "\nrefused ")+strings.Count(out[:min(len(out), 8)], "refused ") != len(unixPaths)+1+len(hosts) {
			t.Errorf("not every dial was tried:\n%s", out)
		}
	}
	if n := reached.Load(); n > 0 {
		t.Errorf("the host's listeners accepted %d connections from jobs", n)
	}
}

// TestHostilePrivilege: a job tries to gain privilege or reach other
// processes: user namespaces ("unshare -r"), setuid tools, the system
// calls the seccomp filter refuses, signals to the node and to another
// job, ptrace of another job. The kernel refuses each, and the other job
// lives on.
func TestHostilePrivilege(t *testing.T) {
	needRoot(t)
	info, err := arch.GetInfo("")
	if err != nil {
		t.Fatal(err)
	}
	victim, _ := startVictim(t, "x", "y")
	// Each call: its number, its arguments, the errno it must fail with.
	type call struct {
		Nr    int      `json:"nr"`
		Args  []uint64 `json:"args"`
		Errno int      `json:"errno"`
	}
	eperm, enosys := int(unix.EPERM), int(unix.ENOSYS)
	calls := map[string]call{
		"unshare(CLONE_NEWUSER)": {Args: []uint64{unix.CLONE_NEWUSER}, Errno: eperm},
		"unshare(CLONE_NEWNS)":   {Args: []uint64{unix.CLONE_NEWNS}, Errno: eperm},
		"clone(CLONE_NEWUSER)":   {Args: []uint64{unix.CLONE_NEWUSER | uint64(unix.SIGCHLD)}, Errno: eperm},
		"clone3":                 {Args: []uint64{0, 0}, Errno: enosys},
		"setns":                  {Args: []uint64{0, 0}, Errno: eperm},
		"mount":                  {Args: []uint64{0, 0, 0, 0, 0}, Errno: eperm},
		"umount2":                {Args: []uint64{0, 0}, Errno: eperm},
		"pivot_root":             {Args: []uint64{0, 0}, Errno: eperm},
		"ptrace(ATTACH victim)":  {Args: []uint64{unix.PTRACE_ATTACH, uint64(victim.Pid())}, Errno: eperm},
		"ptrace(TRACEME)":        {Args: []uint64{unix.PTRACE_TRACEME}, Errno: eperm},
		"process_vm_readv":       {Args: []uint64{1, 0, 0, 0, 0, 0}, Errno: eperm},
		"process_vm_writev":      {Args: []uint64{1, 0, 0, 0, 0, 0}, Errno: eperm},
		"keyctl":                 {Args: []uint64{0}, Errno: eperm},
		"add_key":                {Args: []uint64{0, 0, 0, 0, 0}, Errno: eperm},
		"request_key":            {Args: []uint64{0, 0, 0, 0}, Errno: eperm},
		"bpf":                    {Args: []uint64{0, 0, 0}, Errno: eperm},
		"perf_event_open":        {Args: []uint64{0, 0, ^uint64(0), ^uint64(0), 0}, Errno: eperm},
		"init_module":            {Args: []uint64{0, 0, 0}, Errno: eperm},
		"finit_module":           {Args: []uint64{^uint64(0), 0, 0}, Errno: eperm},
		"delete_module":          {Args: []uint64{0, 0}, Errno: eperm},
		"kexec_load":             {Args: []uint64{0, 0, 0, 0}, Errno: eperm},
		"reboot":                 {Args: []uint64{0, 0, 0, 0}, Errno: eperm},
		"swapon":                 {Args: []uint64{0, 0}, Errno: eperm},
		"swapoff":                {Args: []uint64{0}, Errno: eperm},
		"userfaultfd":            {Args: []uint64{0}, Errno: eperm},
		"io_uring_setup":         {Args: []uint64{1, 0}, Errno: enosys},
		"socket(AF_PACKET)":      {Args: []uint64{unix.AF_PACKET, unix.SOCK_RAW, 0}, Errno: eperm},
		"socket(SOCK_RAW)":       {Args: []uint64{unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP}, Errno: eperm},
		"fallocate":              {Args: []uint64{1, 0, 0, 4096}, Errno: int(unix.EOPNOTSUPP)},
		"personality(no ASLR)":   {Args: []uint64{0x0040000}, Errno: eperm},
		"ioctl(TIOCSTI)":         {Args: []uint64{0, unix.TIOCSTI, 0}, Errno: eperm},
		"kill(the node)":         {Args: []uint64{uint64(os.Getpid()), uint64(unix.SIGKILL)}, Errno: int(unix.ESRCH)},
		"kill(another job)":      {Args: []uint64{uint64(victim.Pid()), uint64(unix.SIGKILL)}, Errno: int(unix.ESRCH)},
	}
	for name, c := range calls {
		sys, _, _ := strings.Cut(name, "(")
		nr, ok := info.SyscallNames[sys]
		if !ok {
			delete(calls, name)
			continue
		}
		c.Nr = nr
		calls[name] = c
	}
	cfg, _ := json.Marshal(calls)
	script := `import ctypes, json, os, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
for name, c in sorted(json.loads(sys.argv[1]).items()):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(c["nr"]), *[ctypes.c_ulong(a) for a in c["args"]])
    e = ctypes.get_errno()
    print("CALL", name, r, e, "ok" if r == -1 and e == c["errno"] else "UNEXPECTED")
for cmd in (["unshare", "-r", "id", "-u"], ["unshare", "-U", "true"], ["su", "root", "-c", "id -u"]):
    try:
        p = subprocess.run(cmd, capture_output=True, timeout=10)
        print("CMD", cmd[0], p.returncode, "ok" if p.returncode != 0 else "UNEXPECTED", p.stdout, p.stderr[-200:])
    except FileNotFoundError:
        print("CMD", cmd[0], "absent ok")
status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
print("STATUS", json.dumps({k: status[k].strip() for k in ("Uid", "NoNewPrivs", "CapEff", "CapPrm", "CapBnd", "Seccomp")}))
print("PROCESSES", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
`
	s := spec(t, nil, "python3", "-c", script, string(cfg))
	_, out := runOut(t, s)
	if n := strings.Count(out, "CALL "); n != len(calls) {
		t.Fatalf("%d of %d calls tried:\n%s", n, len(calls), out)
	}
	if strings.Contains(out, "UNEXPECTED") {
		t.Errorf("the kernel allowed what the sandbox must refuse:\n%s", out)
	}
	_, st, _ := strings.Cut(out, "STATUS ")
	st, _, _ = strings.Cut(st, "\n")
	var status map[string]string
	if err := json.Unmarshal([]byte(st), &status); err != nil {
		t.Fatalf("status %q: %v\n%s", st, err, out)
	}
	for k, want := range map[string]string{"NoNewPrivs": "1", "CapEff": "0000000000000000", "CapPrm": "0000000000000000",
		"CapBnd": "0000000000000000", "Seccomp": "2"} {
		if status[k] != want {
			t.Errorf("%s = %q, want %q", k, status[k], want)
		}
	}
	if uid, _ := strconv.Atoi(strings.Fields(status["Uid"])[0]); uid == 0 || uid == victim.UID() {
		t.Errorf("the job runs as uid %d (the other job's is %d)", uid, victim.UID())
	}
	// It sees its own processes only: bwrap's init, python, maybe a child.
	_, procs, _ := strings.Cut(out, "PROCESSES ")
	if procs, _, _ = strings.Cut(procs, "\n"); strings.Count(procs, ",") > 3 {
		t.Errorf("the job sees processes beyond its own: %s", procs)
	}
	if err := syscall.Kill(victim.Pid(), 0); err != nil {
		t.Errorf("the other job died: %v", err)
	}
}

// TestHostileCPUQuota: a job spinning more threads than its quota gets
// the quota's CPU time, not more.
func TestHostileCPUQuota(t *testing.T) {
	needRoot(t)
	s := spec(t, nil, "sh", "-c", `for i in 1 2 3 4; do timeout 3 sh -c 'while :; do :; done' & done; wait`)
	s.Limits.Cores = 0.5
	e, out := runOut(t, s)
	limit := time.Duration(float64(e.Wall)*0.5*1.2) + 200*time.Millisecond
	t.Logf("wall %s, cpu %s (quota half a core)", e.Wall, e.CPU)
	if e.CPU == 0 || e.CPU > limit {
		t.Errorf("the job used %s of CPU in %s at half a core (at most %s): %s", e.CPU, e.Wall, limit, out)
	}
}

// TestHostileCgroupNames: a job lists every cgroup it can find under
// /sys/fs/cgroup and /proc/self/mountinfo while another job runs, and
// finds no other job's cgroup name (job ID prefixes and a piece of the
// lender's peer ID), nor any cgroup but its own; where a container's
// reader looks, it reads its own CPU quota and memory limit.
func TestHostileCgroupNames(t *testing.T) {
	needRoot(t)
	_, vs := startVictim(t, "x", "y")
	victim, _ := sanitizeName(vs.Name)
	s := spec(t, nil, "sh", "-c", `find /sys/fs/cgroup /sys/fs/cgroup/*/ 2>&1; cat /proc/self/mountinfo
echo QUOTA $(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu.max 2>/dev/null)
echo MEMORY $(cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/memory.max 2>/dev/null)`)
	s.Limits = Limits{Cores: 0.5, MemBytes: 256 << 20}
	_, out := runOut(t, s)
	if !strings.Contains(out, "/sys/fs/cgroup") {
		t.Fatalf("the job listed nothing:\n%s", out)
	}
	for _, leak := range []string{victim, "/" + parentCgroup + "/", "system.slice", "user.slice"} {
		if strings.Contains(out, leak) {
			t.Errorf("the job sees %q:\n%s", leak, out)
		}
	}
	wantQuota := "QUOTA 50000"
	if h, err := machine(); err == nil && h.version() == 2 {
		wantQuota = "QUOTA 50000 100000"
	}
	for _, want := range []string{wantQuota + "\n", "MEMORY " + strconv.Itoa(256<<20) + "\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("the job does not read %q where a container's reader looks:\n%s", want, out)
		}
	}
}

// TestHostileDiskReservations: fallocate, with or without KEEP_SIZE, on
// files and on the job's output, reserves nothing, and its emulation stops
// at the disk bound; truncating stdout does nothing to the node's log,
// which the job has only a pipe to.
func TestHostileDiskReservations(t *testing.T) {
	needRoot(t)
	script := `import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
for name, flags in (("fallocate", 0), ("keep-size", 1)):
    fd = os.open(name, os.O_CREAT | os.O_WRONLY)
    if libc.fallocate(fd, flags, ctypes.c_long(0), ctypes.c_long(4 << 30)) == 0:
        print("RESERVED", name)
    else:
        print("refused", name, ctypes.get_errno())
try:
    os.posix_fallocate(os.open("emulated", os.O_CREAT | os.O_WRONLY), 0, 4 << 30)
    print("RESERVED emulated")
except OSError as e:
    print("refused emulated", e.errno)
for what, f in (("fallocate(stdout)", lambda: os.posix_fallocate(1, 0, 4 << 30)), ("ftruncate(stdout)", lambda: os.ftruncate(1, 4 << 30))):
    try:
        f(); print("RESERVED", what)
    except OSError as e:
        print("refused", what, e.errno)
sys.stdout.flush()
print("done")
`
	s := spec(t, nil, "python3", "-c", script)
	s.Limits.DiskBytes = 64 << 20
	_, out := runOut(t, s)
	if strings.Contains(out, "RESERVED") || !strings.Contains(out, "done") {
		t.Errorf("the job reserved disk:\n%s", out)
	}
	// posix_fallocate falls back to writing, which RLIMIT_FSIZE stops at
	// the bound (EFBIG): at disk speed, not in an instant.
	if !strings.Contains(out, fmt.Sprintf("refused emulated %d", unix.EFBIG)) {
		t.Errorf("writing 4 GiB went past RLIMIT_FSIZE:\n%s", out)
	}
	if u := dirUsage(s.Dir); u > s.Limits.DiskBytes+1<<20 {
		t.Errorf("the job's dir holds %d bytes after its reservations, past its bound of %d", u, s.Limits.DiskBytes)
	}
}

// TestHostileLeavesNothing: a job that daemonizes, binds an abstract
// socket, and writes to /tmp, /var/tmp and /dev/shm leaves no process,
// cgroup, mount, namespace, socket or file behind once it is stopped, and
// its dir is root's again.
func TestHostileLeavesNothing(t *testing.T) {
	needRoot(t)
	name := fmt.Sprintf("dm-hostile-left-%d", os.Getpid())
	s := spec(t, nil, "sh", "-c", `n=$1
setsid sh -c 'trap "" HUP TERM; exec sleep 600' </dev/null >/dev/null 2>&1 &
nohup sleep 600 >/dev/null 2>&1 &
python3 -c 'import socket, time; s = socket.socket(socket.AF_UNIX); s.bind("\0'$n'"); s.listen(); time.sleep(600)' &
echo x > /tmp/$n; echo x > /var/tmp/$n; echo x > /dev/shm/$n; mkfifo fifo; ln -s /etc/passwd link
sleep 1; echo up > ready; exec sleep 600`, "sh", name)
	p, err := Start(t.Context(), s)
	if err != nil {
		t.Fatal(err)
	}
	waitForFile(t, filepath.Join(s.Dir, "ready"))
	pids, err := p.cg.pids()
	if err != nil || len(pids) < 5 {
		t.Fatalf("cgroup holds %v (%v), want the job and its daemons", pids, err)
	}
	// The job's namespaces: those of its processes that the node does not
	// share.
	own := nsInodesOfThisThread(t)
	jobNS := map[string]bool{}
	for _, pid := range pids {
		for ino := range nsInodes(t, pid) {
			if !own[ino] {
				jobNS[ino] = true
			}
		}
	}
	if len(jobNS) < 5 {
		t.Errorf("the job has only %d namespaces of its own: %v", len(jobNS), jobNS)
	}
	p.Stop(200 * time.Millisecond)
	if _, err := p.Wait(); err != nil {
		t.Fatal(err)
	}

	if left := liveProcsOfUID(t, p.UID()); len(left) > 0 {
		t.Errorf("processes of the job's uid are left: %v", left)
	}
	assertCgroupGone(t, p)
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range procs {
		pid, _ := strconv.Atoi(filepath.Base(d))
		for ino := range nsInodes(t, pid) {
			if jobNS[ino] && !strings.HasPrefix(procStateOrZ(pid), "Z") {
				t.Errorf("pid %d is in the job's namespace %s", pid, ino)
			}
		}
	}
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err == nil && strings.Contains(string(mi), s.Dir) {
		t.Errorf("a mount of the job's dir is left on the host")
	}
	if nu, err := os.ReadFile("/proc/net/unix"); err == nil && strings.Contains(string(nu), name) {
		t.Errorf("the job's abstract socket is on the host")
	}
	for _, d := range []string{"/tmp", "/var/tmp", "/dev/shm"} {
		if _, err := os.Lstat(filepath.Join(d, name)); err == nil {
			t.Errorf("%s/%s is on the host", d, name)
		}
	}
	err = filepath.WalkDir(s.Dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != 0 || st.Gid != 0 {
			t.Errorf("%s belongs to %d:%d after Wait, not root", path, st.Uid, st.Gid)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// nsInodes lists the namespaces pid is in ("mnt:[4026531840]").
// nsInodesOfThisThread is nsInodes of the calling thread: not of the
// process's main thread, which a goroutine that entered a job's network
// namespace and exited locked (as NewNetNS's do, to discard their thread)
// may have left wedged in that namespace.
func nsInodesOfThisThread(t *testing.T) map[string]bool {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return nsInodesAt(fmt.Sprintf("/proc/%d/task/%d/ns", os.Getpid(), unix.Gettid()))
}

func nsInodes(t *testing.T, pid int) map[string]bool {
	t.Helper()
	return nsInodesAt(fmt.Sprintf("/proc/%d/ns", pid))
}

func nsInodesAt(dir string) map[string]bool {
	inos := map[string]bool{}
	for _, ns := range []string{"mnt", "pid", "net", "ipc", "uts", "user", "cgroup"} {
		if l, err := os.Readlink(dir + "/" + ns); err == nil {
			inos[l] = true
		}
	}
	return inos
}

// TestChownNeverLeavesTheDir: handing a dir to a job's uid and taking it
// back race a process that swaps a directory and a file of it for
// symbolic links out of it, as fast as it can; the files outside keep
// their owner and mode.
func TestChownNeverLeavesTheDir(t *testing.T) {
	needRoot(t)
	base := filepath.Dir(jobDir(t))
	dir := filepath.Join(base, "job")
	outside := filepath.Join(base, "outside")
	canary := filepath.Join(outside, "canary")
	for _, d := range []string{filepath.Join(dir, "sub", "deep"), outside} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{filepath.Join(dir, "sub", "deep", "f"), filepath.Join(dir, "file"), canary} {
		if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(outside, filepath.Join(dir, ".sub")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(canary, filepath.Join(dir, ".file")); err != nil {
		t.Fatal(err)
	}
	stop := swapLoop(t, dir, [2]string{"sub", ".sub"}, [2]string{"file", ".file"})
	lease, err := DefaultIDs.Acquire()
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release()
	for i := range 2000 {
		uid := lease.ID
		if i%2 == 1 {
			uid = 0
		}
		if err := prepareDir(dir, uid); err != nil && uid != 0 {
			t.Logf("prepare: %v", err)
		}
		if uid == 0 {
			chownTree(dir, 0, 0)
		}
	}
	swaps := stop()
	for _, p := range []string{outside, canary} {
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		want := fs.FileMode(0o700)
		if p == canary {
			want = 0o600
		}
		if st.Uid != 0 || st.Gid != 0 || fi.Mode().Perm() != want {
			t.Errorf("%s is now %d:%d %v: the chown left the dir", p, st.Uid, st.Gid, fi.Mode())
		}
	}
	t.Logf("2000 chowns against %d swaps", swaps)
	if swaps < 1000 {
		t.Errorf("only %d swaps: the race tested little", swaps)
	}
}

// swapLoop exchanges each pair of entries of dir (renameat2
// RENAME_EXCHANGE) as fast as it can until the returned stop is called,
// which says how many swaps it made.
func swapLoop(t *testing.T, dir string, pairs ...[2]string) (stop func() int64) {
	var done atomic.Bool
	var n atomic.Int64
	var wg sync.WaitGroup
	for _, pr := range pairs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !done.Load() {
				if err := unix.Renameat2(unix.AT_FDCWD, filepath.Join(dir, pr[0]), unix.AT_FDCWD, filepath.Join(dir, pr[1]), unix.RENAME_EXCHANGE); err != nil {
					t.Errorf("swap %v: %v", pr, err)
					return
				}
				n.Add(1)
			}
		}()
	}
	return func() int64 {
		done.Store(true)
		wg.Wait()
		return n.Load()
	}
}

// TestJobsLDPreloadStaysInside: a job's LD_PRELOAD (an image's config may
// set it to a library its layers put on the lender's disk) loads nothing
// into bubblewrap, which still runs outside the sandbox when it starts: a
// real library, whose constructor leaves a mark on the host when it runs
// there, leaves none. The job's program still gets the variable.
func TestJobsLDPreloadStaysInside(t *testing.T) {
	needRoot(t)
	dir := readOnlyBase(t) // outside every view the job has
	marks := filepath.Join(dir, "marks")
	if err := os.Mkdir(marks, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(marks, 0o777)
	mark := filepath.Join(marks, "preloaded")
	src := filepath.Join(dir, "evil.c")
	lib := filepath.Join(dir, "evil.so")
	os.WriteFile(src, []byte(`#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) {
	int fd = open("`+mark+`", O_CREAT | O_WRONLY, 0666);
	if (fd >= 0) close(fd);
}
`), 0o644)
	if out, err := exec.Command("gcc", "-shared", "-fPIC", "-o", lib, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc (make deps installs it): %v\n%s", err, out)
	}
	os.Chmod(lib, 0o755)
	// The library works: run on the host, it leaves its mark.
	host := exec.Command("/bin/true")
	host.Env = []string{"LD_PRELOAD=" + lib}
	if err := host.Run(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(mark); err != nil {
		t.Fatalf("the library left no mark on the host: %v", err)
	}
	os.Remove(mark)

	var out bytes.Buffer
	s := spec(t, &out, "/bin/sh", "-c", `echo "preload=$LD_PRELOAD"`)
	s.Env = []string{"LD_PRELOAD=" + lib}
	if e := run(t, s); e.Code != 0 {
		t.Fatalf("job: %+v\n%s", e, out.String())
	}
	if _, err := os.Stat(mark); err == nil {
		t.Fatalf("the job's LD_PRELOAD ran on the host, outside the sandbox:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "preload="+lib) {
		t.Errorf("the job did not get its LD_PRELOAD:\n%s", out.String())
	}
}
