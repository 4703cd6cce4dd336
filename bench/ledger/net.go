package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/cometbft/cometbft/abci/example/kvstore"
	abci "github.com/cometbft/cometbft/abci/types"
	cfg "github.com/cometbft/cometbft/config"
	rpclocal "github.com/cometbft/cometbft/rpc/client/local"
	cmttypes "github.com/cometbft/cometbft/types"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/ledger"
)

const chainID = "deepmarket-bench-ledger"

// appKind is the ABCI application a network runs.
type appKind int

const (
	appKV1K   appKind = iota // CometBFT's kvstore, 1 KiB key=value txs
	appKVSame                // kvstore, txs as long as the ledger's transfers
	appLedger                // our ledger, signed transfers
)

func (k appKind) String() string {
	switch k {
	case appKV1K:
		return "kvstore 1 KiB"
	case appKVSame:
		return "kvstore same size"
	default:
		return "ledger transfer"
	}
}

// benchConfig is the CometBFT configuration every network of the run gets,
// whatever its app: CometBFT's defaults (ledger.StartChain's, which set the
// kv tx indexer) with the mempool's limits raised so that they never bind.
type chainConfig struct {
	mempool int    // mempool size, txs
	indexer string // tx indexer
}

func benchConfig(cc chainConfig) func(*cfg.Config) {
	return func(c *cfg.Config) {
		c.Mempool.Size = cc.mempool
		c.Mempool.MaxTxsBytes = 2 << 30
		c.Mempool.CacheSize = 2 * cc.mempool
		c.TxIndex.Indexer = cc.indexer
	}
}

// describeConfig states the configuration in the output.
func describeConfig(cc chainConfig) map[string]any {
	c := cfg.DefaultConfig()
	benchConfig(cc)(c)
	cp := cmttypes.DefaultConsensusParams()
	return map[string]any{
		"cometbft":              cometVersion(),
		"timeout_propose":       c.Consensus.TimeoutPropose.String(),
		"timeout_prevote":       c.Consensus.TimeoutPrevote.String(),
		"timeout_precommit":     c.Consensus.TimeoutPrecommit.String(),
		"timeout_commit":        c.Consensus.TimeoutCommit.String(),
		"create_empty_blocks":   c.Consensus.CreateEmptyBlocks,
		"mempool_type":          c.Mempool.Type,
		"mempool_size":          c.Mempool.Size,
		"mempool_max_txs_bytes": c.Mempool.MaxTxsBytes,
		"mempool_cache_size":    c.Mempool.CacheSize,
		"mempool_recheck":       c.Mempool.Recheck,
		"block_max_bytes":       cp.Block.MaxBytes,
		"p2p_send_rate":         c.P2P.SendRate,
		"p2p_recv_rate":         c.P2P.RecvRate,
		"tx_index":              c.TxIndex.Indexer,
		"db_backend":            c.DBBackend,
		"abci":                  "in-process local client (one mutex per node: CheckTx and FinalizeBlock serialize)",
		"validators":            "in one process on 127.0.0.1, each with its own app, home directory and ports; persistent peers",
		"ledger_app":            "ledger.OpenApp (badger, sync writes)",
		"kvstore_app":           "kvstore.NewPersistentApplication (goleveldb)",
		"load":                  "BroadcastTxSync through each node's local RPC client (rpc/client/local), workers spread over the validators",
		"latency":               "from just before BroadcastTxSync to validator 0 answering BlockResults for the tx's block",
		"throughput":            "txs committed with code 0 in the blocks validator 0 committed during the measured window",
	}
}

// node is one validator: its CometBFT node, app and files.
type node struct {
	key    *identity.Key
	dir    string
	p2p    int
	chain  *ledger.Chain
	client *rpclocal.Local
	closer interface{ Close() error }
	ledger *ledger.App // nil for kvstore
}

// network is the validators of one case.
type network struct {
	nodes   []*node
	rpcPort int // validator 0's RPC port
	genesis *cmttypes.GenesisDoc
}

func validatorKey(i int) *identity.Key { return seedKey(fmt.Sprintf("bench-validator-%d", i)) }

func seedKey(s string) *identity.Key {
	seed := make([]byte, 32)
	copy(seed, s)
	k, err := identity.KeyFromSeed(seed)
	if err != nil {
		panic(err)
	}
	return k
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// startNetwork starts n validators of a new chain running app, each in its
// own directory under root, peers of one another, and waits until every one
// has committed height 2.
func startNetwork(ctx context.Context, root string, n int, kind appKind, g ledger.GenesisState, cc chainConfig) (*network, error) {
	nw := &network{}
	var gv []ledger.GenesisValidator
	for i := 0; i < n; i++ {
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		k := validatorKey(i)
		nw.nodes = append(nw.nodes, &node{key: k, dir: filepath.Join(root, fmt.Sprintf("v%d", i)), p2p: p})
		gv = append(gv, ledger.GenesisValidator{Name: fmt.Sprintf("v%d", i), PubKey: k.Public(), Power: 10})
	}
	var err error
	if nw.rpcPort, err = freePort(); err != nil {
		return nil, err
	}
	doc, err := ledger.NewGenesis(chainID, gv, g)
	if err != nil {
		return nil, err
	}
	nw.genesis = doc
	for i, v := range nw.nodes {
		var app abci.Application
		appDir := filepath.Join(v.dir, "app")
		if err := os.MkdirAll(appDir, 0o700); err != nil {
			nw.stop()
			return nil, err
		}
		switch kind {
		case appLedger:
			a, err := ledger.OpenApp(appDir, nil)
			if err != nil {
				nw.stop()
				return nil, err
			}
			app, v.closer, v.ledger = a, a, a
		default:
			a := kvstore.NewPersistentApplication(appDir)
			app, v.closer = a, a
		}
		var peers []string
		for _, o := range nw.nodes {
			if o != v {
				peers = append(peers, fmt.Sprintf("%s@127.0.0.1:%d", ledger.NodeIDOf(o.key), o.p2p))
			}
		}
		rpc := ""
		if i == 0 {
			rpc = fmt.Sprintf("tcp://127.0.0.1:%d", nw.rpcPort)
		}
		chain, err := ledger.StartChain(ledger.ChainParams{
			Dir: v.dir, Key: v.key, Genesis: doc, App: app,
			P2PListen: fmt.Sprintf("tcp://127.0.0.1:%d", v.p2p), RPCListen: rpc,
			Peers: peers, Logger: slog.New(slog.DiscardHandler), Configure: benchConfig(cc),
		})
		if err != nil {
			v.closer.Close()
			v.closer = nil
			nw.stop()
			return nil, err
		}
		v.chain, v.client = chain, chain.Client()
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for _, v := range nw.nodes {
		if err := v.chain.WaitHeight(wctx, 2); err != nil {
			nw.stop()
			return nil, err
		}
	}
	return nw, nil
}

func (nw *network) stop() {
	for _, v := range nw.nodes {
		if v.chain != nil {
			v.chain.Stop()
			v.chain = nil
		}
		if v.closer != nil {
			v.closer.Close()
			v.closer = nil
		}
	}
}
