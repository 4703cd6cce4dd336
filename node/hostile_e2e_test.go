package node

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/node/lender"
	"github.com/deepmarket/deepmarket/node/sandbox"
)

// hostilePair is a 2-worker job whose chief writes a large output and
// exits, while worker 1, on the same lender, attacks: it reads the
// lender's key, token and a root-only file, looks for the chief's dir to
// swap a link into it while the node imports it, floods its log and tries
// to grow the node's log file behind it.
const hostilePair = `import ctypes, json, os, socket, sys, time
rank = int(os.environ["DM_RANK"])
peer = os.environ["DM_WORKERS"].split(",")[1].rsplit(":", 1)
print("uid=%d" % os.getuid(), flush=True)
if rank == 0:
    out = os.environ["DM_OUTPUT_DIR"]
    os.makedirs(os.path.join(out, "sub"), exist_ok=True)
    with open(os.path.join(out, "big"), "wb") as f:
        for _ in range(48):
            f.write(os.urandom(1 << 20))
    open(os.path.join(out, "sub", "file"), "w").write("the chief's own\n")
    # Exit, and so have the output imported, once worker 1 is done.
    while True:
        try:
            socket.create_connection((peer[0], int(peer[1]))).recv(1)
            break
        except OSError:
            time.sleep(0.2)
    print("chief done", flush=True)
    sys.exit(0)
home = os.environ["HOME"]
chief = home[:-2] + "-0"
targets = json.loads(sys.argv[1])
for p in [chief, os.path.join(chief, "out"), os.path.join(chief, "out", "big"), "/proc/1/root/" + chief] + targets:
    try:
        if os.path.isdir(p):
            print("LISTED", p, os.listdir(p), flush=True)
        else:
            print("READ", p, open(p, "rb").read(64), flush=True)
    except OSError as e:
        print("denied", p, e.errno, flush=True)
fails, end = 0, time.time() + 8
while time.time() < end:
    try:
        os.rename(os.path.join(chief, "out", "sub"), os.path.join(chief, "out", "x"))
        os.symlink(os.path.dirname(targets[0]), os.path.join(chief, "out", "sub"))
        print("SWAPPED", flush=True)
        break
    except OSError:
        fails += 1
print("swaps failed:", fails, flush=True)
libc = ctypes.CDLL(None, use_errno=True)
r = libc.fallocate(1, 1, ctypes.c_long(0), ctypes.c_long(4 << 30))
print("fallocate(stdout, KEEP_SIZE):", r, ctypes.get_errno(), flush=True)
try:
    os.ftruncate(1, 4 << 30)
    print("TRUNCATED stdout", flush=True)
except OSError as e:
    print("ftruncate(stdout):", e.errno, flush=True)
time.sleep(4)  # the submitter reads the lines above before the flood
line = b"y" * 1023 + b"\n"
for _ in range(40 << 10):
    os.write(1, line)
print("flooded", flush=True)
srv = socket.create_server((peer[0], int(peer[1])))
srv.accept()[0].close()
time.sleep(5)  # while the node imports the chief's output
`

// TestHostileWorkersOnOneLender: two workers of a job share a lender. The
// attacker gets nothing: not the lender's key, token or root's files, not
// the chief's dir (so nothing to swap), not a uid it shares; the job's
// result holds the chief's output and none of the lender's secrets; the
// flood of output leaves at most the log cap on the lender's disk.
func TestHostileWorkersOnOneLender(t *testing.T) {
	py := genericPython(t)
	c := startJobClusterLending(t, py, 1, api.LendRequest{Cores: 2, MemBytes: 2 << 30})
	a, victim := c.sub, c.lenders[0]

	secretOf := func(what string) string {
		b := make([]byte, 16)
		rand.Read(b)
		return what + "-" + hex.EncodeToString(b)
	}
	// Readable by mode, in the lender's home and in /root: only the
	// sandbox keeps the job from them.
	homeCanary, rootCanary := secretOf("HOME-CANARY"), secretOf("ROOT-CANARY")
	homeFile := filepath.Join(victim.home.Dir, "canary")
	rootFile := filepath.Join("/root", fmt.Sprintf("deepmarket-e2e-canary-%d", os.Getpid()))
	for f, v := range map[string]string{homeFile: homeCanary, rootFile: rootCanary} {
		if err := os.WriteFile(f, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { os.Remove(rootFile) })
	key, _ := os.ReadFile(victim.home.KeyPath())
	token, _ := os.ReadFile(victim.home.TokenPath())
	if len(key) < 16 || len(token) < 16 {
		t.Fatalf("the lender's key (%d bytes) and token (%d bytes) are not there to be stolen", len(key), len(token))
	}

	bundle := t.TempDir()
	os.Chmod(bundle, 0o755)
	if err := os.WriteFile(filepath.Join(bundle, "pair.py"), []byte(hostilePair), 0o644); err != nil {
		t.Fatal(err)
	}
	targets, _ := json.Marshal([]string{victim.home.KeyPath(), victim.home.TokenPath(), homeFile, rootFile, "/etc/shadow"})
	j, err := a.client.Submit(t.Context(), api.SubmitRequest{Spec: jobs.File{Name: "hostile-pair", Framework: "generic",
		Command: []string{"python3", "pair.py", string(targets)}, Bundle: bundle, Workers: 2, Cores: 1, Memory: "512MiB",
		MaxPrice: "5", MaxDuration: "10m"}, Yes: true})
	if err != nil {
		t.Fatal(err)
	}
	j = waitJob(t, a, j.ID, 5*time.Minute)
	log := jobLog(t, a, j.ID)
	if j.State != jobs.Succeeded {
		t.Fatalf("job %s: %s\n%s", j.State, j.Reason, log)
	}
	run := j.Current()
	for i, w := range run.Workers {
		if w.Machine != victim.host.ID().String() {
			t.Fatalf("worker %d ran on %s, not on the one lender", i, w.Machine)
		}
	}
	for _, bad := range []string{"LISTED", "READ ", "SWAPPED", "TRUNCATED", homeCanary, rootCanary} {
		if strings.Contains(log, bad) {
			t.Errorf("the attacker got through (%q):\n%s", bad, log)
		}
	}
	if !strings.Contains(log, "denied") || !strings.Contains(log, "swaps failed") || !strings.Contains(log, "of older output dropped") {
		t.Errorf("the attacker's attempts, or the flood's end, are not in the log:\n%s", log)
	}
	// Each worker ran as a uid of its own, from the lender's range.
	uids := map[string]bool{}
	for _, m := range regexp.MustCompile(`\[w[01]\][^\n]*uid=(\d+)`).FindAllStringSubmatch(log, -1) {
		uids[m[1]] = true
		if id, _ := strconv.Atoi(m[1]); !sandbox.DefaultIDs.Contains(id) {
			t.Errorf("a worker ran as uid %d, outside %s", id, sandbox.DefaultIDs)
		}
	}
	if len(uids) != 2 {
		t.Errorf("the workers ran as uids %v; want two different ones", uids)
	}

	// The result is the chief's output, and nothing of the lender's.
	out := filepath.Join(t.TempDir(), "result")
	if _, err := a.client.DataGet(t.Context(), j.ResultCID, out, nil); err != nil {
		t.Fatal(err)
	}
	var names []string
	err = filepath.WalkDir(out, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(out, p)
		names = append(names, rel)
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for what, s := range map[string][]byte{"node.key": key, "api.token": token, "a home file": []byte(homeCanary), "a root file": []byte(rootCanary)} {
			if bytes.Contains(b, bytes.TrimSpace(s)) {
				t.Errorf("the result's %s holds the lender's %s", rel, what)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(names, ",") != "big,sub/file" {
		t.Errorf("the result holds %v, want the chief's big and sub/file", names)
	}

	// The flood: at most the cap on the lender's disk, for each worker.
	dirs, _ := filepath.Glob(filepath.Join(victim.exec.Dir(), "logs", run.ID[:16]+"-*"))
	if len(dirs) != 2 {
		t.Fatalf("log dirs %v, want one per worker", dirs)
	}
	for _, d := range dirs {
		var size int64
		entries, _ := os.ReadDir(d)
		for _, e := range entries {
			fi, _ := e.Info()
			size += fi.Size()
		}
		if size > lender.WorkerLogBytes {
			t.Errorf("%s holds %d bytes of log, over the cap of %d", d, size, lender.WorkerLogBytes)
		}
	}
}

// TestHostileJobsFailAndTheLenderCarriesOn: jobs that read the lender's
// node key, allocate past their memory limit, or fork without end each
// fail with a reason; the lender's node keeps serving and the next job
// on it runs.
func TestHostileJobsFailAndTheLenderCarriesOn(t *testing.T) {
	t.Parallel()
	py := genericPython(t)
	c := startJobCluster(t, py, 1)
	a, lender := c.sub, c.lenders[0]
	bundle := t.TempDir()
	os.Chmod(bundle, 0o755)
	secret := lender.home.KeyPath()
	script := fmt.Sprintf(`import os, sys, time
what = sys.argv[1]
if what == "read":
    try:
        print("READ:", open(%q).read()[:40]); sys.exit(0)
    except OSError as e:
        print("denied:", e); sys.exit(3)
if what == "mem":
    hog = []
    while True:
        hog.append(bytearray(64 << 20))
if what == "fork":
    n = 0
    while True:
        try:
            if os.fork() == 0:
                time.sleep(60); os._exit(0)
            n += 1
        except OSError as e:
            print("fork failed after", n, e, flush=True); time.sleep(5); sys.exit(4)
print("fine")
`, secret)
	if err := os.WriteFile(filepath.Join(bundle, "hostile.py"), []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := func(what string) jobs.File {
		return jobs.File{Name: "hostile-" + what, Framework: "generic", Command: []string{"python3", "hostile.py", what},
			Bundle: bundle, Workers: 1, Cores: 1, Memory: "256MiB", MaxPrice: "1", MaxDuration: "5m"}
	}
	var runs []string
	for _, tc := range []struct{ what, reason string }{
		{"read", "code 3"},
		{"mem", "out of memory"},
		{"fork", "processes"},
	} {
		j, err := a.client.Submit(t.Context(), api.SubmitRequest{Spec: spec(tc.what), Yes: true})
		if err != nil {
			t.Fatal(err)
		}
		j = waitJob(t, a, j.ID, 3*time.Minute)
		runs = append(runs, j.Current().ID)
		log := jobLog(t, a, j.ID)
		if j.State != jobs.Failed || !strings.Contains(j.Reason, tc.reason) {
			t.Errorf("%s: job %s (%s); want failed with %q\n%s", tc.what, j.State, j.Reason, tc.reason, log)
		}
		if strings.Contains(log, "READ:") {
			t.Errorf("the job read the lender's node key\n%s", log)
		}
	}
	// The lender carries on: its node answers and runs the next job.
	if _, err := lender.client.Status(t.Context()); err != nil {
		t.Fatalf("lender after hostile jobs: %v", err)
	}
	j, err := a.client.Submit(t.Context(), api.SubmitRequest{Spec: spec("ok"), Yes: true})
	if err != nil {
		t.Fatal(err)
	}
	if j = waitJob(t, a, j.ID, 2*time.Minute); j.State != jobs.Succeeded {
		t.Errorf("a plain job after the hostile ones: %s (%s)\n%s", j.State, j.Reason, jobLog(t, a, j.ID))
	}
	// No process of a hostile job outlives it (the fork bomb's children
	// included): none is left in the jobs' cgroups.
	procs, _ := filepath.Glob("/proc/[0-9]*/cgroup")
	for _, f := range procs {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, run := range runs {
			if strings.Contains(string(b), "/deepmarket/"+run[:16]+"-") {
				t.Errorf("%s is still in hostile job %s's cgroup", filepath.Dir(f), run[:12])
			}
		}
	}
	rep, err := settledAudit(t, a)
	if err != nil || !rep.OK || rep.Escrowed != 0 {
		t.Fatalf("audit: %+v %v", rep, err)
	}
}
