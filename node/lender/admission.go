package lender

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/units"
)

// LedgerReads is what admission reads of this machine's own ledger replica
// on hot paths (every gossip message, every hold request): in-process map
// lookups as of the last block, no copying.
type LedgerReads interface {
	MachineOwner(machine identity.Address) (owner identity.Address, registered bool)
	IsMember(a identity.Address) bool
	BalanceOf(a identity.Address) uint64
	PayerRecordOf(payer identity.Address) ledger.PayerRecord
}

// Admission decides, on this machine's replica of the ledger, who may take
// part: which machines may offer, which members may bid, and which bids a
// hold may be granted for (the owner's Terms among them).
type Admission struct {
	reads   LedgerReads
	chainID string
	terms   Terms
	// prices, once set, are this machine's reserve prices while it lends
	// (false: not lending): a hold's bid must cover them for its duration.
	prices func() (p2p.Prices, bool)
	// commitments, once set, are the bids seen on the market: a hold's
	// bid must be one of them, and backed by its account's balance
	// beside the account's other live bids.
	commitments *Commitments
}

// SetCommitments has CheckBid hold only for bids seen on the market and
// backed by their account's balance beside its other live bids there.
func (a *Admission) SetCommitments(c *Commitments) { a.commitments = c }

// SetPrices has CheckBid refuse a hold whose bid's max price does not
// cover this machine's reserve prices (what prices returns while it
// lends) for the resources held, for the bid's duration.
func (a *Admission) SetPrices(prices func() (p2p.Prices, bool)) { a.prices = prices }

// Terms are the payment terms a machine's owner lends on ([lend]): a bid
// that offers less is refused a hold here, and a launch that names a
// lower floor is refused.
type Terms struct {
	// HeldJobs: lend to jobs whose submitter holds the model (and pays
	// for accepted rounds above the floor).
	HeldJobs bool
	// MaxVerifyShare is the most of this machine's pay a held job may
	// hold back until a spot check passes.
	MaxVerifyShare float64
	// MinFloor is the least share of its price a job must pay this
	// machine for the time its worker runs, whatever its rounds.
	MinFloor float64
	// MinPayerPaid is the least share of what it owed a payer's own
	// settlements must have paid (its ledger record: the rest its lenders
	// had to lodge receipts for); 0 takes any payer.
	MinPayerPaid float64
}

// DefaultTerms take held jobs, at the network's bounds.
func DefaultTerms() Terms {
	return Terms{HeldJobs: true, MaxVerifyShare: p2p.MaxVerifyShare, MinFloor: p2p.MinFloor}
}

// Accept says why bid's payment terms are not acceptable here, or nil.
func (t Terms) Accept(bid *p2p.Bid) error {
	switch {
	case bid.Floor < t.MinFloor:
		return fmt.Errorf("the bid pays a floor of %g of the price for the time worked: this machine lends for %g at least ([lend] min_floor)", bid.Floor, t.MinFloor)
	case bid.Training.Held() && !t.HeldJobs:
		return errors.New("this machine does not lend to jobs whose submitter holds the model ([lend] held_jobs = false)")
	case bid.Training.Held() && bid.Training.Verify != nil && bid.Training.Verify.Share > t.MaxVerifyShare:
		return fmt.Errorf("the bid holds back %g of the pay until a spot check passes: this machine allows %g at most ([lend] max_verify_share)",
			bid.Training.Verify.Share, t.MaxVerifyShare)
	}
	return nil
}

// AcceptPayer says why a payer with record r is not lent to here, or nil.
func (t Terms) AcceptPayer(r ledger.PayerRecord) error {
	if t.MinPayerPaid <= 0 || r.Owed == 0 {
		return nil
	}
	if paid := float64(r.Paid) / float64(r.Owed); paid < t.MinPayerPaid {
		return fmt.Errorf("the bidder's settlements paid %.2f of what it owed (its lenders lodged receipts for the rest): this machine lends to payers above %.2f ([lend] min_payer_paid)",
			paid, t.MinPayerPaid)
	}
	return nil
}

// NewAdmission checks against reads, for bids signed on chainID, on the
// owner's terms.
func NewAdmission(reads LedgerReads, chainID string, terms Terms) *Admission {
	return &Admission{reads: reads, chainID: chainID, terms: terms}
}

var _ p2p.Admission = (*Admission)(nil)

// Machine implements p2p.Admission: only machines the ledger backs may
// offer (a fake machine costs a university's signature, not a key).
func (a *Admission) Machine(key []byte) (identity.Address, bool) {
	return a.reads.MachineOwner(identity.AddressOf(key))
}

// Bidder implements p2p.Admission: only members whose balance covers a
// bid may bid.
func (a *Admission) Bidder(key []byte, maxPrice uint64) error {
	return a.canPay(identity.AddressOf(key), maxPrice)
}

func (a *Admission) canPay(acct identity.Address, maxPrice uint64) error {
	if !a.reads.IsMember(acct) {
		return fmt.Errorf("account %s is not a member of this network", acct)
	}
	if bal := a.reads.BalanceOf(acct); bal < maxPrice {
		return fmt.Errorf("account %s holds %s credits, less than the bid's %s", acct, units.FormatCredits(bal), units.FormatCredits(maxPrice))
	}
	return nil
}

// Scheduler checks, with a lookup and before any signature, that a
// scheduler asking for a hold is a machine the ledger backs: a stranger
// with a fresh key, holding a bid it overheard, holds nothing.
func (a *Admission) Scheduler(p peer.ID) error {
	raw, err := identity.PublicKeyOf(p)
	if err != nil {
		return fmt.Errorf("scheduler: %w", err)
	}
	if _, ok := a.Machine(raw); !ok {
		return fmt.Errorf("scheduler %s is not a machine the ledger backs: only members' machines hold capacity for bids", p)
	}
	return nil
}

// CheckBid is what a machine checks before holding capacity for a
// scheduler: the bid the request carries is signed by its bidder, for this
// job, by a member whose balance (on this machine's own replica) covers
// its maximum price, and that price covers this machine's reserve prices
// for what the hold asks, for the job's duration (SetPrices); the hold may
// ask for at most what the bid's workers need.
func (a *Admission) CheckBid(ctx context.Context, r *p2p.Reserve, now time.Time) (HoldRequest, error) {
	req := HoldRequest{Reserve: r}
	if r.Op != p2p.OpReserve {
		return req, nil
	}
	rec, err := p2p.OpenBid(r.Bid, a.chainID, now)
	if err != nil {
		return req, fmt.Errorf("the hold's bid: %w", err)
	}
	bid, signer := rec.Bid, rec.Signer
	if bid.JobID != r.JobID {
		return req, fmt.Errorf("the hold is for job %s, its bid for %s", r.JobID, bid.JobID)
	}
	if bidder, err := peer.Decode(r.Bidder); err != nil || bidder != signer {
		return req, fmt.Errorf("the hold names bidder %s, its bid is signed by %s", r.Bidder, signer)
	}
	if err := a.canPay(identity.Address(bid.Submitter), bid.MaxPrice); err != nil {
		return req, err
	}
	if a.prices != nil {
		if p, ok := a.prices(); ok {
			// The scheduler quotes at least the reserve for the job's
			// duration: a bid below it can hold capacity but never pay for it.
			reserve := float64(p.PerHour(r.Res)) * float64(bid.Duration) / 3600
			if float64(bid.MaxPrice) < reserve {
				return req, fmt.Errorf("the bid's max price, %s credits, does not cover this machine's reserve price for what it holds over the job's %s: %s credits",
					units.FormatCredits(bid.MaxPrice), time.Duration(bid.Duration)*time.Second, units.FormatCredits(uint64(reserve)))
			}
			req.Cost, req.Balance = max(uint64(reserve), 1), a.reads.BalanceOf(identity.Address(bid.Submitter))
			req.Rate = p.PerHour(r.Res)
		}
	}
	if err := a.terms.Accept(bid); err != nil {
		return req, err
	}
	if err := a.terms.AcceptPayer(a.reads.PayerRecordOf(identity.Address(bid.Submitter))); err != nil {
		return req, err
	}
	// Last, as it may wait for the bid to arrive on the market.
	if err := a.backed(ctx, rec, now); err != nil {
		return req, err
	}
	req.Account = bid.Submitter
	req.Most = p2p.Resources{
		Cores:    bid.Workers * bid.PerWorker.Cores,
		MemBytes: uint64(bid.Workers) * bid.PerWorker.MemBytes,
		GPUs:     bid.Workers * bid.PerWorker.GPUs,
	}
	return req, nil
}

// backed checks that rec, a hold's bid, was seen on the market (waiting
// BidSeenWait for it) and that its account's balance backs it beside
// its other live bids there (see Commitments).
func (a *Admission) backed(ctx context.Context, rec *p2p.Received, now time.Time) error {
	c := a.commitments
	if c == nil {
		return nil
	}
	bid := rec.Bid
	if !c.Await(ctx, bid.Submitter, bid.JobID, rec.Seq, BidSeenWait) {
		return fmt.Errorf("the hold's bid has not been seen on the market: a machine holds only for bids gossiped on the bids topic, which every machine counts against their account's balance")
	}
	return c.Backed(bid.Submitter, bid.JobID, a.reads.BalanceOf(identity.Address(bid.Submitter)), now)
}

// Desk answers schedulers' hold requests on this machine: it checks each
// request's bid, then applies it to the machine's holds.
type Desk struct {
	adm   *Admission
	holds *Holds
}

// NewDesk serves requests checked by adm against holds.
func NewDesk(adm *Admission, holds *Holds) *Desk { return &Desk{adm: adm, holds: holds} }

// Handle answers the reserve protocol (a p2p.RPC handler).
func (d *Desk) Handle(ctx context.Context, from peer.ID, env *p2p.Envelope) (string, any, error) {
	if env.Type != p2p.TypeReserve {
		return "", nil, fmt.Errorf("%w %q", p2p.ErrUnknownType, env.Type)
	}
	var r p2p.Reserve
	if err := p2p.Unmarshal(env.Payload, &r); err != nil {
		return "", nil, err
	}
	if err := r.Validate(); err != nil {
		return "", nil, err
	}
	return p2p.TypeReserveReply, d.Apply(ctx, from, &r, time.Now()), nil
}

// Apply checks a hold request's bid and applies it to this machine's
// holds; a request whose bid does not hold up is refused with the reason.
// A scheduler on this machine calls it directly.
func (d *Desk) Apply(ctx context.Context, from peer.ID, r *p2p.Reserve, now time.Time) p2p.ReserveReply {
	if r.Op == p2p.OpReserve {
		if err := d.adm.Scheduler(from); err != nil {
			return p2p.ReserveReply{Reason: p2p.Clip(err.Error(), 256)}
		}
	}
	req, err := d.adm.CheckBid(ctx, r, now)
	if err != nil {
		return p2p.ReserveReply{Reason: p2p.Clip(err.Error(), 256)}
	}
	return d.holds.Apply(from, req, now)
}
