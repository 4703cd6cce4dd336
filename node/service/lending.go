package service

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p/core/host"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/fault"
	"github.com/deepmarket/deepmarket/node/inventory"
	"github.com/deepmarket/deepmarket/node/lender"
	"github.com/deepmarket/deepmarket/p2p"
)

// Owners says which account the ledger has a machine earn into.
type Owners interface {
	MachineOwner(machine identity.Address) (owner identity.Address, registered bool)
}

// Lending answers /lend: the owner's settings, and the holds on this
// machine.
type Lending struct {
	Lender  *lender.Lender
	Exec    *lender.Executor
	Holds   *lender.Holds
	Owners  Owners
	Machine identity.Address // this machine's ledger address
	Host    host.Host
	Probe   func() inventory.Inventory
	// Python and ConfigPath name [inventory] python and the config file
	// in the warning shown when that Python has no TensorFlow.
	Python, ConfigPath string
	// ReclaimGrace is how long running jobs keep a machine its owner
	// takes back (lend --stop).
	ReclaimGrace time.Duration
}

// Lend is the settings, whether the ledger backs this machine (peers
// ignore its offers otherwise), and what is held on it.
func (l *Lending) Lend() api.LendState {
	now := time.Now()
	st := l.Lender.State(now)
	owner, ok := l.Owners.MachineOwner(l.Machine)
	st.Registered, st.Owner = ok, string(owner)
	if !ok && st.Lending {
		st.Warnings = append(st.Warnings, fmt.Sprintf("this machine (%s) is not registered on the ledger, so peers ignore its offers: "+
			"ask an issuer of your network to admit it (`deepmarket ledger admit %s` on their node), or link it to your member account "+
			"(`deepmarket ledger consent YOUR_ADDRESS` here, then `deepmarket ledger link TOKEN` on your node)", l.Machine, l.Machine))
	}
	inv := l.Probe()
	if st.Lending && inv.Python != "" && inv.TensorFlow == "" {
		st.Warnings = append(st.Warnings, fmt.Sprintf("the Python jobs run with here (%s, [inventory] python in %s) cannot import TensorFlow: "+
			"this machine is offered for generic jobs only; point [inventory] python at a virtualenv with tensorflow "+
			"(make deps makes one at /opt/deepmarket/venv) and restart the node", l.Python, l.ConfigPath))
	}
	st.Frameworks = []string{"generic"}
	if inv.TensorFlow != "" {
		st.Frameworks = append(st.Frameworks, "tensorflow")
	}
	st.Checking = inv.Probing
	st.NAT = p2p.NATOf(l.Host)
	st.Holds = l.Holds.List(now)
	return st
}

// ReleaseHold drops a hold on this machine that runs no worker.
func (l *Lending) ReleaseHold(id string) error {
	err := l.Holds.ReleaseByOwner(id)
	switch {
	case errors.Is(err, lender.ErrNoHold):
		return fault.Wrap(fault.NotFound, "hold", err)
	case errors.Is(err, lender.ErrHoldRunning):
		return fault.Wrap(fault.Conflict, "hold", err)
	}
	return err
}

// SetLend saves the owner's settings and offers the machine. A machine
// that cannot enforce a job's limits (memory, processes) does not lend:
// limits are enforced, not trusted.
func (l *Lending) SetLend(ctx context.Context, req api.LendRequest) (api.LendState, error) {
	if err := l.Exec.Capable(); err != nil {
		return api.LendState{}, fault.New(fault.Conflict, "", "%v (run the node as root on a machine with cgroups; see README, Running a training job)", err)
	}
	if _, err := l.Lender.Set(ctx, req); err != nil {
		if _, registered := l.Owners.MachineOwner(l.Machine); registered || isRequestFault(err) {
			return api.LendState{}, err
		}
		// Saved; gossip refuses the offer of a machine the ledger does
		// not back, which the state's warning explains.
	}
	return l.Lend(), nil
}

// StopLend withdraws the offer. Running workers get ReclaimGrace to
// finish or checkpoint, then stop; their submitters re-place them.
func (l *Lending) StopLend(ctx context.Context) error {
	if err := l.Lender.Stop(ctx); err != nil {
		return err
	}
	l.Exec.Reclaim(l.ReclaimGrace)
	return nil
}

// isRequestFault says whether err blames the request (a field at fault),
// not the node.
func isRequestFault(err error) bool {
	var field api.FieldError
	if errors.As(err, &field) {
		return true
	}
	k, ok := fault.KindOf(err)
	return ok && k != fault.Internal
}

var _ api.Lending = (*Lending)(nil)
