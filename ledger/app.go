package ledger

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	abci "github.com/cometbft/cometbft/abci/types"
	idb "github.com/cosmos/iavl/db"

	"github.com/deepmarket/deepmarket/identity"
)

// AppVersion is the version of the ledger's state machine: 2 since the
// state lives in an IAVL tree and only members sign; 3 since an unlinked
// machine's entry goes once no consent can use it (consents name a height,
// not a link nonce), escrows lock a least amount per payee and machine
// records count only paid work; 4 since a settlement opens a dispute
// window (payees lodge receipts, dispute failed marks; the escrow closes by
// itself after it) and payers have records; 5 since appeals are judged by
// drawn referees and a settlement withholds what refused rounds would have
// paid, burned when the escrow closes unless the referees uphold the
// refusal; 6 since it withholds a forfeited machine's pay the same way;
// 7 since signatures verify as ZIP-215 says (cofactored, as CometBFT's
// own), so that a block's verify in batches.
const AppVersion = 7

// App is the ledger's ABCI application. It keeps the state in memory, for
// reads, and in an authenticated store (an IAVL tree, store.go) whose root
// hash is the app hash. Opened on a directory, the store saves each
// committed block atomically, so a node killed at any moment restarts at
// the app hash of its last commit and CometBFT's handshake replays the
// rest.
type App struct {
	abci.BaseApplication

	log   *slog.Logger
	store *treeStore

	mu       sync.RWMutex
	state    *State
	prevTime int64 // the time of the block before the last one

	// Mempool view since the last commit: the next nonce and the credits
	// already spent by pending transactions of each account, and the
	// pending transactions (CometBFT checks each again after a commit).
	checkNonce map[string]uint64
	checkSpend map[string]uint64
	pending    map[[32]byte]struct{}
	// Transactions whose signatures CheckTx verified; FinalizeBlock does not
	// verify them again.
	verified map[[32]byte]struct{}
	// committed is closed when the next block is stored (see Committed).
	committed chan struct{}
}

var _ abci.Application = (*App)(nil)

func newApp(st *treeStore, log *slog.Logger) *App {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &App{log: log, store: st, state: NewState(), checkNonce: map[string]uint64{}, checkSpend: map[string]uint64{},
		pending: map[[32]byte]struct{}{}, verified: map[[32]byte]struct{}{}, committed: make(chan struct{})}
}

// Committed returns a channel closed when the next block is stored: a
// reader waiting for a transaction's effect (an escrow, say) looks again
// then, instead of polling.
func (app *App) Committed() <-chan struct{} {
	app.mu.RLock()
	defer app.mu.RUnlock()
	return app.committed
}

// NewMemoryApp returns an app whose state lives in memory only (tests,
// the audit).
func NewMemoryApp(log *slog.Logger) *App {
	st, err := openStore(idb.NewMemDB(), false)
	if err != nil {
		panic(fmt.Sprintf("in-memory ledger store: %v", err)) // an empty memory store always opens
	}
	return newApp(st, log)
}

// OpenApp opens (creating) a persistent app in dir, at the last block it
// committed. A directory an earlier release wrote is refused with
// ErrOldStateFormat.
func OpenApp(dir string, log *slog.Logger) (*App, error) {
	st, err := openDiskStore(dir)
	if err != nil {
		return nil, err
	}
	app := newApp(st, log)
	if app.state, err = st.load(); err != nil {
		st.close()
		return nil, err
	}
	app.prevTime = app.state.Time
	return app, nil
}

// Close closes the app's store.
func (app *App) Close() error { return app.store.close() }

// Info tells CometBFT where the app is, so its handshake replays any
// blocks the app has not committed.
func (app *App) Info(context.Context, *abci.RequestInfo) (*abci.ResponseInfo, error) {
	app.mu.RLock()
	defer app.mu.RUnlock()
	return &abci.ResponseInfo{
		Data: "deepmarket-ledger", Version: strconv.Itoa(AppVersion), AppVersion: AppVersion,
		LastBlockHeight: app.store.version(), LastBlockAppHash: app.store.hash(),
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
	app.mu.Lock()
	defer app.mu.Unlock()
	if app.store.version() != 0 {
		return nil, fmt.Errorf("InitChain on a ledger at height %d", app.store.version())
	}
	app.store.tree.Rollback()
	app.store.setInitialVersion(req.InitialHeight)
	s.Height = req.InitialHeight - 1
	s.markAllDirty() // the first Commit stores genesis too
	problems, err := app.store.write(s)
	if err != nil {
		return nil, fmt.Errorf("write genesis state: %w", err)
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("genesis state: %s", strings.Join(problems, "; "))
	}
	s.AppHash = app.store.workingHash()
	app.state = s
	return &abci.ResponseInitChain{AppHash: s.AppHash}, nil
}

// CheckTx admits a transaction to the mempool if its signer is a member
// (or claims or votes as State.standing allows), it is well formed and
// signed, uses the account's next nonce (counting pending ones), the
// account has fewer than MaxTxsPerBlock pending, and, for spends, the
// account can cover it with what pending transactions leave.
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
	// Standing first: a stranger's transaction costs a map lookup, not a
	// signature check. The signature is checked outside the lock: it is
	// most of the cost, and blocks may execute meanwhile. A recheck
	// trusts the first check.
	app.mu.RLock()
	_, known := app.verified[h]
	chainID := app.state.ChainID
	standing := app.state.standing(d)
	full := app.pendingFull(string(d.signer))
	app.mu.RUnlock()
	if standing != nil {
		return standing
	}
	if full != nil {
		return full
	}
	if !known || !recheck {
		if err := d.verifySig(chainID); err != nil {
			return err
		}
	}
	app.mu.Lock()
	defer app.mu.Unlock()
	s := app.state
	signer := string(d.signer)
	var committed uint64
	if a, found := s.Accounts[signer]; found {
		committed = a.Nonce
	}
	next, ok := app.checkNonce[signer]
	if !ok {
		next = committed
	}
	if d.tx.Nonce != next {
		return reject(CodeBadNonce, "nonce %d, account %s expects %d", d.tx.Nonce, signer, next)
	}
	if err := app.pendingFull(signer); err != nil {
		return err
	}
	// Every check a block would make, against the committed state (before
	// the first block, whose time is not known yet, against the clock:
	// the block re-checks by its own time)...
	now := s.Time
	if now == 0 {
		now = time.Now().Unix()
	}
	if err := s.check(d, now, next); err != nil {
		return err
	}
	// ...and spends must also fit beside those still pending.
	if spend := d.kind.spend(d.msg); spend > 0 {
		bal := s.balanceOf(signer)
		pending := app.checkSpend[signer]
		if total, ok := add(pending, spend); !ok || total > bal {
			return reject(CodeInsufficientFunds, "balance %d, pending spends %d, this spend %d", bal, pending, spend)
		}
		app.checkSpend[signer] = pending + spend
	}
	app.checkNonce[signer] = next + 1
	app.verified[h] = struct{}{}
	app.pending[h] = struct{}{}
	return nil
}

// pendingFull refuses a signer with MaxTxsPerBlock transactions pending.
func (app *App) pendingFull(signer string) error {
	next, ok := app.checkNonce[signer]
	if !ok {
		return nil
	}
	var committed uint64
	if a, found := app.state.Accounts[signer]; found {
		committed = a.Nonce
	}
	if next-committed >= app.state.Params.MaxTxsPerBlock {
		return reject(CodeRateLimited, "%s has %d transactions pending, the most allowed: wait for a block", signer, next-committed)
	}
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
// time, at most MaxTxsPerBlock of each signer (those beyond are refused
// with CodeRateLimited). Signatures not already verified by CheckTx are
// verified first, in batches on all cores (verifySigs), for signers in
// good standing; a stranger's
// transaction is refused without a signature check. The block's changes
// then go into the store and their invariants are checked (O(changes));
// a broken one halts the node: it panics outside any per-transaction
// handling. Validator votes that carried return their changes in
// ValidatorUpdates (CometBFT applies them at height H+2).
func (app *App) FinalizeBlock(_ context.Context, req *abci.RequestFinalizeBlock) (*abci.ResponseFinalizeBlock, error) {
	app.mu.Lock()
	defer app.mu.Unlock()
	s := app.state
	if v := app.store.workingVersion(); req.Height != v {
		return nil, fmt.Errorf("block %d, but the ledger's store is ready for height %d", req.Height, v)
	}
	now := req.Time.Unix()
	seed := sha256.Sum256(append(append(append([]byte(nil), req.Hash...), s.AppHash...), strconv.FormatInt(req.Height, 10)...))
	s.seed = seed[:]
	// Before the transactions: a consent this block could carry never
	// needs an entry pruned here.
	s.pruneLinks(req.Height)
	// Settled escrows whose dispute window ended close before the
	// block's transactions: none of them may lodge or dispute any more.
	s.closeSettled(now)
	decodedTxs := make([]*decoded, len(req.Txs))
	errs := make([]error, len(req.Txs))
	checked := make([]bool, len(req.Txs))
	var toVerify []int
	for i, b := range req.Txs {
		decodedTxs[i], errs[i] = DecodeTx(b)
		if errs[i] != nil {
			continue
		}
		if _, ok := app.verified[TxHash(b)]; ok {
			checked[i] = true
		} else if s.standing(decodedTxs[i]) == nil {
			toVerify = append(toVerify, i)
		}
	}
	batch := make([]*decoded, len(toVerify))
	for k, i := range toVerify {
		batch[k] = decodedTxs[i]
	}
	for k, err := range verifySigs(batch, s.ChainID) {
		errs[toVerify[k]], checked[toVerify[k]] = err, true
	}
	results := make([]*abci.ExecTxResult, len(req.Txs))
	before := s.powers()
	perSigner := map[string]uint64{}
	for i, d := range decodedTxs {
		err := errs[i]
		if err == nil && !checked[i] {
			// Not in good standing when the block began: it may have been
			// admitted since, earlier in this block.
			if err = s.standing(d); err == nil {
				err = d.verifySig(s.ChainID)
			}
		}
		if err == nil {
			if perSigner[string(d.signer)]++; perSigner[string(d.signer)] > s.Params.MaxTxsPerBlock {
				err = reject(CodeRateLimited, "more than %d transactions of %s in one block", s.Params.MaxTxsPerBlock, d.signer)
			}
		}
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
	app.prevTime = s.Time
	s.Height, s.Time = req.Height, now
	problems, err := app.store.write(s)
	if err != nil {
		panic(fmt.Sprintf("write ledger state at height %d: %v", req.Height, err))
	}
	if len(problems) > 0 {
		app.log.Error("ledger invariant broken: halting", "height", req.Height, "problems", problems)
		panic(fmt.Sprintf("ledger invariant broken at height %d: %s", req.Height, strings.Join(problems, "; ")))
	}
	s.AppHash = app.store.workingHash()
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

// Commit saves the block in the store (one atomic write) and resets the
// mempool view (CometBFT rechecks pending transactions next).
func (app *App) Commit(context.Context, *abci.RequestCommit) (*abci.ResponseCommit, error) {
	app.mu.Lock()
	defer app.mu.Unlock()
	s := app.state
	if err := app.store.save(s.Height, s.Time, app.prevTime); err != nil {
		// The block is final; failing to store it must stop the node
		// rather than let it run on with a state it cannot recover.
		panic(fmt.Sprintf("save ledger state at height %d: %v", s.Height, err))
	}
	// New maps, not cleared ones: a cleared map keeps its size, and every
	// block would walk the buckets genesis (every key dirty) left.
	s.dirty = map[string]bool{}
	clear(app.checkNonce)
	clear(app.checkSpend)
	clear(app.pending)
	if len(app.verified) > 100_000 {
		clear(app.verified)
	}
	close(app.committed)
	app.committed = make(chan struct{})
	return &abci.ResponseCommit{}, nil
}

// Query answers reads of the state as of the last executed block (between
// FinalizeBlock and Commit that block is decided but not yet stored).
// Paths (values are JSON):
//
//	/account/ADDR       AccountView
//	/issuer/ADDR        Issuer
//	/member/ADDR        Membership
//	/registration/ADDR  Registration (a machine's owner and link height; /link/ADDR too)
//	/escrow/JOB         Escrow
//	/cases/ADDR         []Docket: the open appeals that drew ADDR as a referee and wait for its vote
//	/machine/ADDR       MachineRecord
//	/pending/HASH       PendingTx: whether this node's mempool holds the transaction
//	/totals             the books
//	/validators         ValidatorSet
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

// AccountView is the answer to /account/ADDR: the account, and the next
// nonce counting the transactions this node's mempool holds.
type AccountView struct {
	Account
	PendingNonce uint64 `json:"pending_nonce"`
}

// Membership is the answer to /member/ADDR.
type Membership struct {
	Address    string `json:"address"`
	Member     bool   `json:"member"`
	AdmittedBy string `json:"admitted_by,omitempty"` // an issuer's account, or "genesis"
	Issuer     bool   `json:"issuer"`
}

// Registration is the answer to /registration/ADDR: whom a machine earns
// for, the height of the link's last change (0: never, or long ago) and of
// the state read (a consent names a height between the two), and whether
// it is registered (it earns for a member).
type Registration struct {
	Machine    string `json:"machine"`
	Owner      string `json:"owner"`
	Changed    int64  `json:"changed"`
	Height     int64  `json:"height"`
	Registered bool   `json:"registered"`
}

// PendingTx is the answer to /pending/HASH.
type PendingTx struct {
	Hash    string `json:"hash"`
	Pending bool   `json:"pending"`
}

func (app *App) query(path string) (any, error) {
	s := app.state
	kind, arg, _ := strings.Cut(strings.TrimPrefix(path, "/"), "/")
	switch kind {
	case "account":
		if _, err := identity.ParseAddress(arg); err != nil {
			return nil, reject(CodeInvalidAddress, "%v", err)
		}
		a := AccountView{}
		if v, ok := s.Accounts[arg]; ok {
			a.Account = *v
		}
		a.PendingNonce = a.Nonce
		if n, ok := app.checkNonce[arg]; ok {
			a.PendingNonce = n
		}
		return a, nil
	case "issuer":
		if v, ok := s.Issuers[arg]; ok {
			return v, nil
		}
	case "member":
		if _, err := identity.ParseAddress(arg); err != nil {
			return nil, reject(CodeInvalidAddress, "%v", err)
		}
		m := Membership{Address: arg}
		if v, ok := s.Members[arg]; ok {
			m.Member, m.AdmittedBy = true, v.By
		}
		_, m.Issuer = s.Issuers[arg]
		return m, nil
	case "registration", "link":
		if _, err := identity.ParseAddress(arg); err != nil {
			return nil, reject(CodeInvalidAddress, "%v", err)
		}
		l := s.link(arg)
		return Registration{Machine: arg, Owner: l.Owner, Changed: l.Changed, Height: s.Height, Registered: s.isMember(l.Owner)}, nil
	case "escrow":
		if v, ok := s.Escrows[arg]; ok {
			return v, nil
		}
	case "cases":
		if _, err := identity.ParseAddress(arg); err != nil {
			return nil, reject(CodeInvalidAddress, "%v", err)
		}
		return s.docket(arg), nil
	case "machine":
		if v, ok := s.Machines[arg]; ok {
			return v, nil
		}
		return MachineRecord{}, nil
	case "payer":
		if v, ok := s.Payers[arg]; ok {
			return v, nil
		}
		return PayerRecord{}, nil
	case "pending":
		raw, err := hex.DecodeString(arg)
		if err != nil || len(raw) != 32 {
			return nil, reject(CodeMalformed, "transaction hash %q: want 64 hex digits", arg)
		}
		_, ok := app.pending[[32]byte(raw)]
		return PendingTx{Hash: strings.ToUpper(arg), Pending: ok}, nil
	case "validators":
		return s.validatorSet(), nil
	case "totals":
		return map[string]any{"totals": s.Totals(), "problems": []string{}, "height": s.Height,
			"accounts": s.books.Accounts, "escrows": s.books.Escrows, "members": s.books.Members, "links": s.books.Links}, nil
	default:
		return nil, reject(CodeMalformed, "unknown query path %q", path)
	}
	return nil, reject(CodeUnknownEscrow, "%s %s: %v", kind, arg, ErrNotFound)
}

// MachineOwner is the account machine earns for (itself when it has no
// link), and whether it is registered: that account is a member. It reads
// the state as of the last executed block, in O(1), for the node's
// gossip validation.
func (app *App) MachineOwner(machine identity.Address) (owner identity.Address, registered bool) {
	app.mu.RLock()
	defer app.mu.RUnlock()
	o, ok := app.state.registered(string(machine))
	return identity.Address(o), ok
}

// IsMember reports whether an issuer admitted a (or genesis made it a
// member).
func (app *App) IsMember(a identity.Address) bool {
	app.mu.RLock()
	defer app.mu.RUnlock()
	return app.state.isMember(string(a))
}

// BalanceOf is a's balance, micro-credits.
func (app *App) BalanceOf(a identity.Address) uint64 {
	app.mu.RLock()
	defer app.mu.RUnlock()
	return app.state.balanceOf(string(a))
}

// PayerRecordOf is payer's record (the zero record if it has none).
func (app *App) PayerRecordOf(payer identity.Address) PayerRecord {
	app.mu.RLock()
	defer app.mu.RUnlock()
	if r, ok := app.state.Payers[string(payer)]; ok {
		return *r
	}
	return PayerRecord{}
}

// EscrowOf is job's open escrow as of the last executed block (a copy),
// and whether there is one: a lending machine's hot-path read.
func (app *App) EscrowOf(job string) (Escrow, bool) {
	app.mu.RLock()
	defer app.mu.RUnlock()
	e, ok := app.state.Escrows[job]
	if !ok {
		return Escrow{}, false
	}
	return *e.clone(), true
}

// Height is the last block the app executed.
func (app *App) Height() int64 {
	app.mu.RLock()
	defer app.mu.RUnlock()
	return app.state.Height
}

// Params are the chain's rules (zero before InitChain).
func (app *App) Params() Params {
	app.mu.RLock()
	defer app.mu.RUnlock()
	return app.state.Params
}

// Snapshot returns a deep copy of the state as of the last executed block
// (for tests and the audit; O(n)).
func (app *App) Snapshot() *State {
	app.mu.RLock()
	defer app.mu.RUnlock()
	return app.state.clone()
}

// Verify checks the whole state (O(n)): every invariant, the books kept
// block by block against the entries, and every leaf of the store
// against the entry it should hold. It returns the problems found.
func (app *App) Verify() []string {
	app.mu.RLock()
	defer app.mu.RUnlock()
	_, problems := app.state.CheckInvariants()
	return append(problems, app.store.verify(app.state)...)
}
