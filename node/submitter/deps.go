package submitter

// What the submitter needs from the rest of the node, each declared here
// as the little it uses.

import (
	"context"
	"log/slog"
	"time"

	ctypes "github.com/cometbft/cometbft/rpc/core/types"
	"github.com/ipfs/go-cid"

	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/storage"
)

// Machines reaches the machines a job runs on: this node itself, or peers.
type Machines interface {
	// Reserve asks machine to apply a hold operation.
	Reserve(ctx context.Context, machine string, r p2p.Reserve) (p2p.ReserveReply, error)
	// Launch asks machine to start the workers l names.
	Launch(ctx context.Context, machine string, l p2p.Launch) (p2p.LaunchReply, error)
	// Status asks machine how a worker is, carrying a usage receipt.
	Status(ctx context.Context, machine string, r p2p.StatusReq) (p2p.JobStatus, error)
	// Logs asks machine for a worker's output from an offset.
	Logs(ctx context.Context, machine string, r p2p.LogsReq) (p2p.Logs, error)
	// Stop asks machine to end a worker.
	Stop(ctx context.Context, machine string, s p2p.Stop) (p2p.JobStatus, error)
	// Addrs is where machine's offer says it listens.
	Addrs(machine string) []string
}

// Offers are the live offers of the market this node holds.
type Offers interface {
	Offers(now time.Time) []p2p.Offer
}

// Bids publishes this node's bids, signed and gossiped, to live for ttl;
// the quotes for them arrive in the QuoteBook.
type Bids interface {
	Publish(ctx context.Context, bid p2p.Bid, ttl time.Duration) (SeenBid, error)
}

// SeenBid is a bid as the market saw it: who sent it, when it came and
// when it lapses (one entry of `bids --json`).
type SeenBid struct {
	p2p.Bid
	From       string    `json:"from"`
	ReceivedAt time.Time `json:"received_at"`
	ExpiresAt  time.Time `json:"expires_at"`
}

// Ledger is the ledger as a job's payer: escrows, receipts, settlements.
// *ledger.Client is one.
type Ledger interface {
	OpenEscrow(ctx context.Context, m ledger.OpenEscrow) (*ctypes.ResultTx, error)
	Settle(ctx context.Context, m ledger.Settle) (*ctypes.ResultTx, error)
	SignReceipt(r ledger.Receipt) ledger.Receipt
	// SignAnswer signs a held run's answer to a machine with the same key.
	SignAnswer(a ledger.Answer) ledger.Answer
	// Wait waits on a transaction sent before, by its hash.
	Wait(ctx context.Context, hash string) (*ctypes.ResultTx, error)
}

// Store persists the jobs, one document each under "jobs/".
type Store interface {
	Put(key string, v any) error
	Each(prefix string, fn func(key string, doc []byte) error) error
}

// Blocks adds a job's bundle and dataset directories to storage.
// *storage.Store is one.
type Blocks interface {
	Add(ctx context.Context, path string, progress func(storage.Progress)) (storage.Pin, error)
	// Pinned is what this node holds of root, if it holds it.
	Pinned(ctx context.Context, root cid.Cid) (storage.Pin, bool, error)
	// Fetch brings every block under root from peers and pins it
	// (storage.ErrStalled when none delivers).
	Fetch(ctx context.Context, root cid.Cid, progress func(storage.Progress)) (storage.Pin, error)
}

// Holders runs the model's holder of this node's held jobs ([training]
// holder = "submitter") on this machine: its executor, which the
// submitter then polls, reads and stops through Machines as worker
// len(World) of the run on Machine().
type Holders interface {
	// CanHold says why this machine cannot run command as a holder (its
	// sandbox, its Python), nil when it can.
	CanHold(command []string) error
	Hold(l p2p.Launch) error
	// HolderAccounts is the holder's accounts file (holder.json), nil
	// before it wrote one.
	HolderAccounts(run string, index int) ([]byte, error)
	Machine() string
}

// Params are what New needs; every field is required but Reference.
type Params struct {
	Account     string        // the ledger address jobs are submitted from
	LogDir      string        // the jobs' logs, one file each
	EscrowSlack time.Duration // an escrow outlives the job's max duration by this
	Machines    Machines
	Holders     Holders
	Offers      Offers
	Bids        Bids
	Quotes      *QuoteBook // where the quotes for Bids' bids arrive
	Ledger      Ledger
	Store       Store
	Blocks      Blocks
	Logger      *slog.Logger
	// Reference prices weigh a waiting job's resources against its max
	// price, for its place in the queue (benefit per cost).
	Reference p2p.Prices
	// Starvation is how long a job may wait before it bids ahead of every
	// job that has waited less, whatever their benefit per cost.
	Starvation time.Duration
}

var (
	_ Ledger = (*ledger.Client)(nil)
	_ Blocks = (*storage.Store)(nil)
)
