package lender

import (
	"time"

	"github.com/deepmarket/deepmarket/p2p"
)

// The lender's words for what its owner asks and sees. They are a public
// JSON contract (`lend --json`, the dashboard, /api/v1/lend): node/api
// names them as aliases, and their field names must not change.

// LendRequest sets what this machine lends.
type LendRequest struct {
	Cores    int         `json:"cores"`
	MemBytes uint64      `json:"mem_bytes"`
	GPUs     int         `json:"gpus"`
	Window   string      `json:"window,omitempty"`
	Price    *p2p.Prices `json:"price,omitempty"` // nil: the configured defaults
	// PriceGiven, when set, names the units of Price the request sets
	// (core, mem, gpu); the others keep what is lent now, else the
	// configured defaults.
	PriceGiven []string `json:"price_given,omitempty"`
	// SuspendAbove, when set, is the owner's own CPU load (cores) above
	// which the jobs here are suspended; 0 never; nil: [owner] suspend_above.
	SuspendAbove *float64 `json:"suspend_above,omitempty"`
}

// LendState is what the machine lends now. Lender.State fills the
// settings and the offer's pace; the node adds what the ledger, the
// inventory and the holds say.
type LendState struct {
	Lending  bool         `json:"lending"`
	Settings *LendRequest `json:"settings,omitempty"`
	Offering bool         `json:"offering"`
	// OwnerBusy, when set, is why the machine's owner keeps it off the
	// market now ([owner] policy): its jobs are suspended meanwhile.
	OwnerBusy string `json:"owner_busy,omitempty"`
	// Unable, when set, is why this machine offers nothing though settings
	// are saved: it cannot run jobs (the job sandbox is missing).
	Unable     string     `json:"unable,omitempty"`
	Since      *time.Time `json:"since,omitempty"`
	NextChange *time.Time `json:"next_change,omitempty"` // window opens or closes
	// AnnounceEveryS is how often the offer is re-announced and OfferTTLS
	// how long peers keep it, seconds: [p2p] announce_interval and
	// offer_ttl, stretched in a market too big for them (announce_budget).
	AnnounceEveryS int64 `json:"announce_every_s,omitempty"`
	OfferTTLS      int64 `json:"offer_ttl_s,omitempty"`
	// Registered: the ledger backs this machine (a member account, or
	// linked to one); peers ignore offers of machines it does not.
	Registered bool   `json:"registered"`
	Owner      string `json:"owner,omitempty"` // the account it earns into
	// Warnings say what keeps the machine from being placed on, and how
	// to fix it.
	Warnings []string `json:"warnings,omitempty"`
	// Frameworks are what jobs this machine runs: generic always,
	// tensorflow when its Python imports TensorFlow.
	Frameworks []string `json:"frameworks,omitempty"`
	// Checking says whether TensorFlow runs here is not known yet: the
	// node's probe of its Python (seconds after start) has not ended.
	Checking bool `json:"checking_frameworks,omitempty"`
	// NAT is how peers reach this machine (as in Status): a private one is
	// reached through a relay and a hole punch.
	NAT p2p.NATStatus `json:"nat"`
	// Holds are the reservations schedulers hold on this machine now.
	Holds []Hold `json:"holds"`
}

// Hold is one reservation on a lending machine, as its owner sees it
// (Holds.List).
type Hold struct {
	ID        string     `json:"id"`
	Job       string     `json:"job_id"`
	State     string     `json:"state"`   // held, committed (waiting for its launch) or running
	Account   string     `json:"account"` // the bidder's account, which pays
	Scheduler string     `json:"scheduler"`
	Bidder    string     `json:"bidder"`
	Cores     uint32     `json:"cores"`
	MemBytes  uint64     `json:"mem_bytes"`
	GPUs      uint32     `json:"gpus"`
	Since     time.Time  `json:"since"`
	Expires   *time.Time `json:"expires,omitempty"` // when it lapses unless committed or launched
}
