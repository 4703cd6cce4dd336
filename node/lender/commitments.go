package lender

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/units"
)

// Commitments is what each account's live bids on the market could lock.
// Every node sees every bid on the bids topic, so a machine asked to hold
// capacity for a bid can weigh it against everything its account has
// bid across the market, not only against its holds here: one balance
// cannot back holds on a hundred machines, one bid each.
//
// The rule, the same on every machine: an account's live bids, in the
// order they first appeared on the market (their signer's sequence), each
// weighing its highest max price less what an open escrow of the
// account's for its job still locks (that left the balance); a bid is
// backed while the weights up to and including its own fit in the
// account's balance. A machine holds only for a backed bid that it has
// seen on the market (a bid handed to one machine alone is counted by no
// other), and when a new bid shows an account over its balance, drops
// the uncommitted holds of the bids no longer backed (Holds.DropUnbacked).
// Two machines granting at the same instant the holds of two bids that
// together overdraw the account: the later one loses its holds as soon
// as its machine sees the other bid (gossip's delay, a second or so).
type Commitments struct {
	// escrowed is what account's open escrow for job still holds (0:
	// none).
	escrowed func(job, account string) uint64

	mu       sync.Mutex
	accounts map[string]map[string]*jobBids // account -> job
	// seen is closed and replaced whenever a bid is recorded, for the
	// holds waiting on one (Await).
	seen chan struct{}
}

// jobBids are one job's bids seen live on the market.
type jobBids struct {
	first uint64 // the lowest sequence seen: the job's place in its account's order
	bids  []seenBid
}

type seenBid struct {
	seq     uint64
	price   uint64
	expires time.Time
}

// Bounds of the bids remembered.
const (
	// maxJobBids is how many live bids of one job are remembered: a job
	// waiting in a queue bids again every so often. Past it the cheapest
	// goes, so the job's weight never falls while a dearer bid lives.
	maxJobBids = 16
	// maxAccountJobs is how many live jobs one account may have on the
	// market: the bids of more are not backed (an honest node bids for
	// a handful of jobs at a time, each for a couple of minutes).
	maxAccountJobs = 256
	// maxAccounts bounds the accounts remembered (only members bid);
	// past it those without live bids go.
	maxAccounts = 100_000
	// BidSeenWait is how long a hold request waits for its bid to arrive
	// on the market: the scheduler that asks saw it there, and a direct
	// request can overtake the gossip by a hop or two.
	BidSeenWait = 1500 * time.Millisecond
)

// NewCommitments counts bids against balances; escrowed is the ledger
// replica's word on what an account's open escrow for a job holds.
func NewCommitments(escrowed func(job, account string) uint64) *Commitments {
	return &Commitments{escrowed: escrowed, accounts: map[string]map[string]*jobBids{}, seen: make(chan struct{})}
}

// Saw records a bid seen on the bids topic, valid until expires, and
// reports whether it was new: the caller then drops the holds it leaves
// unbacked.
func (c *Commitments) Saw(bid *p2p.Bid, seq uint64, expires, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	jobs, ok := c.accounts[bid.Submitter]
	if !ok {
		if len(c.accounts) >= maxAccounts {
			c.pruneLocked(now)
		}
		jobs = map[string]*jobBids{}
		c.accounts[bid.Submitter] = jobs
	}
	j, ok := jobs[bid.JobID]
	if !ok {
		if len(jobs) >= maxAccountJobs {
			if pruneJobs(jobs, now); len(jobs) >= maxAccountJobs {
				return false // not recorded: its holds are refused
			}
		}
		j = &jobBids{first: seq}
		jobs[bid.JobID] = j
	}
	j.drop(now)
	if slices.ContainsFunc(j.bids, func(b seenBid) bool { return b.seq == seq }) {
		return false
	}
	if len(j.bids) == 0 || seq < j.first {
		j.first = seq
	}
	j.bids = append(j.bids, seenBid{seq: seq, price: bid.MaxPrice, expires: expires})
	if len(j.bids) > maxJobBids {
		cheapest := 0
		for i, b := range j.bids {
			if b.price < j.bids[cheapest].price || b.price == j.bids[cheapest].price && b.expires.Before(j.bids[cheapest].expires) {
				cheapest = i
			}
		}
		j.bids = slices.Delete(j.bids, cheapest, cheapest+1)
	}
	close(c.seen)
	c.seen = make(chan struct{})
	return true
}

// drop forgets the expired bids.
func (j *jobBids) drop(now time.Time) {
	j.bids = slices.DeleteFunc(j.bids, func(b seenBid) bool { return !now.Before(b.expires) })
}

// weight is the job's highest live max price (0: no live bid).
func (j *jobBids) weight() uint64 {
	var w uint64
	for _, b := range j.bids {
		w = max(w, b.price)
	}
	return w
}

func pruneJobs(jobs map[string]*jobBids, now time.Time) {
	for id, j := range jobs {
		if j.drop(now); len(j.bids) == 0 {
			delete(jobs, id)
		}
	}
}

func (c *Commitments) pruneLocked(now time.Time) {
	for a, jobs := range c.accounts {
		if pruneJobs(jobs, now); len(jobs) == 0 {
			delete(c.accounts, a)
		}
	}
}

// Await waits, at most within, until the bid of account for job with
// sequence seq has been seen on the market, and reports whether it was.
func (c *Commitments) Await(ctx context.Context, account, job string, seq uint64, within time.Duration) bool {
	timeout := time.NewTimer(within)
	defer timeout.Stop()
	for {
		c.mu.Lock()
		seen, wake := c.hasLocked(account, job, seq), c.seen
		c.mu.Unlock()
		if seen {
			return true
		}
		select {
		case <-wake:
		case <-timeout.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

func (c *Commitments) hasLocked(account, job string, seq uint64) bool {
	j, ok := c.accounts[account][job]
	return ok && slices.ContainsFunc(j.bids, func(b seenBid) bool { return b.seq == seq })
}

// Backed says whether account's bid for job is backed by balance (see
// Commitments); when it is not, the error says by how much it is over.
func (c *Commitments) Backed(account, job string, balance uint64, now time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	order := c.orderLocked(account, now)
	var sum uint64
	for _, w := range order {
		sum += w.weight
		if w.job == job {
			if sum > balance {
				return fmt.Errorf("account %s's live bids on the market, up to and including this one, could lock %s credits, more than its balance of %s",
					account, units.FormatCredits(sum), units.FormatCredits(balance))
			}
			return nil
		}
	}
	return fmt.Errorf("account %s's bid for job %s is not live on the market", account, job)
}

// Unbacked lists account's live jobs whose bids balance no longer backs.
func (c *Commitments) Unbacked(account string, balance uint64, now time.Time) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var sum uint64
	var out []string
	for _, w := range c.orderLocked(account, now) {
		if sum += w.weight; sum > balance {
			out = append(out, w.job)
		}
	}
	return out
}

type weighed struct {
	job    string
	first  uint64
	weight uint64
}

// orderLocked is account's live jobs in their order on the market, each
// with its weight.
func (c *Commitments) orderLocked(account string, now time.Time) []weighed {
	var out []weighed
	for id, j := range c.accounts[account] {
		j.drop(now)
		if len(j.bids) == 0 {
			continue
		}
		w, locked := j.weight(), c.escrowed(id, account)
		out = append(out, weighed{job: id, first: j.first, weight: w - min(w, locked)})
	}
	slices.SortFunc(out, func(a, b weighed) int { return cmp.Or(cmp.Compare(a.first, b.first), cmp.Compare(a.job, b.job)) })
	return out
}
