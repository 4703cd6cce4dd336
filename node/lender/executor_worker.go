package lender

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/ipfs/go-cid"

	"github.com/deepmarket/deepmarket/node/image"
	"github.com/deepmarket/deepmarket/node/sandbox"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/storage"
	"github.com/deepmarket/deepmarket/units"
)

// set runs f with the worker's lock held.
func (w *worker) set(f func()) {
	w.mu.Lock()
	f()
	w.mu.Unlock()
}

// fail ends the worker failed for reason, unless it was stopped (then
// its reason stays the stop's).
func (w *worker) fail(reason string) {
	w.set(func() {
		if w.state != p2p.WorkerStopped {
			w.state, w.reason = p2p.WorkerFailed, reason
		}
		if w.ended.IsZero() {
			w.ended = time.Now()
		}
	})
}

// run is one worker's life here: prepared (recorded, a fresh dir, its
// inputs, its program, its cluster, its environment), started in its
// sandbox and waited for; the chief's output is then kept. A step that
// fails ends the worker failed, with that step's reason.
func (e *Executor) run(ctx context.Context, w *worker) {
	log := e.log.With("module", "executor", "job", w.l.JobID[:12], "worker", w.l.Index)
	defer logFailure(log, w)
	spec, lease, err := e.prepare(ctx, w)
	if err != nil {
		w.fail(err.Error())
		return
	}
	proc, err := e.startWorker(ctx, w, spec)
	if err != nil {
		w.fail(err.Error())
		return
	}
	if proc == nil {
		return // stopped before it started
	}
	log.Info("worker started", "command", w.l.Command, "cpus", w.cpus, "uid", lease.ID)
	exit, err := awaitWorker(proc, lease)
	stopped, wantCkpt, state := w.recordEnd(exit, err)
	log.Info("worker ended", "exit", exit.Code, "signal", exit.Signal, "state", state, "cpu", exit.CPU)
	if !w.holder && w.l.Training.Held() && err == nil {
		e.keepEvidence(ctx, w) // its refused rounds, for an appeal
	}
	if w.keepsOutput() && err == nil && (!stopped && exit.Code == 0 || wantCkpt) {
		// The chief's output dir is the job's result (or its checkpoint),
		// read only once nothing of the job is left to change it.
		e.collectOutput(ctx, w, stopped)
	}
}

// logFailure tells the machine's owner why a worker failed here, whatever
// step failed: the submitter sees the reason clipped (p2p.MaxReasonLen),
// and only if it still asks.
func logFailure(log *slog.Logger, w *worker) {
	w.mu.Lock()
	state, reason, exit := w.state, w.reason, w.exit
	w.mu.Unlock()
	if state == p2p.WorkerFailed || (state == p2p.WorkerExited && reason != "") {
		log.Warn("worker failed", "state", state, "exit", exit, "reason", reason)
	}
}

// prepare readies all the worker's sandbox needs, in order: its record,
// a fresh dir, its inputs, its program, its run's network, its
// environment, its log and uid. It returns the sandbox's spec and the
// lease of the uid it runs as.
func (e *Executor) prepare(ctx context.Context, w *worker) (sandbox.Spec, *sandbox.Lease, error) {
	if err := e.recordWorker(w); err != nil {
		return sandbox.Spec{}, nil, err
	}
	if err := e.prepareDir(w); err != nil {
		return sandbox.Spec{}, nil, err
	}
	// The log first: what the node does before the worker starts (its
	// image's fetch) shows there.
	jl, err := openWorkerLog(e.logs, w.name)
	if err != nil {
		return sandbox.Spec{}, nil, err
	}
	w.set(func() { w.log = jl })
	if err := e.fetchInputs(ctx, w); err != nil {
		return sandbox.Spec{}, nil, err
	}
	argv, err := e.prepareProgram(w)
	if err != nil {
		return sandbox.Spec{}, nil, err
	}
	ns, err := e.wireNet(ctx, w)
	if err != nil {
		return sandbox.Spec{}, nil, err
	}
	env := e.buildEnv(w)
	lease, err := e.ids.Acquire()
	w.set(func() { w.lease = lease })
	if err != nil {
		return sandbox.Spec{}, nil, fmt.Errorf("a uid for the worker: %w", err)
	}
	return e.sandboxSpec(w, argv, env, jl, ns, lease.ID), lease, nil
}

// recordWorker stores the worker's sandbox record before anything of it
// exists to clean up, so that the next start of a node that dies
// meanwhile reaps it; finish forgets it.
func (e *Executor) recordWorker(w *worker) error {
	if err := e.store.Put(sandboxesKey+w.box, sandboxRecord{Job: w.l.JobID, Index: w.l.Index, Dir: w.dir}); err != nil {
		return fmt.Errorf("record the worker: %w", err)
	}
	return nil
}

// prepareDir gives the worker a fresh dir with bundle/, data/, out/ and
// tmp/, root's until the sandbox hands it to the worker's uid: no job can
// reach it while the node lays the inputs out.
func (e *Executor) prepareDir(w *worker) error {
	if err := e.root.RemoveAll(w.name); err != nil {
		return fmt.Errorf("work dir: %w", err)
	}
	if err := e.root.Mkdir(w.name, 0o700); err != nil {
		return fmt.Errorf("work dir: %w", err)
	}
	for _, d := range []string{"bundle", "data", "out", "tmp"} {
		if err := e.root.Mkdir(filepath.Join(w.name, d), 0o755); err != nil {
			return fmt.Errorf("work dir: %w", err)
		}
	}
	return nil
}

// validationDir is where a held job's holder finds its validation batch,
// in its dir: the file by its CID.
const validationDir = "validation"

// fetchInputs fetches the worker's inputs by CID into its dir: the bundle,
// the dataset, for the holder its validation batch, and, for the chief,
// the checkpoint the run resumes from.
func (e *Executor) fetchInputs(ctx context.Context, w *worker) error {
	l := w.l
	fetch := func(c, into string) error {
		if c == "" {
			return nil
		}
		id, _ := cid.Decode(c)
		// A fetch that stalled (no peer delivered a block for a while: a
		// relay or hole punch that broke, on a busy machine) is tried once
		// more, from the blocks it kept, before the worker fails.
		for try := 0; ; try++ {
			_, err := e.blocks.FetchInto(ctx, id, into, nil)
			if err == nil || try == 1 || !errors.Is(err, storage.ErrStalled) || ctx.Err() != nil {
				return err
			}
			e.log.Warn("fetch stalled: trying again from the blocks kept", "module", "executor", "job", l.JobID[:min(len(l.JobID), 12)], "cid", c, "err", err)
		}
	}
	if err := fetch(l.Bundle, filepath.Join(w.dir, "bundle")); err != nil {
		return fmt.Errorf("fetch bundle: %w", err)
	}
	if err := fetch(l.Dataset, filepath.Join(w.dir, "data")); err != nil {
		return fmt.Errorf("fetch dataset: %w", err)
	}
	if w.holder && l.Training != nil {
		if err := fetch(l.Training.Validation, filepath.Join(w.dir, validationDir)); err != nil {
			return fmt.Errorf("fetch validation batch: %w", err)
		}
	}
	if l.Index == 0 {
		if err := fetch(l.Resume, filepath.Join(w.dir, "out")); err != nil {
			return fmt.Errorf("fetch checkpoint: %w", err)
		}
	}
	if l.Image != "" {
		return e.fetchImage(ctx, w)
	}
	return nil
}

// fetchImage gives the worker its image's root filesystem: the one the
// cache holds from a layout of this CID, as it is (a warm machine fetches
// nothing), or else the layout fetched into the worker's dir, root's
// still, checked and unpacked into the cache, then removed. The worker's
// log says which, and how the fetch goes.
func (e *Executor) fetchImage(ctx context.Context, w *worker) error {
	c := w.l.Image
	root, release, ok, err := e.images.RootOf(c)
	if err != nil {
		return fmt.Errorf("image %s: %w", c, err)
	}
	if ok {
		w.set(func() {
			w.image = root
			w.closers = append(w.closers, release)
		})
		w.note("image %s: held here, nothing to fetch", c)
		return nil
	}
	id, _ := cid.Decode(c)
	start, said := time.Now(), time.Now()
	layout := filepath.Join(w.dir, "image")
	progress := func(p storage.Progress) {
		if time.Since(said) >= imageProgressEvery {
			said = time.Now()
			w.note("image %s: fetched %s of %s", c, units.FormatSize(uint64(p.Done)), units.FormatSize(uint64(max(p.Total, p.Done))))
		}
	}
	var pin storage.Pin
	for try := 0; ; try++ { // once more after a stall, as the other inputs
		pin, err = e.blocks.FetchInto(ctx, id, layout, progress)
		if err == nil || try == 1 || !errors.Is(err, storage.ErrStalled) || ctx.Err() != nil {
			break
		}
		w.note("image %s: the fetch stalled (%v): trying again from the blocks kept", c, err)
	}
	if err != nil {
		return fmt.Errorf("fetch image: %w", err)
	}
	fetched := time.Since(start)
	err = e.takeImage(w, layout)
	if rerr := e.root.RemoveAll(filepath.Join(w.name, "image")); err == nil {
		err = rerr
	}
	if err == nil {
		w.note("image %s: fetched %s in %s, checked and unpacked in %s", c, units.FormatSize(uint64(pin.Size)),
			fetched.Round(10*time.Millisecond), (time.Since(start) - fetched).Round(10*time.Millisecond))
	}
	return err
}

// imageProgressEvery is how often a worker's log says how its image's
// fetch goes.
const imageProgressEvery = 2 * time.Second

// note writes a line of the node's own to the worker's log, which the
// job's submitter reads with the worker's output.
func (w *worker) note(format string, args ...any) {
	w.mu.Lock()
	jl := w.log
	w.mu.Unlock()
	if jl != nil {
		fmt.Fprintf(jl, "[deepmarket] "+format+"\n", args...)
	}
}

// takeImage opens the image layout at dir and takes its root filesystem
// from the cache, unpacking it there first when it is new (every layer
// checked against its digest, a hostile one refused): the worker runs in
// it, and the cache keeps it until the worker is done.
func (e *Executor) takeImage(w *worker, dir string) error {
	img, err := image.Open(dir)
	if err != nil {
		return fmt.Errorf("image %s: %w", w.l.Image, err)
	}
	root, release, err := e.images.Root(img, w.l.Image)
	if err != nil {
		return fmt.Errorf("image %s: %w", w.l.Image, err)
	}
	w.set(func() {
		w.image = root
		w.closers = append(w.closers, release)
	})
	return nil
}

// prepareProgram is the worker's argv, its program made executable when
// it is a file of the bundle.
func (e *Executor) prepareProgram(w *worker) ([]string, error) {
	argv, inBundle, err := e.program(w.l.Command, w.l.Image != "")
	if err == nil && inBundle {
		err = e.makeRunnable(w.name, argv[0])
	}
	return argv, err
}

// buildEnv is the worker's environment: the DM_* variables that place it
// in its run (its rank, the cluster, its dirs), the run's training
// settings, its framework's view of the cluster, and a PATH that finds
// this machine's Python first.
func (e *Executor) buildEnv(w *worker) []string {
	l := w.l
	addrs, avg := clusterAddrs(len(l.World))
	env := []string{
		"DM_JOB_ID=" + l.JobID, "DM_RANK=" + strconv.Itoa(l.Index), "DM_WORLD_SIZE=" + strconv.Itoa(len(l.World)),
		"DM_WORKERS=" + strings.Join(addrs, ","), "DM_AVG_PEERS=" + strings.Join(avg, ","), "DM_CORES=" + strconv.Itoa(int(max(l.Res.Cores, 1))),
		"DM_DATA_DIR=" + filepath.Join(w.dir, "data"), "DM_OUTPUT_DIR=" + filepath.Join(w.dir, "out"),
		"DM_PROGRESS_FILE=" + filepath.Join(w.dir, progressFile),
	}
	env = append(env, l.Training.Env()...)
	if w.holder {
		ranks := make([]string, len(l.World))
		for j := range ranks {
			ranks[j] = "127.0.0.1:" + strconv.Itoa(holderPort(j))
		}
		env = append(env, "DM_ROLE=holder", "DM_AVG_HOLDER="+ranks[0], "DM_AVG_HOLDER_RANKS="+strings.Join(ranks, ","))
		if v := l.Training.Validation; v != "" {
			env = append(env, "DM_VALIDATION="+filepath.Join(w.dir, validationDir, v)) // FetchInto: a file root is dir/<cid>
		}
	} else {
		if l.Training.Held() {
			env = append(env, "DM_AVG_HOLDER=127.0.0.1:"+strconv.Itoa(holderPort(l.Index)),
				"DM_EVIDENCE_DIR="+filepath.Join(w.dir, evidenceDir))
		}
		env = append(env, frameworkEnv(l.Framework, l.Index, addrs, l.World)...)
	}
	path := "/usr/local/bin:/usr/bin:/bin"
	if e.python != "" && strings.Contains(e.python, "/") && l.Image == "" {
		// python3 in the command is the configured environment's.
		path = filepath.Dir(e.python) + ":" + path
	}
	// An image's own variables (its PATH, PYTHONPATH, ...) override the
	// default PATH, and the run's override them.
	return append(append([]string{"PATH=" + path}, w.image.Env...), env...)
}

// frameworkEnv tells a worker's framework its cluster: MASTER_ADDR and
// MASTER_PORT (the chief's address, as torch.distributed reads it); for
// torch, the rest of torchrun's contract: RANK and WORLD_SIZE, and
// LOCAL_RANK and LOCAL_WORLD_SIZE among the job's workers on the same
// machine (world names each worker's machine); for TensorFlow, TF_CONFIG
// with the worker's index.
func frameworkEnv(framework string, index int, addrs, world []string) []string {
	var env []string
	if host, port, err := net.SplitHostPort(addrs[0]); err == nil {
		env = append(env, "MASTER_ADDR="+host, "MASTER_PORT="+port)
	}
	if framework == "torch" {
		local, here := 0, 0
		for i, m := range world {
			if m == world[index] {
				if i < index {
					local++
				}
				here++
			}
		}
		env = append(env, "RANK="+strconv.Itoa(index), "WORLD_SIZE="+strconv.Itoa(len(world)),
			"LOCAL_RANK="+strconv.Itoa(local), "LOCAL_WORLD_SIZE="+strconv.Itoa(here))
	}
	if framework == "tensorflow" {
		tf, _ := json.Marshal(map[string]any{
			"cluster": map[string][]string{"worker": addrs},
			"task":    map[string]any{"type": "worker", "index": index},
		})
		env = append(env, "TF_CONFIG="+string(tf))
	}
	return env
}

// sandboxSpec is the worker's sandbox: its dir, entered at bundle/, its
// output to its log, its run's network namespace, its own uid and the
// limits its hold reserved. It may read this machine's Python
// environment, and never sees the node's home.
func (e *Executor) sandboxSpec(w *worker, argv, env []string, jl *workerLog, ns *sandbox.NetNS, uid int) sandbox.Spec {
	l := w.l
	spec := sandbox.Spec{
		Name: w.box, Dir: w.dir, Cwd: filepath.Join(w.dir, "bundle"),
		Argv: argv, Env: env, Stdout: jl, Stderr: jl, NetNS: ns, UID: uid,
		Limits: sandbox.Limits{
			CPUs: w.cpus, Cores: float64(max(l.Res.Cores, 1)), MemBytes: l.Res.MemBytes,
			Pids: 512, DiskBytes: workerDiskBytes(l), GPUs: w.gpus,
		},
		ReadOnly: readOnlyFor(e.python),
		Hide:     []string{e.home},
	}
	if w.image.Dir != "" { // its own environment: none of this machine's
		spec.Root, spec.ReadOnly = w.image.Dir, nil
	}
	return spec
}

// workerDiskBytes bounds a worker's dir, and what the node reads of its
// output. The logs count against the worker's disk bound.
func workerDiskBytes(l p2p.Launch) uint64 {
	return max(10<<30, 2*l.Res.MemBytes) - WorkerLogBytes
}

// startWorker starts the worker's sandbox and marks it running. A worker
// stopped while it was being prepared is not started: startWorker then
// returns neither a process nor an error.
func (e *Executor) startWorker(ctx context.Context, w *worker, spec sandbox.Spec) (*sandbox.Process, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopping {
		return nil, nil
	}
	proc, err := sandbox.Start(ctx, spec)
	if err != nil {
		w.boxLeft = true // Start may have failed to remove its cgroup
		return nil, fmt.Errorf("start: %w", err)
	}
	w.proc, w.state, w.started = proc, p2p.WorkerRunning, time.Now()
	return proc, nil
}

// awaitWorker waits for the worker's sandbox to end. When it ended
// cleanly, nothing of the job is left and its dir is root's again: the
// uid owns nothing and is released to serve another job.
func awaitWorker(proc *sandbox.Process, lease *sandbox.Lease) (sandbox.Exit, error) {
	exit, err := proc.Wait()
	if err == nil {
		lease.Release()
	}
	return exit, err
}

// recordEnd records how the worker's sandbox ended (err: it could not be
// waited for or emptied, so it may be left for the next start to reap).
// It returns whether the worker had been stopped, whether its checkpoint
// was asked for, and the state it ended in.
func (w *worker) recordEnd(exit sandbox.Exit, err error) (stopped, wantCkpt bool, state p2p.WorkerState) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ended = time.Now()
	w.exit = exit.Code
	w.boxLeft = err != nil
	stopped = w.stopping
	switch {
	case stopped:
		w.state = p2p.WorkerStopped
	case err != nil:
		w.state, w.reason = p2p.WorkerFailed, err.Error()
	case exit.OOMKilled:
		w.state, w.reason = p2p.WorkerFailed, fmt.Sprintf("out of memory: the job's limit is %s per worker", units.FormatSize(w.l.Res.MemBytes))
	case exit.PidsLimited:
		w.state, w.reason = p2p.WorkerFailed, "too many processes (the job's limit is 512)"
	case exit.DiskExceeded:
		w.state, w.reason = p2p.WorkerFailed, "the job's work dir outgrew its disk bound"
	case exit.Code != 0 || exit.Signal != "":
		w.state, w.reason = p2p.WorkerExited, fmt.Sprintf("exited with code %d %s", exit.Code, exit.Signal)
	default:
		w.state = p2p.WorkerExited
	}
	return stopped, w.wantCkpt, w.state
}

// collectOutput adds the chief's output dir to storage: the job's result,
// or its checkpoint when it was stopped. A worker that cannot keep its
// result, or whose output is refused (outputRefusal), fails. The time it
// takes is the job's: the worker's end, which its pay runs until, moves
// to when it is done.
func (e *Executor) collectOutput(ctx context.Context, w *worker, stopped bool) {
	pin, err := e.addOutput(context.WithoutCancel(ctx), w)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ended = time.Now()
	var refused outputRefusal
	switch {
	case errors.As(err, &refused):
		w.reason = refused.Error()
	case err != nil:
		w.reason = "could not keep the output: " + err.Error()
	case stopped:
		w.ckpt = pin.CID.String()
	default:
		w.result = pin.CID.String()
	}
	if err != nil && !stopped {
		w.state = p2p.WorkerFailed
	}
}

// addOutput adds the chief's output dir to storage. The job chose what is
// in it, links included: it is measured first, with lstat alone, and
// refused when it passes the bounds in output.go; the import then
// resolves every name beneath the worker's dir and reads nothing outside
// it, and stops should it read more than was measured. Neither runs while
// the worker's sandbox may hold a process of the job.
func (e *Executor) addOutput(ctx context.Context, w *worker) (storage.Pin, error) {
	w.mu.Lock()
	left := w.boxLeft
	w.mu.Unlock()
	if left {
		return storage.Pin{}, errors.New("the job's sandbox could not be emptied: its output is not read")
	}
	dir, err := e.root.OpenRoot(w.name)
	if err != nil {
		return storage.Pin{}, err
	}
	defer dir.Close()
	lim := outputLimits{bytes: workerDiskBytes(w.l), holes: maxOutputHoles, entries: maxOutputEntries, depth: maxOutputDepth}
	size, err := measureOutput(dir, "out", lim)
	if err != nil {
		return storage.Pin{}, err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	overread := func(p storage.Progress) {
		if p.Done > int64(size) {
			cancel(fmt.Errorf("read %d bytes of an output measured at %d", p.Done, size))
		}
	}
	pin, err := e.blocks.AddFrom(ctx, dir, "out", overread)
	if cause := context.Cause(ctx); err != nil && cause != nil {
		err = cause
	}
	return pin, err
}

// readOnlyFor lists what a job may read beyond its dir: the Python
// environment that runs it.
func readOnlyFor(python string) []string {
	if !strings.Contains(python, "/") {
		return nil
	}
	// .../venv/bin/python3 -> .../venv
	return []string{filepath.Dir(filepath.Dir(python))}
}
