package lender

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/units"
)

// launch checks a launch request against this machine's hold and the
// ledger's escrow, then takes the hold and starts the worker in the
// background. A launch refused frees the hold, unless another worker of
// the run already runs on it (a launch that cannot start must not keep
// the machine's capacity), or the refusal may pass (errEscrowNotYet: the
// hold stays until its launch window ends, for the launch to come again).
func (e *Executor) launch(ctx context.Context, from peer.ID, l p2p.Launch) (err error) {
	if l.Floor < e.minFloor {
		return fmt.Errorf("the launch pays a floor of %g of the price for the time worked: this machine lends for %g at least ([lend] min_floor)", l.Floor, e.minFloor)
	}
	if err := e.checkHold(from, l); err != nil {
		return err
	}
	defer func() {
		if err != nil && !errors.Is(err, errEscrowNotYet) && !e.holdInUse(l.Hold) {
			e.holds.Release(l.Hold)
		}
	}()
	if err := e.checkEscrow(ctx, from, l); err != nil {
		return err
	}
	if err := e.checkInputs(l); err != nil {
		return err
	}
	if _, ok := e.holds.Launch(l.Hold, l.JobID, from, time.Now()); !ok {
		return errors.New("the hold lapsed while the launch was checked: reserve and commit again")
	}
	if err := e.admit(from, l, false); err != nil {
		return err
	}
	e.claims.Watch(l.JobID)
	return nil
}

// errEscrowNotYet is a launch's refusal while this machine's replica of
// the ledger does not show the run's escrow: it may be a few blocks
// behind (catching up after its peers restarted), so the launch may be
// sent again.
var errEscrowNotYet = errors.New("no escrow for this job on this machine's ledger yet")

// escrowWait is how long a launch waits for its escrow to show: what is
// left of ctx less a margin, so the refusal reaches the submitter before
// its call gives up.
func escrowWait(ctx context.Context) time.Duration {
	dl, ok := ctx.Deadline()
	if !ok {
		return 7 * time.Second
	}
	return max(time.Until(dl)-3*time.Second, time.Second)
}

// holdInUse reports whether a worker here runs on hold.
func (e *Executor) holdInUse(hold string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, w := range e.workers {
		if w.l.Hold == hold {
			return true
		}
	}
	return false
}

// checkHold checks that the worker is placed on this machine and that from
// committed a hold here for the run, big enough for all its workers here.
func (e *Executor) checkHold(from peer.ID, l p2p.Launch) error {
	self := e.self
	if l.World[l.Index] != self {
		return fmt.Errorf("worker %d is placed on %s, not on this machine", l.Index, l.World[l.Index])
	}
	held, ok := e.holds.Check(l.Hold, l.JobID, from, time.Now())
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
	return nil
}

// checkEscrow checks the run's escrow on the ledger: paid by the
// submitter, with this machine among its payees, lasting past the job's
// max duration, and not empty.
func (e *Executor) checkEscrow(ctx context.Context, from peer.ID, l p2p.Launch) error {
	payer, err := submitterAddress(from)
	if err != nil {
		return err
	}
	wait, cancel := context.WithTimeout(ctx, escrowWait(ctx))
	defer cancel()
	esc, err := e.awaitEscrow(wait, l.JobID)
	if err != nil {
		return err
	}
	me := string(e.account)
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
	return nil
}

// submitterAddress is the ledger address of the peer from.
func submitterAddress(from peer.ID) (identity.Address, error) {
	a, err := identity.AddressOfPeer(from)
	if err != nil {
		return "", fmt.Errorf("submitter key: %w", err)
	}
	return a, nil
}

// awaitEscrow reads run's escrow from the ledger. The escrow was just
// committed: this machine's replica of the ledger may be a block behind,
// so it looks again as each block is stored, until ctx ends (every 200 ms
// where no block notification is wired, and at least every 5 s anyway).
func (e *Executor) awaitEscrow(ctx context.Context, run string) (*ledger.Escrow, error) {
	for {
		var next <-chan struct{}
		again := 200 * time.Millisecond
		if e.committed != nil {
			next, again = e.committed(), 5*time.Second // taken before the read: a block in between still wakes it
		}
		esc, err := e.ledger.Escrow(ctx, run)
		if err == nil {
			return esc, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %w", errEscrowNotYet, err)
		case <-next:
		case <-time.After(again):
		}
	}
}

// checkInputs checks that the launch's inputs are CIDs and that its
// command is one this machine runs.
func (e *Executor) checkInputs(l p2p.Launch) error {
	if err := l.Training.ValidateInputs(); err != nil {
		return err
	}
	for _, c := range []string{l.Bundle, l.Dataset, l.Resume, l.Image} {
		if c != "" {
			if _, err := cid.Decode(c); err != nil {
				return fmt.Errorf("CID %q: %w", c, err)
			}
		}
	}
	_, _, err := e.program(l.Command, l.Image != "")
	return err
}

// admit makes a checked worker one of this machine's, if the node runs
// jobs now: it picks the worker's CPUs, lists it among the workers here
// and runs it in the background, in the executor's group. A retried
// launch of a worker already here succeeds at once.
func (e *Executor) admit(from peer.ID, l p2p.Launch, holder bool) error {
	key := workerKey(l.JobID, l.Index)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ctx == nil || e.closing || e.ctx.Err() != nil {
		return errors.New("the node is not running jobs now")
	}
	if _, ok := e.workers[key]; ok {
		return nil // a retried launch
	}
	var gpus, cpus []int
	if !holder { // the holder shares the machine's CPUs, and uses no GPU
		var err error
		if gpus, err = e.pickGPUs(key, int(l.Res.GPUs)); err != nil {
			return err
		}
		if cpus, err = e.pickCPUs(key, int(l.Res.Cores)); err != nil {
			for _, g := range gpus {
				delete(e.gpus, g)
			}
			return err
		}
	}
	name := workerName(l.JobID, l.Index)
	w := &worker{l: l, bidder: from, key: key, name: name, dir: filepath.Join(e.dir, name), holder: holder,
		cpus: cpus, gpus: gpus, box: name + "-" + e.tag, state: p2p.WorkerFetching, beat: time.Now(), done: make(chan struct{})}
	wctx, cancel := context.WithCancel(e.ctx)
	w.cancel = cancel
	e.workers[key] = w
	if c, m := e.inUseLocked(); c > e.peakCores || m > e.peakMem {
		e.peakCores, e.peakMem = max(c, e.peakCores), max(m, e.peakMem)
	}
	e.spawnLocked(func(context.Context) {
		defer close(w.done)
		e.run(wctx, w)
	})
	return nil
}

// pickGPUs gives a worker n of the GPUs this machine lends (the first
// ones nvidia-smi lists, as the offer says) that no other worker here
// uses. Unlike CPUs, a GPU is never shared: too few free is an error.
func (e *Executor) pickGPUs(key string, n int) ([]int, error) {
	if n == 0 {
		return nil, nil
	}
	lent := e.lent.LentGPUs()
	var got []int
	for g := 0; g < lent && len(got) < n; g++ {
		if _, used := e.gpus[g]; !used {
			got = append(got, g)
		}
	}
	if len(got) < n {
		return nil, fmt.Errorf("%s: this machine lends %s and %d in use", units.Count(n, "GPU wanted", "GPUs wanted"),
			units.Count(lent, "GPU", "GPUs"), len(e.gpus))
	}
	for _, g := range got {
		e.gpus[g] = key
	}
	return got, nil
}

// pickCPUs gives a worker n CPUs no other worker here uses, from the
// highest-numbered down (the owner's own work tends to land low); none
// when the machine shares its CPUs ([executor] share_cpus).
func (e *Executor) pickCPUs(key string, n int) ([]int, error) {
	if e.shareCPUs {
		return nil, nil
	}
	pool := slices.Clone(e.cpuPool)
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

// program is what runs a job's command here: an interpreter name lenders
// offer (python3) becomes this machine's interpreter; anything else must
// be a file of the bundle, named relative to it (inBundle). In an image
// (inImage), an interpreter's name or an absolute path is the image's.
func (e *Executor) program(cmd []string, inImage bool) (argv []string, inBundle bool, err error) {
	if len(cmd) == 0 {
		return nil, false, errors.New("empty command")
	}
	argv = slices.Clone(cmd)
	if inImage && (jobs.IsInterpreter(cmd[0]) || filepath.IsAbs(cmd[0])) {
		return argv, false, nil // the image's own, found in its PATH or at its path
	}
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
