package ledger

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"sort"
	"strings"
	"sync"

	abci "github.com/cometbft/cometbft/abci/types"
	cmted "github.com/cometbft/cometbft/crypto/ed25519"
	cmtjson "github.com/cometbft/cometbft/libs/json"
	rpchttp "github.com/cometbft/cometbft/rpc/client/http"
	ctypes "github.com/cometbft/cometbft/rpc/core/types"
	cmttypes "github.com/cometbft/cometbft/types"
)

// AuditRPC is what the audit reads from a node: genesis, blocks, the last
// block's commit and the app's latest state, all over CometBFT's RPC.
type AuditRPC interface {
	Genesis(ctx context.Context) (*ctypes.ResultGenesis, error)
	Status(ctx context.Context) (*ctypes.ResultStatus, error)
	ABCIInfo(ctx context.Context) (*ctypes.ResultABCIInfo, error)
	Block(ctx context.Context, height *int64) (*ctypes.ResultBlock, error)
	Commit(ctx context.Context, height *int64) (*ctypes.ResultCommit, error)
}

// AuditOptions configures an audit.
type AuditOptions struct {
	// Genesis pins the chain the audit accepts: it starts from this
	// genesis and trusts only its validators (and those they vote in).
	// Nil takes the genesis the node serves: the audit then proves the
	// node's chain consistent with a genesis the node chose, which a fork
	// with the same chain ID passes. Pinning is what protects, so such an
	// audit is not OK (its first problem says what was trusted) unless
	// TrustServedGenesis accepts the served genesis.
	Genesis *cmttypes.GenesisDoc
	// TrustServedGenesis accepts the genesis the node serves when Genesis
	// is nil; the report still says it was not pinned.
	TrustServedGenesis bool
	// GenesisSource says where Genesis came from (a file), for the report.
	GenesisSource string
	// Progress, if set, is called after each block.
	Progress func(height, latest int64)
}

// AccountFlow is what moved through one account over the whole chain.
type AccountFlow struct {
	Address string `json:"address"`
	Balance uint64 `json:"balance"`
	In      uint64 `json:"in"`
	Out     uint64 `json:"out"`
}

// AuditReport is `ledger audit --json`.
type AuditReport struct {
	OK      bool   `json:"ok"`
	ChainID string `json:"chain_id"`
	// Genesis says which genesis the audit started from: a file (pinned),
	// or "as served by" the node (not pinned).
	Genesis     string `json:"genesis"`
	GenesisHash string `json:"genesis_hash"` // SHA-256 of its canonical JSON
	// Pinned is whether the genesis was the caller's own (a file), not
	// the one the node served.
	Pinned   bool          `json:"genesis_pinned"`
	Height   int64         `json:"height"`
	AppHash  string        `json:"app_hash"`
	Commits  int           `json:"commits_verified"` // blocks whose commit signatures were verified
	Txs      int           `json:"txs"`              // transactions replayed
	TxsOK    int           `json:"txs_ok"`           // of which the ledger accepted
	Supply   uint64        `json:"supply"`
	Balances uint64        `json:"balances"`
	Escrowed uint64        `json:"escrowed"`
	Staked   uint64        `json:"staked"`
	Burned   uint64        `json:"burned"` // withheld for refused rounds, out of the supply
	Problems []string      `json:"problems"`
	Accounts []AccountFlow `json:"accounts"`
}

// Audit replays the chain served at rpcURL (CometBFT RPC, e.g.
// http://127.0.0.1:7703) from genesis. See AuditWith.
func Audit(ctx context.Context, rpcURL string, opts AuditOptions) (*AuditReport, error) {
	cl, err := rpchttp.New(rpcURL, "/websocket")
	if err != nil {
		return nil, fmt.Errorf("audit: RPC %s: %w", rpcURL, err)
	}
	return audit(ctx, cl, opts, "as served by "+rpcURL)
}

// AuditWith is a light client of the chain rpc serves, and replays it.
// From the genesis (opts.Genesis, else the node's) it tracks the
// validator set (genesis' validators, then the changes its own replay
// returns, from height H+2 as CometBFT applies them), and for every block
// it checks that more than 2/3 of that set signed its commit, that the
// block's transactions are the ones its header commits to, and that the
// header names the set the audit tracks. It re-executes each block in a
// fresh in-memory ledger, compares the app hash after every block with
// the one the chain committed to (in the next block's header), checks
// every invariant after every block (the full, O(n) check), and reports
// the books. A failed check makes the report not OK; a commit that does
// not verify ends the audit there. Errors are for an audit that could not
// run.
func AuditWith(ctx context.Context, rpc AuditRPC, opts AuditOptions) (*AuditReport, error) {
	return audit(ctx, rpc, opts, "as served by the node")
}

func audit(ctx context.Context, rpc AuditRPC, opts AuditOptions, served string) (*AuditReport, error) {
	ctx, cancel := context.WithCancel(ctx) // ends the prefetching of an audit that stops early
	defer cancel()
	doc, source := opts.Genesis, opts.GenesisSource
	if doc == nil {
		gen, err := rpc.Genesis(ctx)
		if err != nil {
			return nil, fmt.Errorf("audit: fetch genesis: %w", err)
		}
		doc, source = gen.Genesis, served
	} else if source == "" {
		source = "given"
	}
	if err := doc.ValidateAndComplete(); err != nil {
		return nil, fmt.Errorf("audit: genesis: %w", err)
	}
	docJSON, err := cmtjson.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("audit: genesis: %w", err)
	}
	sum := sha256.Sum256(docJSON)
	rep := &AuditReport{ChainID: doc.ChainID, Genesis: source, GenesisHash: fmt.Sprintf("%X", sum[:]), Pinned: opts.Genesis != nil,
		Problems: []string{}, Accounts: []AccountFlow{}}
	if !rep.Pinned && !opts.TrustServedGenesis {
		rep.Problems = append(rep.Problems, fmt.Sprintf("genesis not pinned: the audit trusted the genesis %s (sha256 %s), "+
			"so it proves only that the chain agrees with a genesis the node chose (a fork with the same chain ID passes): "+
			"audit against the genesis you trust", source, rep.GenesisHash))
	}
	fail := func(h int64, format string, args ...any) {
		rep.Problems = append(rep.Problems, fmt.Sprintf("height %d: ", h)+fmt.Sprintf(format, args...))
	}
	st, err := rpc.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("audit: node status: %w", err)
	}
	if st.NodeInfo.Network != doc.ChainID {
		rep.Problems = append(rep.Problems, fmt.Sprintf("the node is on chain %q, the genesis is for %q", st.NodeInfo.Network, doc.ChainID))
		return rep, nil
	}
	latest := st.SyncInfo.LatestBlockHeight
	app := NewMemoryApp(nil)
	defer app.Close()
	// The genesis validators, as CometBFT's handshake hands them over and
	// as its light client trusts them.
	init := &abci.RequestInitChain{ChainId: doc.ChainID, InitialHeight: doc.InitialHeight, AppStateBytes: doc.AppState}
	var genVals []*cmttypes.Validator
	for _, v := range doc.Validators {
		if v.PubKey == nil || v.PubKey.Type() != cmted.KeyType {
			return nil, fmt.Errorf("audit: genesis validator %s: only ed25519 validators are supported", v.Name)
		}
		init.Validators = append(init.Validators, abci.Ed25519ValidatorUpdate(v.PubKey.Bytes(), v.Power))
		genVals = append(genVals, cmttypes.NewValidator(v.PubKey, v.Power))
	}
	if _, err := app.InitChain(ctx, init); err != nil {
		return nil, fmt.Errorf("audit: genesis app state: %w", err)
	}
	// vals is the set that signs height h, next the one for h+1: a
	// change FinalizeBlock returns at h applies from h+2.
	vals := cmttypes.NewValidatorSet(genVals)
	next := vals.Copy()

	flows := map[string]*AccountFlow{}
	prev := map[string]uint64{}
	track := func() {
		for key := range app.state.dirty {
			addr, ok := strings.CutPrefix(key, pAccount)
			if !ok {
				continue
			}
			now := app.state.balanceOf(addr)
			f := flows[addr]
			if f == nil {
				f = &AccountFlow{Address: addr}
				flows[addr] = f
			}
			if was := prev[addr]; now > was {
				f.In += now - was
			} else {
				f.Out += was - now
			}
			prev[addr] = now
		}
	}
	track() // genesis balances count as inflow

	blocks := prefetch(ctx, rpc, doc.InitialHeight, latest)
	var b *ctypes.ResultBlock
	if latest >= doc.InitialHeight {
		f := <-blocks
		if f.err != nil {
			return nil, fmt.Errorf("audit: block %d: %w", doc.InitialHeight, f.err)
		}
		b = f.res
	}
	for h := doc.InitialHeight; h <= latest; h++ {
		// The commit of block h: in block h+1, or the node's for the last.
		var commit *cmttypes.Commit
		var following *ctypes.ResultBlock
		if h < latest {
			f := <-blocks
			if f.err != nil {
				return nil, fmt.Errorf("audit: block %d: %w", h+1, f.err)
			}
			following, commit = f.res, f.res.Block.LastCommit
		} else {
			c, err := rpc.Commit(ctx, &h)
			if err != nil {
				return nil, fmt.Errorf("audit: commit of block %d: %w", h, err)
			}
			commit = c.Commit
		}
		if !verifyBlock(rep, b.Block, commit, vals, next, doc.ChainID, h) {
			rep.Height = h
			return rep, nil
		}
		rep.Commits++
		hdr := b.Block.Header
		if !bytes.Equal(hdr.AppHash, app.state.AppHash) {
			fail(h, "chain says app hash %X before it, replay gives %X", hdr.AppHash, app.state.AppHash)
		}
		req := &abci.RequestFinalizeBlock{Height: h, Time: hdr.Time, Hash: b.Block.Hash()}
		for _, tx := range b.Block.Txs {
			req.Txs = append(req.Txs, tx)
		}
		resp, err := replayBlock(ctx, app, req)
		if err != nil {
			fail(h, "%v", err)
			rep.Height = h
			return rep, nil
		}
		for _, r := range resp.TxResults {
			rep.Txs++
			if r.Code == CodeOK {
				rep.TxsOK++
			}
		}
		track()
		if _, problems := app.state.CheckInvariants(); len(problems) > 0 {
			for _, p := range problems {
				fail(h, "%s", p)
			}
		}
		if _, err := app.Commit(ctx, &abci.RequestCommit{}); err != nil {
			return nil, err
		}
		changes, err := cmttypes.PB2TM.ValidatorUpdates(resp.ValidatorUpdates)
		if err != nil {
			fail(h, "validator updates: %v", err)
			rep.Height = h
			return rep, nil
		}
		after := next.Copy()
		if err := after.UpdateWithChangeSet(changes); err != nil {
			fail(h, "validator updates: %v", err)
			rep.Height = h
			return rep, nil
		}
		vals, next = next, after
		b = following
		if opts.Progress != nil {
			opts.Progress(h, latest)
		}
	}
	// The app hash after the last block is in no header yet; the node's
	// app reports it.
	if info, err := rpc.ABCIInfo(ctx); err == nil && info.Response.LastBlockHeight == latest {
		if !bytes.Equal(info.Response.LastBlockAppHash, app.state.AppHash) {
			fail(latest, "node's app hash %X, replay gives %X", info.Response.LastBlockAppHash, app.state.AppHash)
		}
	}
	rep.Problems = append(rep.Problems, app.Verify()...)
	totals := app.state.Totals()
	rep.Height, rep.AppHash = latest, fmt.Sprintf("%X", app.state.AppHash)
	rep.Supply, rep.Balances, rep.Escrowed, rep.Staked, rep.Burned = totals.Supply, totals.Balances, totals.Escrowed, totals.Staked, totals.Burned
	for _, f := range flows {
		f.Balance = app.state.balanceOf(f.Address)
		rep.Accounts = append(rep.Accounts, *f)
	}
	sort.Slice(rep.Accounts, func(i, j int) bool { return rep.Accounts[i].Address < rep.Accounts[j].Address })
	rep.OK = len(rep.Problems) == 0
	return rep, nil
}

// verifyBlock checks block h as a light client would: it is well formed
// (its transactions and last commit are the ones its header commits to),
// it names the validator sets the audit tracks, and more than 2/3 of the
// set signed its commit. It reports what fails and returns false.
func verifyBlock(rep *AuditReport, b *cmttypes.Block, commit *cmttypes.Commit, vals, next *cmttypes.ValidatorSet, chainID string, h int64) bool {
	fail := func(format string, args ...any) bool {
		rep.Problems = append(rep.Problems, fmt.Sprintf("height %d: ", h)+fmt.Sprintf(format, args...))
		return false
	}
	if err := b.ValidateBasic(); err != nil {
		return fail("the block does not hold what its header commits to: %v", err)
	}
	if b.ChainID != chainID || b.Height != h {
		return fail("the node served block %d of chain %q", b.Height, b.ChainID)
	}
	if commit == nil {
		return fail("no commit")
	}
	if !bytes.Equal(commit.BlockID.Hash, b.Hash()) {
		return fail("the commit is for block %X, the node served block %X", commit.BlockID.Hash, b.Hash())
	}
	if err := vals.VerifyCommitLight(chainID, commit.BlockID, h, commit); err != nil {
		return fail("the commit is not signed by more than 2/3 of the validator set the audit tracks from the genesis (%v): "+
			"this is not the chain of that genesis", err)
	}
	if !bytes.Equal(b.ValidatorsHash, vals.Hash()) || !bytes.Equal(b.NextValidatorsHash, next.Hash()) {
		return fail("the header names validator sets %X and %X, the audit tracks %X and %X",
			b.ValidatorsHash, b.NextValidatorsHash, vals.Hash(), next.Hash())
	}
	return true
}

// replayBlock executes one block, turning the app's halt on a broken
// invariant into a finding.
func replayBlock(ctx context.Context, app *App, req *abci.RequestFinalizeBlock) (resp *abci.ResponseFinalizeBlock, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("replay halted: %v", r)
		}
	}()
	return app.FinalizeBlock(ctx, req)
}

type fetched struct {
	res *ctypes.ResultBlock
	err error
}

// prefetch fetches blocks from..to with a few requests in flight and
// delivers them in order.
func prefetch(ctx context.Context, rpc AuditRPC, from, to int64) <-chan fetched {
	const inFlight = 8
	out := make(chan fetched, inFlight)
	go func() {
		defer close(out)
		slots := make(chan chan fetched, inFlight)
		var wg sync.WaitGroup
		go func() {
			defer close(slots)
			for h := from; h <= to; h++ {
				slot := make(chan fetched, 1)
				select {
				case slots <- slot:
				case <-ctx.Done():
					return
				}
				wg.Add(1)
				go func(h int64) {
					defer wg.Done()
					res, err := rpc.Block(ctx, &h)
					slot <- fetched{res, err}
				}(h)
			}
		}()
		for slot := range slots {
			f := <-slot
			select {
			case out <- f:
			case <-ctx.Done():
				return
			}
			if f.err != nil {
				return
			}
		}
		wg.Wait()
	}()
	return out
}
