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
}

// DefaultCommitTimeout bounds how long Do waits for a transaction to
// commit.
const DefaultCommitTimeout = 30 * time.Second

// ErrCommitTimeout means a broadcast transaction was not seen committed in
// time; it may still commit later.
var ErrCommitTimeout = errors.New("transaction not committed in time")

// Client signs, broadcasts and waits for ledger transactions of one key,
// and reads the ledger.
type Client struct {
	rpc     RPC
	key     Signer
	addr    identity.Address
	chainID string

	mu    sync.Mutex
	nonce *uint64 // next nonce, once known
}

// NewClient returns a client that signs with key on chainID.
func NewClient(rpc RPC, key Signer, chainID string) *Client {
	return &Client{rpc: rpc, key: key, addr: identity.AddressOf(key.Public()), chainID: chainID}
}

// Address is the client's account.
func (c *Client) Address() identity.Address { return c.addr }

// Submit signs msg with the account's next nonce and broadcasts it; it
// returns once the mempool has accepted it, with its hash. A rejection by
// CheckTx comes back as *Error with the ledger's code and reason.
func (c *Client) Submit(ctx context.Context, typ string, msg any) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for attempt := 0; ; attempt++ {
		if c.nonce == nil {
			a, err := c.Account(ctx, c.addr)
			if err != nil {
				return "", err
			}
			n := a.Nonce
			c.nonce = &n
		}
		tx, err := NewTx(c.key, c.chainID, typ, *c.nonce, msg)
		if err != nil {
			return "", err
		}
		res, err := c.broadcast(ctx, tx)
		if err != nil {
			c.nonce = nil
			return "", fmt.Errorf("broadcast %s: %w", typ, err)
		}
		if res.Code == CodeBadNonce && attempt == 0 {
			c.nonce = nil // someone else used this key: learn the nonce again
			continue
		}
		if res.Code != CodeOK {
			return "", &Error{Code: res.Code, Reason: res.Log}
		}
		*c.nonce++
		return TxHashHex(tx), nil
	}
}

// catchUpWait bounds how long a broadcast waits for a replica that is
// still catching up with the chain (a node just started).
const catchUpWait = time.Minute

// broadcast sends tx, waiting while the replica catches up: CometBFT
// refuses transactions until its block sync is done.
func (c *Client) broadcast(ctx context.Context, tx []byte) (*ctypes.ResultBroadcastTx, error) {
	deadline := time.Now().Add(catchUpWait)
	for {
		res, err := c.rpc.BroadcastTxSync(ctx, tx)
		if err == nil || !strings.Contains(err.Error(), "catching up") || time.Now().After(deadline) {
			return res, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// Wait waits until the transaction is committed and returns its result;
// a transaction the block rejected comes back as *Error.
func (c *Client) Wait(ctx context.Context, hash string) (*ctypes.ResultTx, error) {
	raw, err := hex.DecodeString(hash)
	if err != nil {
		return nil, fmt.Errorf("tx hash %q: %w", hash, err)
	}
	for {
		res, err := c.rpc.Tx(ctx, raw, false)
		if err == nil {
			if res.TxResult.Code != CodeOK {
				c.mu.Lock()
				c.nonce = nil
				c.mu.Unlock()
				return res, &Error{Code: res.TxResult.Code, Reason: res.TxResult.Log}
			}
			return res, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %s", ErrCommitTimeout, hash)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

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

// Grant issues credits to a member (issuers only).
func (c *Client) Grant(ctx context.Context, to identity.Address, amount uint64) (*ctypes.ResultTx, error) {
	return c.Do(ctx, TypeGrant, &Grant{To: string(to), Amount: amount})
}

// OpenEscrow locks a job's maximum price.
func (c *Client) OpenEscrow(ctx context.Context, m OpenEscrow) (*ctypes.ResultTx, error) {
	return c.Do(ctx, TypeOpenEscrow, &m)
}

// Settle pays the machines of a job and refunds the rest.
func (c *Client) Settle(ctx context.Context, m Settle) (*ctypes.ResultTx, error) {
	return c.Do(ctx, TypeSettle, &m)
}

// Claim takes what a receipt covers from an expired escrow.
func (c *Client) Claim(ctx context.Context, r Receipt) (*ctypes.ResultTx, error) {
	return c.Do(ctx, TypeClaim, &Claim{Receipt: r})
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
	if err := query(ctx, rpc, "/validators", &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// SignReceipt signs a usage receipt with the client's key (as payer).
func (c *Client) SignReceipt(r Receipt) Receipt { return SignReceipt(c.key, c.chainID, r) }

func (c *Client) query(ctx context.Context, path string, v any) error {
	return query(ctx, c.rpc, path, v)
}

// Querier is the part of CometBFT's RPC client that reads the ledger.
type Querier interface {
	ABCIQuery(ctx context.Context, path string, data cmtbytes.HexBytes) (*ctypes.ResultABCIQuery, error)
}

func query(ctx context.Context, rpc Querier, path string, v any) error {
	res, err := rpc.ABCIQuery(ctx, path, nil)
	if err != nil {
		return fmt.Errorf("query %s: %w", path, err)
	}
	if res.Response.Code != CodeOK {
		return &Error{Code: res.Response.Code, Reason: res.Response.Log}
	}
	return json.Unmarshal(res.Response.Value, v)
}

// Account returns an account's balance and nonce.
func (c *Client) Account(ctx context.Context, addr identity.Address) (Account, error) {
	var a Account
	return a, c.query(ctx, "/account/"+string(addr), &a)
}

// Balance returns an account's balance in micro-credits.
func (c *Client) Balance(ctx context.Context, addr identity.Address) (uint64, error) {
	a, err := c.Account(ctx, addr)
	return a.Balance, err
}

// Escrow returns the open escrow of a job.
func (c *Client) Escrow(ctx context.Context, job string) (*Escrow, error) {
	var e Escrow
	if err := c.query(ctx, "/escrow/"+job, &e); err != nil {
		return nil, err
	}
	return &e, nil
}

// MachineRecord is a machine's track record (jobs completed and failed,
// credits earned); the zero record for a machine with none.
func (c *Client) MachineRecord(ctx context.Context, machine string) (MachineRecord, error) {
	var r MachineRecord
	return r, c.query(ctx, "/machine/"+machine, &r)
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
			e := HistoryEntry{Height: tx.Height, Hash: tx.Hash.String(), Attrs: map[string]string{}}
			for _, ev := range tx.TxResult.Events {
				if ev.Type != EventType {
					continue
				}
				for _, a := range ev.Attributes {
					switch a.Key {
					case "type":
						e.Type = a.Value
					case "account":
					case "paid":
						e.Paid = append(e.Paid, a.Value)
					default:
						e.Attrs[a.Key] = a.Value
					}
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
