package lender

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"

	"github.com/deepmarket/deepmarket/node/sandbox"
	"github.com/deepmarket/deepmarket/node/sandbox/sandboxtest"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/p2p/tunnel"
	"github.com/deepmarket/deepmarket/storage"
)

// runnerExecutor is an executor that runs real workers in the sandbox,
// through its whole pipeline: a work area the workers' uids can reach, a
// block store, and a libp2p host for the tunnels (a one-machine run opens
// none). Its workers run this machine's python3 (DM_PYTHON when set).
func runnerExecutor(t *testing.T) *Executor {
	t.Helper()
	sandboxtest.Need(t)
	work := reapWorkDir(t)
	e := workAreaExecutor(t, filepath.Join(work, "work"), newMemStore())
	if err := os.Chmod(e.dir, 0o711); err != nil {
		t.Fatal(err)
	}
	store, err := storage.Open(filepath.Join(t.TempDir(), "blocks"), storage.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	h, err := libp2p.New(libp2p.NoListenAddrs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	e.tunnels = tunnel.New(h, "test-chain", slog.New(slog.DiscardHandler))
	t.Cleanup(e.tunnels.Close)
	e.self, e.blocks, e.ids = h.ID().String(), store, sandbox.DefaultIDs
	e.python = cmp.Or(os.Getenv("DM_PYTHON"), "python3")
	e.home = t.TempDir()
	e.workers, e.nets, e.cpus, e.gpus = map[string]*worker{}, map[string]*runNet{}, map[int]string{}, map[int]string{}
	return e
}

// runChief runs the chief of a one-machine job whose command is python3
// -c script on e, to its end (its output kept or refused), and returns
// what its status says and the worker's log.
func runChief(t *testing.T, e *Executor, script string) (p2p.JobStatus, string) {
	t.Helper()
	job := randomJobID(t)
	name := workerName(job, 0)
	w := &worker{l: p2p.Launch{JobID: job, World: []string{e.self}, Command: []string{"python3", "-c", script},
		Res: p2p.Resources{Cores: 1, MemBytes: 256 << 20}, MaxSecs: 60},
		key: workerKey(job, 0), name: name, dir: filepath.Join(e.dir, name), box: name + "-test",
		state: p2p.WorkerFetching, beat: time.Now(), done: make(chan struct{})}
	e.workers[w.key] = w
	e.run(t.Context(), w)
	close(w.done)
	log := w.readLog(0)
	// What finish does, but for the hold, which the test never took.
	for _, c := range w.closers {
		c()
	}
	w.log.Close()
	if err := e.root.RemoveAll(name); err != nil {
		t.Error(err)
	}
	return w.status(time.Now()), string(log.Data)
}

// cappedBlocks stops any import that reads more than capBytes, so that a
// node without an output bound fails a test in seconds rather than
// reading for minutes; read is the most an import said it had read.
type cappedBlocks struct {
	Blocks
	read atomic.Int64
}

const capBytes = 256 << 20

func (b *cappedBlocks) AddFrom(ctx context.Context, root *os.Root, path string, progress func(storage.Progress)) (storage.Pin, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	return b.Blocks.AddFrom(ctx, root, path, func(p storage.Progress) {
		if p.Done > b.read.Load() {
			b.read.Store(p.Done)
		}
		if p.Done > capBytes {
			cancel()
		}
		if progress != nil {
			progress(p)
		}
	})
}

// nodeWork is what this process (the node) has read, in bytes, and the
// CPU time it has used.
func nodeWork(t *testing.T) (read int64, cpu time.Duration) {
	t.Helper()
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "rchar: "); ok {
			read, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return read, time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestHostileOutputIsRefusedUnread: real jobs leave outputs that cost
// nothing to make and much to read (the sparse-output bomb: two 9 GiB
// sparse files and a hard link to each, 36 GiB to read and nothing on
// disk; a real 16 MiB file linked 700 times; 10,001 empty files). The
// node refuses each, says why in the worker's status, and reads next to
// nothing of it. An honest output beside them is kept.
func TestHostileOutputIsRefusedUnread(t *testing.T) {
	e := runnerExecutor(t)
	blocks := &cappedBlocks{Blocks: e.blocks}
	e.blocks = blocks
	const prelude = "import os\nout = os.environ['DM_OUTPUT_DIR']\np = lambda n: os.path.join(out, n)\n"
	for _, tc := range []struct {
		name, script, why string
	}{
		{"sparse bomb", `
for n in ("a", "b"):
    with open(p(n), "wb") as f:
        f.truncate(9 << 30)
    os.link(p(n), p(n + ".link"))
`, "is sparse"},
		{"hard links", `
with open(p("w"), "wb") as f:
    f.write(os.urandom(16 << 20))
for i in range(700):
    os.link(p("w"), p("w%d" % i))
`, "counts once per hard link"},
		{"entries", `
for i in range(10001):
    open(p("f%d" % i), "w").close()
`, "more than 10000 files"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			blocks.read.Store(0)
			read0, cpu0 := nodeWork(t)
			st, log := runChief(t, e, prelude+tc.script)
			read1, cpu1 := nodeWork(t)
			read, cpu := read1-read0, cpu1-cpu0
			t.Logf("the node read %d bytes (%d by the import) and used %s of CPU; status %s: %s", read, blocks.read.Load(), cpu, st.State, st.Reason)
			if st.State != p2p.WorkerFailed || st.Result != "" || !strings.HasPrefix(st.Reason, "output too large: ") || !strings.Contains(st.Reason, tc.why) {
				t.Errorf("status %s, result %q, reason %q; want failed, no result, output too large: …%s…\n%s", st.State, st.Result, st.Reason, tc.why, log)
			}
			if read > 16<<20 || blocks.read.Load() > 0 {
				t.Errorf("the node read %d bytes, the import %d, for an output it refuses", read, blocks.read.Load())
			}
		})
	}

	t.Run("honest", func(t *testing.T) {
		st, log := runChief(t, e, prelude+`
os.makedirs(p("ckpt"))
with open(p("ckpt/weights"), "wb") as f:
    f.write(os.urandom(3 << 20))
with open(p("result.json"), "w") as f:
    f.write('{"loss": 0.1}')
os.symlink("ckpt/weights", p("latest"))
`)
		if st.State != p2p.WorkerExited || st.Result == "" || st.Reason != "" {
			t.Fatalf("status %+v; want exited with a result\n%s", st, log)
		}
	})
}

// TestMeasureOutput: the walk that bounds an output, on trees laid out
// here, reads no file and follows no link.
func TestMeasureOutput(t *testing.T) {
	lim := outputLimits{bytes: 1 << 20, holes: 64 << 10, entries: 50, depth: 4}
	for _, tc := range []struct {
		name    string
		lay     func(t *testing.T, out string)
		bytes   uint64
		refused string
	}{
		{"files and links", func(t *testing.T, out string) {
			write(t, filepath.Join(out, "a"), 1000)
			mkdir(t, filepath.Join(out, "d"))
			write(t, filepath.Join(out, "d", "b"), 24)
			// A link to a big file outside counts nothing: it is kept as a link.
			big := filepath.Join(t.TempDir(), "big")
			write(t, big, 4<<20)
			symlink(t, big, filepath.Join(out, "big"))
			symlink(t, "..", filepath.Join(out, "d", "up"))
		}, 1024, ""},
		{"hard links count per link", func(t *testing.T, out string) {
			write(t, filepath.Join(out, "w"), 300<<10)
			for i := range 3 {
				if err := os.Link(filepath.Join(out, "w"), filepath.Join(out, fmt.Sprint("l", i))); err != nil {
					t.Fatal(err)
				}
			}
		}, 0, "output too large: more than 1 MiB in the output dir, the job's disk bound (a file counts once per hard link)"},
		{"sparse", func(t *testing.T, out string) {
			if err := os.Truncate(create(t, filepath.Join(out, "s")), 128<<10); err != nil {
				t.Fatal(err)
			}
		}, 0, "output too large: out/s is sparse (128 KiB long, 0 B on disk); at most 64 KiB of holes are kept"},
		{"a little sparse", func(t *testing.T, out string) {
			if err := os.Truncate(create(t, filepath.Join(out, "s")), 60<<10); err != nil {
				t.Fatal(err)
			}
		}, 60 << 10, ""},
		{"entries", func(t *testing.T, out string) {
			for i := range 51 {
				create(t, filepath.Join(out, fmt.Sprint(i)))
			}
		}, 0, "output too large: more than 50 files and dirs in the output dir"},
		{"depth", func(t *testing.T, out string) {
			mkdir(t, filepath.Join(out, "1", "2", "3", "4"))
		}, 0, "output too large: the output dir nests dirs more than 4 deep"},
		{"fifo", func(t *testing.T, out string) {
			if err := syscall.Mkfifo(filepath.Join(out, "p"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, 0, "output refused: out/p is a named pipe; only files, directories and symbolic links are kept"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			mkdir(t, filepath.Join(dir, "out"))
			tc.lay(t, filepath.Join(dir, "out"))
			root, err := os.OpenRoot(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer root.Close()
			got, err := measureOutput(root, "out", lim)
			if tc.refused != "" {
				if _, ok := err.(outputRefusal); !ok || !strings.HasPrefix(err.Error(), tc.refused) {
					t.Fatalf("measured %d, %v; want refused: %s", got, err, tc.refused)
				}
				return
			}
			if err != nil || got != tc.bytes {
				t.Fatalf("measured %d, %v; want %d", got, err, tc.bytes)
			}
		})
	}
}

func mkdir(t *testing.T, p string) {
	t.Helper()
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
}

func create(t *testing.T, p string) string {
	t.Helper()
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func write(t *testing.T, p string, n int) {
	t.Helper()
	if err := os.WriteFile(p, bytes.Repeat([]byte{'x'}, n), 0o644); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, p string) {
	t.Helper()
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
}
