package ledger

import (
	"context"
	"crypto/ed25519"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	cmtbytes "github.com/cometbft/cometbft/libs/bytes"
	mempl "github.com/cometbft/cometbft/mempool"
	ctypes "github.com/cometbft/cometbft/rpc/core/types"
	cmttypes "github.com/cometbft/cometbft/types"

	"github.com/deepmarket/deepmarket/identity"
)

// RPC is the part of CometBFT's RPC client (local or HTTP) the ledger
// client needs.
type RPC interface {
	BroadcastTxSync(ctx context.Context, tx cmttypes.Tx) (*ctypes.ResultBroadcastTx, error)
	Tx(ctx context.Context, hash []byte, prove bool) (*ctypes.ResultTx, error)
	ABCIQuery(ctx context.Context, path string, data cmtbytes.HexBytes) (*ctypes.ResultABCIQuery, error)
	TxSearch(ctx context.Context, query string, prove bool, page, perPage *int, orderBy string) (*ctypes.ResultTxSearch, error)
	Block(ctx context.Context, height *int64) (*ctypes.ResultBlock, error)
	BlockResults(ctx context.Context, height *int64) (*ctypes.ResultBlockResults, error)
}

// DefaultCommitTimeout bounds how long Do waits for a transaction to
// commit.
const DefaultCommitTimeout = 30 * time.Second

// ErrCommitTimeout means a broadcast transaction was not seen committed in
// time; it may still commit later. Errors that say so also satisfy
// errors.Is(err, ErrUnknownOutcome).
var ErrCommitTimeout = errors.New("transaction not committed in time")

// ErrUnknownOutcome is satisfied (errors.Is) by every error the client
// returns when it cannot tell whether a transaction was, or will be,
// committed: the connection was lost after sending, the commit did not
// come in time. Such an error is an *UnknownOutcomeError, which names the
// transaction's hash: TxStatus tells later. Only a *Error says the ledger
// refused a transaction.
var ErrUnknownOutcome = errors.New("outcome unknown")

// ErrDuplicateTx means the signed transaction is one a node already has,
// sent by another client of the same key: it is that transaction, not a
// new one.
var ErrDuplicateTx = errors.New("the same transaction was sent already")

// ErrNotSent means a transaction was never delivered to a node (it was
// catching up, or its mempool was full, until the caller gave up): it
// cannot commit.
var ErrNotSent = errors.New("transaction not sent")

// UnknownOutcomeError is a transaction whose fate the client cannot tell.
type UnknownOutcomeError struct {
	Hash   string // the transaction's hash, as CometBFT names it
	Reason string // why it cannot tell
	// Timeout: the commit did not come in time (errors.Is ErrCommitTimeout).
	Timeout bool
}

func (e *UnknownOutcomeError) Error() string {
	return fmt.Sprintf("outcome unknown: transaction %s (%s)", e.Hash, e.Reason)
}

// Is makes errors.Is(err, ErrUnknownOutcome) hold, and ErrCommitTimeout
// for a commit that did not come in time.
func (e *UnknownOutcomeError) Is(target error) bool {
	return target == ErrUnknownOutcome || (e.Timeout && target == ErrCommitTimeout)
}

// Client signs, broadcasts and waits for ledger transactions of one key,
// and reads the ledger.
//
// A transaction is signed once (Prepare) and its bytes are what every
// retry sends, so a retry can never pay twice. The client remembers the
// transactions it sent until their outcome is known (in an Outbox, when
// it has one, across restarts), sends them again when a later nonce is
// refused as too high, and, with an Outbox, in Run.
type Client struct {
	rpc     RPC
	key     Signer
	addr    identity.Address
	chainID string
	outbox  Outbox
	now     func() time.Time
	started time.Time

	mu      sync.Mutex
	nonce   *uint64                 // next nonce to sign, once known
	turn    uint64                  // the lowest prepared nonce not yet through its first broadcast
	turnCh  chan struct{}           // closed when turn moves
	entries map[string]*OutboxEntry // sent, by hash: unresolved, or resolved within outboxKeep
	loaded  bool                    // entries hold the outbox's
	height  int64                   // the chain's height as last seen
	seen    time.Time               // when
}

// ClientOption configures NewClient.
type ClientOption func(*Client)

// WithOutbox keeps the client's unresolved transactions in o, so a client
// started again (a node restarted) sends them again and can tell what
// became of them. Default: none (the client remembers them in memory).
func WithOutbox(o Outbox) ClientOption { return func(c *Client) { c.outbox = o } }

// NewClient returns a client that signs with key on chainID.
func NewClient(rpc RPC, key Signer, chainID string, opts ...ClientOption) *Client {
	c := &Client{rpc: rpc, key: key, addr: identity.AddressOf(key.Public()), chainID: chainID, now: time.Now, started: time.Now(),
		turnCh: make(chan struct{}), entries: map[string]*OutboxEntry{}}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Address is the client's account.
func (c *Client) Address() identity.Address { return c.addr }

// Prepared is a signed transaction: what is sent, on every try.
type Prepared struct {
	Hash   string // upper-case hex SHA-256 of Tx, as CometBFT names it
	Tx     []byte
	Type   string
	Nonce  uint64
	Height int64 // the chain's height when it was signed: it commits later
}

// Prepare signs msg with the account's next nonce. The caller may tell
// the hash to whoever waits for it, then must Broadcast (or Release) it:
// the client broadcasts prepared transactions in nonce order.
func (c *Client) Prepare(ctx context.Context, typ string, msg any) (*Prepared, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.loadLocked(); err != nil {
		return nil, err
	}
	if c.nonce == nil || c.now().Sub(c.seen) > heightStale {
		var a AccountView
		h, err := query(ctx, c.rpc, "/account/"+string(c.addr), &a)
		if err != nil {
			return nil, err
		}
		c.sawHeightLocked(h)
		if c.nonce == nil {
			next := max(a.Nonce, a.PendingNonce) // another client of this key may have some pending
			for _, e := range c.entries {
				if e.Final == nil && e.Nonce >= next {
					next = e.Nonce + 1 // sent, not yet committed: the nonce is taken
				}
			}
			c.nonce = &next
			c.moveTurnLocked(next)
		}
	}
	tx, err := NewTx(c.key, c.chainID, typ, *c.nonce, msg)
	if err != nil {
		return nil, fmt.Errorf("sign %s: %w", typ, err)
	}
	p := &Prepared{Hash: TxHashHex(tx), Tx: tx, Type: typ, Nonce: *c.nonce, Height: c.height}
	*c.nonce++
	return p, nil
}

// heightStale is how old the client's idea of the chain's height may be
// when it signs: a search for the transaction starts there.
const heightStale = 30 * time.Second

func (c *Client) sawHeightLocked(h int64) {
	if h > c.height {
		c.height = h
	}
	c.seen = c.now()
}

func (c *Client) sawHeight(h int64) {
	c.mu.Lock()
	c.sawHeightLocked(h)
	c.mu.Unlock()
}

// Release gives up a prepared transaction that will not be broadcast, so
// that later ones need not wait for it.
func (c *Client) Release(p *Prepared) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.moveTurnLocked(p.Nonce + 1)
	c.unusedLocked(p)
}

// unusedLocked gives back p's nonce, which no transaction will use: the
// next one signs with it, or, if others were signed after p, the client
// learns the nonce again.
func (c *Client) unusedLocked(p *Prepared) {
	switch {
	case c.nonce == nil:
	case *c.nonce == p.Nonce+1:
		*c.nonce = p.Nonce
	default:
		c.nonce = nil
	}
}

// moveTurnLocked lets every prepared nonce below n broadcast.
func (c *Client) moveTurnLocked(n uint64) {
	if n > c.turn {
		c.turn = n
		close(c.turnCh)
		c.turnCh = make(chan struct{})
	}
}

// turnWait bounds how long a broadcast waits for earlier prepared ones.
const turnWait = 10 * time.Second

// waitTurn waits until the transactions prepared before p were broadcast
// (or released), or turnWait passes.
func (c *Client) waitTurn(ctx context.Context, p *Prepared) error {
	timeout := time.NewTimer(turnWait)
	defer timeout.Stop()
	for {
		c.mu.Lock()
		if p.Nonce <= c.turn {
			c.mu.Unlock()
			return nil
		}
		ch := c.turnCh
		c.mu.Unlock()
		select {
		case <-ch:
		case <-timeout.C:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("%w: %s waits for the transactions signed before it: %w", ErrNotSent, p.Hash, ctx.Err())
		}
	}
}

// broadcastWait bounds how long a broadcast retries: a replica catching
// up (a node just started), a full mempool, a connection lost.
const broadcastWait = time.Minute

// Broadcast sends p (after the transactions prepared before it) and
// returns once a node's mempool accepted it. It retries with the same
// bytes, also while the mempool holds as many of the signer's
// transactions as it may (CodeRateLimited): a sender waits for room. A refusal by CheckTx comes back as *Error (the ledger refused it:
// it will not commit); an answer it cannot interpret as either, as an
// *UnknownOutcomeError; a transaction never delivered, as ErrNotSent.
func (c *Client) Broadcast(ctx context.Context, p *Prepared) error {
	if err := c.waitTurn(ctx, p); err != nil {
		c.Release(p)
		return err
	}
	defer func() {
		c.mu.Lock()
		c.moveTurnLocked(p.Nonce + 1)
		c.mu.Unlock()
	}()
	known, err := c.remember(p)
	if err != nil {
		return err
	}
	return c.send(ctx, p, known)
}

// send broadcasts p's bytes until a node answers for them; delivered: an
// earlier broadcast of this client may have reached a node.
func (c *Client) send(ctx context.Context, p *Prepared, delivered bool) error {
	deadline := time.Now().Add(broadcastWait)
	refilled := false
	var last error
	for {
		res, err := c.rpc.BroadcastTxSync(ctx, p.Tx)
		switch {
		case err == nil && res.Code == CodeOK:
			return nil
		case err != nil && inCache(err):
			if delivered {
				return nil // ours, sent before
			}
			c.finish(p.Hash, TxStatus{Hash: p.Hash, State: TxRefused, Code: CodeBadNonce, Reason: "sent already by another client of this key"})
			c.forgetNonce()
			return fmt.Errorf("%w: %s (nonce %d)", ErrDuplicateTx, p.Hash, p.Nonce)
		case err == nil && res.Code == CodeRateLimited:
			// The signer has as many pending as a block takes: send the
			// same bytes again once there is room.
			last = &Error{Code: res.Code, Reason: res.Log}
		case err == nil:
			refusal := &Error{Code: res.Code, Reason: res.Log}
			if delivered {
				// An earlier try may have got it in: what became of it?
				return c.settleAmbiguous(ctx, p, refusal)
			}
			if res.Code == CodeBadNonce && !refilled {
				// A later nonce refused as too high: our earlier ones were
				// lost (a node restarted); send them again, then this.
				refilled = true
				if c.refill(ctx, p) {
					continue
				}
			}
			c.finish(p.Hash, TxStatus{Hash: p.Hash, State: TxRefused, Code: res.Code, Reason: res.Log})
			c.mu.Lock()
			if res.Code == CodeBadNonce {
				c.nonce = nil
			} else {
				c.unusedLocked(p)
			}
			c.mu.Unlock()
			return refusal
		case retryable(err):
			last = err // not delivered
		default:
			last, delivered = err, true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			if !delivered {
				c.finish(p.Hash, TxStatus{Hash: p.Hash, State: TxRefused, Code: CodeMalformed, Reason: "never sent: " + last.Error()})
				c.mu.Lock()
				c.unusedLocked(p)
				c.mu.Unlock()
				return fmt.Errorf("%w: %s: %w", ErrNotSent, p.Hash, last)
			}
			return &UnknownOutcomeError{Hash: p.Hash, Reason: "the node did not answer: " + last.Error()}
		}
		pause := 250 * time.Millisecond
		if errors.As(last, new(*Error)) {
			pause = 50 * time.Millisecond // rate limited: room comes with each block
		}
		select {
		case <-ctx.Done():
		case <-time.After(pause):
		}
	}
}

// settleAmbiguous answers for a transaction refused on a retry: the
// refusal may be of a transaction that got in on an earlier try.
func (c *Client) settleAmbiguous(ctx context.Context, p *Prepared, refusal *Error) error {
	st, err := c.TxStatus(ctx, p.Hash)
	if err != nil {
		return &UnknownOutcomeError{Hash: p.Hash, Reason: fmt.Sprintf("refused on a retry (%v), and its status: %v", refusal, err)}
	}
	switch st.State {
	case TxCommitted, TxPending:
		return nil
	case TxFailed, TxDropped, TxRefused:
		return &Error{Code: st.Code, Reason: st.Reason}
	}
	return &UnknownOutcomeError{Hash: p.Hash, Reason: fmt.Sprintf("refused on a retry (%v); an earlier try may have got in", refusal)}
}

// refill sends again, in nonce order, the unresolved transactions below
// p's nonce; false if there are none.
func (c *Client) refill(ctx context.Context, p *Prepared) bool {
	var earlier []*OutboxEntry
	c.mu.Lock()
	for _, e := range c.entries {
		if e.Final == nil && e.Nonce < p.Nonce {
			earlier = append(earlier, e)
		}
	}
	c.mu.Unlock()
	if len(earlier) == 0 {
		return false
	}
	sort.Slice(earlier, func(i, j int) bool { return earlier[i].Nonce < earlier[j].Nonce })
	for _, e := range earlier {
		c.rpc.BroadcastTxSync(ctx, e.Tx) // an answer is a guess; TxStatus tells later
	}
	return true
}

func inCache(err error) bool {
	return errors.Is(err, mempl.ErrTxInCache) || strings.Contains(err.Error(), mempl.ErrTxInCache.Error())
}

// retryable errors are answers from a node that did not take the
// transaction in.
func retryable(err error) bool {
	var full mempl.ErrMempoolIsFull
	s := err.Error()
	return errors.As(err, &full) || strings.Contains(s, "catching up") || strings.Contains(s, "mempool is full")
}

// forgetNonce makes the next Prepare learn the nonce again.
func (c *Client) forgetNonce() {
	c.mu.Lock()
	c.nonce = nil
	c.mu.Unlock()
}

// Submit signs msg with the account's next nonce and broadcasts it; it
// returns once the mempool has accepted it, with its hash. A refusal by
// CheckTx comes back as *Error with the ledger's code and reason; if the
// refusal was for the nonce, or the bytes were sent already (another
// client used the key), Submit learns the nonce again and signs once more.
func (c *Client) Submit(ctx context.Context, typ string, msg any) (string, error) {
	for attempt := 0; ; attempt++ {
		p, err := c.Prepare(ctx, typ, msg)
		if err != nil {
			return "", err
		}
		err = c.Broadcast(ctx, p)
		if err == nil {
			return p.Hash, nil
		}
		var lerr *Error
		if attempt == 0 && (errors.As(err, &lerr) && lerr.Code == CodeBadNonce || errors.Is(err, ErrDuplicateTx)) {
			continue
		}
		return p.Hash, fmt.Errorf("broadcast %s: %w", typ, err)
	}
}

// Wait waits until the transaction is committed and returns its result;
// a transaction the block refused comes back as *Error. When ctx ends
// first it returns an *UnknownOutcomeError (errors.Is ErrCommitTimeout):
// TxStatus then tells, dropped included.
func (c *Client) Wait(ctx context.Context, hash string) (*ctypes.ResultTx, error) {
	raw, err := hex.DecodeString(hash)
	if err != nil {
		return nil, fmt.Errorf("tx hash %q: %w", hash, err)
	}
	hash = strings.ToUpper(hash)
	nextResolve := time.Now().Add(waitResolve)
	for {
		res, err := c.rpc.Tx(ctx, raw, false)
		if err == nil {
			c.sawHeight(res.Height)
			st := statusOf(res)
			c.finish(hash, st)
			if res.TxResult.Code != CodeOK {
				c.forgetNonce()
				return res, &Error{Code: res.TxResult.Code, Reason: res.TxResult.Log}
			}
			return res, nil
		}
		// The index lags a commit by a moment, and may have lost a block
		// to a crash: when the transaction is long in coming, ask the
		// chain itself.
		if time.Now().After(nextResolve) {
			nextResolve = time.Now().Add(waitResolve)
			if st, err := c.resolve(ctx, hash, false); err == nil {
				switch st.State {
				case TxCommitted:
					return &ctypes.ResultTx{Hash: raw, Height: st.Height, TxResult: abciResult(st)}, nil
				case TxFailed, TxDropped:
					c.forgetNonce()
					return nil, &Error{Code: st.Code, Reason: st.Reason}
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil, &UnknownOutcomeError{Hash: hash, Reason: "not seen committed in time", Timeout: true}
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitResolve is how long Wait polls the tx index before it asks the
// chain itself (and how often after that).
const waitResolve = 3 * time.Second

// Do submits msg and waits up to DefaultCommitTimeout for it to commit.
func (c *Client) Do(ctx context.Context, typ string, msg any) (*ctypes.ResultTx, error) {
	hash, err := c.Submit(ctx, typ, msg)
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, DefaultCommitTimeout)
	defer cancel()
	return c.Wait(wctx, hash)
}

// Transfer sends amount micro-credits to another account.
func (c *Client) Transfer(ctx context.Context, to identity.Address, amount uint64, memo string) (*ctypes.ResultTx, error) {
	return c.Do(ctx, TypeTransfer, &Transfer{To: string(to), Amount: amount, Memo: memo})
}

// Grant issues credits to an account and admits it as a member (issuers
// only).
func (c *Client) Grant(ctx context.Context, to identity.Address, amount uint64) (*ctypes.ResultTx, error) {
	return c.Do(ctx, TypeGrant, &Grant{To: string(to), Amount: amount})
}

// Admit makes account a member without moving credits (issuers only).
func (c *Client) Admit(ctx context.Context, account identity.Address) (*ctypes.ResultTx, error) {
	return c.Do(ctx, TypeAdmit, &Admit{Account: string(account)})
}

// Revoke ends the membership of an account this issuer admitted.
func (c *Client) Revoke(ctx context.Context, account identity.Address) (*ctypes.ResultTx, error) {
	return c.Do(ctx, TypeAdmit, &Admit{Account: string(account), Revoke: true})
}

// LinkMachine makes the machine that signed consent earn into its Owner's
// account: the client's, or, to unlink it, the machine's own (the client
// then signs as the current owner or as the machine).
func (c *Client) LinkMachine(ctx context.Context, consent LinkConsent) (*ctypes.ResultTx, error) {
	return c.Do(ctx, TypeLinkMachine, &LinkMachine{Consent: consent})
}

// ConsentTo signs, as the machine (the client's key), its consent to earn
// into owner's account, for its link as it is now, valid for ttl (at most
// MaxConsentTTL seconds).
func (c *Client) ConsentTo(ctx context.Context, owner identity.Address, ttl time.Duration) (LinkConsent, error) {
	reg, err := c.Registration(ctx, c.addr)
	if err != nil {
		return LinkConsent{}, err
	}
	return SignLinkConsent(c.key, c.chainID, owner, reg, c.now().Add(ttl).Unix()), nil
}

// OpenEscrow locks a job's maximum price.
func (c *Client) OpenEscrow(ctx context.Context, m OpenEscrow) (*ctypes.ResultTx, error) {
	return c.Do(ctx, TypeOpenEscrow, &m)
}

// Settle pays the machines of a job and opens its escrow's dispute
// window; the rest is refunded when the window closes.
func (c *Client) Settle(ctx context.Context, m Settle) (*ctypes.ResultTx, error) {
	return c.Do(ctx, TypeSettle, &m)
}

// Claim takes what a receipt covers, less what was paid, from an expired
// escrow or from a settled one in its dispute window.
func (c *Client) Claim(ctx context.Context, r Receipt) (*ctypes.ResultTx, error) {
	return c.Do(ctx, TypeClaim, &Claim{Receipt: r})
}

// Dispute contests, in a settled escrow's dispute window, the failed mark
// its settlement gave this client's machine.
func (c *Client) Dispute(ctx context.Context, job string) (*ctypes.ResultTx, error) {
	return c.Do(ctx, TypeDispute, &Dispute{Job: job})
}

// Appeal asks referees, in a settled escrow's dispute window, to pay this
// client's machine claim more than the settlement paid it; evidence is
// the content address of what they recompute the contested check from.
// The machine's owner locks the ledger's appeal bond.
func (c *Client) Appeal(ctx context.Context, job string, claim uint64, evidence, reason string) (*ctypes.ResultTx, error) {
	return c.Do(ctx, TypeAppeal, &Appeal{Job: job, Claim: claim, Evidence: evidence, Reason: reason})
}

// Verdict is this client's vote, as a referee the appeal drew, on
// appellant's appeal of job: overturn the refusal, or uphold it.
func (c *Client) Verdict(ctx context.Context, job, appellant string, overturn bool) (*ctypes.ResultTx, error) {
	return c.Do(ctx, TypeVerdict, &Verdict{Job: job, Appellant: appellant, Overturn: overturn})
}

// Expire reclaims an expired escrow's remainder.
func (c *Client) Expire(ctx context.Context, job string) (*ctypes.ResultTx, error) {
	return c.Do(ctx, TypeExpire, &Expire{Job: job})
}

// VoteValidator votes, as a current validator, that the validator with
// key pub have power (0 removes it); name names a new one. The vote
// commits whether or not it carries the change: ValidatorSet tells.
func (c *Client) VoteValidator(ctx context.Context, pub ed25519.PublicKey, power int64, name string) (*ctypes.ResultTx, error) {
	return c.Do(ctx, TypeValidatorVote, &ValidatorVote{PubKey: pub, Power: power, Name: name})
}

// Validators returns the validator set and the changes voted on but not
// carried, as of the last executed block.
func (c *Client) Validators(ctx context.Context) (*ValidatorSet, error) {
	return ReadValidators(ctx, c.rpc)
}

// ReadValidators is Client.Validators for a reader with no key: from any
// node's RPC.
func ReadValidators(ctx context.Context, rpc Querier) (*ValidatorSet, error) {
	var v ValidatorSet
	if _, err := query(ctx, rpc, "/validators", &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// SignReceipt signs a usage receipt with the client's key (as payer).
func (c *Client) SignReceipt(r Receipt) Receipt { return SignReceipt(c.key, c.chainID, r) }

// SignAnswer signs a held job's answer to a payee with the client's key
// (as payer).
func (c *Client) SignAnswer(a Answer) Answer { return SignAnswer(c.key, c.chainID, a) }

func (c *Client) query(ctx context.Context, path string, v any) error {
	_, err := query(ctx, c.rpc, path, v)
	return err
}

// Querier is the part of CometBFT's RPC client that reads the ledger.
type Querier interface {
	ABCIQuery(ctx context.Context, path string, data cmtbytes.HexBytes) (*ctypes.ResultABCIQuery, error)
}

// query reads path into v and returns the height the answer is at.
func query(ctx context.Context, rpc Querier, path string, v any) (int64, error) {
	res, err := rpc.ABCIQuery(ctx, path, nil)
	if err != nil {
		return 0, fmt.Errorf("query %s: %w", path, err)
	}
	if res.Response.Code != CodeOK {
		return 0, &Error{Code: res.Response.Code, Reason: res.Response.Log}
	}
	return res.Response.Height, json.Unmarshal(res.Response.Value, v)
}

// Account returns an account's balance and nonce.
func (c *Client) Account(ctx context.Context, addr identity.Address) (Account, error) {
	a, _, err := c.accountAt(ctx, addr)
	return a, err
}

func (c *Client) accountAt(ctx context.Context, addr identity.Address) (Account, int64, error) {
	var a Account
	h, err := query(ctx, c.rpc, "/account/"+string(addr), &a)
	return a, h, err
}

// Balance returns an account's balance in micro-credits.
func (c *Client) Balance(ctx context.Context, addr identity.Address) (uint64, error) {
	a, err := c.Account(ctx, addr)
	return a.Balance, err
}

// Member tells whether an account is a member, and who admitted it.
func (c *Client) Member(ctx context.Context, addr identity.Address) (Membership, error) {
	var m Membership
	return m, c.query(ctx, "/member/"+string(addr), &m)
}

// Registration tells whom a machine earns for, the height of its link's
// last change and of the state read, and whether it is registered.
func (c *Client) Registration(ctx context.Context, machine identity.Address) (Registration, error) {
	var r Registration
	return r, c.query(ctx, "/registration/"+string(machine), &r)
}

// Escrow returns the open escrow of a job.
func (c *Client) Escrow(ctx context.Context, job string) (*Escrow, error) {
	var e Escrow
	if err := c.query(ctx, "/escrow/"+job, &e); err != nil {
		return nil, err
	}
	return &e, nil
}

// Cases are the open appeals that drew referee and wait for its vote.
func (c *Client) Cases(ctx context.Context, referee identity.Address) ([]Docket, error) {
	var d []Docket
	return d, c.query(ctx, "/cases/"+string(referee), &d)
}

// MachineRecord is a machine's track record (jobs completed and failed,
// credits earned); the zero record for a machine with none.
func (c *Client) MachineRecord(ctx context.Context, machine string) (MachineRecord, error) {
	var r MachineRecord
	return r, c.query(ctx, "/machine/"+machine, &r)
}

// PayerRecord is a payer's track record (escrows closed, paid against
// owed, failed marks given and disputed); the zero record for a payer
// with none.
func (c *Client) PayerRecord(ctx context.Context, payer string) (PayerRecord, error) {
	var r PayerRecord
	return r, c.query(ctx, "/payer/"+payer, &r)
}

// HistoryEntry is one committed transaction that touched an account.
type HistoryEntry struct {
	Height int64             `json:"height"`
	Hash   string            `json:"hash"`
	Type   string            `json:"type"`
	Attrs  map[string]string `json:"attrs"`
	Paid   []string          `json:"paid,omitempty"` // settle: machine=amount
}

// History lists the committed transactions that touched addr, newest
// first, up to limit (most 100 a page, as CometBFT serves them).
func (c *Client) History(ctx context.Context, addr identity.Address, limit int) ([]HistoryEntry, error) {
	if limit <= 0 {
		limit = 100
	}
	var out []HistoryEntry
	for page := 1; len(out) < limit; page++ {
		per := min(100, limit-len(out))
		res, err := c.rpc.TxSearch(ctx, fmt.Sprintf("%s.account='%s'", EventType, addr), false, &page, &per, "desc")
		if err != nil {
			if page > 1 && strings.Contains(err.Error(), "page should be within") {
				break
			}
			return nil, fmt.Errorf("history of %s: %w (is the node's tx indexer on?)", addr, err)
		}
		for _, tx := range res.Txs {
			ev := ParseEvent(tx.TxResult.Events)
			e := HistoryEntry{Height: tx.Height, Hash: tx.Hash.String(), Type: ev.Type, Attrs: map[string]string{}, Paid: ev.All("paid")}
			for _, a := range ev.Attrs {
				if a[0] != "paid" {
					e.Attrs[a[0]] = a[1]
				}
			}
			out = append(out, e)
		}
		if len(res.Txs) < per || len(out) >= res.TotalCount {
			break
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Height > out[j].Height })
	return out, nil
}

// Amount reads an integer attribute of a history entry.
func (e HistoryEntry) Amount(key string) uint64 {
	v, _ := strconv.ParseUint(e.Attrs[key], 10, 64)
	return v
}
