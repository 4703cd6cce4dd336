package lender

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/node/image"
	"github.com/deepmarket/deepmarket/node/inventory"
	"github.com/deepmarket/deepmarket/node/sandbox"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/p2p/tunnel"
)

// Executor timings.
const (
	// submitterSilence stops a worker whose submitter stopped asking
	// after it: work past its last receipt would not be paid.
	submitterSilence = 90 * time.Second
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
	log     *slog.Logger
	self    string           // this machine's peer ID
	account identity.Address // what the ledger pays this machine
	chainID string           // the ledger's: receipts are signed for it
	// minFloor is the least floor a launch may name: receipts cover at
	// least that share of the price for the time worked, or the worker
	// stops (unpaid).
	minFloor float64
	// refusedStop: the [lend] refused_stop (0: never).
	refusedStop int
	store       Store
	blocks      Blocks
	ledger      Escrows
	// appeals, when the ledger client serves them: this machine's appeals
	// and its referee duty (referee.go).
	appeals Appeals
	// appealing are the runs whose appeal is being recomputed (referee.go), under mu.
	appealing map[string]bool
	// committed: see ExecutorParams.Committed.
	committed func() <-chan struct{}
	holds     HoldBook
	lent      GPULender
	dial      Dialer
	home      string // the node's home, hidden from jobs
	cpuPool   []int  // the CPUs workers may be pinned to (all when empty)
	shareCPUs bool   // pin no worker
	dir       string
	root      *os.Root // dir: the workers' dirs
	logs      *os.Root // dir/logs: one dir per worker, which only the node writes
	ids       sandbox.IDRange
	keep      time.Duration // how long logs and dirs of ended workers stay
	tunnels   *tunnel.Service
	// images are the jobs' environments, unpacked once each (node/image).
	images *image.Cache
	python string
	// tag ends this node's sandbox names: nodes sharing a machine share
	// the cgroup parent, and one must never take another's sandbox for its
	// own leftover.
	tag string

	mu      sync.Mutex
	workers map[string]*worker // run/index
	nets    map[string]*runNet // run -> its network namespace here
	cpus    map[int]string     // CPU id -> worker using it
	gpus    map[int]string     // GPU index (as nvidia-smi numbers them) -> worker using it
	// ctx is Run's, set once Run serves; closing is set once Run stops:
	// from then on the executor starts nothing (spawn).
	ctx     context.Context
	closing bool
	// wg counts every goroutine the executor starts (spawn): Run waits
	// for them all before it returns, so that nothing of the executor
	// writes to storage after.
	wg     sync.WaitGroup
	claims *claims

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
	gpus   []int  // the GPUs it sees, its own
	box    string // the sandbox's name

	mu       sync.Mutex
	state    p2p.WorkerState
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
	image    image.Rootfs // its image's root filesystem and environment, when its launch names one
	stopping bool
	wantCkpt bool
	closers  []func()
	done     chan struct{}
	// boxLeft: the sandbox may not be gone (it could not be emptied or
	// removed), so its record stays for the next start to reap.
	boxLeft bool
	// swept: it ended keep_logs ago and the sweep is forgetting it.
	swept bool
	// frozenAt is when the owner's use suspended it (zero: it is not);
	// frozenFor the time it spent suspended before, not paid for.
	frozenAt  time.Time
	frozenFor time.Duration
	frozenWhy string
	vacated   bool // stopped for the owner (Vacate)
	outOfTime bool // stopped at the job's max duration
	unpaid    bool // stopped by the stop-loss ("stopped: unpaid")
	// holder: the model's holder of this machine's own held job (Hold),
	// not a lent worker: the owner's use neither suspends nor reclaims it.
	holder bool
	// answers are the round answers it last reported (accepted, refused).
	answers [2]uint64
}

// keepsOutput says whether the worker's output dir is its run's result:
// the holder's in a held job, else the chief's.
func (w *worker) keepsOutput() bool {
	if w.l.Training.Held() {
		return w.holder
	}
	return w.l.Index == 0
}

func workerKey(run string, index int) string { return run + "/" + strconv.Itoa(index) }

// workerName names worker index of run here: its work dir and log file.
func workerName(run string, index int) string { return run[:16] + "-" + strconv.Itoa(index) }

// ExecutorParams configures an Executor: where it works, what it runs
// jobs with, and the services of the node it uses.
type ExecutorParams struct {
	Dir      string        // the work area ([executor] work_dir)
	Python   string        // the interpreter jobs run with ([inventory] python)
	Home     string        // the node's home dir, which jobs never see
	UIDRange string        // the uids workers run as ([executor] uid_range)
	KeepLogs time.Duration // how long ended workers' logs and dirs stay
	// ImageCache bounds the jobs' unpacked images ([executor] image_cache);
	// 0: 32 GiB.
	ImageCache int64
	CPUs       []int // the CPUs workers may be pinned to (all when empty)
	// ShareCPUs pins no worker: the CPU quota alone holds each to its cores.
	ShareCPUs bool
	ChainID   string
	// MinFloor is the least floor a launch may name ([lend] min_floor);
	// 0: p2p.MinFloor.
	MinFloor float64
	// DisputeWindow is the ledger's (genesis dispute_window_s): the claim
	// service looks for a run's settlement at least four times in it.
	DisputeWindow time.Duration
	// RefusedStop stops a worker whose last RefusedStop round answers
	// all refused its update ([lend] refused_stop; 0: never).
	RefusedStop int

	Host    host.Host        // tunnels to a run's other machines go through it
	Account identity.Address // this machine's ledger account, which is paid
	Store   Store
	Blocks  Blocks
	Ledger  Escrows
	// Committed, when set, returns a channel closed when this machine's
	// ledger replica stores its next block (ledger.App.Committed).
	Committed func() <-chan struct{}
	Holds     HoldBook
	GPUs      GPULender
	Dialer    Dialer

	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// Jobs' images: unpacked under the work area (which a job's uid may only
// pass through), within imageCacheBytes of files in all unless
// ExecutorParams.ImageCache says.
const (
	imagesDir       = "images"
	imageCacheBytes = 32 << 30
)

// NewExecutor prepares the work area; Run serves until ctx ends.
func NewExecutor(p ExecutorParams) (*Executor, error) {
	if strings.Contains(p.Python, "/") {
		// Checked against the node's home here, where it is known; the
		// config's own check covers the rest.
		if err := sandbox.CheckReadOnly(readOnlyFor(p.Python)[0], p.Home); err != nil {
			return nil, fmt.Errorf("[inventory] python = %q: its prefix %w; point it at a virtualenv such as /opt/deepmarket/venv/bin/python3", p.Python, err)
		}
	}
	ids, err := sandbox.ParseIDRange(p.UIDRange)
	if err != nil {
		return nil, fmt.Errorf("[executor] uid_range: %w", err)
	}
	root, logs, err := openWorkArea(p.Dir)
	if err != nil {
		return nil, err
	}
	cacheBytes := p.ImageCache
	if cacheBytes <= 0 {
		cacheBytes = imageCacheBytes
	}
	images, err := image.OpenCache(filepath.Join(p.Dir, imagesDir), cacheBytes, image.DefaultLimits)
	if err != nil {
		return nil, fmt.Errorf("the image cache: %w", err)
	}
	id := p.Host.ID().String()
	minFloor := p.MinFloor
	if minFloor == 0 {
		minFloor = p2p.MinFloor
	}
	e := &Executor{log: p.Logger, self: id, account: p.Account, chainID: p.ChainID, minFloor: minFloor, refusedStop: p.RefusedStop, store: p.Store, blocks: p.Blocks, ledger: p.Ledger, committed: p.Committed,
		holds: p.Holds, lent: p.GPUs, dial: p.Dialer, home: p.Home, cpuPool: p.CPUs, shareCPUs: p.ShareCPUs,
		dir: p.Dir, root: root, logs: logs, ids: ids, keep: p.KeepLogs,
		python: p.Python, images: images, tunnels: tunnel.New(p.Host, p.ChainID, p.Logger.With("module", "tunnel")),
		tag: id[len(id)-8:], workers: map[string]*worker{}, nets: map[string]*runNet{}, cpus: map[int]string{}, gpus: map[int]string{},
		claims: newClaims(p.Ledger, p.Store, string(p.Account), p.Logger.With("module", "claims"))}
	e.claims.failedHere = e.failedHere
	if a, ok := p.Ledger.(Appeals); ok {
		e.appeals = a
		e.claims.appeal = e.appealRefusal
	}
	if w := p.DisputeWindow / 4; w > 0 && w < e.claims.look {
		e.claims.look = max(w, time.Second)
	}
	e.registerMetrics(p.Registerer)
	return e, nil
}

// openWorkArea makes the work dir, which a job's uid may only pass
// through to its own dir, and its logs/ dir, root's alone; it opens both.
func openWorkArea(dir string) (root, logs *os.Root, err error) {
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return nil, nil, fmt.Errorf("executor work dir: %w", err)
	}
	// A job's uid must be able to reach its own dir through this one, and
	// nothing more.
	if err := os.Chmod(dir, 0o711); err != nil {
		return nil, nil, fmt.Errorf("executor work dir: %w", err)
	}
	if os.Geteuid() == 0 {
		if err := sandbox.CheckRootOnly(dir); err != nil {
			return nil, nil, fmt.Errorf("[executor] work_dir %s: %w; pick a dir only root can change", dir, err)
		}
	}
	root, err = os.OpenRoot(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("executor work dir: %w", err)
	}
	if err := root.Mkdir("logs", 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, nil, fmt.Errorf("executor log dir: %w", err)
	}
	if err := root.Chmod("logs", 0o700); err != nil {
		return nil, nil, fmt.Errorf("executor log dir: %w", err)
	}
	logs, err = root.OpenRoot("logs")
	if err != nil {
		return nil, nil, fmt.Errorf("executor log dir: %w", err)
	}
	return root, logs, nil
}

// registerMetrics exports the executor's gauges: its workers, the cores
// they hold, and the most cores and memory they have held at once.
func (e *Executor) registerMetrics(reg prometheus.Registerer) {
	gauge := func(name, help string, f func() float64) {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "deepmarket", Subsystem: "exec", Name: name, Help: help}, f))
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
		if w.holder {
			continue // the machine's own job, not lent
		}
		cores += w.l.Res.Cores
		mem += w.l.Res.MemBytes
	}
	return cores, mem
}

// Capable says whether this machine builds the whole job sandbox; if not,
// it does not lend, and the error says what to install. The probe (a test
// cgroup, a trial job in bubblewrap) is made once.
func (e *Executor) Capable() error {
	e.probeOnce.Do(func() {
		c := sandbox.Probe()
		if e.probeErr = c.Essential(); e.probeErr != nil {
			e.probeErr = fmt.Errorf("this machine cannot confine jobs, so it does not lend: %w", e.probeErr)
			return
		}
		if len(c.Problems) > 0 {
			e.log.Warn("job sandbox", "problems", c.Problems)
		}
	})
	return e.probeErr
}

// Run watches workers for silent submitters and over-long runs until ctx
// ends, then stops them all. It first ends what a previous run of this
// node left behind; until then it launches nothing. The claim service
// runs beside it. Every goroutine the executor starts runs under ctx and
// ends before Run returns: after that, it writes nothing to storage.
func (e *Executor) Run(ctx context.Context) error {
	e.reapLeftovers()
	e.mu.Lock()
	e.ctx = ctx
	e.mu.Unlock()
	e.spawn(e.claims.run)
	if e.appeals != nil {
		e.spawn(e.serveReferee)
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
			e.mu.Lock()
			e.closing = true
			e.mu.Unlock()
			e.wg.Wait()
			e.tunnels.Close()
			return nil
		case now := <-t.C:
			if now.Sub(lastSweep) > sweepEvery(e.keep) {
				e.sweep(now)
				lastSweep = now
			}
			e.watch(now)
		}
	}
}

// spawn runs f with Run's context in a goroutine of the executor's
// group, which Run waits for. Before Run serves and once it stops it
// starts nothing, and says so.
func (e *Executor) spawn(f func(ctx context.Context)) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.spawnLocked(f)
}

// spawnLocked is spawn with e.mu held.
func (e *Executor) spawnLocked(f func(ctx context.Context)) bool {
	if e.ctx == nil || e.closing {
		return false
	}
	ctx := e.ctx
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		f(ctx)
	}()
	return true
}

// watch stops the live workers whose submitter stopped asking after them
// (work past its last receipt would not be paid), whose receipts fell
// behind the floor (unpaid), or that ran past the job's max duration.
func (e *Executor) watch(now time.Time) {
	unpaid := e.unpaidRuns(now)
	for _, w := range e.snapshot() {
		w.mu.Lock()
		live := w.state == p2p.WorkerRunning || w.state == p2p.WorkerFetching
		silent := now.Sub(w.beat) > submitterSilence
		over := !w.started.IsZero() && now.Sub(w.started) > time.Duration(w.l.MaxSecs)*time.Second
		w.mu.Unlock()
		refused := live && !w.holder && e.refusedStop > 0 && e.answered(w) >= uint64(e.refusedStop)
		switch why, short := unpaid[w.l.JobID]; {
		case live && silent:
			e.stop(w, "the submitter stopped answering", false)
		case live && short && !w.holder:
			w.set(func() { w.unpaid = w.unpaid || !w.stopping })
			e.stop(w, why, false)
		case refused:
			w.set(func() { w.unpaid = w.unpaid || !w.stopping })
			e.stop(w, fmt.Sprintf("stopped: unpaid: the job's holder refused this worker's last %d updates; only the floor would pay it", e.refusedStop), false)
		case live && over:
			w.set(func() { w.outOfTime = true })
			e.stop(w, "out of time: the job's max duration was reached", false)
		}
	}
}

// Handle answers the job protocol (a p2p.RPC handler): it decodes the
// request and hands it to the typed handler below, which the node calls
// directly for its own jobs on this machine.
func (e *Executor) Handle(ctx context.Context, from peer.ID, env *p2p.Envelope) (string, any, error) {
	switch env.Type {
	case p2p.TypeLaunch:
		return handle(env, p2p.TypeLaunchReply, func(l p2p.Launch) (p2p.LaunchReply, error) { return e.Launch(ctx, from, l) })
	case p2p.TypeStatusReq:
		return handle(env, p2p.TypeJobStatus, func(r p2p.StatusReq) (p2p.JobStatus, error) { return e.Status(from, r) })
	case p2p.TypeLogsReq:
		return handle(env, p2p.TypeLogs, func(r p2p.LogsReq) (p2p.Logs, error) { return e.Logs(from, r) })
	case p2p.TypeStop:
		return handle(env, p2p.TypeJobStatus, func(r p2p.Stop) (p2p.JobStatus, error) { return e.Stop(from, r) })
	}
	return "", nil, fmt.Errorf("%w %q", p2p.ErrUnknownType, env.Type)
}

// handle decodes env's request and answers it with f's reply.
func handle[Req, Rep any](env *p2p.Envelope, replyType string, f func(Req) (Rep, error)) (string, any, error) {
	var r Req
	if err := p2p.Unmarshal(env.Payload, &r); err != nil {
		return "", nil, err
	}
	rep, err := f(r)
	if err != nil {
		return "", nil, err
	}
	return replyType, rep, nil
}

// Launch starts the workers l names for from (the job's submitter); a
// launch refused is a reply that says why, not an error.
func (e *Executor) Launch(ctx context.Context, from peer.ID, l p2p.Launch) (p2p.LaunchReply, error) {
	if err := l.Validate(); err != nil {
		return p2p.LaunchReply{}, err
	}
	if err := e.launch(ctx, from, l); err != nil {
		return p2p.LaunchReply{Reason: p2p.Clip(err.Error(), 512), Retry: errors.Is(err, errEscrowNotYet)}, nil
	}
	return p2p.LaunchReply{OK: true}, nil
}

// Status reports a worker from launched, keeping the usage receipt the
// request carries.
func (e *Executor) Status(from peer.ID, r p2p.StatusReq) (p2p.JobStatus, error) {
	w, err := e.owned(from, r.JobID, r.Index)
	if err != nil {
		return p2p.JobStatus{}, err
	}
	if r.Receipt != nil {
		if err := e.keepReceipt(w, from, *r.Receipt); err != nil {
			// The claim service holds it and stores it again later.
			e.log.Warn("cannot keep a usage receipt", "module", "executor", "job", w.l.JobID[:12], "err", err)
		}
	}
	return e.statusOf(w), nil
}

// Logs is a worker's output from r.Offset on, for the submitter that
// launched it.
func (e *Executor) Logs(from peer.ID, r p2p.LogsReq) (p2p.Logs, error) {
	w, err := e.owned(from, r.JobID, r.Index)
	if err != nil {
		return p2p.Logs{}, err
	}
	return w.readLog(r.Offset), nil
}

// Stop ends a worker from launched (keeping the chief's output as a
// checkpoint, or finishing it, as r asks) and reports it.
func (e *Executor) Stop(from peer.ID, r p2p.Stop) (p2p.JobStatus, error) {
	w, err := e.owned(from, r.JobID, r.Index)
	if err != nil {
		return p2p.JobStatus{}, err
	}
	reason := r.Reason
	if reason == "" {
		reason = "stopped by the submitter"
	}
	e.stop(w, p2p.Clip(reason, 200), r.Checkpoint)
	if r.Checkpoint && w.l.Index == 0 {
		e.spawn(func(ctx context.Context) { e.keepCheckpoint(ctx, w) })
	}
	if r.Final {
		e.spawn(func(context.Context) { e.finish(w) })
	}
	return e.statusOf(w), nil
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
	suspended := w.frozenFor
	if !w.frozenAt.IsZero() {
		st.Suspended, st.Reason = true, w.frozenWhy
		end := now
		if !w.ended.IsZero() {
			end = w.ended
		}
		suspended += max(end.Sub(w.frozenAt), 0)
	}
	st.SuspendedMs = suspended.Milliseconds()
	// The reason is often an error's whole chain (a tunnel that could not
	// connect, a fetch that failed): clipped, so the report still checks
	// out and the submitter learns why.
	st.Reason = p2p.Clip(st.Reason, p2p.MaxReasonLen)
	// Output is kept only once the chief has ended: until then a result
	// or checkpoint CID is not known.
	if w.keepsOutput() && (w.state == p2p.WorkerExited || w.state == p2p.WorkerStopped) && w.result == "" && w.ckpt == "" {
		select {
		case <-w.done:
		default:
			st.State = p2p.WorkerRunning // still adding its output
		}
	}
	st.Vacated = w.vacated && st.State == p2p.WorkerStopped
	st.OutOfTime = w.outOfTime && st.State == p2p.WorkerStopped
	st.Unpaid = w.unpaid && st.State == p2p.WorkerStopped
	return st
}

// readLog reads the worker's output from offset off.
func (w *worker) readLog(off int64) p2p.Logs {
	w.mu.Lock()
	jl := w.log
	w.mu.Unlock()
	if jl == nil {
		return p2p.Logs{Next: off}
	}
	lg := jl.Read(off)
	// Paths under the worker's dir exist only here: its submitter reads
	// them relative to it ("out/model.keras", the job's result). Next
	// stays the log's own offset.
	if w.dir != "" {
		lg.Data = bytes.ReplaceAll(lg.Data, []byte(w.dir+"/"), nil)
	}
	return lg
}

// Images lists the layout CIDs of the images this machine holds
// unpacked, the most recently used first, at most n: what its offer
// lists (p2p.Offer.Images).
func (e *Executor) Images(n int) []string {
	if e.images == nil {
		return nil
	}
	return e.images.Sources(n)
}

// DiskFree is the bytes free on the disk of the work area, where workers'
// files and the image cache are: what this machine's offer says it has.
func (e *Executor) DiskFree() uint64 {
	return inventory.DiskFree(e.dir)
}
