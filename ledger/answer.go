package ledger

import (
	"crypto/ed25519"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/deepmarket/deepmarket/wire"
)

// Answer is a payer's signed word on one payee's workers in a held job,
// as of its holder's round Round: the rounds the holder accepted and
// refused (cumulative), the seconds its accepted rounds took, in
// milliseconds, the reason it gave for its last refusal, and whether a
// spot check forfeited the payee's pay. The payer's node sends it with
// each receipt; the payee's node keeps the latest it can verify. It is
// what the payer said and cannot take back: the evidence a dispute of a
// refusal starts from.
type Answer struct {
	Job            string `cbor:"job" json:"job"`
	Payee          string `cbor:"payee" json:"payee"`
	Round          uint64 `cbor:"round" json:"round"`
	Accepted       uint32 `cbor:"accepted" json:"accepted"`
	Refused        uint32 `cbor:"refused" json:"refused"`
	AcceptedMillis uint64 `cbor:"accepted_ms" json:"accepted_ms"`
	Reason         string `cbor:"reason,omitempty" json:"reason,omitempty"`
	Forfeited      bool   `cbor:"forfeited,omitempty" json:"forfeited,omitempty"`
	// Refusal names what the holder last refused of the payee's workers,
	// by digest; nil when it refused nothing or named nothing.
	Refusal *Refusal `cbor:"refusal,omitempty" json:"refusal,omitempty"`
	// Terms are the bid's terms the refusal was judged by. Neither side
	// sends them (p2p.Answer has none): each fills them from the bid it
	// holds, so the payer's signature covers the terms the payee was
	// launched on.
	Terms Terms  `cbor:"terms" json:"terms"`
	Sig   []byte `cbor:"sig" json:"sig"`
}

// Refusal is what a held job's holder refused in Round, by digest: the
// round's global weights (Theta), the weights before the last update that
// moved them (Prev, for the echo check; "" before any), the update as the
// holder decoded it, and the model's description (Model, "" when the
// program gives none). The refused worker keeps the same bytes (the
// deepmarket package's evidence.py); referees recompute the check from
// bytes with these digests and no others.
type Refusal struct {
	Round  uint64 `cbor:"round" json:"round"`
	Theta  string `cbor:"theta" json:"theta"`
	Prev   string `cbor:"prev,omitempty" json:"prev,omitempty"`
	Update string `cbor:"update" json:"update"`
	Model  string `cbor:"model,omitempty" json:"model,omitempty"`
}

// Terms are a held job's terms as its signed bid states them: the
// validation batch's content address and the holder's thresholds.
type Terms struct {
	Validation string  `cbor:"validation" json:"validation"`
	Tolerance  float64 `cbor:"tolerance" json:"tolerance"`
	Echo       float64 `cbor:"echo" json:"echo"`
	Residual   float64 `cbor:"residual" json:"residual"`
}

// MaxDigestLen bounds a Refusal's digests (hex).
const MaxDigestLen = 64

// Valid reports whether r's digests are lower-case hex of at most
// MaxDigestLen, Theta and Update given.
func (r *Refusal) Valid() bool {
	if r == nil {
		return true
	}
	hex := func(s string, need bool) bool {
		if s == "" {
			return !need
		}
		return len(s) <= MaxDigestLen && !strings.ContainsFunc(s, func(c rune) bool { return !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') })
	}
	return hex(r.Theta, true) && hex(r.Update, true) && hex(r.Prev, false) && hex(r.Model, false)
}

// MaxReasonLen bounds an answer's reason (bytes of UTF-8).
const MaxReasonLen = 256

// SignAnswer is the payer's signature on a for chainID.
func SignAnswer(payer Signer, chainID string, a Answer) Answer {
	a.Sig = payer.Sign(answerBytes(chainID, a))
	return a
}

// VerifyAnswer reports whether a is well formed and signed by payer (an
// ed25519 public key) for chainID.
func VerifyAnswer(payer []byte, chainID string, a Answer) bool {
	return len(payer) == ed25519.PublicKeySize && len(a.Sig) == ed25519.SignatureSize &&
		a.Refused <= MaxRounds && a.Accepted <= MaxRounds && len(a.Reason) <= MaxReasonLen && utf8.ValidString(a.Reason) &&
		a.Refusal.Valid() && len(a.Terms.Validation) <= 128 &&
		verify(payer, answerBytes(chainID, a), a.Sig)
}

// Later reports whether a says more than b of the same job and payee: a
// later round, or the same round with more rounds answered.
func (a Answer) Later(b Answer) bool {
	return a.Round > b.Round || (a.Round == b.Round && uint64(a.Accepted)+uint64(a.Refused) > uint64(b.Accepted)+uint64(b.Refused))
}

func answerBytes(chainID string, a Answer) []byte {
	r := a.Refusal
	if r == nil {
		r = &Refusal{}
	}
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	b, _ := wire.Marshal([]any{answerDomain, chainID, a.Job, a.Payee, a.Round, a.Accepted, a.Refused, a.AcceptedMillis, a.Reason, a.Forfeited,
		r.Round, r.Theta, r.Prev, r.Update, r.Model, a.Terms.Validation, f(a.Terms.Tolerance), f(a.Terms.Echo), f(a.Terms.Residual)})
	return b
}
