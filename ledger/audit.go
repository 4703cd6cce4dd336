package ledger

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"

	abci "github.com/cometbft/cometbft/abci/types"
	cmted "github.com/cometbft/cometbft/crypto/ed25519"
	rpchttp "github.com/cometbft/cometbft/rpc/client/http"
	ctypes "github.com/cometbft/cometbft/rpc/core/types"
)

// AuditRPC is what the audit reads from a node: genesis, blocks and the
// app's latest state, all over CometBFT's RPC.
type AuditRPC interface {
	Genesis(ctx context.Context) (*ctypes.ResultGenesis, error)
	Status(ctx context.Context) (*ctypes.ResultStatus, error)
	ABCIInfo(ctx context.Context) (*ctypes.ResultABCIInfo, error)
	Block(ctx context.Context, height *int64) (*ctypes.ResultBlock, error)
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
	OK       bool          `json:"ok"`
	ChainID  string        `json:"chain_id"`
	Height   int64         `json:"height"`
	AppHash  string        `json:"app_hash"`
	Txs      int           `json:"txs"`    // transactions replayed
	TxsOK    int           `json:"txs_ok"` // of which the ledger accepted
	Supply   uint64        `json:"supply"`
	Balances uint64        `json:"balances"`
	Escrowed uint64        `json:"escrowed"`
	Problems []string      `json:"problems"`
	Accounts []AccountFlow `json:"accounts"`
}

// Audit replays the chain served at rpcURL (CometBFT RPC, e.g.
// http://127.0.0.1:7703) from genesis in a fresh in-memory ledger. See
// AuditWith.
func Audit(ctx context.Context, rpcURL string, progress func(height, latest int64)) (*AuditReport, error) {
	cl, err := rpchttp.New(rpcURL, "/websocket")
	if err != nil {
		return nil, fmt.Errorf("audit: RPC %s: %w", rpcURL, err)
	}
	return AuditWith(ctx, cl, progress)
}

// AuditWith fetches every block from genesis, re-executes each in a fresh
// in-memory app, compares the app hash after every block with the one the
// chain committed to (in the next block's header), checks every invariant
// after every block, and reports the books. A mismatch or broken invariant
// makes the report not OK; errors are for an audit that could not run.
func AuditWith(ctx context.Context, rpc AuditRPC, progress func(height, latest int64)) (*AuditReport, error) {
	gen, err := rpc.Genesis(ctx)
	if err != nil {
		return nil, fmt.Errorf("audit: fetch genesis: %w", err)
	}
	doc := gen.Genesis
	st, err := rpc.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("audit: node status: %w", err)
	}
	latest := st.SyncInfo.LatestBlockHeight
	rep := &AuditReport{ChainID: doc.ChainID, Problems: []string{}, Accounts: []AccountFlow{}}
	app := NewMemoryApp(nil)
	// The genesis validators, as CometBFT's handshake hands them over.
	init := &abci.RequestInitChain{ChainId: doc.ChainID, InitialHeight: doc.InitialHeight, AppStateBytes: doc.AppState}
	for _, v := range doc.Validators {
		if v.PubKey == nil || v.PubKey.Type() != cmted.KeyType {
			return nil, fmt.Errorf("audit: genesis validator %s: only ed25519 validators are supported", v.Name)
		}
		init.Validators = append(init.Validators, abci.Ed25519ValidatorUpdate(v.PubKey.Bytes(), v.Power))
	}
	if _, err := app.InitChain(ctx, init); err != nil {
		return nil, fmt.Errorf("audit: genesis app state: %w", err)
	}
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
	for h := doc.InitialHeight; h <= latest; h++ {
		b := <-blocks
		if b.err != nil {
			return nil, fmt.Errorf("audit: block %d: %w", h, b.err)
		}
		hdr := b.res.Block.Header
		if !bytes.Equal(hdr.AppHash, app.state.AppHash) {
			rep.Problems = append(rep.Problems, fmt.Sprintf("height %d: chain says app hash %X before it, replay gives %X", h, hdr.AppHash, app.state.AppHash))
		}
		req := &abci.RequestFinalizeBlock{Height: h, Time: hdr.Time, Hash: b.res.Block.Hash()}
		for _, tx := range b.res.Block.Txs {
			req.Txs = append(req.Txs, tx)
		}
		resp, err := replayBlock(ctx, app, req)
		if err != nil {
			rep.Problems = append(rep.Problems, fmt.Sprintf("height %d: %v", h, err))
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
				rep.Problems = append(rep.Problems, fmt.Sprintf("height %d: %s", h, p))
			}
		}
		if _, err := app.Commit(ctx, &abci.RequestCommit{}); err != nil {
			return nil, err
		}
		if progress != nil {
			progress(h, latest)
		}
	}
	// The app hash after the last block is in no header yet; the node's
	// app reports it.
	if info, err := rpc.ABCIInfo(ctx); err == nil && info.Response.LastBlockHeight == latest {
		if !bytes.Equal(info.Response.LastBlockAppHash, app.state.AppHash) {
			rep.Problems = append(rep.Problems, fmt.Sprintf("height %d: node's app hash %X, replay gives %X", latest, info.Response.LastBlockAppHash, app.state.AppHash))
		}
	}
	totals, problems := app.state.CheckInvariants()
	rep.Problems = append(rep.Problems, problems...)
	rep.Height, rep.AppHash = latest, fmt.Sprintf("%X", app.state.AppHash)
	rep.Supply, rep.Balances, rep.Escrowed = totals.Supply, totals.Balances, totals.Escrowed
	for _, f := range flows {
		f.Balance = app.state.balanceOf(f.Address)
		rep.Accounts = append(rep.Accounts, *f)
	}
	sort.Slice(rep.Accounts, func(i, j int) bool { return rep.Accounts[i].Address < rep.Accounts[j].Address })
	rep.OK = len(rep.Problems) == 0
	return rep, nil
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
