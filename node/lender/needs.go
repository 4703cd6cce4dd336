package lender

import (
	"context"
	"os"
	"time"

	ctypes "github.com/cometbft/cometbft/rpc/core/types"
	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/storage"
)

// What the lender's room needs from the rest of the node, declared here
// where it is used; the node passes its own services (or thin adapters).

// Store is the node's small key-value store: lend settings, workers'
// sandbox records and usage receipts survive restarts in it.
type Store interface {
	Get(key string, v any) (found bool, err error)
	Put(key string, v any) error
	Delete(key string) error
	Each(prefix string, fn func(key string, doc []byte) error) error
}

// Blocks fetches a job's inputs by CID and adds its output.
type Blocks interface {
	FetchInto(ctx context.Context, root cid.Cid, dir string, progress func(storage.Progress)) (storage.Pin, error)
	AddFrom(ctx context.Context, root *os.Root, path string, progress func(storage.Progress)) (storage.Pin, error)
}

// Escrows (the ledger client) reads a run's escrow, claims this
// machine's due from it and disputes a failed mark its settlement gave.
type Escrows interface {
	Escrow(ctx context.Context, job string) (*ledger.Escrow, error)
	Claim(ctx context.Context, r ledger.Receipt) (*ctypes.ResultTx, error)
	Dispute(ctx context.Context, job string) (*ctypes.ResultTx, error)
}

// Dialer makes another machine of a run reachable: it learns the
// addresses the launch named for it and those its offer announces.
type Dialer interface {
	LearnMachine(machine peer.ID, known []string)
}

// HoldBook is this machine's holds as the executor uses them: a launch
// checks its committed hold, then takes it; a finished worker releases it.
type HoldBook interface {
	Check(id, job string, launcher peer.ID, now time.Time) (p2p.Resources, bool)
	Launch(id, job string, launcher peer.ID, now time.Time) (p2p.Resources, bool)
	Release(id string)
}

// GPULender says how many GPUs this machine lends now.
type GPULender interface {
	LentGPUs() int
}

var (
	_ HoldBook  = (*Holds)(nil)
	_ GPULender = (*Lender)(nil)
)
