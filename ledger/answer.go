package ledger

import (
	"crypto/ed25519"
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
	Sig            []byte `cbor:"sig" json:"sig"`
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
		verify(payer, answerBytes(chainID, a), a.Sig)
}

// Later reports whether a says more than b of the same job and payee: a
// later round, or the same round with more rounds answered.
func (a Answer) Later(b Answer) bool {
	return a.Round > b.Round || (a.Round == b.Round && uint64(a.Accepted)+uint64(a.Refused) > uint64(b.Accepted)+uint64(b.Refused))
}

func answerBytes(chainID string, a Answer) []byte {
	b, _ := wire.Marshal([]any{answerDomain, chainID, a.Job, a.Payee, a.Round, a.Accepted, a.Refused, a.AcceptedMillis, a.Reason, a.Forfeited})
	return b
}
