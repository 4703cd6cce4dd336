package node

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"

	cfg "github.com/cometbft/cometbft/config"
	cmttypes "github.com/cometbft/cometbft/types"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/ledger"
)

// ledgerParts are this node's replica of the ledger: its state (the
// ABCI app), the CometBFT node that runs it, and the client that signs as
// this node.
type ledgerParts struct {
	app    *ledger.App
	chain  *ledger.Chain
	client *ledger.Client
}

// startLedger opens the ledger's state and starts this node's CometBFT
// replica of the chain in home's genesis.json; its outbox lives in store.
func startLedger(home Home, c Config, key *identity.Key, store *Store, log *slog.Logger) (ledgerParts, error) {
	doc, err := cmttypes.GenesisDocFromFile(home.GenesisPath())
	if err != nil {
		return ledgerParts{}, fmt.Errorf("read genesis %s: %w", home.GenesisPath(), err)
	}
	if doc.ChainID != c.Node.ChainID {
		return ledgerParts{}, fmt.Errorf("genesis %s is for chain %q but config.toml says chain_id %q", home.GenesisPath(), doc.ChainID, c.Node.ChainID)
	}
	app, err := ledger.OpenApp(home.LedgerDir(), log.With("module", "ledger"))
	if err != nil {
		return ledgerParts{}, err
	}
	lc := c.Ledger
	chain, err := ledger.StartChain(ledger.ChainParams{
		Dir: home.CometDir(), Key: key, Genesis: doc, App: app,
		P2PListen: lc.P2PListen, RPCListen: lc.RPCListen, Peers: lc.Peers,
		Logger: log.With("module", "cometbft"), Metrics: true,
		Configure: func(c *cfg.Config) {
			c.Consensus.TimeoutCommit = lc.BlockTime.Duration
			c.Consensus.CreateEmptyBlocksInterval = lc.EmptyBlockInterval.Duration
			c.P2P.MaxNumInboundPeers = lc.MaxInboundPeers
			// A transaction goes to every persistent peer (a lab machine's
			// validators; a validator's fellow validators) and to this many
			// others, not to all: a validator's hundreds of lab machines
			// need blocks, not its mempool, and flooding every transaction
			// to every replica cost a 100-node network on one machine more
			// than consensus could spare (make bench-scale).
			c.Mempool.ExperimentalMaxGossipConnectionsToNonPersistentPeers = ledgerTxFanout
		},
	})
	if err != nil {
		app.Close()
		if strings.Contains(err.Error(), "address already in use") {
			return ledgerParts{}, fmt.Errorf("ledger: %w (set [ledger] p2p_listen and rpc_listen in %s)", err, home.ConfigPath())
		}
		return ledgerParts{}, fmt.Errorf("ledger: %w", err)
	}
	client := ledger.NewClient(chain.Client(), key, c.Node.ChainID, ledger.WithOutbox(storeOutbox{store}))
	return ledgerParts{app: app, chain: chain, client: client}, nil
}

// ledgerTxFanout is how many peers beyond its persistent ones a replica
// relays a pending transaction to.
const ledgerTxFanout = 4

// stop stops the replica, then closes its state.
func (l ledgerParts) stop(log *slog.Logger) {
	if err := l.chain.Stop(); err != nil {
		log.Warn("stop ledger", "err", err)
	}
	l.app.Close()
}

// storeOutbox keeps the ledger client's outbox in the node store: a node
// killed mid-transfer sends it again when it restarts, and can still say
// what became of it.
type storeOutbox struct{ s *Store }

const outboxKey = "ledger/outbox/"

func (o storeOutbox) Put(e ledger.OutboxEntry) error { return o.s.Put(outboxKey+e.Hash, &e) }
func (o storeOutbox) Delete(hash string) error       { return o.s.Delete(outboxKey + hash) }

func (o storeOutbox) List() ([]ledger.OutboxEntry, error) {
	var out []ledger.OutboxEntry
	err := o.s.Each(outboxKey, func(key string, doc []byte) error {
		var e ledger.OutboxEntry
		if err := json.Unmarshal(doc, &e); err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		out = append(out, e)
		return nil
	})
	return out, err
}

// A consent is good for DefaultConsentTTL seconds unless asked otherwise,
// and at most MaxConsentTTL (ledger.ConsentTerms).
const (
	DefaultConsentTTL = ledger.DefaultConsentTTL
	MaxConsentTTL     = ledger.MaxRequestedConsentTTL
)
