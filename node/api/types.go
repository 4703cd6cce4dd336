package api

import (
	"fmt"
	"time"

	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/inventory"
	"github.com/deepmarket/deepmarket/node/lender"
	"github.com/deepmarket/deepmarket/node/market"
	"github.com/deepmarket/deepmarket/node/submitter"
	"github.com/deepmarket/deepmarket/p2p"
)

// Status is `status --json`.
type Status struct {
	PeerID   string   `json:"peer_id"`
	Addrs    []string `json:"addrs"`
	Account  string   `json:"account"`
	ChainID  string   `json:"chain_id"`
	Height   int64    `json:"height"`
	Peers    int      `json:"peers"`
	Lending  bool     `json:"lending"`
	Offering bool     `json:"offering"` // an offer is out now (inside the window)
	API      string   `json:"api"`
	Moniker  string   `json:"moniker"`
	Site     string   `json:"site"`
	Version  string   `json:"version"`
	UptimeS  int64    `json:"uptime_s"`
	Offers   int      `json:"offers"` // offers held from the market
	// LedgerNodeID and LedgerRPC identify this node's ledger replica: other
	// ledger nodes list it as LedgerNodeID@host:port, auditors read LedgerRPC.
	LedgerNodeID string `json:"ledger_node_id"`
	LedgerRPC    string `json:"ledger_rpc"`
	// NAT is how peers reach this node: whether AutoNAT found it public or
	// private, its public and relay addresses, whether it relays, and the
	// hole punches tried.
	NAT p2p.NATStatus `json:"nat"`
}

// Balance is `ledger balance --json`.
type Balance struct {
	Address string `json:"address"`
	Balance uint64 `json:"balance"`
	Nonce   uint64 `json:"nonce"`
	Height  int64  `json:"height"`
}

// Record is an account's two track records on the ledger: as a payer
// (escrows closed, paid against owed, marks given and disputed, rounds
// its holders refused) and as a machine (work completed and failed,
// earned, rounds refused).
type Record struct {
	Address string               `json:"address"`
	Payer   ledger.PayerRecord   `json:"payer"`
	Machine ledger.MachineRecord `json:"machine"`
	Height  int64                `json:"height"`
}

// SendRequest moves credits: a transfer, or a grant by an issuer.
type SendRequest struct {
	// Kind is transfer (the default), grant, admit or revoke (an issuer's
	// membership for To; no amount), or link (Consent; no To, no amount).
	Kind   string `json:"kind,omitempty"`
	To     string `json:"to,omitempty"`
	Amount uint64 `json:"amount,omitempty"`
	Memo   string `json:"memo,omitempty"`
	// Consent is a machine's consent to earn into this node's account, as
	// `ledger consent` prints it (kind link).
	Consent string `json:"consent,omitempty"`
}

// ConsentRequest asks this node, as a machine, to consent to earning into
// Owner's account (POST /api/v1/ledger/consent).
type ConsentRequest struct {
	Owner string `json:"owner"`
	// TTLSeconds is how long the consent is good for: 1 to 3600 (default).
	TTLSeconds int `json:"ttl_s,omitempty"`
}

// Consent is a signed link consent, to hand to the owner's node.
type Consent struct {
	Machine string `json:"machine"` // the machine's account
	Owner   string `json:"owner"`
	Expires int64  `json:"expires"` // unix seconds
	Token   string `json:"token"`   // what ledger link takes
}

// SendResult names the committed transaction.
type SendResult struct {
	Hash   string `json:"hash"`
	Height int64  `json:"height"`
}

// SendPrepared names a transaction the node signed and is about to send:
// the first line of a streamed send, so the caller knows the hash before
// anything can go wrong.
type SendPrepared struct {
	Hash  string `json:"hash"`
	Nonce uint64 `json:"nonce"`
}

// OutcomeUnknown is Error.Outcome when the node cannot tell whether a
// transaction was, or will be, committed.
const OutcomeUnknown = "unknown"

// Inventory is the machine's inventory.
type Inventory = inventory.Inventory

// LendRequest sets what this machine lends.
type LendRequest = lender.LendRequest

// LendState is what the machine lends now.
type LendState = lender.LendState

// Hold is one reservation on a lending machine, as its owner sees it.
type Hold = lender.Hold

// Offer is one entry of `offers --json`.
type Offer struct {
	Machine        string        `json:"machine"`
	Owner          string        `json:"owner"`
	Moniker        string        `json:"moniker"`
	Site           string        `json:"site"`
	Cores          uint32        `json:"cores"`
	MemBytes       uint64        `json:"mem_bytes"`
	GPUs           uint32        `json:"gpus"`
	GPUModels      []p2p.GPU     `json:"gpu_models,omitempty"`
	DiskBytes      uint64        `json:"disk_bytes"`
	Allocated      p2p.Resources `json:"allocated"`
	Price          uint64        `json:"price"` // micro-credits per hour for everything lent
	Prices         p2p.Prices    `json:"prices"`
	Window         string        `json:"window,omitempty"`
	AvailableUntil *time.Time    `json:"available_until,omitempty"`
	Addrs          []string      `json:"addrs"`
	Software       p2p.Software  `json:"software"`
	// Links are the machine's measured paths to other machines.
	Links []p2p.LinkSample `json:"links,omitempty"`
	// Reach is how other machines reach this one: public, nat (behind a
	// NAT a hole punch crosses) or relay (only through a relay).
	Reach string `json:"reach,omitempty"`
	// Images are the CIDs of the job images the machine holds unpacked:
	// a job in one starts there without fetching it.
	Images     []string  `json:"images,omitempty"`
	ExpiresAt  time.Time `json:"expires_at"`
	ReceivedAt time.Time `json:"received_at"`
	Self       bool      `json:"self"`
}

// Peer is one entry of `peers --json`.
type Peer struct {
	PeerID     string  `json:"peer_id"`
	Moniker    string  `json:"moniker,omitempty"`
	Site       string  `json:"site,omitempty"`
	Version    string  `json:"version,omitempty"`
	DeepMarket bool    `json:"deepmarket"`
	LatencyMS  float64 `json:"latency_ms"`
	Score      float64 `json:"score"`
	Direction  string  `json:"direction"`
	// Connection is "direct", or "relayed" while the only connection goes
	// through a relay (control messages only).
	Connection string `json:"connection"`
	// Punch, while the connection is relayed, says why it is not direct:
	// the last hole punch with the peer (its attempts and error), or none
	// yet and why.
	Punch string   `json:"punch,omitempty"`
	Addrs []string `json:"addrs"`
}

// SeenBid is one entry of `bids --json` (the submitter's type).
type SeenBid = submitter.SeenBid

// PublishBidRequest asks the node to gossip a bid signed by its key.
type PublishBidRequest struct {
	Bid p2p.Bid `json:"bid"`
	TTL string  `json:"ttl,omitempty"` // Go duration; default 10m
}

// Error is the body of every non-2xx answer.
type Error struct {
	Status  int    `json:"-"`
	Message string `json:"error"`
	Field   string `json:"field,omitempty"` // the request field at fault
	Code    uint32 `json:"code,omitempty"`  // the ledger's rejection code
	// Outcome "unknown": the transaction Hash may still commit (ledger tx
	// tells); absent for errors that changed nothing.
	Outcome string `json:"outcome,omitempty"`
	Hash    string `json:"hash,omitempty"`
}

func (e *Error) Error() string {
	if e.Code != 0 {
		return fmt.Sprintf("%s (ledger code %d)", e.Message, e.Code)
	}
	return e.Message
}

// MachinePrices is one machine's current prices, load and free capacity.
type MachinePrices = market.MachinePrices

// MarketPrices is `deepmarket prices`: what this node's scheduler charges
// now, per machine and market-wide (micro-credits per unit-hour; memory
// per GiB-hour).
type MarketPrices = market.Prices

// QuoteRequest is a job shape to price.
type QuoteRequest = market.QuoteRequest

// QuotedWorker is where one worker would run, at what hourly price.
type QuotedWorker = market.QuotedWorker

// QuoteResult is a quote, or the reason there is none.
type QuoteResult = market.QuoteResult

// ReceivedQuote is a scheduler's quote for one of this node's bids (the
// submitter's type).
type ReceivedQuote = submitter.ReceivedQuote

// SubmitRequest submits a job: its spec as written, the directory its
// relative paths are from, and whether to go on without confirmation (the
// submitter's type).
type SubmitRequest = submitter.SubmitRequest

// JobLogs is a chunk of a job's log; Done when the job has ended and
// nothing more will come (the submitter's type).
type JobLogs = submitter.JobLogs
