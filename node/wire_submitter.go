package node

// The submitter's wiring: what node/submitter needs, made of this node's
// parts.

import (
	"context"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/lender"
	"github.com/deepmarket/deepmarket/node/market"
	"github.com/deepmarket/deepmarket/node/service"
	"github.com/deepmarket/deepmarket/node/submitter"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/storage"
)

// submitterDeps are what the submitter reads of the rest of the node.
type submitterDeps struct {
	home   Home
	key    *identity.Key
	calls  *machineCalls
	exec   *lender.Executor
	book   *market.OfferBook
	bids   submitter.Bids
	quotes *submitter.QuoteBook
	ledger *ledger.Client
	store  *Store
	blocks *storage.Store
	log    *slog.Logger
}

// newSubmitter makes the manager of this node's own jobs.
func newSubmitter(c Config, d submitterDeps) *submitter.Manager {
	self := d.key.PeerID()
	return submitter.New(submitter.Params{
		Account:     string(d.key.Address()),
		LogDir:      filepath.Join(d.home.Dir, "data", "joblogs"),
		EscrowSlack: c.Jobs.EscrowSlack.Duration,
		Machines:    submitterMachines{d.calls, d.exec},
		Holders:     localHolders{d.exec, self},
		Offers:      heldOffers{d.book},
		Bids:        d.bids,
		Quotes:      d.quotes,
		Ledger:      d.ledger,
		Store:       d.store,
		Blocks:      d.blocks,
		Logger:      d.log.With("module", "submitter"),
		Reference:   c.DefaultPrices(),
		Starvation:  c.Jobs.Starvation.Duration,
	})
}

var (
	_ submitter.Machines = submitterMachines{}
	_ submitter.Holders  = localHolders{}
	_ submitter.Offers   = heldOffers{}
	_ submitter.Bids     = (*service.Market)(nil)
	_ api.Jobs           = (*submitter.Manager)(nil)
)

// submitterMachines reaches the machines a job runs on through this
// node's calls, and this machine's executor directly.
type submitterMachines struct {
	calls *machineCalls
	exec  *lender.Executor
}

func (m submitterMachines) Reserve(ctx context.Context, machine string, r p2p.Reserve) (p2p.ReserveReply, error) {
	id, err := peer.Decode(machine)
	if err != nil {
		return p2p.ReserveReply{}, err
	}
	return m.calls.reserve(ctx, id, m.calls.machineAddrs(machine), r)
}

func (m submitterMachines) Launch(ctx context.Context, machine string, l p2p.Launch) (p2p.LaunchReply, error) {
	return jobCall(m.calls, ctx, machine, p2p.TypeLaunch, l, p2p.TypeLaunchReply,
		func(self peer.ID, l p2p.Launch) (p2p.LaunchReply, error) { return m.exec.Launch(ctx, self, l) })
}

func (m submitterMachines) Status(ctx context.Context, machine string, r p2p.StatusReq) (p2p.JobStatus, error) {
	return jobCall(m.calls, ctx, machine, p2p.TypeStatusReq, r, p2p.TypeJobStatus, m.exec.Status)
}

func (m submitterMachines) Logs(ctx context.Context, machine string, r p2p.LogsReq) (p2p.Logs, error) {
	return jobCall(m.calls, ctx, machine, p2p.TypeLogsReq, r, p2p.TypeLogs, m.exec.Logs)
}

func (m submitterMachines) Stop(ctx context.Context, machine string, s p2p.Stop) (p2p.JobStatus, error) {
	return jobCall(m.calls, ctx, machine, p2p.TypeStop, s, p2p.TypeJobStatus, m.exec.Stop)
}

func (m submitterMachines) Addrs(machine string) []string { return m.calls.machineAddrs(machine) }

// localHolders runs held jobs' model holders on this machine's executor.
type localHolders struct {
	exec *lender.Executor
	self peer.ID
}

func (h localHolders) Hold(l p2p.Launch) error { return h.exec.Hold(h.self, l) }

func (h localHolders) CanHold(command []string) error { return h.exec.CanHold(command) }

func (h localHolders) HolderAccounts(run string, index int) ([]byte, error) {
	return h.exec.HolderAccounts(run, index)
}

func (h localHolders) Machine() string { return h.self.String() }

// heldOffers are the live offers of this node's book.
type heldOffers struct{ book *market.OfferBook }

func (o heldOffers) Offers(now time.Time) []p2p.Offer {
	held := o.book.List(now)
	out := make([]p2p.Offer, len(held))
	for i, h := range held {
		out[i] = h.Offer
	}
	return out
}
