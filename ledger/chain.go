package ledger

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	dbm "github.com/cometbft/cometbft-db"

	abci "github.com/cometbft/cometbft/abci/types"
	cfg "github.com/cometbft/cometbft/config"
	cmted "github.com/cometbft/cometbft/crypto/ed25519"
	cmtlog "github.com/cometbft/cometbft/libs/log"
	"github.com/cometbft/cometbft/libs/service"
	nm "github.com/cometbft/cometbft/node"
	cmtp2p "github.com/cometbft/cometbft/p2p"
	"github.com/cometbft/cometbft/privval"
	"github.com/cometbft/cometbft/proxy"
	rpclocal "github.com/cometbft/cometbft/rpc/client/local"
	cmttypes "github.com/cometbft/cometbft/types"

	"github.com/deepmarket/deepmarket/identity"
)

// ChainParams configures a CometBFT node running an ABCI app in-process.
type ChainParams struct {
	Dir     string        // CometBFT's home: config/ and data/
	Key     *identity.Key // the validator key and CometBFT node key
	Genesis *cmttypes.GenesisDoc
	App     abci.Application
	// P2PListen and RPCListen are CometBFT's addresses, e.g.
	// "tcp://127.0.0.1:26656"; RPC empty disables it.
	P2PListen, RPCListen string
	Peers                []string // persistent peers: "ID@host:port"
	Logger               *slog.Logger
	// Metrics registers CometBFT's metrics in Prometheus' default registry.
	// They are process-wide: only the first chain of a process gets them.
	Metrics bool
	// Configure adjusts CometBFT's config last (timeouts in tests, ...).
	Configure func(*cfg.Config)
}

// Chain is a running CometBFT node.
type Chain struct {
	node *nm.Node
	cfg  *cfg.Config
	dbs  *openDBs
}

// openDBs remembers every database CometBFT opens, for two defects of
// CometBFT v0.40.0 seen in tests: its node does not close the transaction
// index on Stop (a restart in the same process could not open it), and a
// consensus routine may read the block store after Stop closed it, which
// panics the whole process ("leveldb: closed"). Each database is wrapped so
// that reads after Close find nothing instead.
type openDBs struct {
	mu  sync.Mutex
	all []*guardedDB
}

func (o *openDBs) provider(ctx *cfg.DBContext) (dbm.DB, error) {
	db, err := cfg.DefaultDBProvider(ctx)
	if err != nil {
		return nil, err
	}
	g := &guardedDB{DB: db}
	o.mu.Lock()
	o.all = append(o.all, g)
	o.mu.Unlock()
	return g, nil
}

func (o *openDBs) closeAll() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, db := range o.all {
		db.Close()
	}
	o.all = nil
}

// guardedDB answers reads after Close as if the key were absent.
type guardedDB struct {
	dbm.DB
	closed atomic.Bool
}

func (g *guardedDB) Close() error {
	if g.closed.Swap(true) {
		return nil
	}
	return g.DB.Close()
}

func (g *guardedDB) Get(key []byte) ([]byte, error) {
	if g.closed.Load() {
		return nil, nil
	}
	return g.DB.Get(key)
}

func (g *guardedDB) Has(key []byte) (bool, error) {
	if g.closed.Load() {
		return false, nil
	}
	return g.DB.Has(key)
}

var metricsOnce sync.Once

// StartChain runs the app behind one ABCI client per connection (the app
// locks its own state), so the mempool's CheckTx need not wait for blocks.
// It writes CometBFT's files if missing (genesis, validator key and
// its last-sign state, node key) and starts the node; the handshake with
// the app replays whatever blocks the app has not committed.
func StartChain(p ChainParams) (*Chain, error) {
	c := cfg.DefaultConfig()
	c.SetRoot(p.Dir)
	c.Moniker = "deepmarket"
	c.P2P.ListenAddress = p.P2PListen
	c.P2P.PersistentPeers = joinComma(p.Peers)
	c.P2P.AllowDuplicateIP = true
	c.P2P.AddrBookStrict = false
	c.RPC.ListenAddress = p.RPCListen
	c.Instrumentation.Prometheus = false
	c.TxIndex.Indexer = "kv"
	if p.Configure != nil {
		p.Configure(c)
	}
	for _, d := range []string{filepath.Join(p.Dir, "config"), filepath.Join(p.Dir, "data")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("chain dir: %w", err)
		}
	}
	if err := c.ValidateBasic(); err != nil {
		return nil, fmt.Errorf("CometBFT config: %w", err)
	}
	if _, err := os.Stat(c.GenesisFile()); err != nil {
		if err := p.Genesis.SaveAs(c.GenesisFile()); err != nil {
			return nil, fmt.Errorf("write genesis: %w", err)
		}
	}
	priv := cmted.PrivKey(p.Key.Ed25519())
	var pv *privval.FilePV
	if _, err := os.Stat(c.PrivValidatorStateFile()); err == nil {
		pv = privval.LoadFilePV(c.PrivValidatorKeyFile(), c.PrivValidatorStateFile())
	} else {
		pv = privval.NewFilePV(priv, c.PrivValidatorKeyFile(), c.PrivValidatorStateFile())
		pv.Save()
	}
	log := p.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	metrics := nm.DefaultMetricsProvider(c.Instrumentation)
	if p.Metrics {
		metricsOnce.Do(func() {
			ic := *c.Instrumentation
			ic.Prometheus = true
			metrics = nm.DefaultMetricsProvider(&ic)
		})
	}
	dbs := &openDBs{}
	node, err := nm.NewNode(c, pv, &cmtp2p.NodeKey{PrivKey: priv}, proxy.NewConnSyncLocalClientCreator(p.App),
		nm.DefaultGenesisDocProviderFunc(c), dbs.provider, metrics, slogAdapter{log})
	if err != nil {
		dbs.closeAll()
		return nil, fmt.Errorf("create CometBFT node: %w", err)
	}
	if err := node.Start(); err != nil {
		dbs.closeAll()
		return nil, fmt.Errorf("start CometBFT node: %w", err)
	}
	return &Chain{node: node, cfg: c, dbs: dbs}, nil
}

// Stop stops the node and waits for it, and for its address book's last
// save (CometBFT's node does not wait for that goroutine, which otherwise
// writes into the directory after Stop returned).
func (c *Chain) Stop() error {
	defer c.dbs.closeAll()
	if !c.node.IsRunning() {
		return nil
	}
	began := time.Now()
	err := c.node.Stop()
	c.node.Wait()
	if c.cfg.P2P.PexReactor {
		book := c.cfg.P2P.AddrBookFile()
		for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if st, err := os.Stat(book); err == nil && !st.ModTime().Before(began) {
				break
			}
		}
	}
	return err
}

// Client is an in-process RPC client of the node.
func (c *Chain) Client() *rpclocal.Local { return rpclocal.New(c.node) }

// NodeID is the node's CometBFT peer ID.
func (c *Chain) NodeID() string { return string(c.node.NodeInfo().ID()) }

// Height is the last committed height.
func (c *Chain) Height() int64 { return c.node.BlockStore().Height() }

// WaitHeight waits until the chain reaches height h.
func (c *Chain) WaitHeight(ctx context.Context, h int64) error {
	for c.Height() < h {
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for height %d (at %d): %w", h, c.Height(), ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

func joinComma(s []string) string {
	out := ""
	for i, v := range s {
		if i > 0 {
			out += ","
		}
		out += v
	}
	return out
}

// NodeIDOf is the CometBFT peer ID a key will have.
func NodeIDOf(k *identity.Key) string {
	return string(cmtp2p.PubKeyToID(cmted.PrivKey(k.Ed25519()).PubKey()))
}

// slogAdapter routes CometBFT's logs into slog. CometBFT logs every block
// at info; those go to debug so a node's log stays readable.
type slogAdapter struct{ l *slog.Logger }

func (a slogAdapter) Debug(msg string, kv ...any) { a.l.Debug(msg, kv...) }
func (a slogAdapter) Info(msg string, kv ...any)  { a.l.Debug(msg, kv...) }
func (a slogAdapter) Warn(msg string, kv ...any)  { a.l.Warn(msg, kv...) }
func (a slogAdapter) Error(msg string, kv ...any) {
	// CometBFT reports its listeners closing at shutdown as errors.
	for _, v := range kv {
		if err, ok := v.(error); ok && errors.Is(err, net.ErrClosed) {
			a.l.Debug(msg, kv...)
			return
		}
	}
	// Its block-sync reactor stops a pool it stopped already when it
	// switched to consensus: "Error stopping pool" with "already stopped".
	if msg == "Stopped accept routine, as transport is closed" || msg == "Error stopping pool" && alreadyStopped(kv) {
		a.l.Debug(msg, kv...)
		return
	}
	a.l.Error(msg, kv...)
}
func alreadyStopped(kv []any) bool {
	for _, v := range kv {
		if err, ok := v.(error); ok && errors.Is(err, service.ErrAlreadyStopped) {
			return true
		}
	}
	return false
}

func (a slogAdapter) With(kv ...any) cmtlog.Logger {
	return slogAdapter{a.l.With(kv...)}
}
