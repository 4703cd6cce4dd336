package lender

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/storage"
)

// The node's own operations on a worker's dir, which the job controls:
// each races a concurrent process swapping entries of the dir for
// symbolic links out of it (renameat2 RENAME_EXCHANGE, as fast as it
// can) and must neither read nor touch anything outside.

// outsideCanary makes a root-only dir outside the work area holding a
// secret file, as the node's home holds node.key.
func outsideCanary(t *testing.T) (dir, file string, secret []byte) {
	t.Helper()
	dir = filepath.Join(t.TempDir(), "home")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 24)
	rand.Read(b)
	secret = []byte("NODE-KEY-" + hex.EncodeToString(b))
	file = filepath.Join(dir, "node.key")
	if err := os.WriteFile(file, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir, file, secret
}

// swapper exchanges each pair of entries under dir until stopped; stop
// says how many swaps it made.
func swapper(t *testing.T, dir string, pairs ...[2]string) (stop func() int64) {
	t.Helper()
	var done atomic.Bool
	var n atomic.Int64
	var wg sync.WaitGroup
	for _, pr := range pairs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a, b := filepath.Join(dir, pr[0]), filepath.Join(dir, pr[1])
			for !done.Load() {
				if err := unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE); err != nil {
					if os.IsNotExist(err) {
						continue // removed meanwhile: the removal test's doing
					}
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

// testExecutor is an executor with a work area and a block store, enough
// for the node's operations on worker dirs.
func testExecutor(t *testing.T) *Executor {
	t.Helper()
	dir := t.TempDir()
	store, err := storage.Open(filepath.Join(dir, "blocks"), storage.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	e := workAreaExecutor(t, filepath.Join(dir, "work"), newMemStore())
	e.blocks = store
	return e
}

// workAreaExecutor is an executor over work dir work, its records in st.
func workAreaExecutor(t *testing.T, work string, st Store) *Executor {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(work, "logs"), 0o700); err != nil {
		t.Fatal(err)
	}
	root, err := os.OpenRoot(work)
	if err != nil {
		t.Fatal(err)
	}
	logs, err := root.OpenRoot("logs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close(); logs.Close() })
	return &Executor{log: slog.New(slog.DiscardHandler), store: st, dir: work, root: root, logs: logs, keep: time.Hour}
}

// workerTree lays out a worker dir whose out/ holds a dir and a file, and
// beside each a link to the canary's dir and file to swap them with.
func workerTree(t *testing.T, e *Executor, name, canaryDir, canaryFile string) string {
	t.Helper()
	out := filepath.Join(e.dir, name, "out")
	if err := os.MkdirAll(filepath.Join(out, "ckpt"), 0o755); err != nil {
		t.Fatal(err)
	}
	for f, size := range map[string]int{"ckpt/weights": 8192, "result.json": 64} {
		b := make([]byte, size)
		rand.Read(b)
		if err := os.WriteFile(filepath.Join(out, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for target, link := range map[string]string{canaryDir: ".ckpt", canaryFile: ".result.json"} {
		if err := os.Symlink(target, filepath.Join(out, link)); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// TestOutputImportNeverLeavesTheWorkerDir: the chief's output import (the
// result, or a checkpoint) races the swaps 2000 times; no block holds the
// canary's bytes.
func TestOutputImportNeverLeavesTheWorkerDir(t *testing.T) {
	e := testExecutor(t)
	cdir, cfile, secret := outsideCanary(t)
	w := &worker{name: "0123456789abcdef-0"}
	out := workerTree(t, e, w.name, cdir, cfile)
	stop := swapper(t, out, [2]string{"ckpt", ".ckpt"}, [2]string{"result.json", ".result.json"})
	ok := 0
	for range 2000 {
		if _, err := e.addOutput(t.Context(), w); err == nil {
			ok++
		}
	}
	swaps := stop()
	t.Logf("%d of 2000 imports succeeded against %d swaps", ok, swaps)
	if ok == 0 || swaps < 1000 {
		t.Errorf("%d imports, %d swaps: the race tested little", ok, swaps)
	}
	keys, err := e.blocks.(*storage.Store).Blockstore().AllKeysChan(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for k := range keys {
		b, err := e.blocks.(*storage.Store).Blockstore().Get(t.Context(), k)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b.RawData(), secret) {
			t.Fatalf("block %s holds the canary from outside the worker's dir", k)
		}
	}
}

// TestWorkerDirRemovalNeverLeavesIt: removing a worker's dir while its
// entries are swapped for links out of it removes nothing outside, 500
// times over.
func TestWorkerDirRemovalNeverLeavesIt(t *testing.T) {
	e := testExecutor(t)
	cdir, cfile, secret := outsideCanary(t)
	var swaps int64
	for i := range 500 {
		name := "0123456789abcdef-" + string(rune('a'+i%26))
		out := workerTree(t, e, name, cdir, cfile)
		stop := swapper(t, out, [2]string{"ckpt", ".ckpt"}, [2]string{"result.json", ".result.json"})
		time.Sleep(100 * time.Microsecond)
		err := e.root.RemoveAll(name)
		swaps += stop()
		if err != nil {
			e.root.RemoveAll(name) // a swap raced the listing; the next pass empties it
		}
		if b, err := os.ReadFile(cfile); err != nil || !bytes.Equal(b, secret) {
			t.Fatalf("after %d removals the canary is %q, %v", i+1, b, err)
		}
	}
	t.Logf("500 removals against %d swaps", swaps)
}

// TestWorkerLogReadsStayInTheLogDir: reads of a worker's log, while its
// files are swapped for links to the canary, never return its bytes.
func TestWorkerLogReadsStayInTheLogDir(t *testing.T) {
	e := testExecutor(t)
	_, cfile, secret := outsideCanary(t)
	l, err := openWorkerLog(e.logs, "w")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	line := bytes.Repeat([]byte("x"), 1023)
	for l.Size() < workerLogFileBytes+4096 { // a previous file and a current one
		l.Write(append(line, '\n'))
	}
	logDir := filepath.Join(e.dir, "logs", "w")
	for _, n := range []string{".cur", ".prev"} {
		if err := os.Symlink(cfile, filepath.Join(logDir, n)); err != nil {
			t.Fatal(err)
		}
	}
	stop := swapper(t, logDir, [2]string{workerLogCurrent, ".cur"}, [2]string{workerLogPrevious, ".prev"})
	for i := range 5000 {
		got := l.Read(int64(i) * 1000 % l.Size())
		if bytes.Contains(got.Data, secret) {
			t.Fatal("a log read returned the canary from outside the log dir")
		}
	}
	t.Logf("5000 reads against %d swaps", stop())
}

// TestWorkerLogCapsAndRotates: a worker writing far more than the cap
// leaves at most the cap on disk; a reader that carries on from its last
// offset gets every byte kept, in order, and is told of what was dropped.
func TestWorkerLogCapsAndRotates(t *testing.T) {
	e := testExecutor(t)
	l, err := openWorkerLog(e.logs, "w")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var all bytes.Buffer
	chunk := make([]byte, 100_003)
	for i := 0; all.Len() < 5*WorkerLogBytes; i++ {
		for j := range chunk {
			chunk[j] = 'a' + byte((i+j)%26)
		}
		all.Write(chunk)
		if n, err := l.Write(chunk); n != len(chunk) || err != nil {
			t.Fatalf("write: %d, %v", n, err)
		}
	}
	var onDisk int64
	entries, _ := os.ReadDir(filepath.Join(e.dir, "logs", "w"))
	for _, d := range entries {
		fi, _ := d.Info()
		onDisk += fi.Size()
	}
	if onDisk > WorkerLogBytes || len(entries) > workerLogFiles {
		t.Errorf("%d files, %d bytes on disk; want at most %d files, %d bytes", len(entries), onDisk, workerLogFiles, WorkerLogBytes)
	}
	if l.Size() != int64(all.Len()) {
		t.Errorf("Size = %d, want %d written", l.Size(), all.Len())
	}
	// A reader from the start: told of the drop, then the kept tail.
	first := l.Read(0)
	if !strings.HasPrefix(string(first.Data), "[deepmarket: ") {
		t.Fatalf("a read from a dropped offset starts %q", first.Data[:min(len(first.Data), 60)])
	}
	var got bytes.Buffer
	_, kept, _ := bytes.Cut(first.Data, []byte("\n"))
	got.Write(kept)
	off := first.Next
	for {
		lg := l.Read(off)
		if len(lg.Data) == 0 {
			break
		}
		if len(lg.Data) > p2p.MaxLogChunk {
			t.Fatalf("a chunk of %d bytes", len(lg.Data))
		}
		got.Write(lg.Data)
		off = lg.Next
	}
	if off != int64(all.Len()) || !bytes.HasSuffix(all.Bytes(), got.Bytes()) || int64(got.Len()) < WorkerLogBytes-workerLogFileBytes {
		t.Errorf("read %d bytes up to offset %d of %d: not the kept tail of what was written", got.Len(), off, all.Len())
	}
}

// TestSweepRemovesOldLogs: logs not written for longer than keep_logs go;
// newer ones and a live worker's stay.
func TestSweepRemovesOldLogs(t *testing.T) {
	e := testExecutor(t)
	now := time.Now()
	for name, age := range map[string]time.Duration{"old": 2 * time.Hour, "new": time.Minute, "live": 3 * time.Hour} {
		l, err := openWorkerLog(e.logs, name)
		if err != nil {
			t.Fatal(err)
		}
		l.Write([]byte("hello\n"))
		l.Close()
		for _, p := range []string{filepath.Join(name, workerLogCurrent), name} {
			if err := e.logs.Chtimes(p, now.Add(-age), now.Add(-age)); err != nil {
				t.Fatal(err)
			}
		}
	}
	e.workers = map[string]*worker{"live": {name: "live", done: make(chan struct{})}}
	e.sweep(now)
	for name, want := range map[string]bool{"old": false, "new": true, "live": true} {
		if _, err := e.logs.Stat(name); (err == nil) != want {
			t.Errorf("log %s there: %v, want %v", name, err == nil, want)
		}
	}
}

// TestWorkerLogSaysPathsRelativeToTheWorker: a worker's output names paths
// in its dir, which exist only on this machine; its submitter reads them
// relative to the worker's dir, and the offsets stay the log's own.
func TestWorkerLogSaysPathsRelativeToTheWorker(t *testing.T) {
	e := testExecutor(t)
	l, err := openWorkerLog(e.logs, "w")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	w := &worker{dir: "/var/tmp/deepmarket-jobs/x1/job-0", log: l}
	line := "wrote /var/tmp/deepmarket-jobs/x1/job-0/out/model.keras and /etc/hostname\n"
	l.Write([]byte(line))
	got := w.readLog(0)
	if string(got.Data) != "wrote out/model.keras and /etc/hostname\n" || got.Next != int64(len(line)) {
		t.Errorf("read %q, next %d", got.Data, got.Next)
	}
}
