package node

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/node/sandbox"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/p2p/tunnel"
	"github.com/deepmarket/deepmarket/storage"
	"github.com/deepmarket/deepmarket/units"
)

// Executor timings.
const (
	// submitterSilence stops a worker whose submitter stopped asking
	// after it: work past its last receipt would not be paid.
	submitterSilence = 90 * time.Second
	// stopGrace is how long a stopped worker has to write its
	// checkpoint before it is killed.
	stopGrace = 10 * time.Second
	// claimDelay waits past an escrow's expiry before claiming, so the
	// ledger's block time has passed it.
	claimDelay = 30 * time.Second
	// claimRetry spaces claims the ledger found early; claimAttempts
	// bounds them (well past two empty-block intervals).
	claimRetry    = 10 * time.Second
	claimAttempts = 12
)

// Executor runs the workers this machine was asked to launch: it is the
// lender's side of a job. Each worker gets a fresh work dir (bundle/,
// data/, out/), its inputs fetched by CID, loopback ports for its cluster
// reached through authenticated libp2p tunnels, a uid of its own and a
// sandbox with the limits its hold reserved. Only the submitter that
// committed the hold can launch, watch, read the logs of, or stop a worker.
//
// A worker's dir is the job's: whatever the node (root) does in it goes
// through root, an os.Root of the work area, or a descriptor walk in the
// sandbox package, so that no name is resolved out of it and no symlink
// the job planted leads the node elsewhere.
type Executor struct {
	n       *Node
	dir     string
	root    *os.Root // dir: the workers' dirs
	logs    *os.Root // dir/logs: one dir per worker, which only the node writes
	ids     sandbox.IDRange
	keep    time.Duration // how long logs and dirs of ended workers stay
	tunnels *tunnel.Service
	python  string
	// tag ends this node's sandbox names: nodes sharing a machine share
	// the cgroup parent, and one must never take another's sandbox for its
	// own leftover.
	tag string

	mu      sync.Mutex
	workers map[string]*worker // run/index
	nets    map[string]*runNet // run -> its network namespace here
	cpus    map[int]string     // CPU id -> worker using it
	ctx     context.Context
	wg      sync.WaitGroup

	probeOnce sync.Once
	probeErr  error

	// Most cores and memory the workers here have held at once: what
	// tests read to check that no machine was over-committed.
	peakCores uint32
	peakMem   uint64
}

type worker struct {
	l      p2p.Launch
	bidder peer.ID
	key    string
	name   string // its dir under the work area and its log dir
	dir    string
	cpus   []int
	box    string // the sandbox's name

	mu       sync.Mutex
	state    string
	exit     int
	reason   string
	started  time.Time
	ended    time.Time
	result   string
	ckpt     string
	beat     time.Time
	proc     *sandbox.Process
	log      *workerLog
	lease    *sandbox.Lease // its uid, held until nothing of the job is left
	cancel   context.CancelFunc
	stopping bool
	wantCkpt bool
	closers  []func()
	done     chan struct{}
	// boxLeft: the sandbox may not be gone (it could not be emptied or
	// removed), so its record stays for the next start to reap.
	boxLeft bool
	// swept: it ended keep_logs ago and the sweep is forgetting it.
	swept bool
}

func workerKey(run string, index int) string { return run + "/" + strconv.Itoa(index) }

// workerName names worker index of run here: its work dir and log file.
func workerName(run string, index int) string { return run[:16] + "-" + strconv.Itoa(index) }

// sandboxesKey prefixes the node store's record of each worker's sandbox,
// "sandboxes/<sandbox name>" -> sandboxRecord. A record lives from before
// the worker's sandbox starts until its work dir is removed, so that the
// next start of a node that died meanwhile (SIGKILL, power cut) finds what
// it left: workers still running, holding cores and memory no one pays
// for, and work dirs no one will remove.
const sandboxesKey = "sandboxes/"

// sandboxRecord is the stored record of one worker's sandbox.
type sandboxRecord struct {
	Job   string `json:"job"`
	Index int    `json:"index"`
	Dir   string `json:"dir"` // its work dir
}

// newExecutor prepares the work area; Run serves until ctx ends.
func newExecutor(n *Node, dir, python string) (*Executor, error) {
	if strings.Contains(python, "/") {
		// Checked against the node's home here, where it is known; the
		// config's own check covers the rest.
		if err := sandbox.CheckReadOnly(readOnlyFor(python)[0], n.home.Dir); err != nil {
			return nil, fmt.Errorf("[inventory] python = %q: its prefix %w; point it at a virtualenv such as /opt/deepmarket/venv/bin/python3", python, err)
		}
	}
	ids, err := sandbox.ParseIDRange(n.cfg.Executor.UIDRange)
	if err != nil {
		return nil, fmt.Errorf("[executor] uid_range: %w", err)
	}
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return nil, fmt.Errorf("executor work dir: %w", err)
	}
	// A job's uid must be able to reach its own dir through this one, and
	// nothing more.
	if err := os.Chmod(dir, 0o711); err != nil {
		return nil, fmt.Errorf("executor work dir: %w", err)
	}
	if os.Geteuid() == 0 {
		if err := sandbox.CheckRootOnly(dir); err != nil {
			return nil, fmt.Errorf("[executor] work_dir %s: %w; pick a dir only root can change", dir, err)
		}
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("executor work dir: %w", err)
	}
	if err := root.Mkdir("logs", 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("executor log dir: %w", err)
	}
	if err := root.Chmod("logs", 0o700); err != nil {
		return nil, fmt.Errorf("executor log dir: %w", err)
	}
	logs, err := root.OpenRoot("logs")
	if err != nil {
		return nil, fmt.Errorf("executor log dir: %w", err)
	}
	id := n.host.ID().String()
	e := &Executor{n: n, dir: dir, root: root, logs: logs, ids: ids, keep: n.cfg.Executor.KeepLogs.Duration,
		python: python, tunnels: tunnel.New(n.host, n.cfg.Node.ChainID, n.log.With("module", "tunnel")),
		tag: id[len(id)-8:], workers: map[string]*worker{}, nets: map[string]*runNet{}, cpus: map[int]string{}}
	gauge := func(name, help string, f func() float64) {
		n.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "deepmarket", Subsystem: "exec", Name: name, Help: help}, f))
	}
	gauge("workers", "Workers of lent jobs on this machine now.", func() float64 {
		e.mu.Lock()
		defer e.mu.Unlock()
		return float64(len(e.workers))
	})
	gauge("cores_in_use", "Cores the workers here hold now.", func() float64 { c, _ := e.inUse(); return float64(c) })
	gauge("cores_in_use_peak", "Most cores the workers here have held at once.", func() float64 {
		e.mu.Lock()
		defer e.mu.Unlock()
		return float64(e.peakCores)
	})
	gauge("mem_in_use_peak_bytes", "Most memory the workers here have held at once.", func() float64 {
		e.mu.Lock()
		defer e.mu.Unlock()
		return float64(e.peakMem)
	})
	return e, nil
}

// snapshot lists the workers here now.
func (e *Executor) snapshot() []*worker {
	e.mu.Lock()
	defer e.mu.Unlock()
	ws := make([]*worker, 0, len(e.workers))
	for _, w := range e.workers {
		ws = append(ws, w)
	}
	return ws
}

// inUse is what the workers here hold now.
func (e *Executor) inUse() (cores uint32, mem uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.inUseLocked()
}

func (e *Executor) inUseLocked() (cores uint32, mem uint64) {
	for _, w := range e.workers {
		cores += w.l.Res.Cores
		mem += w.l.Res.MemBytes
	}
	return cores, mem
}

// capable says whether this machine builds the whole job sandbox; if not,
// it does not lend, and the error says what to install. The probe (a test
// cgroup, a trial job in bubblewrap) is made once.
func (e *Executor) capable() error {
	e.probeOnce.Do(func() {
		c := sandbox.Probe()
		if e.probeErr = c.Essential(); e.probeErr != nil {
			e.probeErr = fmt.Errorf("this machine cannot confine jobs, so it does not lend: %w", e.probeErr)
			return
		}
		if len(c.Problems) > 0 {
			e.n.log.Warn("job sandbox", "problems", c.Problems)
		}
	})
	return e.probeErr
}

// Run watches workers for silent submitters and over-long runs until ctx
// ends, then stops them all. It first ends what a previous run of this
// node left behind; until then it launches nothing.
func (e *Executor) Run(ctx context.Context) error {
	e.reapLeftovers()
	e.mu.Lock()
	e.ctx = ctx
	e.mu.Unlock()
	// Receipts kept before a restart still get claimed if their escrows
	// expire unsettled.
	var runs []string
	e.n.store.Each("receipts/", func(key string, _ []byte) error {
		runs = append(runs, strings.TrimPrefix(key, "receipts/"))
		return nil
	})
	for _, run := range runs {
		go e.claimLater(run)
	}
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	e.sweep(time.Now())
	lastSweep := time.Now()
	for {
		select {
		case <-ctx.Done():
			for _, w := range e.snapshot() {
				e.stop(w, "the node is stopping", false)
			}
			e.wg.Wait()
			e.tunnels.Close()
			return nil
		case now := <-t.C:
			if now.Sub(lastSweep) > sweepEvery(e.keep) {
				e.sweep(now)
				lastSweep = now
			}
			for _, w := range e.snapshot() {
				w.mu.Lock()
				live := w.state == p2p.WorkerRunning || w.state == p2p.WorkerFetching
				silent := now.Sub(w.beat) > submitterSilence
				over := !w.started.IsZero() && now.Sub(w.started) > time.Duration(w.l.MaxSecs)*time.Second
				w.mu.Unlock()
				switch {
				case live && silent:
					e.stop(w, "the submitter stopped answering", false)
				case live && over:
					e.stop(w, "max duration reached", false)
				}
			}
		}
	}
}

// reapLeftovers kills the workers a previous run of this node left
// running and removes their work dirs. Only the records in this node's
// own store are followed, so the workers of other nodes on this machine
// are never touched. Receipts stay: they are what this machine is owed.
func (e *Executor) reapLeftovers() {
	log := e.n.log.With("module", "executor")
	recs := map[string]sandboxRecord{}
	err := e.n.store.Each(sandboxesKey, func(key string, doc []byte) error {
		var r sandboxRecord
		if err := json.Unmarshal(doc, &r); err != nil {
			log.Warn("unreadable worker record: reaping its sandbox, keeping its work dir", "key", key, "err", err)
		}
		recs[strings.TrimPrefix(key, sandboxesKey)] = r
		return nil
	})
	if err != nil {
		log.Warn("cannot read the records of workers of a previous run: any still running are not reaped", "err", err)
		return
	}
	for name, r := range recs {
		killed, err := sandbox.Reap(name)
		if err != nil {
			// The record stays: the next start tries again.
			log.Warn("cannot reap a worker left by a previous run of this node", "sandbox", name, "err", err)
			continue
		}
		if killed > 0 {
			log.Warn(fmt.Sprintf("reaped %d processes of a worker left running by a previous run of this node", killed),
				"sandbox", name, "job", r.Job, "worker", r.Index)
		}
		if e.isWorkerDir(r) {
			if err := e.root.RemoveAll(workerName(r.Job, r.Index)); err != nil {
				log.Warn("cannot remove the work dir of a worker of a previous run", "dir", r.Dir, "err", err)
				continue
			}
			log.Info("removed the work dir of a worker of a previous run of this node", "dir", r.Dir)
		} else if r.Dir != "" {
			log.Info("kept a dir outside this node's work dir", "dir", r.Dir)
		}
		if err := e.n.store.Delete(sandboxesKey + name); err != nil {
			log.Warn("cannot forget a reaped worker", "err", err)
		}
	}
}

// isWorkerDir says whether a record's dir is the work dir this executor
// gives its worker, the only dir a record may have removed.
func (e *Executor) isWorkerDir(r sandboxRecord) bool {
	if len(r.Job) < 16 || r.Index < 0 || r.Dir == "" {
		return false
	}
	if _, err := hex.DecodeString(r.Job); err != nil {
		return false
	}
	return filepath.Clean(r.Dir) == filepath.Join(e.dir, workerName(r.Job, r.Index))
}

// handle answers the job protocol.
func (e *Executor) handle(ctx context.Context, from peer.ID, env *p2p.Envelope) (string, any, error) {
	switch env.Type {
	case p2p.TypeLaunch:
		var l p2p.Launch
		if err := p2p.Unmarshal(env.Payload, &l); err != nil {
			return "", nil, err
		}
		if err := l.Validate(); err != nil {
			return "", nil, err
		}
		if err := e.launch(ctx, from, l); err != nil {
			return p2p.TypeLaunchReply, p2p.LaunchReply{Reason: truncate(err.Error(), 512)}, nil
		}
		return p2p.TypeLaunchReply, p2p.LaunchReply{OK: true}, nil
	case p2p.TypeStatusReq:
		r, w, err := ownedReq(e, from, env, func(r *p2p.StatusReq) (string, int) { return r.JobID, r.Index })
		if err != nil {
			return "", nil, err
		}
		if r.Receipt != nil {
			e.keepReceipt(w, *r.Receipt)
		}
		return p2p.TypeJobStatus, w.status(time.Now()), nil
	case p2p.TypeLogsReq:
		r, w, err := ownedReq(e, from, env, func(r *p2p.LogsReq) (string, int) { return r.JobID, r.Index })
		if err != nil {
			return "", nil, err
		}
		return p2p.TypeLogs, w.readLog(r.Offset), nil
	case p2p.TypeStop:
		r, w, err := ownedReq(e, from, env, func(r *p2p.Stop) (string, int) { return r.JobID, r.Index })
		if err != nil {
			return "", nil, err
		}
		reason := r.Reason
		if reason == "" {
			reason = "stopped by the submitter"
		}
		e.stop(w, truncate(reason, 200), r.Checkpoint)
		if r.Checkpoint && w.l.Index == 0 {
			go e.keepCheckpoint(w)
		}
		if r.Final {
			go e.finish(w)
		}
		return p2p.TypeJobStatus, w.status(time.Now()), nil
	}
	return "", nil, fmt.Errorf("%w %q", p2p.ErrUnknownType, env.Type)
}

// ownedReq decodes a request about one worker and finds that worker, if
// from launched it.
func ownedReq[T any](e *Executor, from peer.ID, env *p2p.Envelope, ref func(*T) (string, int)) (*T, *worker, error) {
	var r T
	if err := p2p.Unmarshal(env.Payload, &r); err != nil {
		return nil, nil, err
	}
	run, index := ref(&r)
	w, err := e.owned(from, run, index)
	return &r, w, err
}

// owned finds worker index of run, if from launched it.
func (e *Executor) owned(from peer.ID, run string, index int) (*worker, error) {
	e.mu.Lock()
	w := e.workers[workerKey(run, index)]
	e.mu.Unlock()
	if w == nil || w.bidder != from {
		return nil, fmt.Errorf("no worker %d of job %s launched by %s here", index, run, from)
	}
	w.mu.Lock()
	w.beat = time.Now()
	w.mu.Unlock()
	return w, nil
}

// launch checks a launch request against this machine's hold and the
// ledger's escrow, then starts the worker in the background.
func (e *Executor) launch(ctx context.Context, from peer.ID, l p2p.Launch) error {
	self := e.n.host.ID().String()
	if l.World[l.Index] != self {
		return fmt.Errorf("worker %d is placed on %s, not on this machine", l.Index, l.World[l.Index])
	}
	held, ok := e.n.holds.Launch(l.Hold, l.JobID, from, time.Now())
	if !ok {
		return errors.New("no committed hold for this job here from you: reserve and commit first")
	}
	// The hold covers every worker of the run on this machine.
	var mine uint32
	for _, m := range l.World {
		if m == self {
			mine++
		}
	}
	if l.Res.Cores*mine > held.Cores || l.Res.MemBytes*uint64(mine) > held.MemBytes || l.Res.GPUs*mine > held.GPUs {
		return fmt.Errorf("the hold reserved %s: less than %s of this size", units.FormatResources(int(held.Cores), held.MemBytes, int(held.GPUs)), units.Count(int(mine), "worker", "workers"))
	}
	pub, err := from.ExtractPublicKey()
	if err != nil {
		return fmt.Errorf("submitter key: %w", err)
	}
	raw, err := pub.Raw()
	if err != nil {
		return err
	}
	payer := identity.AddressOf(raw)
	// The escrow was just committed: this machine's replica of the
	// ledger may be a block behind.
	var esc *ledger.Escrow
	for {
		if esc, err = e.n.ledger.Escrow(ctx, l.JobID); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no escrow for this job on the ledger: %w", err)
		case <-time.After(200 * time.Millisecond):
		}
	}
	me := string(e.n.key.Address())
	switch {
	case esc.Payer != string(payer):
		return fmt.Errorf("the escrow is paid by %s, not by the submitter %s", esc.Payer, payer)
	case !slices.Contains(esc.Payees, me):
		return fmt.Errorf("this machine (%s) is not a payee of the escrow", me)
	case time.Unix(esc.Expiry, 0).Before(time.Now().Add(time.Duration(l.MaxSecs) * time.Second)):
		return errors.New("the escrow expires before the job's max duration ends")
	case esc.Amount == 0:
		return errors.New("the escrow is empty")
	}
	for _, c := range []string{l.Bundle, l.Dataset, l.Resume} {
		if c != "" {
			if _, err := cid.Decode(c); err != nil {
				return fmt.Errorf("CID %q: %w", c, err)
			}
		}
	}
	if _, _, err := e.program(l.Command); err != nil {
		return err
	}
	key := workerKey(l.JobID, l.Index)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ctx == nil || e.ctx.Err() != nil {
		return errors.New("the node is not running jobs now")
	}
	if _, ok := e.workers[key]; ok {
		return nil // a retried launch
	}
	cpus, err := e.pickCPUs(key, int(l.Res.Cores))
	if err != nil {
		return err
	}
	name := workerName(l.JobID, l.Index)
	w := &worker{l: l, bidder: from, key: key, name: name, dir: filepath.Join(e.dir, name),
		cpus: cpus, box: name + "-" + e.tag, state: p2p.WorkerFetching, beat: time.Now(), done: make(chan struct{})}
	wctx, cancel := context.WithCancel(e.ctx)
	w.cancel = cancel
	e.workers[key] = w
	if c, m := e.inUseLocked(); c > e.peakCores || m > e.peakMem {
		e.peakCores, e.peakMem = max(c, e.peakCores), max(m, e.peakMem)
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		defer close(w.done)
		e.run(wctx, w)
	}()
	go e.claimLater(l.JobID)
	return nil
}

// pickCPUs gives a worker n CPUs no other worker here uses, from the
// highest-numbered down (the owner's own work tends to land low).
func (e *Executor) pickCPUs(key string, n int) ([]int, error) {
	pool := slices.Clone(e.n.cfg.Executor.CPUs)
	if len(pool) == 0 {
		for c := range runtime.NumCPU() {
			pool = append(pool, c)
		}
	}
	var got []int
	for k := len(pool) - 1; k >= 0 && len(got) < n; k-- {
		if _, used := e.cpus[pool[k]]; !used {
			got = append(got, pool[k])
		}
	}
	if len(got) < n {
		// More cores lent than CPUs free to pin: share, bounded by quota.
		return nil, nil
	}
	for _, c := range got {
		e.cpus[c] = key
	}
	slices.Sort(got)
	return got, nil
}

// workerPort is where worker j of a run listens, inside the run's
// network namespace on every machine: the namespace is fresh, so the
// same ports serve every run.
func workerPort(j int) int { return 20000 + j }

// avgPort is worker j's second port, for traffic the job runs beside its
// framework's (the deepmarket package's DiLoCo averaging; DM_AVG_PEERS
// lists them): 1000 above workerPort(j). Its tunnel is told apart from
// the first port's by the worker index avgIndex(j).
func avgPort(j int) int { return workerPort(j) + 1000 }

func avgIndex(j int) int { return p2p.MaxWorkers + j }

// runNet is a run's network namespace on this machine, shared by its
// workers here, with the forwarders to its workers elsewhere.
type runNet struct {
	ns   *sandbox.NetNS
	refs int
	fwd  map[int]io.Closer
}

// acquireNet gives worker w its run's namespace, made on first use, with a
// forwarder to each remote worker.
func (e *Executor) acquireNet(ctx context.Context, l p2p.Launch) (*sandbox.NetNS, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	rn := e.nets[l.JobID]
	if rn == nil {
		ns, err := sandbox.NewNetNS()
		if err != nil {
			return nil, fmt.Errorf("cannot isolate the job's network (%v): not running it", err)
		}
		rn = &runNet{ns: ns, fwd: map[int]io.Closer{}}
		e.nets[l.JobID] = rn
	}
	rn.refs++
	self := e.n.host.ID().String()
	for j, m := range l.World {
		if m == self || rn.fwd[j] != nil {
			continue
		}
		id, err := peer.Decode(m)
		if err != nil {
			return rn.ns, err
		}
		var known []string
		if j < len(l.Addrs) {
			known = l.Addrs[j]
		}
		e.n.learnAddrs(id, append(known, e.n.machineAddrs(m)...))
		_, closer, err := e.tunnels.ForwardIn(ctx, rn.ns, workerPort(j), l.JobID, j, id)
		if err != nil {
			return rn.ns, fmt.Errorf("tunnel to worker %d: %w", j, err)
		}
		rn.fwd[j] = closer
		_, closer, err = e.tunnels.ForwardIn(ctx, rn.ns, avgPort(j), l.JobID, avgIndex(j), id)
		if err != nil {
			return rn.ns, fmt.Errorf("tunnel to worker %d's second port: %w", j, err)
		}
		rn.fwd[avgIndex(j)] = closer
	}
	return rn.ns, nil
}

func (e *Executor) releaseNet(run string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	rn := e.nets[run]
	if rn == nil {
		return
	}
	if rn.refs--; rn.refs > 0 {
		return
	}
	for _, c := range rn.fwd {
		c.Close()
	}
	rn.ns.Close()
	delete(e.nets, run)
}

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

// program is what runs a job's command here: an interpreter name lenders
// offer (python3) becomes this machine's interpreter; anything else must
// be a file of the bundle, named relative to it (inBundle).
func (e *Executor) program(cmd []string) (argv []string, inBundle bool, err error) {
	if len(cmd) == 0 {
		return nil, false, errors.New("empty command")
	}
	argv = slices.Clone(cmd)
	if jobs.IsInterpreter(cmd[0]) {
		argv[0] = e.python
		return argv, false, nil
	}
	if !filepath.IsLocal(cmd[0]) {
		return nil, false, fmt.Errorf("command[0] %q: not in the bundle and not an interpreter this machine offers (%s)",
			cmd[0], strings.Join(jobs.Interpreters, ", "))
	}
	argv[0] = "./" + filepath.Clean(cmd[0])
	return argv, true, nil
}

// makeRunnable marks the bundle's program executable (a bundle fetched by
// CID carries no modes), while the dir is still root's alone.
func (e *Executor) makeRunnable(worker, prog string) error {
	name := filepath.Join(worker, "bundle", prog)
	fi, err := e.root.Lstat(name)
	if err != nil || !fi.Mode().IsRegular() {
		return fmt.Errorf("command[0] %q is not a file of the bundle", prog)
	}
	return e.root.Chmod(name, 0o755)
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

// sweepEvery is how often ended workers' logs and dirs are looked at.
func sweepEvery(keep time.Duration) time.Duration { return min(time.Hour, max(keep/4, 5*time.Second)) }

// sweep forgets workers that ended longer than keep ago (their submitters
// never said they were done: their dirs go) and removes log dirs not
// written for as long, so that nothing of a job stays on the lender
// forever.
func (e *Executor) sweep(now time.Time) {
	live := map[string]bool{}
	for _, w := range e.snapshot() {
		live[w.name] = true
		select {
		case <-w.done:
		default:
			continue
		}
		w.mu.Lock()
		stale := !w.ended.IsZero() && now.Sub(w.ended) > e.keep && !w.swept
		w.swept = w.swept || stale
		w.mu.Unlock()
		if stale {
			go e.finish(w)
		}
	}
	f, err := e.logs.Open(".")
	if err != nil {
		return
	}
	entries, err := f.ReadDir(-1)
	f.Close()
	if err != nil {
		return
	}
	for _, d := range entries {
		fi, err := d.Info()
		if err != nil || live[d.Name()] || now.Sub(fi.ModTime()) <= e.keep {
			continue
		}
		// A log dir's mtime is that of its last rotation; its current file
		// tells when the worker last wrote.
		if cur, err := e.logs.Stat(filepath.Join(d.Name(), workerLogCurrent)); err == nil && now.Sub(cur.ModTime()) <= e.keep {
			continue
		}
		if err := e.logs.RemoveAll(d.Name()); err != nil {
			e.n.log.Warn("cannot remove an old worker log", "module", "executor", "dir", d.Name(), "err", err)
		}
	}
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

// stop ends a worker (its checkpoint kept when asked); it returns at once.
func (e *Executor) stop(w *worker, reason string, checkpoint bool) {
	w.mu.Lock()
	if w.stopping || w.state == p2p.WorkerExited || w.state == p2p.WorkerFailed {
		w.mu.Unlock()
		return
	}
	w.stopping, w.wantCkpt = true, checkpoint
	proc := w.proc
	if proc == nil {
		w.state, w.reason, w.ended = p2p.WorkerStopped, reason, time.Now()
		w.cancel()
	} else {
		w.reason = reason
	}
	w.mu.Unlock()
	if proc != nil {
		go proc.Stop(stopGrace)
	}
}

// reclaim stops every worker after grace: the owner took the machine
// back. Workers launched meanwhile are not taken (the offer is gone).
func (e *Executor) reclaim(grace time.Duration) {
	e.mu.Lock()
	ws := make([]*worker, 0, len(e.workers))
	for _, w := range e.workers {
		ws = append(ws, w)
	}
	ctx := e.ctx
	e.mu.Unlock()
	if len(ws) == 0 || ctx == nil {
		return
	}
	e.n.log.Info("the owner took the machine back: stopping its jobs after the grace period", "workers", len(ws), "grace", grace)
	go func() {
		select {
		case <-ctx.Done():
		case <-time.After(grace):
		}
		for _, w := range ws {
			e.stop(w, "the owner took the machine back", w.l.Index == 0)
			if w.l.Index == 0 {
				go e.keepCheckpoint(w)
			}
		}
	}()
}

// keepCheckpoint adds a chief's output dir to storage as the run's
// checkpoint once it has ended, if it left none (it may have exited on
// its own when a peer vanished, before being asked to stop).
func (e *Executor) keepCheckpoint(w *worker) {
	<-w.done
	w.mu.Lock()
	need := w.result == "" && w.ckpt == ""
	w.mu.Unlock()
	if !need {
		return
	}
	pin, err := e.addOutput(context.Background(), w)
	w.mu.Lock()
	if err == nil {
		w.ckpt = pin.CID.String()
	}
	w.mu.Unlock()
}

// finish forgets a worker whose submitter has what it needs: its hold is
// released, its tunnels closed, its dir and CPUs freed.
func (e *Executor) finish(w *worker) {
	<-w.done
	w.mu.Lock()
	closers := w.closers
	w.closers = nil
	w.mu.Unlock()
	for _, c := range closers {
		c()
	}
	e.n.holds.Release(w.l.Hold)
	w.mu.Lock()
	left, lease, jl := w.boxLeft, w.lease, w.log
	w.mu.Unlock()
	if err := e.root.RemoveAll(w.name); err == nil && !left {
		if err := e.n.store.Delete(sandboxesKey + w.box); err != nil {
			e.n.log.Warn("cannot forget a finished worker", "module", "executor", "err", err)
		}
		// Its files are gone with its dir: the uid owns nothing.
		lease.Release()
	}
	if jl != nil {
		jl.Close() // its files stay until the sweep
	}
	e.mu.Lock()
	delete(e.workers, w.key)
	for c, k := range e.cpus {
		if k == w.key {
			delete(e.cpus, c)
		}
	}
	e.mu.Unlock()
}

func (w *worker) status(now time.Time) p2p.JobStatus {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := p2p.JobStatus{JobID: w.l.JobID, Index: w.l.Index, State: w.state, ExitCode: w.exit, Reason: w.reason,
		Result: w.result, Checkpoint: w.ckpt}
	if !w.started.IsZero() {
		st.Started = w.started.UnixMilli()
	}
	if !w.ended.IsZero() {
		st.Ended = w.ended.UnixMilli()
	}
	if w.log != nil {
		st.LogBytes = w.log.Size()
	}
	// Output is kept only once the chief has ended: until then a result
	// or checkpoint CID is not known.
	if w.l.Index == 0 && (w.state == p2p.WorkerExited || w.state == p2p.WorkerStopped) && w.result == "" && w.ckpt == "" {
		select {
		case <-w.done:
		default:
			st.State = p2p.WorkerRunning // still adding its output
		}
	}
	return st
}

// readLogs reads a log file of the node's own (the submitter's job log)
// from offset off.
func readLogs(path string, off int64) p2p.Logs {
	f, err := os.Open(path)
	if err != nil {
		return p2p.Logs{Next: off}
	}
	defer f.Close()
	buf := make([]byte, p2p.MaxLogChunk)
	n, err := f.ReadAt(buf, max(off, 0))
	if err != nil && !errors.Is(err, io.EOF) {
		return p2p.Logs{Next: off}
	}
	return p2p.Logs{Data: buf[:n], Next: max(off, 0) + int64(n)}
}

// readLog reads the worker's output from offset off.
func (w *worker) readLog(off int64) p2p.Logs {
	w.mu.Lock()
	jl := w.log
	w.mu.Unlock()
	if jl == nil {
		return p2p.Logs{Next: off}
	}
	return jl.Read(off)
}

// keepReceipt records the submitter's latest usage receipt for this
// machine, on disk: it is what the machine claims with if the submitter
// never settles.
func (e *Executor) keepReceipt(w *worker, r p2p.Receipt) {
	if r.Payee != string(e.n.key.Address()) {
		return
	}
	key := "receipts/" + w.l.JobID
	var old ledger.Receipt
	if found, _ := e.n.store.Get(key, &old); found && old.Seq >= r.Seq {
		return
	}
	e.n.store.Put(key, ledger.Receipt{Job: w.l.JobID, Payee: r.Payee, Amount: r.Amount, Seq: r.Seq, Sig: r.Sig})
}

// claimLater claims this machine's due from a run's escrow after it
// expires, if its payer never settled: the receipts are what it is owed.
func (e *Executor) claimLater(run string) {
	ctx := e.ctx
	esc, err := e.n.ledger.Escrow(ctx, run)
	if err != nil {
		return
	}
	wait := time.Until(time.Unix(esc.Expiry, 0)) + claimDelay
	select {
	case <-ctx.Done():
		return
	case <-time.After(wait):
	}
	e.claim(ctx, run)
}

func (e *Executor) claim(ctx context.Context, run string) {
	var r ledger.Receipt
	if found, _ := e.n.store.Get("receipts/"+run, &r); !found || r.Amount == 0 {
		return
	}
	if _, err := e.n.ledger.Escrow(ctx, run); err != nil {
		return // settled
	}
	// The ledger judges expiry by block time, which lags the clock while
	// the chain is idle (an empty block comes every empty_block_interval):
	// try again until a block is past the expiry.
	for attempt := 1; ; attempt++ {
		_, err := e.n.ledger.Claim(ctx, r)
		if err == nil {
			break
		}
		if ledger.CodeOf(err) != ledger.CodeNotExpired || attempt == claimAttempts {
			e.n.log.Warn("claim", "job", run, "err", err)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(claimRetry):
		}
	}
	e.n.log.Info("claimed from an unsettled escrow", "job", run, "amount", r.Amount)
}
