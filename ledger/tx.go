package ledger

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"runtime"
	"sync"

	voi "github.com/oasisprotocol/curve25519-voi/primitives/ed25519"
	"github.com/oasisprotocol/curve25519-voi/primitives/ed25519/extra/cache"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/wire"
)

// Transaction types: what Tx.Type names, and the type of the event a
// committed transaction emits. Each has its entry in txKinds (kinds.go).
const (
	TypeTransfer    = "transfer"
	TypeGrant       = "grant"
	TypeLinkMachine = "link_machine"
	TypeOpenEscrow  = "open_escrow"
	TypeSettle      = "settle"
	TypeClaim       = "claim"
	TypeExpire      = "expire"
	// TypeDispute is a payee contesting the failed mark a settlement gave
	// it, in the escrow's dispute window.
	TypeDispute = "dispute"
	// TypeAppeal is a payee asking referees to overturn what a
	// settlement refused it, with a bond; TypeVerdict is a drawn
	// referee's vote on an appeal (appeal.go).
	TypeAppeal  = "appeal"
	TypeVerdict = "verdict"
	// TypeValidatorVote is a current validator's vote to add a validator,
	// change its power or remove it (validators.go).
	TypeValidatorVote = "validator_vote"
	// TypeAdmit is an issuer admitting an account as a member (or
	// revoking one it admitted).
	TypeAdmit = "admit"
)

// MaxTxSize bounds a transaction's encoding.
const MaxTxSize = 16 << 10

// Response codes. Every rejection carries one of these and a reason; codes
// are stable so clients can branch on them.
const (
	CodeOK uint32 = iota
	CodeMalformed
	CodeUnknownType
	CodeBadSignature
	CodeBadNonce
	CodeInvalidAddress
	CodeInvalidAmount
	CodeInsufficientFunds
	CodeOverflow
	CodeNotIssuer
	CodeQuotaExceeded
	CodeEscrowExists
	CodeUnknownEscrow
	CodeNotPayer
	CodeNotPayee
	CodeNotExpired
	CodeExpired
	CodeBadReceipt
	CodeTooLarge
	CodeInvalidJob
	CodeNotValidator     // a validator vote signed by a key outside the set
	CodeInvalidValidator // a validator vote for a key, power, name or change the rules refuse
	CodeAlreadyVoted     // the signer's pending vote is already this one
	CodeNotMember        // the signer is not a member (no issuer admitted it), or an Admit revokes a non-member
	CodeAlreadyMember    // an Admit of an account that is a member already
	CodeNotRegistered    // an escrow payee that is not a registered machine
	CodeLimitReached     // a per-member limit: machines linked to an owner, escrows open
	CodeRateLimited      // more transactions of one signer in a block (or pending at once) than allowed
	CodeSettled          // the escrow is settled: it closes by itself once its dispute window ends
	CodeNotSettled       // a dispute on an escrow not settled yet
	CodeNoReferees       // an appeal no validator can judge: every one is a party to it
	CodeNotReferee       // a verdict by an account the appeal did not draw
	CodeClosedAppeal     // a verdict on an appeal already decided, or past its deadline
)

// Error is a rejected transaction: a stable code and a readable reason.
type Error struct {
	Code   uint32
	Reason string
}

func (e *Error) Error() string { return fmt.Sprintf("code %d: %s", e.Code, e.Reason) }

func reject(code uint32, format string, args ...any) *Error {
	return &Error{Code: code, Reason: fmt.Sprintf(format, args...)}
}

// CodeOf returns the code of a ledger error (CodeOK for nil, CodeMalformed
// for any other error).
func CodeOf(err error) uint32 {
	if err == nil {
		return CodeOK
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return CodeMalformed
}

// Tx is a signed ledger transaction.
type Tx struct {
	Type   string `cbor:"1,keyasint"`
	Signer []byte `cbor:"2,keyasint"` // ed25519 public key
	Nonce  uint64 `cbor:"3,keyasint"` // the signer's next nonce
	Body   []byte `cbor:"4,keyasint"` // the message, encoded
	Sig    []byte `cbor:"5,keyasint"`
}

// Messages, one per transaction type.
type (
	// Transfer moves credits between accounts.
	Transfer struct {
		To     string `cbor:"to"`
		Amount uint64 `cbor:"amount"`
		Memo   string `cbor:"memo,omitempty"`
	}
	// Grant creates credits for a member, within the issuer's quota.
	Grant struct {
		To     string `cbor:"to"`
		Amount uint64 `cbor:"amount"`
	}
	// LinkMachine makes a machine earn into Consent.Owner's account (the
	// signer's), or, with the machine itself as Owner, unlinks it (signed
	// by its owner or by the machine). The machine's consent names the
	// link it changes, so it serves once.
	LinkMachine struct {
		Consent LinkConsent `cbor:"consent"`
	}
	// Admit makes Account a member, or with Revoke ends the membership of
	// a member the signing issuer admitted. It moves no credits.
	Admit struct {
		Account string `cbor:"account"`
		Revoke  bool   `cbor:"revoke,omitempty"`
	}
	// OpenEscrow locks a job's maximum price until it settles or expires.
	OpenEscrow struct {
		Job    string   `cbor:"job"`
		Amount uint64   `cbor:"amount"`
		Expiry int64    `cbor:"expiry"` // unix seconds, block time
		Payees []string `cbor:"payees"` // machine addresses
	}
	// Payment is one machine's share at settlement.
	Payment struct {
		Machine string `cbor:"machine"`
		Amount  uint64 `cbor:"amount"`
		Failed  bool   `cbor:"failed,omitempty"`
		// Rounds and Refused are the machine's rounds in a held job and
		// those the holder refused (at most MaxRounds): they count in the
		// machine's and the payer's records, apart from failures.
		Rounds  uint32 `cbor:"rounds,omitempty"`
		Refused uint32 `cbor:"refused,omitempty"`
		// Withheld is what the machine's refused rounds, or its pay
		// forfeited to a failed spot check (Failed), would have paid
		// beyond Amount: it stays in the escrow, and when the escrow
		// closes it is burned, not refunded, unless referees upheld the
		// refusal on the machine's appeal (overturned, the machine is paid
		// from it). Refusing a round, or a forfeit, never pays its payer.
		Withheld uint64 `cbor:"withheld,omitempty"`
	}
	// Settle pays each machine for time used and refunds the rest.
	Settle struct {
		Job      string    `cbor:"job"`
		Payments []Payment `cbor:"payments"`
	}
	// Receipt is the payer's signed statement that a machine has earned
	// Amount (cumulative) on a job.
	Receipt struct {
		Job    string `cbor:"job"`
		Payee  string `cbor:"payee"`
		Amount uint64 `cbor:"amount"`
		Seq    uint64 `cbor:"seq"`
		Sig    []byte `cbor:"sig"`
	}
	// Claim lets a machine take what its latest receipt covers, less what
	// it was paid: after the escrow expired unsettled, or in the dispute
	// window its settlement opened.
	Claim struct {
		Receipt Receipt `cbor:"receipt"`
	}
	// Dispute is a payee contesting, in the dispute window, the failed
	// mark the settlement of Job gave it.
	Dispute struct {
		Job string `cbor:"job"`
	}
	// Appeal is a payee of a settled escrow asking, in its dispute
	// window, to be paid Claim more than the settlement paid it: what
	// the rounds the payer's holder refused would have paid. Its owner
	// posts Params.AppealBond; Params.Referees validators drawn from the
	// block's hash judge it from Evidence, the content address of what
	// they recompute the contested check from (the model by digest, the
	// worker's update, the committed validation batch, the payer's
	// signed answer).
	Appeal struct {
		Job      string `cbor:"job"`
		Claim    uint64 `cbor:"claim"`
		Evidence string `cbor:"evidence"`
		Reason   string `cbor:"reason,omitempty"`
	}
	// Verdict is a referee's vote on Appellant's appeal of Job: Overturn
	// says the refusal was wrong and the appellant is to be paid.
	Verdict struct {
		Job       string `cbor:"job"`
		Appellant string `cbor:"appellant"`
		Overturn  bool   `cbor:"overturn"`
	}
	// Expire returns an expired escrow's remainder to its payer.
	Expire struct {
		Job string `cbor:"job"`
	}
	// ValidatorVote is a current validator's vote that the validator with
	// PubKey have Power (0 removes it). The change is made once validators
	// holding more than 2/3 of the power have voted for it.
	ValidatorVote struct {
		PubKey []byte `cbor:"pub_key"` // ed25519, 32 bytes
		Power  int64  `cbor:"power"`
		Name   string `cbor:"name,omitempty"` // the university, for people reading the set
	}
)

var jobRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Signing domains keep each kind of signature from being reused as another.
const (
	txDomain      = "deepmarket/tx/1"
	linkDomain    = "deepmarket/link/3"
	receiptDomain = "deepmarket/receipt/1"
	answerDomain  = "deepmarket/answer/2"
)

type txSigning struct {
	_       struct{} `cbor:",toarray"`
	Domain  string
	ChainID string
	Type    string
	Signer  []byte
	Nonce   uint64
	Body    []byte
}

func (tx *Tx) signBytes(chainID string) []byte {
	b, err := wire.Marshal(txSigning{Domain: txDomain, ChainID: chainID, Type: tx.Type, Signer: tx.Signer, Nonce: tx.Nonce, Body: tx.Body})
	if err != nil {
		panic(err) // plain values always encode
	}
	return b
}

// Signer is a key that signs transactions: identity.Key satisfies it.
type Signer interface {
	Public() ed25519.PublicKey
	Sign([]byte) []byte
}

// NewTx encodes msg as a transaction of type typ, signed by key for chainID
// with the given nonce, and returns its bytes. msg is typ's message (a
// *Transfer for TypeTransfer, ...); anything else is refused before it is
// signed, as the ledger would refuse it.
func NewTx(key Signer, chainID, typ string, nonce uint64, msg any) ([]byte, error) {
	k, ok := kindByType[typ]
	if !ok {
		return nil, reject(CodeUnknownType, "unknown transaction type %q", typ)
	}
	if !k.carries(msg) {
		return nil, reject(CodeMalformed, "a %s transaction carries a %s, not a %T", typ, k.msg, msg)
	}
	body, err := wire.Marshal(msg)
	if err != nil {
		return nil, err
	}
	tx := Tx{Type: typ, Signer: key.Public(), Nonce: nonce, Body: body}
	tx.Sig = key.Sign(tx.signBytes(chainID))
	return wire.Marshal(&tx)
}

// SignReceipt signs a usage receipt as the payer.
func SignReceipt(payer Signer, chainID string, r Receipt) Receipt {
	r.Sig = payer.Sign(receiptBytes(chainID, r))
	return r
}

// VerifyReceipt reports whether r is signed by payer (an ed25519 public
// key) for chainID: what a payee checks before it keeps a receipt, as the
// ledger will when the payee lodges it.
func VerifyReceipt(payer []byte, chainID string, r Receipt) bool {
	return len(payer) == ed25519.PublicKeySize && len(r.Sig) == ed25519.SignatureSize && verify(payer, receiptBytes(chainID, r), r.Sig)
}

func receiptBytes(chainID string, r Receipt) []byte {
	b, _ := wire.Marshal([]any{receiptDomain, chainID, r.Job, r.Payee, r.Amount, r.Seq})
	return b
}

// LinkConsent is a machine's signed agreement to earn into Owner's
// account. It names the link it changes: the machine's current owner and
// a height at which the link was so (at or after the link's last change).
// A change moves the link's height past it, so it serves once; it serves
// within Params.ConsentBlocks of that height, and lapses at Expiry.
type LinkConsent struct {
	Machine []byte `cbor:"machine"` // the machine's ed25519 public key
	Owner   string `cbor:"owner"`   // the new owner; the machine itself unlinks it
	Current string `cbor:"current"` // the machine's owner now (itself when unlinked)
	Height  int64  `cbor:"height"`  // a committed height since the link's last change
	Expiry  int64  `cbor:"expiry"`  // block time, unix seconds
	Sig     []byte `cbor:"sig"`
}

// MaxRounds bounds the rounds one settlement counts for one machine.
const MaxRounds = 1 << 20

// MaxConsentTTL bounds how far ahead of the block time a consent may
// expire.
const MaxConsentTTL = 3600

// ConsentLag is how many blocks before the registration's height a
// consent names (never before the link's last change): the owner's node,
// which checks it first, may be a block or two behind the machine's.
const ConsentLag = 3

// SignLinkConsent is the machine's half of a LinkMachine: it agrees, while
// its link is reg (as the registration query reports it), to earn into
// owner's account until expiry (unix seconds, at most MaxConsentTTL ahead
// of the block that carries it). The consent names a height ConsentLag
// blocks before reg's, or the link's last change if that is later.
func SignLinkConsent(machine Signer, chainID string, owner identity.Address, reg Registration, expiry int64) LinkConsent {
	c := LinkConsent{Machine: machine.Public(), Owner: string(owner), Current: reg.Owner,
		Height: max(reg.Changed, reg.Height-ConsentLag, 0), Expiry: expiry}
	c.Sig = machine.Sign(c.signBytes(chainID))
	return c
}

func (c *LinkConsent) signBytes(chainID string) []byte {
	return mustEncode([]any{linkDomain, chainID, c.Machine, c.Owner, c.Current, c.Height, c.Expiry})
}

// TxHash is the hash CometBFT names a transaction by.
func TxHash(tx []byte) [32]byte { return sha256.Sum256(tx) }

// TxHashHex is TxHash as upper-case hex, as CometBFT's RPC prints it.
func TxHashHex(tx []byte) string {
	h := TxHash(tx)
	return fmt.Sprintf("%X", h[:])
}

// decoded is a transaction parsed and checked for form (not yet for state).
type decoded struct {
	tx     Tx
	signer identity.Address
	kind   *txKind // the txKinds entry of tx.Type
	msg    any     // the body, decoded into kind's message
}

// DecodeTx parses tx bytes and checks their form; it does not check the
// signature. It accepts only the canonical encoding of the envelope and
// of the body (wire.Unmarshal), so a signed transaction has one form and
// one hash: TxHash of the bytes accepted.
func DecodeTx(b []byte) (*decoded, error) {
	if len(b) > MaxTxSize {
		return nil, reject(CodeTooLarge, "transaction is %d bytes, limit %d", len(b), MaxTxSize)
	}
	var d decoded
	if err := wire.Unmarshal(b, &d.tx); err != nil {
		return nil, reject(CodeMalformed, "%v", err)
	}
	if len(d.tx.Signer) != ed25519.PublicKeySize || len(d.tx.Sig) != ed25519.SignatureSize {
		return nil, reject(CodeMalformed, "signer key or signature missing")
	}
	d.signer = identity.AddressOf(d.tx.Signer)
	k, ok := kindByType[d.tx.Type]
	if !ok {
		return nil, reject(CodeUnknownType, "unknown transaction type %q", d.tx.Type)
	}
	d.kind = k
	var err error
	if d.msg, err = k.decode(d.tx.Body); err != nil {
		return nil, reject(CodeMalformed, "%s body: %v", d.tx.Type, err)
	}
	return &d, nil
}

func decodeBody[T any](b []byte) (*T, error) {
	var v T
	if err := wire.Unmarshal(b, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// verifier caches expanded public keys: a ledger sees the same accounts
// sign again and again. Signatures verify as ZIP-215 says (cofactored,
// as CometBFT verifies its own), the rule under which checking a batch
// and checking each signature alone agree (AppVersion 7; 6 and before
// verified cofactorless, as Go's crypto/ed25519 does, which no batch
// can).
var (
	verifier   = cache.NewVerifier(cache.NewLRUCache(8192))
	verifyOpts = &voi.Options{Verify: voi.VerifyOptionsZIP_215}
)

func verify(pub, msg, sig []byte) bool { return verifier.VerifyWithOptions(pub, msg, sig, verifyOpts) }

// batchSize is how many signatures one batch checks: a batch costs about
// half of its signatures checked alone, and the gain flattens beyond a
// few hundred.
const batchSize = 256

// verifySigs checks the signatures of ds under chainID in batches, the
// batches on all cores, and returns each one's error (nil when it
// verifies). A batch with a bad signature is checked one signature at a
// time (curve25519-voi's Verify), so each bad one is found.
func verifySigs(ds []*decoded, chainID string) []error {
	errs := make([]error, len(ds))
	if len(ds) < 4 { // too few to gain from a batch
		for i, d := range ds {
			errs[i] = d.verifySig(chainID)
		}
		return errs
	}
	// Batches of at most batchSize, at least one per core.
	cores := runtime.GOMAXPROCS(0)
	size := min(batchSize, (len(ds)+cores-1)/cores)
	n := (len(ds) + size - 1) / size
	var wg sync.WaitGroup
	for b := range n {
		wg.Go(func() { verifyBatch(ds, errs, b*size, min((b+1)*size, len(ds)), chainID) })
	}
	wg.Wait()
	return errs
}

// verifyBatch checks ds[lo:hi] as one batch, into errs[lo:hi].
func verifyBatch(ds []*decoded, errs []error, lo, hi int, chainID string) {
	bv := voi.NewBatchVerifierWithCapacity(hi - lo)
	for _, d := range ds[lo:hi] {
		verifier.AddWithOptions(bv, d.tx.Signer, d.tx.signBytes(chainID), d.tx.Sig, verifyOpts)
	}
	if all, valid := bv.Verify(nil); !all {
		for i, ok := range valid {
			if !ok {
				errs[lo+i] = ds[lo+i].sigError(chainID)
			}
		}
	}
}

// verifySig checks the transaction's signature under chainID.
func (d *decoded) verifySig(chainID string) error {
	if !verify(d.tx.Signer, d.tx.signBytes(chainID), d.tx.Sig) {
		return d.sigError(chainID)
	}
	return nil
}

func (d *decoded) sigError(chainID string) error {
	return reject(CodeBadSignature, "signature does not verify for signer %s on chain %s", d.signer, chainID)
}

func checkAddress(field, s string) error {
	if _, err := identity.ParseAddress(s); err != nil {
		return reject(CodeInvalidAddress, "%s: %v", field, err)
	}
	return nil
}

func checkJob(job string) error {
	if !jobRE.MatchString(job) {
		return reject(CodeInvalidJob, "job %q is not a hex SHA-256", job)
	}
	return nil
}

// JobID returns the job ID of a job spec's bytes: hex SHA-256.
func JobID(spec []byte) string {
	h := sha256.Sum256(spec)
	return hex.EncodeToString(h[:])
}

// Address is identity.Address, re-exported for callers of this package.
type Address = identity.Address
