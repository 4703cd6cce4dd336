package p2p

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	voi "github.com/oasisprotocol/curve25519-voi/primitives/ed25519"
	"github.com/oasisprotocol/curve25519-voi/primitives/ed25519/extra/cache"

	"github.com/deepmarket/deepmarket/identity"
)

// MaxEnvelopeSize bounds every message on the wire; bigger ones are rejected
// before any decoding.
const MaxEnvelopeSize = 64 << 10

// MaxTTL is how far in the future an envelope may expire; a longer-lived
// message could be replayed for too long.
const MaxTTL = 24 * time.Hour

// clockSkew is the tolerance for peers' clocks when judging expiry.
const clockSkew = 5 * time.Second

// verifier checks ed25519 signatures with curve25519-voi, caching each
// signer's expanded public key: the same machines re-announce every few
// seconds, and skipping point decompression makes verification about 1.6x
// faster than crypto/ed25519 on a lab machine (see make bench-p2p).
var (
	verifier   = cache.NewVerifier(cache.NewLRUCache(4096))
	verifyOpts = &voi.Options{Verify: voi.VerifyOptionsStdLib}
)

// envelopeDomain separates DeepMarket envelope signatures from any other use
// of the same key (libp2p records, ledger transactions).
const envelopeDomain = "deepmarket/envelope/1"

// Sentinel errors: the validator turns each into a gossipsub rejection and a
// metric label, callers may branch on them with errors.Is.
var (
	ErrOversize       = errors.New("message too large")
	ErrMalformed      = errors.New("malformed message")
	ErrUnknownType    = errors.New("unknown message type")
	ErrBadSignature   = errors.New("bad signature")
	ErrSignerMismatch = errors.New("signer does not match")
	ErrExpired        = errors.New("message expired")
	ErrReplay         = errors.New("replayed or old sequence")
	ErrOutOfRange     = errors.New("value out of range")
	// ErrNotAdmitted: the ledger does not back the signer (an unregistered
	// machine, a bidder who is not a member or cannot pay). Gossip ignores
	// such a message rather than rejecting it, since a replica a few
	// blocks behind may not know yet of a machine just registered; the
	// peers that keep delivering them lose score (see Admission).
	ErrNotAdmitted = errors.New("not admitted by the ledger")
)

// Envelope is the signed wrapper of every DeepMarket message.
type Envelope struct {
	Signer  []byte `cbor:"1,keyasint"` // raw ed25519 public key
	Type    string `cbor:"2,keyasint"`
	Payload []byte `cbor:"3,keyasint"`
	Seq     uint64 `cbor:"4,keyasint"` // strictly increasing per signer
	Expiry  int64  `cbor:"5,keyasint"` // unix milliseconds
	Sig     []byte `cbor:"6,keyasint"`
}

// signingInput is what a signature covers: the domain, the chain ID (so a
// message cannot be replayed on another network) and every other field.
type signingInput struct {
	_       struct{} `cbor:",toarray"`
	Domain  string
	ChainID string
	Signer  []byte
	Type    string
	Payload []byte
	Seq     uint64
	Expiry  int64
}

func (e *Envelope) signingBytes(chainID string) ([]byte, error) {
	return Marshal(signingInput{
		Domain: envelopeDomain, ChainID: chainID, Signer: e.Signer,
		Type: e.Type, Payload: e.Payload, Seq: e.Seq, Expiry: e.Expiry,
	})
}

// SignerID returns the libp2p peer ID of the envelope's signer.
func (e *Envelope) SignerID() peer.ID { return identity.PeerIDOf(e.Signer) }

// ExpiresAt returns the envelope's expiry as a time.
func (e *Envelope) ExpiresAt() time.Time { return time.UnixMilli(e.Expiry) }

// Seal encodes payload, wraps it in an envelope signed by key for chainID,
// and returns the envelope's wire bytes.
func Seal(key *identity.Key, chainID, typ string, payload any, seq uint64, expiry time.Time) ([]byte, error) {
	body, err := Marshal(payload)
	if err != nil {
		return nil, fmt.Errorf("seal %s: %w", typ, err)
	}
	env := Envelope{Signer: key.Public(), Type: typ, Payload: body, Seq: seq, Expiry: expiry.UnixMilli()}
	in, err := env.signingBytes(chainID)
	if err != nil {
		return nil, fmt.Errorf("seal %s: %w", typ, err)
	}
	env.Sig = key.Sign(in)
	out, err := Marshal(&env)
	if err != nil {
		return nil, fmt.Errorf("seal %s: %w", typ, err)
	}
	if len(out) > MaxEnvelopeSize {
		return nil, fmt.Errorf("seal %s: %w (%d bytes, limit %d)", typ, ErrOversize, len(out), MaxEnvelopeSize)
	}
	return out, nil
}

// Open decodes wire bytes, checks the size, the signature under chainID and
// the expiry, and returns the envelope. It does not decode the payload.
func Open(data []byte, chainID string, now time.Time) (*Envelope, error) {
	env, err := decodeEnvelope(data)
	if err != nil {
		return nil, err
	}
	return env, env.verify(chainID, now)
}

// decodeEnvelope checks the size and decodes the envelope (its canonical
// encoding only) without checking the signature, which costs far more.
func decodeEnvelope(data []byte) (*Envelope, error) {
	if len(data) > MaxEnvelopeSize {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrOversize, len(data), MaxEnvelopeSize)
	}
	var env Envelope
	if err := Unmarshal(data, &env); err != nil {
		return nil, err
	}
	if len(env.Signer) != ed25519.PublicKeySize || len(env.Sig) != ed25519.SignatureSize || env.Type == "" {
		return nil, fmt.Errorf("%w: missing signer, signature or type", ErrMalformed)
	}
	return &env, nil
}

// verify checks the signature under chainID and the expiry.
func (e *Envelope) verify(chainID string, now time.Time) error {
	in, err := e.signingBytes(chainID)
	if err != nil {
		return err
	}
	if !verifier.VerifyWithOptions(e.Signer, in, e.Sig, verifyOpts) {
		return ErrBadSignature
	}
	exp := e.ExpiresAt()
	if exp.Before(now.Add(-clockSkew)) {
		return fmt.Errorf("%w: at %s", ErrExpired, exp.UTC().Format(time.RFC3339))
	}
	if exp.After(now.Add(MaxTTL + clockSkew)) {
		return fmt.Errorf("%w: expiry %s is more than %s away", ErrOutOfRange, exp.UTC().Format(time.RFC3339), MaxTTL)
	}
	return nil
}

// Sequencer hands out strictly increasing sequence numbers that also grow
// across restarts: they start from the wall clock in nanoseconds.
type Sequencer struct{ last atomic.Uint64 }

// Next returns a number greater than every one returned before.
func (s *Sequencer) Next() uint64 {
	for {
		last := s.last.Load()
		next := uint64(time.Now().UnixNano())
		if next <= last {
			next = last + 1
		}
		if s.last.CompareAndSwap(last, next) {
			return next
		}
	}
}
