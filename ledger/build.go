package ledger

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/deepmarket/deepmarket/identity"
)

// Building transactions from plain values, as a person or the node's API
// gives them (an address as text, an amount, a consent token): each value
// is checked before anything is signed, and one that cannot be used is a
// *FieldError that names it.

// FieldError is a value a transaction cannot be built from. Field names
// it as the request does ("to", "amount", "kind", "consent", "owner",
// "ttl_s"); Reason says what is wrong with it.
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }

func badField(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// Send kinds that are not transaction types: SendRevoke is an Admit that
// revokes, SendLink a LinkMachine.
const (
	SendRevoke = "revoke"
	SendLink   = "link"
)

// Send is a transaction asked for in plain values: what `deepmarket
// ledger send` and the node's API take.
type Send struct {
	// Kind is TypeTransfer (or empty), TypeGrant, TypeAdmit or SendRevoke
	// (To's membership; no Amount), or SendLink or TypeLinkMachine
	// (Consent; no To, no Amount).
	Kind    string
	To      string // an address
	Amount  uint64 // micro-credits
	Memo    string // a transfer's
	Consent string // a consent token (EncodeConsent), for a link
}

// BuildSend returns the type and the message of the transaction s asks
// for. A value it cannot use is a *FieldError naming it.
func BuildSend(s Send) (typ string, msg any, err error) {
	bad := func(field, format string, args ...any) (string, any, error) {
		return "", nil, badField(field, format, args...)
	}
	if s.Kind == SendLink || s.Kind == TypeLinkMachine {
		consent, err := DecodeConsent(s.Consent)
		if err != nil {
			return bad("consent", "%v", err)
		}
		return TypeLinkMachine, &LinkMachine{Consent: consent}, nil
	}
	to, err := identity.ParseAddress(s.To)
	if err != nil {
		return bad("to", "%v", err)
	}
	switch s.Kind {
	case "", TypeTransfer, TypeGrant:
		if s.Amount == 0 {
			return bad("amount", "amount must be more than 0")
		}
	default:
		if s.Amount != 0 {
			return bad("amount", "a %s moves no credits", s.Kind)
		}
	}
	switch s.Kind {
	case "", TypeTransfer:
		return TypeTransfer, &Transfer{To: string(to), Amount: s.Amount, Memo: s.Memo}, nil
	case TypeGrant:
		return TypeGrant, &Grant{To: string(to), Amount: s.Amount}, nil
	case TypeAdmit:
		return TypeAdmit, &Admit{Account: string(to)}, nil
	case SendRevoke:
		return TypeAdmit, &Admit{Account: string(to), Revoke: true}, nil
	}
	return bad("kind", "kind %q: want transfer, grant, admit, revoke or link", s.Kind)
}

// A consent a machine is asked for is good for DefaultConsentTTL seconds
// unless asked otherwise, and at most MaxRequestedConsentTTL: the ledger
// refuses one expiring more than MaxConsentTTL after the block that
// carries it, and block time trails the clock.
const (
	DefaultConsentTTL      = 1800
	MaxRequestedConsentTTL = MaxConsentTTL - 60
)

// ConsentTerms checks what a machine is asked to consent to: earning into
// owner's account (an address) for ttlSeconds (0: DefaultConsentTTL; at
// most MaxRequestedConsentTTL). Client.ConsentTo signs the consent.
func ConsentTerms(owner string, ttlSeconds int) (identity.Address, time.Duration, error) {
	a, err := identity.ParseAddress(owner)
	if err != nil {
		return "", 0, badField("owner", "%v", err)
	}
	if ttlSeconds == 0 {
		ttlSeconds = DefaultConsentTTL
	}
	if ttlSeconds < 1 || ttlSeconds > MaxRequestedConsentTTL {
		return "", 0, badField("ttl_s", "a consent is good for 1 to %d seconds, not %d", MaxRequestedConsentTTL, ttlSeconds)
	}
	return a, time.Duration(ttlSeconds) * time.Second, nil
}

// EncodeConsent is the token a machine hands its owner, who sends it as a
// link (DecodeConsent): the consent as JSON, in unpadded base64url.
func EncodeConsent(c LinkConsent) string {
	b, err := json.Marshal(c)
	if err != nil {
		panic(err) // plain values always encode
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// DecodeConsent reads a token EncodeConsent made; surrounding space is
// ignored, and so is nothing else.
func DecodeConsent(token string) (LinkConsent, error) {
	var c LinkConsent
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimSpace(token))
	if err != nil || len(b) == 0 {
		return c, errors.New("not a consent token (run `deepmarket ledger consent OWNER` on the machine and pass what it prints)")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return c, fmt.Errorf("not a consent token: %v", err)
	}
	return c, nil
}
