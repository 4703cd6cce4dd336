package p2p

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/identity"
)

// Received is a message that passed validation: its envelope and its
// payload, decoded. Exactly one of Offer, Withdrawal and Bid is set: the
// one Type names (the offers topic carries offers and withdrawals, the
// bids topic bids), so a consumer reads the field it wants and never
// asserts a type.
type Received struct {
	Topic  string
	Signer peer.ID
	Type   string
	Seq    uint64
	Expiry time.Time

	Offer      *Offer
	Withdrawal *Withdrawal
	Bid        *Bid

	// Raw is the signed envelope as it arrived: a scheduler hands a bid's
	// to the machines it asks for holds, which check it themselves.
	Raw []byte
}

// Admission is the ledger's say on who may publish on the market. p2p
// cannot read the ledger (it must not import it); the node answers from
// its replica. A nil Admission admits everyone (tests of this package).
type Admission interface {
	// Machine reports whether the machine with this ed25519 key is
	// registered on the ledger, and the account it earns into.
	Machine(key []byte) (owner identity.Address, registered bool)
	// Bidder says whether the account of key may bid a job of maxPrice
	// micro-credits: nil when it is a member whose balance covers it.
	// maxPrice 0 asks about membership alone.
	Bidder(key []byte, maxPrice uint64) error
}

// payloadKind describes one payload type a topic accepts.
type payloadKind struct {
	// admit runs before the signature is checked, on the envelope alone
	// (rec has no payload yet: a flood of messages from keys the ledger
	// does not know costs a map lookup each), and again once the payload
	// is decoded into rec; nil admits.
	admit func(a Admission, env *Envelope, rec *Received) error
	// decode reads env's payload, checks its values and sets its field
	// of rec (the only one it sets).
	decode func(env *Envelope, rec *Received) error
}

func decodeOffer(env *Envelope, rec *Received) error {
	var o Offer
	if err := Unmarshal(env.Payload, &o); err != nil {
		return err
	}
	if err := o.Validate(env.SignerID()); err != nil {
		return err
	}
	rec.Offer = &o
	return nil
}

func decodeWithdrawal(env *Envelope, rec *Received) error {
	var w Withdrawal
	if err := Unmarshal(env.Payload, &w); err != nil {
		return err
	}
	if err := w.Validate(env.SignerID()); err != nil {
		return err
	}
	rec.Withdrawal = &w
	return nil
}

func decodeBid(env *Envelope, rec *Received) error {
	var bid Bid
	if err := Unmarshal(env.Payload, &bid); err != nil {
		return err
	}
	if err := bid.Validate(); err != nil {
		return err
	}
	// The bid spends the submitter's credits: only its own key may sign
	// it, or anyone could bid on a rich account's balance.
	if a := identity.AddressOf(env.Signer); bid.Submitter != string(a) {
		return fmt.Errorf("%w: bid for account %s signed by %s", ErrSignerMismatch, bid.Submitter, a)
	}
	rec.Bid = &bid
	return nil
}

// admitMachine lets offers and withdrawals of registered machines through;
// an offer must also name the owner the ledger has.
func admitMachine(a Admission, env *Envelope, rec *Received) error {
	owner, ok := a.Machine(env.Signer)
	if !ok {
		return fmt.Errorf("%w: machine %s is not registered on the ledger", ErrNotAdmitted, env.SignerID())
	}
	if o := rec.Offer; o != nil && o.Owner != string(owner) {
		return fmt.Errorf("%w: offer names owner %s, the ledger says %s", ErrNotAdmitted, o.Owner, owner)
	}
	return nil
}

// admitBidder lets through the bids of members whose balance covers the
// bid (before the bid is decoded, of members).
func admitBidder(a Admission, env *Envelope, rec *Received) error {
	var max uint64
	if b := rec.Bid; b != nil {
		max = b.MaxPrice
	}
	if err := a.Bidder(env.Signer, max); err != nil {
		return fmt.Errorf("%w: %v", ErrNotAdmitted, err)
	}
	return nil
}

// maxTracked bounds the replay table (about 1 KiB a signer and topic);
// beyond it the oldest entries go.
const maxTracked = 20_000

type seqKey struct {
	topic  string
	signer peer.ID
}

// replayWindow is how many of a signer's latest sequence numbers (per
// topic) are remembered. Messages validated concurrently, or relayed along
// different paths, arrive slightly out of order: a sequence not seen yet
// and above the oldest remembered one is accepted; one seen already, or
// older than the window, is a replay.
const replayWindow = 128

type seqEntry struct {
	recent [replayWindow]uint64 // ring of the latest accepted sequences
	n      int                  // how many of recent are filled
	next   int                  // where the next one goes
	seen   time.Time
}

// floor is the oldest sequence the window still remembers, once full;
// anything at or below it is too old to tell from a replay.
func (e *seqEntry) floor() uint64 {
	if e.n < replayWindow {
		return 0
	}
	return e.recent[e.next] // the oldest: the next to be overwritten
}

func (e *seqEntry) has(seq uint64) bool {
	for i := range e.n {
		if e.recent[i] == seq {
			return true
		}
	}
	return false
}

func (e *seqEntry) add(seq uint64) {
	e.recent[e.next] = seq
	e.next = (e.next + 1) % replayWindow
	e.n = min(e.n+1, replayWindow)
}

// Validator checks every message that arrives on a DeepMarket topic: size,
// encoding, type, signature (under the chain ID), expiry, signer, value
// ranges, and replay (a signer's sequence numbers must increase per topic).
// It is safe for concurrent use; gossipsub runs it on several goroutines.
type Validator struct {
	chainID string
	admit   Admission
	kinds   map[string]map[string]payloadKind // topic -> type -> kind

	mu   sync.Mutex
	last map[seqKey]*seqEntry
}

// NewValidator returns a validator for the topics of chainID; admit (may
// be nil) is the ledger's say on who may publish.
func NewValidator(chainID string, admit Admission) *Validator {
	return &Validator{
		chainID: chainID,
		admit:   admit,
		kinds: map[string]map[string]payloadKind{
			OffersTopic(chainID): {
				TypeOffer:      {admitMachine, decodeOffer},
				TypeWithdrawal: {admitMachine, decodeWithdrawal},
			},
			BidsTopic(chainID): {
				TypeBid: {admitBidder, decodeBid},
			},
		},
		last: make(map[seqKey]*seqEntry),
	}
}

// Validate checks data received on topic from author (the gossipsub
// message's verified origin) at time now. On success the message's
// sequence number is recorded, so the same message is refused a second
// time. The ledger's admission is asked before the signature is checked
// and before anything is remembered of the signer, so messages of keys it
// does not back cost a decode and a lookup, and no memory.
func (v *Validator) Validate(topic string, data []byte, author peer.ID, now time.Time) (*Received, error) {
	rec, err := v.check(topic, data, author, now)
	if err != nil {
		return nil, err
	}
	if err := v.advance(seqKey{topic, rec.Signer}, rec.Seq, now); err != nil {
		return nil, err
	}
	return rec, nil
}

// CheckOffer checks an offer that did not come by gossip (a peer's offer
// book, see FetchBook) as Validate would, but records nothing: the same
// offer may still arrive by gossip, from a peer that must not be scored
// for a replay. The book that applies it ignores a sequence it has seen.
func (v *Validator) CheckOffer(data []byte, now time.Time) (*Received, error) {
	rec, err := v.check(OffersTopic(v.chainID), data, "", now)
	if err != nil {
		return nil, err
	}
	if rec.Offer == nil {
		return nil, fmt.Errorf("%w: %q in an offer book", ErrUnknownType, rec.Type)
	}
	return rec, nil
}

// check is Validate without the replay check.
func (v *Validator) check(topic string, data []byte, author peer.ID, now time.Time) (*Received, error) {
	kinds, ok := v.kinds[topic]
	if !ok {
		return nil, fmt.Errorf("%w: topic %q", ErrUnknownType, topic)
	}
	env, err := decodeEnvelope(data)
	if err != nil {
		return nil, err
	}
	kind, ok := kinds[env.Type]
	if !ok {
		return nil, fmt.Errorf("%w: %q on %s", ErrUnknownType, env.Type, topic)
	}
	signer := env.SignerID()
	if signer == "" {
		return nil, fmt.Errorf("%w: signer key", ErrMalformed)
	}
	if author != "" && signer != author {
		return nil, fmt.Errorf("%w: signed by %s, published by %s", ErrSignerMismatch, signer, author)
	}
	rec := &Received{Topic: topic, Signer: signer, Type: env.Type, Seq: env.Seq, Expiry: env.ExpiresAt(), Raw: data}
	admit := v.admit != nil && kind.admit != nil
	if admit {
		if err := kind.admit(v.admit, env, rec); err != nil {
			return nil, err
		}
	}
	if err := env.verify(v.chainID, now); err != nil {
		return nil, err
	}
	if err := kind.decode(env, rec); err != nil {
		return nil, err
	}
	if admit {
		if err := kind.admit(v.admit, env, rec); err != nil {
			return nil, err
		}
	}
	return rec, nil
}

func (v *Validator) advance(k seqKey, seq uint64, now time.Time) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	e, ok := v.last[k]
	if ok {
		if e.has(seq) {
			return fmt.Errorf("%w: sequence %d seen already", ErrReplay, seq)
		}
		if f := e.floor(); seq <= f {
			return fmt.Errorf("%w: sequence %d is older than the last %d seen (from %d)", ErrReplay, seq, replayWindow, f)
		}
	} else {
		if len(v.last) >= maxTracked {
			v.pruneLocked(now)
		}
		e = &seqEntry{}
		v.last[k] = e
	}
	e.add(seq)
	e.seen = now
	return nil
}

// pruneLocked forgets signers not heard from for longer than any message
// can live: their old messages are expired anyway.
func (v *Validator) pruneLocked(now time.Time) {
	for k, e := range v.last {
		if now.Sub(e.seen) > MaxTTL+clockSkew {
			delete(v.last, k)
		}
	}
	for k := range v.last { // still full: drop arbitrary entries
		if len(v.last) < maxTracked {
			break
		}
		delete(v.last, k)
	}
}

// Reason names a validation error for metrics and logs.
func Reason(err error) string {
	for _, r := range []struct {
		err  error
		name string
	}{
		{ErrOversize, "oversize"}, {ErrMalformed, "malformed"}, {ErrUnknownType, "unknown_type"},
		{ErrBadSignature, "bad_signature"}, {ErrSignerMismatch, "signer_mismatch"}, {ErrExpired, "expired"},
		{ErrReplay, "replay"}, {ErrOutOfRange, "out_of_range"}, {ErrNotAdmitted, "not_admitted"},
	} {
		if errors.Is(err, r.err) {
			return r.name
		}
	}
	return "other"
}

// Tracked is how many (topic, signer) sequences the validator remembers.
func (v *Validator) Tracked() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.last)
}
