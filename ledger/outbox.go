package ledger

import (
	"context"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"
	"time"

	abci "github.com/cometbft/cometbft/abci/types"
	ctypes "github.com/cometbft/cometbft/rpc/core/types"
)

// Outbox keeps a client's transactions until their outcome is known, and
// that outcome for a while after: the node keeps it in its store, so a
// node restarted after a crash sends again what it had sent and can still
// answer for it. Implementations must be safe for concurrent use.
type Outbox interface {
	Put(OutboxEntry) error
	Delete(hash string) error
	List() ([]OutboxEntry, error)
}

// OutboxEntry is a transaction the client sent.
type OutboxEntry struct {
	Hash   string `json:"hash"`
	Tx     []byte `json:"tx"`
	Nonce  uint64 `json:"nonce"`
	Height int64  `json:"height"` // the chain's height when it was signed
	// Final is its outcome once definitive (committed, failed, refused,
	// dropped); nil while unknown.
	Final *TxStatus `json:"final,omitempty"`
	At    int64     `json:"at"` // unix seconds of the last change
}

// TxState is what became of a transaction.
type TxState string

// The states TxStatus answers. Committed, failed, refused and dropped are
// final; pending and unknown are not (yet).
const (
	TxCommitted TxState = "committed" // in a block, code OK: it took effect
	TxFailed    TxState = "failed"    // in a block, refused there (Code, Reason): no effect
	TxRefused   TxState = "refused"   // refused before any block (CheckTx): no effect
	TxPending   TxState = "pending"   // in the node's mempool
	TxDropped   TxState = "dropped"   // never committed, and its signer's nonce moved past it: it never can be
	TxUnknown   TxState = "unknown"   // not seen: it may still arrive
)

// Final reports whether the state can no longer change.
func (s TxState) Final() bool {
	return s == TxCommitted || s == TxFailed || s == TxRefused || s == TxDropped
}

// TxStatus is what TxStatus knows of a transaction.
type TxStatus struct {
	Hash   string  `json:"hash"`
	State  TxState `json:"state"`
	Height int64   `json:"height,omitempty"` // committed or failed: its block
	Code   uint32  `json:"code"`             // the ledger's code (0 committed)
	Reason string  `json:"reason,omitempty"`
	Nonce  *uint64 `json:"nonce,omitempty"` // known for the client's own transactions
}

// outboxKeep is how long a final outcome stays in the outbox for
// TxStatus; sweepEvery is how often Run goes through the outbox.
// A client with no outbox keeps at most maxEntries in memory.
const (
	outboxKeep = 24 * time.Hour
	sweepEvery = 5 * time.Second
	maxEntries = 10_000
	// sweepAge is how old a transaction this client sent must be before
	// Run looks after it.
	sweepAge = 30 * time.Second
)

// loadLocked reads the outbox once.
func (c *Client) loadLocked() error {
	if c.loaded || c.outbox == nil {
		c.loaded = true
		return nil
	}
	entries, err := c.outbox.List()
	if err != nil {
		return fmt.Errorf("read the ledger outbox: %w", err)
	}
	for i := range entries {
		e := entries[i]
		c.entries[e.Hash] = &e
	}
	c.loaded = true
	return nil
}

// remember keeps p until its outcome is known, in the outbox first: once
// it may have been sent, a restarted client must know of it. known: this
// client sent it before.
func (c *Client) remember(p *Prepared) (known bool, err error) {
	c.mu.Lock()
	old, known := c.entries[p.Hash]
	c.mu.Unlock()
	if known && old.Final == nil {
		return true, nil
	}
	e := &OutboxEntry{Hash: p.Hash, Tx: p.Tx, Nonce: p.Nonce, Height: p.Height, At: c.now().Unix()}
	if c.outbox != nil {
		if err := c.outbox.Put(*e); err != nil {
			return false, fmt.Errorf("%w: %s: keep it in the outbox: %w", ErrNotSent, p.Hash, err)
		}
	}
	c.mu.Lock()
	c.entries[p.Hash] = e
	c.mu.Unlock()
	return known, nil
}

// finish records a transaction's final outcome.
func (c *Client) finish(hash string, st TxStatus) {
	if !st.State.Final() {
		return
	}
	c.mu.Lock()
	e, ok := c.entries[hash]
	if !ok || e.Final != nil {
		c.mu.Unlock()
		return
	}
	if st.Nonce == nil {
		n := e.Nonce
		st.Nonce = &n
	}
	e.Final, e.At = &st, c.now().Unix()
	cp := *e
	if c.outbox == nil && len(c.entries) > maxEntries {
		for h, old := range c.entries { // with no outbox, outcomes are kept while there is room
			if old.Final != nil && len(c.entries) > maxEntries/2 {
				delete(c.entries, h)
			}
		}
	}
	c.mu.Unlock()
	if c.outbox != nil {
		c.outbox.Put(cp) // if it fails, the outcome is found again from the chain
	}
}

func (c *Client) entry(hash string) (OutboxEntry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.loadLocked(); err != nil {
		return OutboxEntry{}, false
	}
	e, ok := c.entries[hash]
	if !ok {
		return OutboxEntry{}, false
	}
	return *e, true
}

// TxStatus tells what became of a transaction: committed or failed in a
// block (with its height and code), pending in the node's mempool,
// refused by CheckTx or dropped (never committed, its nonce used by
// another: it never can be), or unknown (not seen; it may still arrive).
// Refused and dropped are known only for the client's own transactions.
// Chain reads that fail are errors; they never make a status.
func (c *Client) TxStatus(ctx context.Context, hash string) (TxStatus, error) {
	hash = strings.ToUpper(strings.TrimSpace(hash))
	if raw, err := hex.DecodeString(hash); err != nil || len(raw) != 32 {
		return TxStatus{}, fmt.Errorf("transaction hash %q: want 64 hex digits", hash)
	}
	if e, ok := c.entry(hash); ok && e.Final != nil {
		return *e.Final, nil
	}
	st, err := c.resolve(ctx, hash, true)
	if err != nil {
		return TxStatus{}, err
	}
	if e, ok := c.entry(hash); ok && st.Nonce == nil {
		n := e.Nonce
		st.Nonce = &n
	}
	c.finish(hash, st)
	return st, nil
}

// ReadTxStatus tells what a node knows of any transaction: committed or
// failed (its tx index), pending (its mempool), else unknown. Only the
// client that sent a transaction can tell it refused or dropped
// (Client.TxStatus).
func ReadTxStatus(ctx context.Context, rpc RPC, hash string) (TxStatus, error) {
	hash = strings.ToUpper(strings.TrimSpace(hash))
	if raw, err := hex.DecodeString(hash); err != nil || len(raw) != 32 {
		return TxStatus{}, fmt.Errorf("transaction hash %q: want 64 hex digits", hash)
	}
	return lookupTx(ctx, rpc, hash)
}

// lookupTx reads a transaction from a node's tx index and mempool.
func lookupTx(ctx context.Context, rpc RPC, hash string) (TxStatus, error) {
	raw, _ := hex.DecodeString(hash)
	if res, err := rpc.Tx(ctx, raw, false); err == nil {
		return statusOf(res), nil
	} else if ctx.Err() != nil {
		return TxStatus{}, err
	}
	st := TxStatus{Hash: hash, State: TxUnknown, Reason: "not seen: it may still arrive"}
	var pend PendingTx
	if _, err := query(ctx, rpc, "/pending/"+hash, &pend); err != nil {
		return TxStatus{}, err
	}
	if pend.Pending {
		st.State, st.Reason = TxPending, "in the node's mempool"
	}
	return st, nil
}

// resolve asks the chain what became of a transaction. Only with search
// does it read the blocks since the transaction was signed, when the tx
// index lacks it and its nonce is used (the index lags a commit, and a
// crash can lose a block's index): that tells committed from dropped, at
// the cost of reading those blocks.
func (c *Client) resolve(ctx context.Context, hash string, search bool) (TxStatus, error) {
	st, err := lookupTx(ctx, c.rpc, hash)
	if err != nil || st.State.Final() {
		if err == nil {
			c.sawHeight(st.Height)
		}
		return st, err
	}
	e, mine := c.entry(hash)
	if !mine {
		return st, nil
	}
	n := e.Nonce
	st.Nonce = &n
	if st.State == TxPending {
		return st, nil
	}
	a, h, err := c.accountAt(ctx, c.addr)
	if err != nil {
		return TxStatus{}, err
	}
	c.sawHeight(h)
	if a.Nonce <= e.Nonce {
		return st, nil // its nonce is still free
	}
	if !search {
		st.Reason = fmt.Sprintf("nonce %d is used; the tx index does not have it yet", n)
		return st, nil
	}
	// Its nonce is used: by it (the tx index may lag, or have lost a
	// block to a crash) or by another. The blocks since it was signed
	// tell.
	return c.scan(ctx, e, h)
}

// maxScan bounds how many blocks a status search reads.
const maxScan = 100_000

// scan looks for e in the blocks after it was signed, up to height.
func (c *Client) scan(ctx context.Context, e OutboxEntry, height int64) (TxStatus, error) {
	n := e.Nonce
	from := max(e.Height, 1)
	if height-from > maxScan {
		return TxStatus{Hash: e.Hash, State: TxUnknown, Nonce: &n,
			Reason: fmt.Sprintf("nonce %d is used, and %d blocks since it was signed are too many to search", n, height-from)}, nil
	}
	for h := from; h <= height; h++ {
		b, err := c.rpc.Block(ctx, &h)
		if err != nil {
			return TxStatus{}, fmt.Errorf("block %d: %w", h, err)
		}
		for i, tx := range b.Block.Txs {
			if TxHashHex(tx) != e.Hash {
				continue
			}
			r, err := c.rpc.BlockResults(ctx, &h)
			if err != nil {
				return TxStatus{}, fmt.Errorf("block %d results: %w", h, err)
			}
			if i >= len(r.TxsResults) {
				return TxStatus{}, fmt.Errorf("block %d: %d results for %d transactions", h, len(r.TxsResults), len(b.Block.Txs))
			}
			return statusOf(&ctypes.ResultTx{Hash: tx.Hash(), Height: h, TxResult: *r.TxsResults[i]}), nil
		}
	}
	return TxStatus{Hash: e.Hash, State: TxDropped, Code: CodeBadNonce, Nonce: &n,
		Reason: fmt.Sprintf("never committed, and nonce %d of %s is used by another transaction: it never will be", n, c.addr)}, nil
}

func statusOf(res *ctypes.ResultTx) TxStatus {
	st := TxStatus{Hash: strings.ToUpper(hex.EncodeToString(res.Hash)), State: TxCommitted, Height: res.Height, Code: res.TxResult.Code}
	if res.TxResult.Code != CodeOK {
		st.State, st.Reason = TxFailed, res.TxResult.Log
	}
	return st
}

func abciResult(st TxStatus) abci.ExecTxResult {
	return abci.ExecTxResult{Code: st.Code, Log: st.Reason}
}

// Run goes through the outbox until ctx ends: when it starts and every
// few seconds, it finds what became of each transaction not yet resolved
// and sends again, with the same bytes and in nonce order, each that
// neither committed nor can no longer commit, so that a transaction sent
// before a crash commits or is known dropped. Final outcomes are kept a
// day. Without an outbox it only waits for ctx.
func (c *Client) Run(ctx context.Context) error {
	if c.outbox == nil {
		<-ctx.Done()
		return nil
	}
	tick := time.NewTicker(sweepEvery)
	defer tick.Stop()
	for {
		c.sweep(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// sweep resolves and resends the unresolved entries once.
func (c *Client) sweep(ctx context.Context) {
	c.mu.Lock()
	if err := c.loadLocked(); err != nil {
		c.mu.Unlock()
		return
	}
	var open []OutboxEntry
	var old []string
	now := c.now()
	cutoff, fresh := now.Add(-outboxKeep).Unix(), now.Add(-sweepAge).Unix()
	for h, e := range c.entries {
		switch {
		case e.Final == nil && (e.At < c.started.Unix() || e.At < fresh):
			// From before this client started (a restarted node), or long
			// in coming; the others have a Wait of their own.
			open = append(open, *e)
		case e.At < cutoff:
			old = append(old, h)
			delete(c.entries, h)
		}
	}
	c.mu.Unlock()
	for _, h := range old {
		c.outbox.Delete(h)
	}
	sort.Slice(open, func(i, j int) bool { return open[i].Nonce < open[j].Nonce })
	for _, e := range open {
		st, err := c.resolve(ctx, e.Hash, true)
		if err != nil {
			return // the node is not answering; the next sweep tries again
		}
		if st.State.Final() {
			c.finish(e.Hash, st)
			continue
		}
		if st.State == TxUnknown {
			c.rpc.BroadcastTxSync(ctx, e.Tx) // same bytes; the next sweep sees what it did
		}
	}
}
