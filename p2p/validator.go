package p2p

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// Received is a message that passed validation: its envelope and the
// decoded payload (*Offer, *Withdrawal or *Bid).
type Received struct {
	Topic   string
	Signer  peer.ID
	Type    string
	Seq     uint64
	Expiry  time.Time
	Payload any
}

// payloadKind describes one payload type a topic accepts.
type payloadKind struct {
	decode func([]byte, peer.ID) (any, error)
}

func decodeOffer(b []byte, signer peer.ID) (any, error) {
	var o Offer
	if err := Unmarshal(b, &o); err != nil {
		return nil, err
	}
	return &o, o.Validate(signer)
}

func decodeWithdrawal(b []byte, signer peer.ID) (any, error) {
	var w Withdrawal
	if err := Unmarshal(b, &w); err != nil {
		return nil, err
	}
	return &w, w.Validate(signer)
}

func decodeBid(b []byte, _ peer.ID) (any, error) {
	var bid Bid
	if err := Unmarshal(b, &bid); err != nil {
		return nil, err
	}
	return &bid, bid.Validate()
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
	kinds   map[string]map[string]payloadKind // topic -> type -> kind

	mu   sync.Mutex
	last map[seqKey]*seqEntry
}

// NewValidator returns a validator for the topics of chainID.
func NewValidator(chainID string) *Validator {
	return &Validator{
		chainID: chainID,
		kinds: map[string]map[string]payloadKind{
			OffersTopic(chainID): {
				TypeOffer:      {decodeOffer},
				TypeWithdrawal: {decodeWithdrawal},
			},
			BidsTopic(chainID): {
				TypeBid: {decodeBid},
			},
		},
		last: make(map[seqKey]*seqEntry),
	}
}

// Validate checks data received on topic from author (the gossipsub
// message's verified origin) at time now. On success the message's
// sequence number is recorded, so the same message is refused a second time.
func (v *Validator) Validate(topic string, data []byte, author peer.ID, now time.Time) (*Received, error) {
	kinds, ok := v.kinds[topic]
	if !ok {
		return nil, fmt.Errorf("%w: topic %q", ErrUnknownType, topic)
	}
	env, err := Open(data, v.chainID, now)
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
	payload, err := kind.decode(env.Payload, signer)
	if err != nil {
		return nil, err
	}
	if err := v.advance(seqKey{topic, signer}, env.Seq, now); err != nil {
		return nil, err
	}
	return &Received{Topic: topic, Signer: signer, Type: env.Type, Seq: env.Seq, Expiry: env.ExpiresAt(), Payload: payload}, nil
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
		{ErrReplay, "replay"}, {ErrOutOfRange, "out_of_range"},
	} {
		if errors.Is(err, r.err) {
			return r.name
		}
	}
	return "other"
}
