package node

// The submitter's wiring: what node/submitter needs, made of this node's
// parts, and the API calls that forward to it.

import (
	"context"
	"path/filepath"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/submitter"
	"github.com/deepmarket/deepmarket/p2p"
)

// newSubmitter makes the manager of this node's own jobs.
func (n *Node) newSubmitter() *submitter.Manager {
	return submitter.New(submitter.Params{
		Account:     string(n.key.Address()),
		LogDir:      filepath.Join(n.home.Dir, "data", "joblogs"),
		EscrowSlack: n.cfg.Jobs.EscrowSlack.Duration,
		Machines:    submitterWire{n},
		Holders:     submitterWire{n},
		Offers:      submitterWire{n},
		Bids:        n,
		Quotes:      n.quotes,
		Ledger:      n.ledger,
		Store:       n.store,
		Blocks:      n.blocks,
		Logger:      n.log.With("module", "submitter"),
		Reference:   n.cfg.DefaultPrices(),
		Starvation:  n.cfg.Jobs.Starvation.Duration,
	})
}

// submitterWire gives the submitter this node's calls to machines and
// the offers it holds.
type submitterWire struct{ n *Node }

var (
	_ submitter.Machines = submitterWire{}
	_ submitter.Holders  = submitterWire{}
	_ submitter.Offers   = submitterWire{}
	_ submitter.Bids     = (*Node)(nil)
)

func (w submitterWire) Reserve(ctx context.Context, machine string, r p2p.Reserve) (p2p.ReserveReply, error) {
	id, err := peer.Decode(machine)
	if err != nil {
		return p2p.ReserveReply{}, err
	}
	return w.n.reserve(ctx, id, w.n.machineAddrs(machine), r)
}

func (w submitterWire) Launch(ctx context.Context, machine string, l p2p.Launch) (p2p.LaunchReply, error) {
	return jobCall(w.n, ctx, machine, p2p.TypeLaunch, l, p2p.TypeLaunchReply,
		func(self peer.ID, l p2p.Launch) (p2p.LaunchReply, error) { return w.n.exec.Launch(ctx, self, l) })
}

func (w submitterWire) Status(ctx context.Context, machine string, r p2p.StatusReq) (p2p.JobStatus, error) {
	return jobCall(w.n, ctx, machine, p2p.TypeStatusReq, r, p2p.TypeJobStatus, w.n.exec.Status)
}

func (w submitterWire) Logs(ctx context.Context, machine string, r p2p.LogsReq) (p2p.Logs, error) {
	return jobCall(w.n, ctx, machine, p2p.TypeLogsReq, r, p2p.TypeLogs, w.n.exec.Logs)
}

func (w submitterWire) Stop(ctx context.Context, machine string, s p2p.Stop) (p2p.JobStatus, error) {
	return jobCall(w.n, ctx, machine, p2p.TypeStop, s, p2p.TypeJobStatus, w.n.exec.Stop)
}

func (w submitterWire) Addrs(machine string) []string { return w.n.machineAddrs(machine) }

func (w submitterWire) Hold(l p2p.Launch) error { return w.n.exec.Hold(w.n.host.ID(), l) }

func (w submitterWire) CanHold(command []string) error { return w.n.exec.CanHold(command) }

func (w submitterWire) HolderAccounts(run string, index int) ([]byte, error) {
	return w.n.exec.HolderAccounts(run, index)
}

func (w submitterWire) Machine() string { return w.n.host.ID().String() }

func (w submitterWire) Offers(now time.Time) []p2p.Offer {
	held := w.n.book.List(now)
	out := make([]p2p.Offer, len(held))
	for i, h := range held {
		out[i] = h.Offer
	}
	return out
}

// Quotes implements api.Scheduling: the quotes received for a job this
// node bid.
func (n *Node) Quotes(ctx context.Context, job string) ([]api.ReceivedQuote, error) {
	return n.quotes.Quotes(ctx, job)
}

// payeeOf is the ledger address a machine is paid at.
func payeeOf(machine string) string { return submitter.PayeeOf(machine) }
