package p2p

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/fxamacker/cbor/v2"

	"github.com/deepmarket/deepmarket/identity"
)

func TestSealOpenRoundTrip(t *testing.T) {
	k := testKey(t, 1)
	now := time.Now()
	data := seal(t, k, testChain, TypeOffer, testOffer(k), 7, now.Add(time.Minute))
	env, err := Open(data, testChain, now)
	if err != nil {
		t.Fatal(err)
	}
	if env.SignerID() != k.PeerID() || env.Seq != 7 || env.Type != TypeOffer {
		t.Fatalf("envelope %+v", env)
	}
	var o Offer
	if err := Unmarshal(env.Payload, &o); err != nil || o.Lent.Cores != 4 {
		t.Fatalf("payload %+v %v", o, err)
	}
	// Deterministic: sealing the same values gives the same bytes.
	if again := seal(t, k, testChain, TypeOffer, testOffer(k), 7, now.Add(time.Minute)); string(again) != string(data) {
		t.Fatal("sealing is not deterministic")
	}
}

// TestValidatorRejects covers every kind of bad message the gossip
// validators must refuse, each with the reason the metrics will show.
func TestValidatorRejects(t *testing.T) {
	k, other := testKey(t, 1), testKey(t, 2)
	now := time.Now()
	exp := now.Add(time.Minute)
	offers, bids := OffersTopic(testChain), BidsTopic(testChain)

	tampered := func() []byte {
		env := Envelope{}
		if err := Unmarshal(seal(t, k, testChain, TypeOffer, testOffer(k), 1, exp), &env); err != nil {
			t.Fatal(err)
		}
		env.Sig[0] ^= 0xff
		b, _ := Marshal(&env)
		return b
	}
	withOffer := func(mod func(*Offer)) []byte {
		o := testOffer(k)
		mod(o)
		return seal(t, k, testChain, TypeOffer, o, 1, exp)
	}
	withBid := func(mod func(*Bid)) []byte {
		b := testBid(k)
		mod(b)
		return seal(t, k, testChain, TypeBid, b, 1, exp)
	}
	// A payload whose cores field is a negative CBOR integer.
	negative := func() []byte {
		m := map[string]any{"machine": k.PeerID().String(), "owner": string(k.Address()), "lent": map[string]any{"cores": -4, "mem": 1}}
		body, _ := cbor.Marshal(m)
		env := Envelope{Signer: k.Public(), Type: TypeOffer, Payload: body, Seq: 1, Expiry: exp.UnixMilli()}
		in, _ := env.signingBytes(testChain)
		env.Sig = k.Sign(in)
		b, _ := Marshal(&env)
		return b
	}

	cases := []struct {
		name   string
		topic  string
		data   []byte
		author string // "" means the signer
		reason string
	}{
		{"bad signature", offers, tampered(), "", "bad_signature"},
		{"other chain", offers, seal(t, k, "deepmarket-other", TypeOffer, testOffer(k), 1, exp), "", "bad_signature"},
		{"published by another peer", offers, seal(t, k, testChain, TypeOffer, testOffer(k), 1, exp), "other", "signer_mismatch"},
		{"offer for another machine", offers, withOffer(func(o *Offer) { o.Machine = other.PeerID().String() }), "", "signer_mismatch"},
		{"unknown type", offers, seal(t, k, testChain, "offer/99", testOffer(k), 1, exp), "", "unknown_type"},
		{"bid on offers topic", offers, seal(t, k, testChain, TypeBid, testBid(k), 1, exp), "", "unknown_type"},
		{"oversize", offers, append(seal(t, k, testChain, TypeOffer, testOffer(k), 1, exp), make([]byte, MaxEnvelopeSize)...), "", "oversize"},
		{"not cbor", offers, []byte("hello, world"), "", "malformed"},
		{"expired", offers, seal(t, k, testChain, TypeOffer, testOffer(k), 1, now.Add(-time.Minute)), "", "expired"},
		{"expiry too far", offers, seal(t, k, testChain, TypeOffer, testOffer(k), 1, now.Add(48*time.Hour)), "", "out_of_range"},
		{"absurd cores", offers, withOffer(func(o *Offer) { o.Lent.Cores = 1_000_000_000 }), "", "out_of_range"},
		{"negative cores", offers, negative(), "", "malformed"},
		{"zero memory", offers, withOffer(func(o *Offer) { o.Lent.MemBytes = 0 }), "", "out_of_range"},
		{"allocated beyond lent", offers, withOffer(func(o *Offer) { o.Allocated.Cores = 5 }), "", "out_of_range"},
		{"absurd price", offers, withOffer(func(o *Offer) { o.Price.CoreHour = MaxUnitPrice + 1 }), "", "out_of_range"},
		{"bad window", offers, withOffer(func(o *Offer) { o.Window = "25:00-07:00" }), "", "out_of_range"},
		{"bad owner", offers, withOffer(func(o *Offer) { o.Owner = "alice" }), "", "out_of_range"},
		{"bad address", offers, withOffer(func(o *Offer) { o.Addrs = []string{"not a multiaddr"} }), "", "out_of_range"},
		{"gpu models mismatch", offers, withOffer(func(o *Offer) { o.Lent.GPUs = 2 }), "", "out_of_range"},
		{"bad site label", offers, withOffer(func(o *Offer) { o.Site = strings.Repeat("x", 100) }), "", "out_of_range"},
		{"bid with zero workers", bids, withBid(func(b *Bid) { b.Workers = 0 }), "", "out_of_range"},
		{"bid with a bad training block", bids, withBid(func(b *Bid) { b.Training = &Training{Mode: "sync", Steps: -3} }), "", "out_of_range"},
		{"offer with a link to itself", offers, withOffer(func(o *Offer) { o.Links = []LinkSample{{Machine: o.Machine}} }), "", "out_of_range"},
		{"offer listing too many images", offers, withOffer(func(o *Offer) {
			for i := range MaxOfferImages + 1 {
				o.Images = append(o.Images, fmt.Sprintf("bafyimage%d", i))
			}
		}), "", "out_of_range"},
		{"offer listing a bad image CID", offers, withOffer(func(o *Offer) { o.Images = []string{"../etc"} }), "", "out_of_range"},
		{"bid with a bad image CID", bids, withBid(func(b *Bid) { b.Image = "bafy/../x" }), "", "out_of_range"},
		{"bid with an image size but no image", bids, withBid(func(b *Bid) { b.ImageBytes = 1 << 20 }), "", "out_of_range"},
		{"bid with absurd workers", bids, withBid(func(b *Bid) { b.Workers = 1 << 30 }), "", "out_of_range"},
		{"bid with unknown framework", bids, withBid(func(b *Bid) { b.Framework = "caffe" }), "", "out_of_range"},
		{"bid with bad job id", bids, withBid(func(b *Bid) { b.JobID = "xyz" }), "", "out_of_range"},
		{"bid without price", bids, withBid(func(b *Bid) { b.MaxPrice = 0 }), "", "out_of_range"},
		{"bid spending another account", bids, withBid(func(b *Bid) { b.Submitter = string(other.Address()) }), "", "signer_mismatch"},
		{"envelope with an extra key", offers, malleate(t, seal(t, k, testChain, TypeOffer, testOffer(k), 1, exp)), "", "malformed"},
		{"unknown topic", "/deepmarket/x/other/1", seal(t, k, testChain, TypeOffer, testOffer(k), 1, exp), "", "unknown_type"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := NewValidator(testChain, nil)
			author := k.PeerID()
			if c.author == "other" {
				author = other.PeerID()
			}
			rec, err := v.Validate(c.topic, c.data, author, now)
			if err == nil {
				t.Fatalf("accepted: %+v", rec)
			}
			if got := Reason(err); got != c.reason {
				t.Fatalf("reason %q (%v), want %q", got, err, c.reason)
			}
		})
	}
}

func TestValidatorReplay(t *testing.T) {
	k := testKey(t, 1)
	v := NewValidator(testChain, nil)
	now := time.Now()
	topic := OffersTopic(testChain)
	first := seal(t, k, testChain, TypeOffer, testOffer(k), 10, now.Add(time.Minute))
	if _, err := v.Validate(topic, first, k.PeerID(), now); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Validate(topic, first, k.PeerID(), now); !errors.Is(err, ErrReplay) {
		t.Fatalf("same message twice: %v", err)
	}
	// Slightly out of order (validated concurrently, relayed along
	// another path): still fresh.
	reordered := seal(t, k, testChain, TypeOffer, testOffer(k), 9, now.Add(time.Minute))
	if _, err := v.Validate(topic, reordered, k.PeerID(), now); err != nil {
		t.Fatalf("sequence 9 after 10: %v", err)
	}
	if _, err := v.Validate(topic, reordered, k.PeerID(), now); !errors.Is(err, ErrReplay) {
		t.Fatalf("sequence 9 twice: %v", err)
	}
	// Once the window has moved on, an old sequence is a replay.
	for s := uint64(100); s < 100+replayWindow; s++ {
		if _, err := v.Validate(topic, seal(t, k, testChain, TypeOffer, testOffer(k), s, now.Add(time.Minute)), k.PeerID(), now); err != nil {
			t.Fatal(err)
		}
	}
	older := seal(t, k, testChain, TypeOffer, testOffer(k), 50, now.Add(time.Minute))
	if _, err := v.Validate(topic, older, k.PeerID(), now); !errors.Is(err, ErrReplay) {
		t.Fatalf("sequence below the window: %v", err)
	}
	if _, err := v.Validate(topic, first, k.PeerID(), now); !errors.Is(err, ErrReplay) {
		t.Fatalf("the first message again, after the window moved: %v", err)
	}
	newer := seal(t, k, testChain, TypeWithdrawal, &Withdrawal{Machine: k.PeerID().String()}, 1000, now.Add(time.Minute))
	rec, err := v.Validate(topic, newer, k.PeerID(), now)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Withdrawal == nil || rec.Withdrawal.Machine != k.PeerID().String() || payloads(rec) != 1 {
		t.Fatalf("received %+v", rec)
	}
	// Sequences are per topic: a bid with a low number is still fresh.
	if _, err := v.Validate(BidsTopic(testChain), seal(t, k, testChain, TypeBid, testBid(k), 1, now.Add(time.Minute)), k.PeerID(), now); err != nil {
		t.Fatal(err)
	}
}

func TestValidatorAcceptsGoodMessages(t *testing.T) {
	k := testKey(t, 3)
	v := NewValidator(testChain, nil)
	now := time.Now()
	o := testOffer(k)
	o.Window = "19:00-07:00"
	o.Lent.GPUs = 1
	o.GPUs = []GPU{{Index: 0, Model: "Tesla T4", MemBytes: 16 << 30}}
	o.Images = []string{"bafybeigdyrzt5sfp7udm7hu76uh7y26nf3efuylqabf3oclgtqy55fbzdi"}
	rec, err := v.Validate(OffersTopic(testChain), seal(t, k, testChain, TypeOffer, o, 1, now.Add(time.Minute)), k.PeerID(), now)
	if err != nil {
		t.Fatal(err)
	}
	got := rec.Offer
	if got == nil || payloads(rec) != 1 || rec.Type != TypeOffer || len(got.Images) != 1 || got.Images[0] != o.Images[0] {
		t.Fatalf("received %+v", rec)
	}
	if got.GPUs[0].Model != "Tesla T4" || got.Window != "19:00-07:00" || rec.Signer != k.PeerID() {
		t.Fatalf("decoded %+v", got)
	}
}

// payloads counts the payload fields of rec that are set.
func payloads(rec *Received) int {
	n := 0
	for _, set := range []bool{rec.Offer != nil, rec.Withdrawal != nil, rec.Bid != nil} {
		if set {
			n++
		}
	}
	return n
}

// TestReceivedCarriesItsType: each payload type of the validator's table
// arrives in its own field of Received, and in no other.
func TestReceivedCarriesItsType(t *testing.T) {
	k := testKey(t, 4)
	now := time.Now()
	exp := now.Add(time.Minute)
	for _, c := range []struct {
		topic, typ string
		payload    any
		field      func(*Received) bool
	}{
		{OffersTopic(testChain), TypeOffer, testOffer(k), func(r *Received) bool { return r.Offer != nil && r.Offer.Lent.Cores == 4 }},
		{OffersTopic(testChain), TypeWithdrawal, &Withdrawal{Machine: k.PeerID().String(), Reason: "gone"}, func(r *Received) bool {
			return r.Withdrawal != nil && r.Withdrawal.Reason == "gone"
		}},
		{BidsTopic(testChain), TypeBid, testBid(k), func(r *Received) bool { return r.Bid != nil && r.Bid.Workers == 2 }},
	} {
		v := NewValidator(testChain, nil)
		rec, err := v.Validate(c.topic, seal(t, k, testChain, c.typ, c.payload, 1, exp), k.PeerID(), now)
		if err != nil {
			t.Fatalf("%s: %v", c.typ, err)
		}
		if rec.Type != c.typ || payloads(rec) != 1 || !c.field(rec) {
			t.Errorf("%s: received %+v", c.typ, rec)
		}
	}
}

func TestSequencerIncreases(t *testing.T) {
	var s Sequencer
	last := uint64(0)
	for i := 0; i < 10000; i++ {
		n := s.Next()
		if n <= last {
			t.Fatalf("sequence went from %d to %d", last, n)
		}
		last = n
	}
}

func TestWindow(t *testing.T) {
	w, err := ParseWindow("19:00-07:00")
	if err != nil {
		t.Fatal(err)
	}
	at := func(h, m int) time.Time { return time.Date(2026, 11, 21, h, m, 0, 0, time.UTC) }
	for _, c := range []struct {
		t      time.Time
		inside bool
		change time.Time
	}{
		{at(18, 59), false, at(19, 0)},
		{at(19, 0), true, at(7, 0).AddDate(0, 0, 1)},
		{at(23, 30), true, at(7, 0).AddDate(0, 0, 1)},
		{at(3, 0), true, at(7, 0)},
		{at(7, 0), false, at(19, 0)},
	} {
		inside, change := w.Next(c.t)
		if inside != c.inside || !change.Equal(c.change) {
			t.Errorf("at %s: inside=%v change=%s, want %v %s", c.t, inside, change, c.inside, c.change)
		}
	}
	day, _ := ParseWindow("09:00-17:30")
	if !day.Contains(at(12, 0)) || day.Contains(at(17, 30)) || day.String() != "09:00-17:30" {
		t.Error("day window")
	}
	for _, bad := range []string{"", "9-17", "24:00-07:00", "19:60-07:00", "19:00-19:00", "19:00-07:00x", "aa:bb-cc:dd"} {
		if _, err := ParseWindow(bad); err == nil {
			t.Errorf("ParseWindow(%q) accepted", bad)
		}
	}
}

func FuzzValidate(f *testing.F) {
	k := testKey(f, 1)
	f.Add(seal(f, k, testChain, TypeOffer, testOffer(k), 1, time.Now().Add(time.Hour)))
	f.Add(seal(f, k, testChain, TypeBid, testBid(k), 1, time.Now().Add(time.Hour)))
	f.Add([]byte{0xa0})
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, topic := range []string{OffersTopic(testChain), BidsTopic(testChain)} {
			rec, err := NewValidator(testChain, nil).Validate(topic, data, "", time.Now())
			if err != nil {
				continue
			}
			named := map[string]bool{TypeOffer: rec.Offer != nil, TypeWithdrawal: rec.Withdrawal != nil, TypeBid: rec.Bid != nil}
			if payloads(rec) != 1 || !named[rec.Type] {
				t.Fatalf("accepted %+v on %s: want exactly the payload its type names", rec, topic)
			}
		}
	})
}

// malleate adds a key to an envelope's CBOR map: the signature still
// verifies over the fields it covers, but the bytes (and any hash of
// them) differ. The canonical decoder must refuse it.
func malleate(t *testing.T, data []byte) []byte {
	t.Helper()
	var m map[int]any
	if err := cbor.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	m[99] = "x"
	b, err := cbor.CoreDetEncOptions().EncMode()
	if err != nil {
		t.Fatal(err)
	}
	out, err := b.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// admission is a ledger stand-in for the validator's unit tests (the node
// tests use the real ledger).
type admission struct {
	machines map[string]identity.Address // by key
	balance  map[string]uint64           // by key; absent: not a member
	asked    int
}

func (a *admission) Machine(key []byte) (identity.Address, bool) {
	a.asked++
	o, ok := a.machines[string(key)]
	return o, ok
}

func (a *admission) Bidder(key []byte, max uint64) error {
	a.asked++
	b, ok := a.balance[string(key)]
	switch {
	case !ok:
		return errors.New("not a member")
	case b < max:
		return errors.New("balance too low")
	}
	return nil
}

// TestValidatorAsksTheLedger: offers of unregistered machines, offers that
// name another owner than the ledger's, and bids of non-members or of more
// than the bidder holds are not admitted; the check comes before the
// signature's, so a forged signature from an unknown key is not even
// verified, and nothing is remembered of such signers.
func TestValidatorAsksTheLedger(t *testing.T) {
	k, stranger := testKey(t, 1), testKey(t, 2)
	now := time.Now()
	exp := now.Add(time.Minute)
	adm := &admission{
		machines: map[string]identity.Address{string(k.Public()): k.Address()},
		balance:  map[string]uint64{string(k.Public()): 10_000_000},
	}
	v := NewValidator(testChain, adm)
	offers, bids := OffersTopic(testChain), BidsTopic(testChain)
	if _, err := v.Validate(offers, seal(t, k, testChain, TypeOffer, testOffer(k), 1, exp), k.PeerID(), now); err != nil {
		t.Fatalf("registered machine's offer: %v", err)
	}
	if _, err := v.Validate(offers, seal(t, stranger, testChain, TypeOffer, testOffer(stranger), 1, exp), stranger.PeerID(), now); !errors.Is(err, ErrNotAdmitted) {
		t.Fatalf("unregistered machine's offer: %v", err)
	}
	other := testOffer(k)
	other.Owner = string(stranger.Address())
	if _, err := v.Validate(offers, seal(t, k, testChain, TypeOffer, other, 2, exp), k.PeerID(), now); !errors.Is(err, ErrNotAdmitted) {
		t.Fatalf("offer naming an owner the ledger does not have: %v", err)
	}
	if _, err := v.Validate(bids, seal(t, k, testChain, TypeBid, testBid(k), 1, exp), k.PeerID(), now); err != nil {
		t.Fatalf("a member's bid within its balance: %v", err)
	}
	dear := testBid(k)
	dear.MaxPrice = 10_000_001
	if _, err := v.Validate(bids, seal(t, k, testChain, TypeBid, dear, 2, exp), k.PeerID(), now); !errors.Is(err, ErrNotAdmitted) {
		t.Fatalf("a bid above the balance: %v", err)
	}
	if _, err := v.Validate(bids, seal(t, stranger, testChain, TypeBid, testBid(stranger), 1, exp), stranger.PeerID(), now); !errors.Is(err, ErrNotAdmitted) {
		t.Fatalf("a non-member's bid: %v", err)
	}
	// A forged signature from an unregistered key is turned away by the
	// ledger check, before the signature is looked at.
	forged := seal(t, stranger, testChain, TypeOffer, testOffer(stranger), 5, exp)
	var env Envelope
	if err := Unmarshal(forged, &env); err != nil {
		t.Fatal(err)
	}
	env.Sig[0] ^= 1
	forged, _ = Marshal(&env)
	if _, err := v.Validate(offers, forged, stranger.PeerID(), now); !errors.Is(err, ErrNotAdmitted) {
		t.Fatalf("forged offer of an unknown key: %v (want not admitted, before the signature check)", err)
	}
	v.mu.Lock()
	for key := range v.last {
		if key.signer == stranger.PeerID() {
			t.Errorf("the validator remembers the stranger's sequence on %s", key.topic)
		}
	}
	v.mu.Unlock()
}

// TestOpenBid: a machine checks the bid a hold request carries itself.
func TestOpenBid(t *testing.T) {
	k, other := testKey(t, 1), testKey(t, 2)
	now := time.Now()
	rec, err := OpenBid(seal(t, k, testChain, TypeBid, testBid(k), 7, now.Add(time.Minute)), testChain, now)
	if err != nil || rec.Signer != k.PeerID() || rec.Bid.Workers != 2 || rec.Seq != 7 {
		t.Fatalf("bid %+v: %v", rec, err)
	}
	for name, data := range map[string][]byte{
		"offer":           seal(t, k, testChain, TypeOffer, testOffer(k), 1, now.Add(time.Minute)),
		"expired":         seal(t, k, testChain, TypeBid, testBid(k), 1, now.Add(-time.Minute)),
		"other chain":     seal(t, k, "deepmarket-other", TypeBid, testBid(k), 1, now.Add(time.Minute)),
		"another account": seal(t, other, testChain, TypeBid, testBid(k), 1, now.Add(time.Minute)),
	} {
		if _, err := OpenBid(data, testChain, now); err == nil {
			t.Errorf("%s: opened", name)
		}
	}
}

func TestClip(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"exactly ten", 11, "exactly ten"},
		{"a longer reason", 10, "a longe…"},
		{"héhéhéhé", 7, "héh…"},
		{"héhéhéhé", 6, "hé…"}, // not inside the second é
		{"abcdef", 2, "ab"[:0]},
	} {
		got := Clip(c.in, c.n)
		if got != c.want || len(got) > c.n || !utf8.ValidString(got) {
			t.Errorf("Clip(%q, %d) = %q, want %q", c.in, c.n, got, c.want)
		}
	}
}

func TestJobStatusValidate(t *testing.T) {
	job := strings.Repeat("ab", 32)
	good := JobStatus{JobID: job, Index: 1, State: WorkerExited, Result: "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"}
	if err := good.Validate(job, 1); err != nil {
		t.Fatalf("a good report: %v", err)
	}
	for name, edit := range map[string]func(*JobStatus){
		"another worker": func(s *JobStatus) { s.Index = 0 },
		"another job":    func(s *JobStatus) { s.JobID = strings.Repeat("cd", 32) },
		"unknown state":  func(s *JobStatus) { s.State = "placed" },
		"long reason":    func(s *JobStatus) { s.Reason = strings.Repeat("x", maxTextLen+1) },
		"bad result":     func(s *JobStatus) { s.Result = "../../etc" },
		"negative log":   func(s *JobStatus) { s.LogBytes = -1 },
	} {
		s := good
		edit(&s)
		if err := s.Validate(job, 1); !errors.Is(err, ErrOutOfRange) {
			t.Errorf("%s: %v, want out of range", name, err)
		}
	}
}
