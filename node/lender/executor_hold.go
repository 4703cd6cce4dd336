package lender

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/p2p"
)

// Hold starts the model's holder of a held job ([training] holder =
// "submitter") on this machine, the job's submitter's: the job's program
// once more, as worker len(l.World) of the run here, with DM_ROLE=holder.
// It takes no hold and no escrow (the job is this machine's own), pins no
// CPU, is not paid, and the owner's use of the machine neither suspends
// nor reclaims it; the run's machines reach its averaging port through
// their tunnels. self (this machine) polls, reads and stops it as any
// worker here.
func (e *Executor) Hold(self peer.ID, l p2p.Launch) error {
	switch {
	case !l.Training.Held():
		return errors.New("not a held job: its [training] holder is not the submitter")
	case l.Index != len(l.World) || len(l.World) > p2p.MaxWorkers:
		return fmt.Errorf("the holder is worker %d of a run of %d, not %d", len(l.World), len(l.World), l.Index)
	case self.String() != e.self:
		return errors.New("the holder runs on its submitter's own machine")
	}
	if err := e.checkInputs(l); err != nil {
		return err
	}
	return e.admit(self, l, true)
}

// CanHold says why this machine cannot run a holder with command: the
// sandbox it would run in, or the program; nil when it can.
func (e *Executor) CanHold(command []string) error {
	if err := e.Capable(); err != nil {
		return err
	}
	argv, inBundle, err := e.program(command, false)
	if err != nil || inBundle {
		return err
	}
	if argv[0] == "" {
		return errors.New("no Python environment to run it with ([inventory] python in config.toml)")
	}
	if _, err := os.Stat(argv[0]); err != nil {
		return fmt.Errorf("its Python environment: %w", err)
	}
	return nil
}

// holderFile is where the holder keeps its accounts of the workers,
// inside its dir (the deepmarket package's Holder writes it in out/).
var holderFile = filepath.Join("out", "holder.json")

// maxHolderBytes bounds what is read of a holder's accounts.
const maxHolderBytes = 256 << 10

// HolderAccounts reads what the holder of run (worker index here) last
// wrote of its accounts: opened beneath its dir (no link leads out),
// without blocking, only if regular, up to a bound. Nil when it wrote
// none yet.
func (e *Executor) HolderAccounts(run string, index int) ([]byte, error) {
	e.mu.Lock()
	w := e.workers[workerKey(run, index)]
	e.mu.Unlock()
	if w == nil || !w.holder {
		return nil, fmt.Errorf("no holder of job %.12s here", run)
	}
	dir, err := e.root.OpenRoot(w.name)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	f, err := dir.OpenFile(holderFile, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, errors.New("the holder's accounts are not a regular file")
	}
	b, err := io.ReadAll(io.LimitReader(f, maxHolderBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxHolderBytes {
		return nil, fmt.Errorf("the holder's accounts are over %d bytes", maxHolderBytes)
	}
	return b, nil
}
