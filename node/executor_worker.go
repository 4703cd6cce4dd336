package node

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/node/sandbox"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/storage"
	"github.com/deepmarket/deepmarket/units"
)

func (w *worker) set(f func()) {
	w.mu.Lock()
	f()
	w.mu.Unlock()
}

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

// run fetches the worker's inputs, wires its cluster and runs it.
func (e *Executor) run(ctx context.Context, w *worker) {
	log := e.n.log.With("module", "executor", "job", w.l.JobID[:12], "worker", w.l.Index)
	l := w.l
	// Recorded before anything exists to clean up; finish forgets it.
	if err := e.n.store.Put(sandboxesKey+w.box, sandboxRecord{Job: l.JobID, Index: l.Index, Dir: w.dir}); err != nil {
		w.fail("record the worker: " + err.Error())
		return
	}
	// A fresh dir, root's until the sandbox hands it to the worker's uid:
	// no job can reach it while the node lays the inputs out.
	if err := e.root.RemoveAll(w.name); err != nil {
		w.fail("work dir: " + err.Error())
		return
	}
	if err := e.root.Mkdir(w.name, 0o700); err != nil {
		w.fail("work dir: " + err.Error())
		return
	}
	for _, d := range []string{"bundle", "data", "out", "tmp"} {
		if err := e.root.Mkdir(filepath.Join(w.name, d), 0o755); err != nil {
			w.fail("work dir: " + err.Error())
			return
		}
	}
	fetch := func(c, into string) error {
		if c == "" {
			return nil
		}
		id, _ := cid.Decode(c)
		_, err := e.n.blocks.FetchInto(ctx, id, into, nil)
		return err
	}
	if err := fetch(l.Bundle, filepath.Join(w.dir, "bundle")); err != nil {
		w.fail("fetch bundle: " + err.Error())
		return
	}
	if err := fetch(l.Dataset, filepath.Join(w.dir, "data")); err != nil {
		w.fail("fetch dataset: " + err.Error())
		return
	}
	if l.Index == 0 {
		if err := fetch(l.Resume, filepath.Join(w.dir, "out")); err != nil {
			w.fail("fetch checkpoint: " + err.Error())
			return
		}
	}
	argv, inBundle, err := e.program(l.Command)
	if err == nil && inBundle {
		err = e.makeRunnable(w.name, argv[0])
	}
	if err != nil {
		w.fail(err.Error())
		return
	}
	// The cluster, as every worker sees it: worker j at 127.0.0.1 on
	// workerPort(j) of the run's network namespace, where only loopback
	// exists; remote workers are forwarders through authenticated tunnels.
	self := e.n.host.ID().String()
	addrs := make([]string, len(l.World))
	avg := make([]string, len(l.World))
	var allowed []peer.ID
	for j, m := range l.World {
		addrs[j] = "127.0.0.1:" + strconv.Itoa(workerPort(j))
		avg[j] = "127.0.0.1:" + strconv.Itoa(avgPort(j))
		if id, err := peer.Decode(m); err == nil && m != self && !slices.Contains(allowed, id) {
			allowed = append(allowed, id)
		}
	}
	ns, err := e.acquireNet(ctx, l)
	if ns != nil {
		w.set(func() { w.closers = append(w.closers, func() { e.releaseNet(l.JobID) }) })
	}
	if err != nil {
		w.fail(err.Error())
		return
	}
	unexpose := e.tunnels.ExposeIn(ns, l.JobID, l.Index, workerPort(l.Index), allowed)
	unexposeAvg := e.tunnels.ExposeIn(ns, l.JobID, avgIndex(l.Index), avgPort(l.Index), allowed)
	w.set(func() { w.closers = append(w.closers, unexpose, unexposeAvg) })

	env := []string{
		"DM_JOB_ID=" + l.JobID, "DM_RANK=" + strconv.Itoa(l.Index), "DM_WORLD_SIZE=" + strconv.Itoa(len(l.World)),
		"DM_WORKERS=" + strings.Join(addrs, ","), "DM_AVG_PEERS=" + strings.Join(avg, ","), "DM_CORES=" + strconv.Itoa(int(max(l.Res.Cores, 1))),
		"DM_DATA_DIR=" + filepath.Join(w.dir, "data"), "DM_OUTPUT_DIR=" + filepath.Join(w.dir, "out"),
	}
	env = append(env, l.Training.Env()...)
	if host, port, err := net.SplitHostPort(addrs[0]); err == nil {
		env = append(env, "MASTER_ADDR="+host, "MASTER_PORT="+port)
	}
	if l.Framework == "tensorflow" {
		tf, _ := json.Marshal(map[string]any{
			"cluster": map[string][]string{"worker": addrs},
			"task":    map[string]any{"type": "worker", "index": l.Index},
		})
		env = append(env, "TF_CONFIG="+string(tf))
	}
	path := "/usr/local/bin:/usr/bin:/bin"
	if e.python != "" && strings.Contains(e.python, "/") {
		// python3 in the command is the configured environment's.
		path = filepath.Dir(e.python) + ":" + path
	}
	env = append(env, "PATH="+path)
	jl, err := openWorkerLog(e.logs, w.name)
	if err != nil {
		w.fail(err.Error())
		return
	}
	lease, err := e.ids.Acquire()
	w.set(func() { w.log, w.lease = jl, lease })
	if err != nil {
		w.fail("a uid for the worker: " + err.Error())
		return
	}
	spec := sandbox.Spec{
		Name: w.box, Dir: w.dir, Cwd: filepath.Join(w.dir, "bundle"),
		Argv: argv, Env: env, Stdout: jl, Stderr: jl, NetNS: ns, UID: lease.ID,
		Limits: sandbox.Limits{
			CPUs: w.cpus, Cores: float64(max(l.Res.Cores, 1)), MemBytes: l.Res.MemBytes,
			// The logs count against the worker's disk bound.
			Pids: 512, DiskBytes: max(10<<30, 2*l.Res.MemBytes) - workerLogBytes, GPUs: gpuIDs(int(l.Res.GPUs)),
		},
		ReadOnly: readOnlyFor(e.python),
		Hide:     []string{e.n.home.Dir},
	}
	w.mu.Lock()
	if w.stopping {
		w.mu.Unlock()
		return
	}
	proc, err := sandbox.Start(ctx, spec)
	if err != nil {
		w.boxLeft = true // Start may have failed to remove its cgroup
		w.mu.Unlock()
		w.fail("start: " + err.Error())
		return
	}
	w.proc, w.state, w.started = proc, p2p.WorkerRunning, time.Now()
	w.mu.Unlock()
	log.Info("worker started", "command", l.Command, "cpus", w.cpus, "uid", lease.ID)
	exit, err := proc.Wait()
	if err == nil {
		// Nothing of the job is left and its dir is root's again: the uid
		// owns nothing and may serve another job.
		lease.Release()
	}
	w.mu.Lock()
	w.ended = time.Now()
	w.exit = exit.Code
	w.boxLeft = err != nil
	stopped := w.stopping
	switch {
	case stopped:
		w.state = p2p.WorkerStopped
	case err != nil:
		w.state, w.reason = p2p.WorkerFailed, err.Error()
	case exit.OOMKilled:
		w.state, w.reason = p2p.WorkerFailed, fmt.Sprintf("out of memory: the job's limit is %s per worker", units.FormatSize(l.Res.MemBytes))
	case exit.PidsLimited:
		w.state, w.reason = p2p.WorkerFailed, "too many processes (the job's limit is 512)"
	case exit.DiskExceeded:
		w.state, w.reason = p2p.WorkerFailed, "the job's work dir outgrew its disk bound"
	case exit.Code != 0 || exit.Signal != "":
		w.state, w.reason = p2p.WorkerExited, fmt.Sprintf("exited with code %d %s", exit.Code, exit.Signal)
	default:
		w.state = p2p.WorkerExited
	}
	wantCkpt := w.wantCkpt
	w.mu.Unlock()
	log.Info("worker ended", "exit", exit.Code, "signal", exit.Signal, "state", w.state, "cpu", exit.CPU)
	if l.Index == 0 && ((!stopped && exit.Code == 0 && err == nil) || wantCkpt) {
		// The chief's output dir is the job's result (or its checkpoint).
		pin, err := e.addOutput(context.WithoutCancel(ctx), w)
		w.mu.Lock()
		switch {
		case err != nil:
			w.reason = "could not keep the output: " + err.Error()
			if !stopped {
				w.state = p2p.WorkerFailed
			}
		case stopped:
			w.ckpt = pin.CID.String()
		default:
			w.result = pin.CID.String()
		}
		w.mu.Unlock()
	}
}

func gpuIDs(n int) []int {
	ids := make([]int, n)
	for i := range ids {
		ids[i] = i
	}
	return ids
}

// addOutput adds the chief's output dir to storage. The job chose what is
// in it, links included: the import resolves every name beneath the
// worker's dir and reads nothing outside it.
func (e *Executor) addOutput(ctx context.Context, w *worker) (storage.Pin, error) {
	dir, err := e.root.OpenRoot(w.name)
	if err != nil {
		return storage.Pin{}, err
	}
	defer dir.Close()
	return e.n.blocks.AddFrom(ctx, dir, "out", nil)
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
