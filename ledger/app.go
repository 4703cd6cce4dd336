package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sort"
	"strings"
	"sync"

	abci "github.com/cometbft/cometbft/abci/types"
	badger "github.com/dgraph-io/badger/v4"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/wire"
)

// AppVersion is the version of the ledger's state machine.
const AppVersion = 1

// App is the ledger's ABCI application. It keeps the state in memory and,
// when opened on a badger directory, persists each committed block
// atomically, so a node killed at any moment restarts at the app hash of
// its last commit and CometBFT's handshake replays the rest.
type App struct {
	abci.BaseApplication

	log *slog.Logger
	db  *badger.DB // nil: in memory (tests, audit)

	mu    sync.RWMutex
	state *State

	// Mempool view since the last commit: the next nonce and the credits
	// already spent by pending transactions of each account.
	checkNonce map[string]uint64
	checkSpend map[string]uint64
	// Transactions whose signatures CheckTx verified; FinalizeBlock does not
	// verify them again.
	verified map[[32]byte]struct{}
}

var _ abci.Application = (*App)(nil)

// NewMemoryApp returns an app whose state lives in memory only.
func NewMemoryApp(log *slog.Logger) *App {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &App{log: log, state: NewState(), checkNonce: map[string]uint64{}, checkSpend: map[string]uint64{}, verified: map[[32]byte]struct{}{}}
}

// OpenApp opens (creating) a persistent app in dir.
func OpenApp(dir string, log *slog.Logger) (*App, error) {
	app := NewMemoryApp(log)
	// No background compactors: each wakes every 50 ms, a cost an idle lab
	// machine would feel. Commit compacts level 0 itself when it fills.
	opts := badger.DefaultOptions(dir).WithLogger(nil).WithSyncWrites(true).
		WithMemTableSize(memTableSize).WithNumMemtables(2).WithBlockCacheSize(8 << 20).
		WithValueThreshold(64 << 10).WithValueLogFileSize(64 << 20).WithNumCompactors(0).
		WithNumLevelZeroTables(4).WithNumLevelZeroTablesStall(32)
	db, err := badger.Open(opts)
	if err != nil {
		return nil, fmt.Errorf("open ledger state %s: %w", dir, err)
	}
	app.db = db
	if err := app.load(); err != nil {
		db.Close()
		return nil, err
	}
	return app, nil
}

// Close closes the app's store.
func (app *App) Close() error {
	if app.db != nil {
		return app.db.Close()
	}
	return nil
}

type meta struct {
	ChainID string `cbor:"chain_id"`
	Height  int64  `cbor:"height"`
	Time    int64  `cbor:"time"`
	AppHash []byte `cbor:"app_hash"`
	Supply  uint64 `cbor:"supply"`
	Params  Params `cbor:"params"`
}

const metaKey = "meta"

func (app *App) load() error {
	s := NewState()
	err := app.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.DefaultIteratorOptions)
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			key := string(item.Key())
			val, err := item.ValueCopy(nil)
			if err != nil {
				return err
			}
			prefix, name, _ := strings.Cut(key, "/")
			switch prefix + "/" {
			case pAccount:
				err = decodeInto(val, s.Accounts, name)
			case pIssuer:
				err = decodeInto(val, s.Issuers, name)
			case pEscrow:
				err = decodeInto(val, s.Escrows, name)
			case pMachine:
				err = decodeInto(val, s.Machines, name)
			case pValidator:
				err = decodeInto(val, s.Validators, name)
			case pPending:
				err = decodeInto(val, s.Pending, name)
			case pLink:
				s.Links[name] = string(val)
			default:
				if key == metaKey {
					var m meta
					if err = wire.Unmarshal(val, &m); err == nil {
						s.ChainID, s.Height, s.Time, s.AppHash, s.Supply, s.Params = m.ChainID, m.Height, m.Time, m.AppHash, m.Supply, m.Params
					}
				}
			}
			if err != nil {
				return fmt.Errorf("ledger state key %q: %w", key, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("load ledger state: %w", err)
	}
	if s.Height > 0 {
		if h := s.Hash(); string(h) != string(s.AppHash) {
			return fmt.Errorf("load ledger state: stored app hash %X does not match the stored state (%X): the store is corrupt", s.AppHash, h)
		}
	}
	app.state = s
	return nil
}

func decodeInto[T any](b []byte, m map[string]*T, name string) error {
	var v T
	if err := wire.Unmarshal(b, &v); err != nil {
		return err
	}
	m[name] = &v
	return nil
}

// Info tells CometBFT where the app is, so its handshake replays any
// blocks the app has not committed.
func (app *App) Info(context.Context, *abci.RequestInfo) (*abci.ResponseInfo, error) {
	app.mu.RLock()
	defer app.mu.RUnlock()
	return &abci.ResponseInfo{
		Data: "deepmarket-ledger", Version: "1", AppVersion: AppVersion,
		LastBlockHeight: app.state.Height, LastBlockAppHash: app.state.AppHash,
	}, nil
}

// InitChain loads the genesis app state and takes the validator set from
// genesis (req.Validators; their names from the app state). It returns no
// validators, so CometBFT keeps genesis' set.
func (app *App) InitChain(_ context.Context, req *abci.RequestInitChain) (*abci.ResponseInitChain, error) {
	var g GenesisState
	if len(req.AppStateBytes) > 0 {
		dec := json.NewDecoder(strings.NewReader(string(req.AppStateBytes)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&g); err != nil {
			return nil, fmt.Errorf("genesis app_state: %w", err)
		}
	}
	s, err := g.State(req.ChainId)
	if err != nil {
		return nil, err
	}
	if err := s.initValidators(req.Validators, g.Validators); err != nil {
		return nil, err
	}
	s.Height = req.InitialHeight - 1
	s.AppHash = s.Hash()
	s.markAllDirty() // the first Commit stores genesis too
	app.mu.Lock()
	app.state = s
	app.mu.Unlock()
	return &abci.ResponseInitChain{AppHash: s.AppHash}, nil
}

// CheckTx admits a transaction to the mempool if it is well formed,
// signed, uses the account's next nonce (counting pending ones) and, for
// spends, the account can cover it with what pending transactions leave.
func (app *App) CheckTx(_ context.Context, req *abci.RequestCheckTx) (*abci.ResponseCheckTx, error) {
	if err := app.checkTx(req.Tx, req.Type == abci.CheckTxType_Recheck); err != nil {
		return &abci.ResponseCheckTx{Code: CodeOf(err), Log: err.Error(), Codespace: "deepmarket"}, nil
	}
	return &abci.ResponseCheckTx{Code: CodeOK, GasWanted: 1}, nil
}

func (app *App) checkTx(b []byte, recheck bool) error {
	d, err := DecodeTx(b)
	if err != nil {
		return err
	}
	h := TxHash(b)
	// The signature is checked outside the lock: it is most of the cost,
	// and blocks may execute meanwhile. A recheck trusts the first check.
	app.mu.RLock()
	_, known := app.verified[h]
	chainID := app.state.ChainID
	app.mu.RUnlock()
	if !known || !recheck {
		if err := d.verifySig(chainID); err != nil {
			return err
		}
	}
	app.mu.Lock()
	defer app.mu.Unlock()
	signer := string(d.signer)
	next, ok := app.checkNonce[signer]
	if !ok {
		if a, found := app.state.Accounts[signer]; found {
			next = a.Nonce
		}
	}
	if d.tx.Nonce != next {
		return reject(CodeBadNonce, "nonce %d, account %s expects %d", d.tx.Nonce, signer, next)
	}
	// Every check a block would make, against the committed state...
	if err := app.state.check(d, app.state.Time, next); err != nil {
		return err
	}
	// ...and spends must also fit beside those still pending.
	var spend uint64
	switch m := d.msg.(type) {
	case *Transfer:
		spend = m.Amount
	case *OpenEscrow:
		spend = m.Amount
	}
	if spend > 0 {
		bal := app.state.balanceOf(signer)
		pending := app.checkSpend[signer]
		if total, ok := add(pending, spend); !ok || total > bal {
			return reject(CodeInsufficientFunds, "balance %d, pending spends %d, this spend %d", bal, pending, spend)
		}
		app.checkSpend[signer] = pending + spend
	}
	app.checkNonce[signer] = next + 1
	app.verified[h] = struct{}{}
	return nil
}

// PrepareProposal orders each signer's transactions by nonce. Mempools
// can hold one account's transactions out of order (a node hears them from
// several peers at once), and a block that ran nonce 8 before 7 would
// reject both; the order between signers is kept. Transactions beyond the
// block's byte limit wait for the next block.
func (app *App) PrepareProposal(_ context.Context, req *abci.RequestPrepareProposal) (*abci.ResponsePrepareProposal, error) {
	var total int64
	txs := make([][]byte, 0, len(req.Txs))
	for _, tx := range req.Txs {
		if total += int64(len(tx)); total > req.MaxTxBytes {
			break
		}
		txs = append(txs, tx)
	}
	return &abci.ResponsePrepareProposal{Txs: orderByNonce(txs)}, nil
}

// orderByNonce sorts the transactions of each signer by nonce, each signer
// keeping the positions its transactions had; undecodable ones stay put.
func orderByNonce(txs [][]byte) [][]byte {
	type slot struct {
		pos   int
		nonce uint64
	}
	bySigner := map[string][]slot{}
	var order []string
	for i, b := range txs {
		d, err := DecodeTx(b)
		if err != nil {
			continue
		}
		k := string(d.tx.Signer)
		if _, ok := bySigner[k]; !ok {
			order = append(order, k)
		}
		bySigner[k] = append(bySigner[k], slot{i, d.tx.Nonce})
	}
	out := append([][]byte(nil), txs...)
	for _, k := range order {
		slots := bySigner[k]
		if len(slots) < 2 {
			continue
		}
		sorted := append([]slot(nil), slots...)
		sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].nonce < sorted[j].nonce })
		for i, s := range slots {
			out[s.pos] = txs[sorted[i].pos]
		}
	}
	return out
}

// FinalizeBlock executes the block's transactions in order at the block's
// time. Signatures not already verified by CheckTx are verified in
// parallel first. A broken invariant afterwards halts the node: it panics
// outside any per-transaction handling. Validator votes that carried
// return their changes in ValidatorUpdates (CometBFT applies them at
// height H+2).
func (app *App) FinalizeBlock(_ context.Context, req *abci.RequestFinalizeBlock) (*abci.ResponseFinalizeBlock, error) {
	app.mu.Lock()
	defer app.mu.Unlock()
	s := app.state
	now := req.Time.Unix()
	decodedTxs := make([]*decoded, len(req.Txs))
	errs := make([]error, len(req.Txs))
	var toVerify []int
	for i, b := range req.Txs {
		decodedTxs[i], errs[i] = DecodeTx(b)
		if errs[i] != nil {
			continue
		}
		if _, ok := app.verified[TxHash(b)]; !ok {
			toVerify = append(toVerify, i)
		}
	}
	parallel(len(toVerify), func(k int) {
		i := toVerify[k]
		errs[i] = decodedTxs[i].verifySig(s.ChainID)
	})
	results := make([]*abci.ExecTxResult, len(req.Txs))
	before := s.powers()
	for i, d := range decodedTxs {
		err := errs[i]
		var ev *event
		if err == nil {
			ev, err = s.execute(d, now)
		}
		if err != nil {
			results[i] = &abci.ExecTxResult{Code: CodeOf(err), Log: err.Error(), Codespace: "deepmarket"}
			continue
		}
		results[i] = &abci.ExecTxResult{Code: CodeOK, Events: ev.abci()}
	}
	s.Height, s.Time = req.Height, now
	if _, problems := s.CheckInvariants(); len(problems) > 0 {
		app.log.Error("ledger invariant broken: halting", "height", req.Height, "problems", problems)
		panic(fmt.Sprintf("ledger invariant broken at height %d: %s", req.Height, strings.Join(problems, "; ")))
	}
	s.AppHash = s.Hash()
	return &abci.ResponseFinalizeBlock{TxResults: results, AppHash: s.AppHash, ValidatorUpdates: s.updatesSince(before)}, nil
}

// parallel runs fn(0..n-1) on all cores.
func parallel(n int, fn func(int)) {
	if n < 16 {
		for i := 0; i < n; i++ {
			fn(i)
		}
		return
	}
	workers := runtime.GOMAXPROCS(0)
	var wg sync.WaitGroup
	next := make(chan int, n)
	for i := 0; i < n; i++ {
		next <- i
	}
	close(next)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				fn(i)
			}
		}()
	}
	wg.Wait()
}

// Commit persists the block's changes in one atomic write and resets the
// mempool view (CometBFT rechecks pending transactions next).
func (app *App) Commit(context.Context, *abci.RequestCommit) (*abci.ResponseCommit, error) {
	app.mu.Lock()
	defer app.mu.Unlock()
	if app.db != nil {
		if err := app.persist(); err != nil {
			// The block is final; failing to store it must stop the node
			// rather than let it run on with a state it cannot recover.
			panic(fmt.Sprintf("persist ledger state at height %d: %v", app.state.Height, err))
		}
	}
	if app.db != nil && app.state.Height%compactEvery == 0 {
		if err := app.compact(); err != nil {
			app.log.Warn("compact ledger state", "err", err)
		}
	}
	clear(app.state.dirty)
	clear(app.checkNonce)
	clear(app.checkSpend)
	if len(app.verified) > 100_000 {
		clear(app.verified)
	}
	return &abci.ResponseCommit{}, nil
}

// memTableSize is badger's memtable size for the ledger state (a variable
// so tests can fill level 0 quickly).
var memTableSize int64 = 16 << 20

// compactEvery is how many blocks pass between checks of level 0.
const compactEvery = 64

// compact folds level 0 into the tree once it holds four tables (each a
// flushed 16 MiB memtable), far below the 32 at which writes would stall.
func (app *App) compact() error {
	if l := app.db.Levels(); len(l) > 0 && l[0].NumTables >= 4 {
		return app.db.Flatten(1)
	}
	return nil
}

func (app *App) persist() error {
	s := app.state
	wb := app.db.NewWriteBatch()
	defer wb.Cancel()
	for key := range s.dirty {
		prefix, name, _ := strings.Cut(key, "/")
		var val []byte
		var found bool
		switch prefix + "/" {
		case pAccount:
			if a, ok := s.Accounts[name]; ok && (a.Balance != 0 || a.Nonce != 0) {
				val, found = mustEncode(a), true
			}
		case pIssuer:
			if v, ok := s.Issuers[name]; ok {
				val, found = mustEncode(v), true
			}
		case pEscrow:
			if v, ok := s.Escrows[name]; ok {
				val, found = mustEncode(v), true
			}
		case pMachine:
			if v, ok := s.Machines[name]; ok {
				val, found = mustEncode(v), true
			}
		case pValidator:
			if v, ok := s.Validators[name]; ok {
				val, found = mustEncode(v), true
			}
		case pPending:
			if v, ok := s.Pending[name]; ok {
				val, found = mustEncode(v), true
			}
		case pLink:
			if v, ok := s.Links[name]; ok {
				val, found = []byte(v), true
			}
		}
		var err error
		if found {
			err = wb.Set([]byte(key), val)
		} else {
			err = wb.Delete([]byte(key))
		}
		if err != nil {
			return err
		}
	}
	m := meta{ChainID: s.ChainID, Height: s.Height, Time: s.Time, AppHash: s.AppHash, Supply: s.Supply, Params: s.Params}
	if err := wb.Set([]byte(metaKey), mustEncode(&m)); err != nil {
		return err
	}
	return wb.Flush()
}

func mustEncode(v any) []byte {
	b, err := wire.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// Query answers reads of the state as of the last executed block (between
// FinalizeBlock and Commit that block is decided but not yet stored).
// Paths:
// /account/ADDR, /issuer/ADDR, /escrow/JOB, /machine/ADDR, /link/ADDR,
// /totals, /validators (a ValidatorSet). Values are JSON.
func (app *App) Query(_ context.Context, req *abci.RequestQuery) (*abci.ResponseQuery, error) {
	app.mu.RLock()
	defer app.mu.RUnlock()
	v, err := app.query(req.Path)
	if err != nil {
		return &abci.ResponseQuery{Code: CodeOf(err), Log: err.Error(), Height: app.state.Height}, nil
	}
	b, _ := json.Marshal(v)
	return &abci.ResponseQuery{Code: CodeOK, Value: b, Height: app.state.Height}, nil
}

// ErrNotFound is answered for queries of missing entries.
var ErrNotFound = errors.New("not found")

func (app *App) query(path string) (any, error) {
	s := app.state
	kind, arg, _ := strings.Cut(strings.TrimPrefix(path, "/"), "/")
	switch kind {
	case "account":
		if _, err := identity.ParseAddress(arg); err != nil {
			return nil, reject(CodeInvalidAddress, "%v", err)
		}
		a := Account{}
		if v, ok := s.Accounts[arg]; ok {
			a = *v
		}
		return a, nil
	case "issuer":
		if v, ok := s.Issuers[arg]; ok {
			return v, nil
		}
	case "escrow":
		if v, ok := s.Escrows[arg]; ok {
			return v, nil
		}
	case "machine":
		if v, ok := s.Machines[arg]; ok {
			return v, nil
		}
		return MachineRecord{}, nil
	case "link":
		return map[string]string{"machine": arg, "owner": s.ownerOf(arg)}, nil
	case "validators":
		return s.validatorSet(), nil
	case "totals":
		t, problems := s.CheckInvariants()
		return map[string]any{"totals": t, "problems": problems, "height": s.Height}, nil
	default:
		return nil, reject(CodeMalformed, "unknown query path %q", path)
	}
	return nil, reject(CodeUnknownEscrow, "%s %s: %v", kind, arg, ErrNotFound)
}

// Snapshot returns a deep copy of the state as of the last executed block
// (for tests, audit and the node's own reads).
func (app *App) Snapshot() *State {
	app.mu.RLock()
	defer app.mu.RUnlock()
	return app.state.clone()
}

func (s *State) clone() *State {
	c := NewState()
	c.ChainID, c.Height, c.Time, c.Supply, c.Params = s.ChainID, s.Height, s.Time, s.Supply, s.Params
	c.AppHash = append([]byte(nil), s.AppHash...)
	for k, v := range s.Accounts {
		a := *v
		c.Accounts[k] = &a
	}
	for k, v := range s.Issuers {
		a := *v
		c.Issuers[k] = &a
	}
	for k, v := range s.Links {
		c.Links[k] = v
	}
	for k, v := range s.Escrows {
		e := *v
		e.Payees = append([]string(nil), v.Payees...)
		e.Claimed = append([]Claimed(nil), v.Claimed...)
		c.Escrows[k] = &e
	}
	for k, v := range s.Machines {
		m := *v
		c.Machines[k] = &m
	}
	for k, v := range s.Validators {
		a := *v
		a.PubKey = append([]byte(nil), v.PubKey...)
		c.Validators[k] = &a
	}
	for k, v := range s.Pending {
		p := *v
		p.PubKey = append([]byte(nil), v.PubKey...)
		p.Votes = make([]PendingVote, len(v.Votes))
		for i, vote := range v.Votes {
			p.Votes[i] = PendingVote{Voter: append([]byte(nil), vote.Voter...), Power: vote.Power}
		}
		c.Pending[k] = &p
	}
	return c
}
