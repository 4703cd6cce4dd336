package lender

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/p2p"
)

// ledgerView is a replica's read-only view as admission sees it: members
// and their balances.
type ledgerView map[identity.Address]uint64

func (v ledgerView) MachineOwner(identity.Address) (identity.Address, bool) { return "", false }
func (v ledgerView) IsMember(a identity.Address) bool                       { _, ok := v[a]; return ok }
func (v ledgerView) BalanceOf(a identity.Address) uint64                    { return v[a] }
func (v ledgerView) PayerRecordOf(identity.Address) ledger.PayerRecord      { return ledger.PayerRecord{} }

const admissionChain = "deepmarket-test"

func admissionKey(t *testing.T, b byte) *identity.Key {
	t.Helper()
	k, err := identity.KeyFromSeed(bytes.Repeat([]byte{b}, 32))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestCheckBid: a hold is granted only for a bid its bidder signed, for
// the same job, from a member whose balance covers it; and it may take at
// most what the bid's workers need.
func TestCheckBid(t *testing.T) {
	bidder, stranger := admissionKey(t, 1), admissionKey(t, 2)
	now := time.Now()
	bid := p2p.Bid{JobID: strings.Repeat("ab", 32), Submitter: string(bidder.Address()), Workers: 2,
		PerWorker: p2p.Resources{Cores: 3, MemBytes: 1 << 30, GPUs: 1}, MaxPrice: 5_000_000, Duration: 600, Framework: "tensorflow",
		Floor: p2p.DefaultFloor}
	sealed := func(k *identity.Key, b p2p.Bid) []byte {
		data, err := p2p.Seal(k, admissionChain, p2p.TypeBid, &b, 1, now.Add(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	reserve := func(data []byte, job string, by *identity.Key) *p2p.Reserve {
		return &p2p.Reserve{Op: p2p.OpReserve, ID: "0000000000000001", JobID: job, TTL: 5, Bidder: by.PeerID().String(), Bid: data}
	}
	funded := ledgerView{bidder.Address(): 10_000_000}
	poor := ledgerView{bidder.Address(): 1}
	other := bid
	other.JobID = strings.Repeat("cd", 32)
	noFloor, held := bid, bid
	noFloor.Floor = 0
	held.Training = &p2p.Training{Mode: "diloco", Holder: p2p.HolderSubmitter, Verify: &p2p.Verify{Rate: 0.5, Share: 0.2, Tolerance: 0.1}}
	for name, c := range map[string]struct {
		view ledgerView
		r    *p2p.Reserve
		ok   bool
	}{
		"funded member":        {funded, reserve(sealed(bidder, bid), bid.JobID, bidder), true},
		"not a member":         {ledgerView{}, reserve(sealed(bidder, bid), bid.JobID, bidder), false},
		"balance below bid":    {poor, reserve(sealed(bidder, bid), bid.JobID, bidder), false},
		"bid for another job":  {funded, reserve(sealed(bidder, other), bid.JobID, bidder), false},
		"named another bidder": {funded, reserve(sealed(bidder, bid), bid.JobID, stranger), false},
		"no bid":               {funded, reserve(nil, bid.JobID, bidder), false},
		"no floor":             {funded, reserve(sealed(bidder, noFloor), bid.JobID, bidder), false},
		"held, default terms":  {funded, reserve(sealed(bidder, held), bid.JobID, bidder), true},
	} {
		req, err := NewAdmission(c.view, admissionChain, DefaultTerms()).CheckBid(t.Context(), c.r, now)
		if (err == nil) != c.ok {
			t.Errorf("%s: err = %v, want ok %v", name, err, c.ok)
			continue
		}
		if c.ok && (req.Account != string(bidder.Address()) || req.Most != (p2p.Resources{Cores: 6, MemBytes: 2 << 30, GPUs: 2})) {
			t.Errorf("%s: the hold may take %+v for %s, want the two workers' 6 cores, 2 GiB, 2 GPUs", name, req.Most, req.Account)
		}
	}
	// The owner's terms: no held jobs, or less held back.
	for name, terms := range map[string]Terms{
		"held_jobs = false":      {HeldJobs: false, MaxVerifyShare: 0.2, MinFloor: 0.25},
		"max_verify_share = 0.1": {HeldJobs: true, MaxVerifyShare: 0.1, MinFloor: 0.25},
		"min_floor = 0.75":       {HeldJobs: true, MaxVerifyShare: 0.2, MinFloor: 0.75},
	} {
		if _, err := NewAdmission(funded, admissionChain, terms).CheckBid(t.Context(), reserve(sealed(bidder, held), bid.JobID, bidder), now); err == nil ||
			!strings.Contains(err.Error(), "[lend] "+strings.Fields(name)[0]) {
			t.Errorf("terms %s: a held bid with a 0.5 floor and 0.2 held back: %v, want refused naming the key", name, err)
		}
	}
	// Commits and releases carry no bid: the hold they name was checked.
	if _, err := NewAdmission(ledgerView{}, admissionChain, DefaultTerms()).CheckBid(t.Context(), &p2p.Reserve{Op: p2p.OpCommit, ID: "0000000000000001"}, now); err != nil {
		t.Errorf("commit: %v", err)
	}
}

// TestPayerRecordTerms: a lender that asks for it refuses a bidder whose
// own settlements paid less than its share of what it owed; a payer with
// no record, or a lender that asks nothing, lends.
func TestPayerRecordTerms(t *testing.T) {
	picky := DefaultTerms()
	picky.MinPayerPaid = 0.9
	for _, c := range []struct {
		terms Terms
		rec   ledger.PayerRecord
		ok    bool
	}{
		{picky, ledger.PayerRecord{Closed: 3, Paid: 20_000, Owed: 2_400_000}, false},
		{picky, ledger.PayerRecord{Closed: 3, Paid: 2_300_000, Owed: 2_400_000}, true},
		{picky, ledger.PayerRecord{}, true},
		{DefaultTerms(), ledger.PayerRecord{Closed: 3, Paid: 20_000, Owed: 2_400_000}, true},
	} {
		err := c.terms.AcceptPayer(c.rec)
		if (err == nil) != c.ok || (err != nil && !strings.Contains(err.Error(), "[lend] min_payer_paid")) {
			t.Errorf("terms %+v, record %+v: %v, want ok %v", c.terms, c.rec, err, c.ok)
		}
	}
}

// TestBidMustCoverTheReserve: a bid whose max price does not cover this
// machine's reserve prices for what the hold asks, over the job's
// duration, holds nothing here (the insider's 1-micro-credit bid); one
// that does, does; and a machine not lending has no reserve to check.
func TestBidMustCoverTheReserve(t *testing.T) {
	bidder := admissionKey(t, 1)
	now := time.Now()
	funded := ledgerView{bidder.Address(): 10_000_000}
	hold := func(maxPrice uint64) *p2p.Reserve {
		bid := p2p.Bid{JobID: strings.Repeat("ab", 32), Submitter: string(bidder.Address()), Workers: 1,
			PerWorker: p2p.Resources{Cores: 2, MemBytes: 1 << 30}, MaxPrice: maxPrice, Duration: 3600, Framework: "generic", Floor: p2p.DefaultFloor}
		data, err := p2p.Seal(bidder, admissionChain, p2p.TypeBid, &bid, 1, now.Add(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		return &p2p.Reserve{Op: p2p.OpReserve, ID: "0000000000000001", JobID: bid.JobID, TTL: 5, Bidder: bidder.PeerID().String(),
			Bid: data, Res: p2p.Resources{Cores: 2, MemBytes: 1 << 30}}
	}
	a := NewAdmission(funded, admissionChain, DefaultTerms())
	lending := true
	// 2 cores at 0.1 and 1 GiB at 0.05 credit an hour: 0.25 credit for the job's hour.
	a.SetPrices(func() (p2p.Prices, bool) { return p2p.Prices{CoreHour: 100_000, MemGiBHour: 50_000}, lending })
	if _, err := a.CheckBid(t.Context(), hold(1), now); err == nil || !strings.Contains(err.Error(), "does not cover this machine's reserve price") {
		t.Errorf("a 1-micro-credit bid: %v, want refused", err)
	}
	if _, err := a.CheckBid(t.Context(), hold(249_999), now); err == nil {
		t.Error("a bid just under the reserve was granted a hold")
	}
	if _, err := a.CheckBid(t.Context(), hold(250_000), now); err != nil {
		t.Errorf("a bid at the reserve: %v", err)
	}
	lending = false
	if _, err := a.CheckBid(t.Context(), hold(1), now); err != nil {
		t.Errorf("a machine not lending checked a reserve: %v", err)
	}
}
