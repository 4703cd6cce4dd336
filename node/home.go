package node

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	cmtjson "github.com/cometbft/cometbft/libs/json"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/ledger"
)

// ErrNoHome means the home directory has not been initialised.
var ErrNoHome = errors.New("no DeepMarket home")

// ErrHomeExists means init would overwrite an existing home.
var ErrHomeExists = errors.New("home already initialised")

// Home is the node's home directory and the files in it.
type Home struct{ Dir string }

// DefaultHomeDir returns $DEEPMARKET_HOME, else ~/.deepmarket.
func DefaultHomeDir() string {
	if h := os.Getenv("DEEPMARKET_HOME"); h != "" {
		return h
	}
	if d, err := os.UserHomeDir(); err == nil {
		return filepath.Join(d, ".deepmarket")
	}
	return ".deepmarket"
}

// ConfigPath is config.toml.
func (h Home) ConfigPath() string { return filepath.Join(h.Dir, "config.toml") }

// KeyPath is the node's ed25519 key.
func (h Home) KeyPath() string { return filepath.Join(h.Dir, "node.key") }

// TokenPath is the API token the CLI presents.
func (h Home) TokenPath() string { return filepath.Join(h.Dir, "api.token") }

// APIAddrPath holds the running node's API address (written at start).
func (h Home) APIAddrPath() string { return filepath.Join(h.Dir, "api.addr") }

// StoreDir is the badger node store.
func (h Home) StoreDir() string { return filepath.Join(h.Dir, "data", "node") }

// BlocksDir is the blockstore: datasets by content address.
func (h Home) BlocksDir() string { return filepath.Join(h.Dir, "data", "blocks") }

// LedgerDir holds the ledger's state (badger).
func (h Home) LedgerDir() string { return filepath.Join(h.Dir, "data", "ledger") }

// CometDir is CometBFT's home: its config and block store.
func (h Home) CometDir() string { return filepath.Join(h.Dir, "data", "cometbft") }

// GenesisPath is the network's genesis file: made by init for a local
// network, or the one given with --genesis.
func (h Home) GenesisPath() string { return filepath.Join(h.Dir, "genesis.json") }

// Check reports ErrNoHome, with what to do, when the home is missing.
func (h Home) Check() error {
	if _, err := os.Stat(h.ConfigPath()); err != nil {
		return fmt.Errorf("%w at %s: run `deepmarket init --home %s` first", ErrNoHome, h.Dir, h.Dir)
	}
	return nil
}

// LoadKey reads the node key.
func (h Home) LoadKey() (*identity.Key, error) {
	if err := h.Check(); err != nil {
		return nil, err
	}
	return identity.LoadKey(h.KeyPath())
}

// LoadToken reads the API token.
func (h Home) LoadToken() (string, error) {
	b, err := os.ReadFile(h.TokenPath())
	if err != nil {
		return "", fmt.Errorf("read API token: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// InitOptions are init's settings; empty fields keep the defaults.
type InitOptions struct {
	Moniker   string
	Site      string
	Listen    []string
	API       string
	Bootstrap []string
	ChainID   string
	Genesis   string // path to a genesis.json to join
	LedgerP2P string // CometBFT p2p listen, tcp://HOST:PORT
	LedgerRPC string // CometBFT RPC listen
	// LedgerPeers are other ledger nodes, NODE_ID@HOST:PORT.
	LedgerPeers []string
	Force       bool
	// Key is the node key to use; nil makes a new one. (A testnet makes
	// its keys first: genesis lists the validators.)
	Key *identity.Key
	// Python is the interpreter lent jobs run with ([inventory] python);
	// empty picks DefaultPython().
	Python string
	// Configure, if set, adjusts the config before it is written.
	Configure func(*Config)
	// LedgerParams, if set, are the rules of a new local network's
	// ledger (default ledger.DefaultParams); a node that joins takes its
	// genesis's.
	LedgerParams *ledger.Params
}

// PythonCandidates are where DefaultPython looks, in order: the
// virtualenv `make deps` makes as root, then one in the working directory
// (`make deps` as another user).
var PythonCandidates = []string{"/opt/deepmarket/venv/bin/python3", ".venv/bin/python3"}

// DefaultPython is the interpreter a new node's jobs run with: the first
// of PythonCandidates that exists (made absolute), else "python3" from
// the PATH.
func DefaultPython() string {
	for _, p := range PythonCandidates {
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			if abs, err := filepath.Abs(p); err == nil {
				return abs
			}
		}
	}
	return "python3"
}

// Local network defaults: the node's own account is the issuer, with a
// quota, and starts with a balance.
const (
	LocalIssuerQuota   = 1_000_000 * 1_000_000 // micro-credits
	LocalStarterCredit = 1_000 * 1_000_000
)

// InitResult says what Init made.
type InitResult struct {
	Home    string
	PeerID  string
	Address identity.Address
	ChainID string
	Python  string // [inventory] python
	Backup  string // where --force moved the old home, if it did
}

// Init creates a home: node key, config.toml and API token. It refuses to
// touch an existing home unless opts.Force, which moves the old one aside
// rather than deleting it.
func Init(h Home, opts InitOptions) (*InitResult, error) {
	res := &InitResult{Home: h.Dir}
	cfg := initConfig(opts)
	genesis, err := chooseChain(&cfg, opts)
	if err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	text, err := cfg.Render()
	if err != nil {
		return nil, fmt.Errorf("render config: %w", err)
	}

	if res.Backup, err = clearHome(h, opts.Force); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(h.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("create home: %w", err)
	}
	key := opts.Key
	if key == nil {
		if key, err = identity.GenerateKey(); err != nil {
			return nil, err
		}
	}
	if genesis == nil {
		if genesis, err = localGenesis(cfg, key, opts.LedgerParams); err != nil {
			return nil, err
		}
	}
	if err := writeHomeFiles(h, key, genesis, text); err != nil {
		return nil, err
	}
	res.PeerID = key.PeerID().String()
	res.Address = key.Address()
	res.ChainID = cfg.Node.ChainID
	res.Python = cfg.Inventory.Python
	return res, nil
}

// initConfig is the default config with opts' settings applied, then
// opts.Configure; the chain ID is chooseChain's.
func initConfig(opts InitOptions) Config {
	cfg := DefaultConfig()
	if opts.Moniker != "" {
		cfg.Node.Moniker = opts.Moniker
	}
	if opts.Site != "" {
		cfg.Node.Site = opts.Site
	}
	if len(opts.Listen) > 0 {
		cfg.P2P.Listen = opts.Listen
	}
	if opts.API != "" {
		cfg.API.Listen = opts.API
	}
	cfg.P2P.Bootstrap = opts.Bootstrap
	if opts.LedgerP2P != "" {
		cfg.Ledger.P2PListen = opts.LedgerP2P
	}
	if opts.LedgerRPC != "" {
		cfg.Ledger.RPCListen = opts.LedgerRPC
	}
	cfg.Ledger.Peers = opts.LedgerPeers
	cfg.Inventory.Python = opts.Python
	if cfg.Inventory.Python == "" {
		cfg.Inventory.Python = DefaultPython()
	}
	if opts.Configure != nil {
		opts.Configure(&cfg)
	}
	return cfg
}

// chooseChain sets cfg's chain ID: that of the genesis file opts.Genesis,
// whose contents it returns, else opts.ChainID, else a new local network's.
// It returns no genesis for those two: Init makes a local one.
func chooseChain(cfg *Config, opts InitOptions) (genesis []byte, err error) {
	switch {
	case opts.Genesis != "":
		genesis, err = os.ReadFile(opts.Genesis)
		if err != nil {
			return nil, fmt.Errorf("--genesis: %w", err)
		}
		var g struct {
			ChainID string `json:"chain_id"`
		}
		if err := json.Unmarshal(genesis, &g); err != nil {
			return nil, fmt.Errorf("--genesis %s: not a genesis JSON file: %v", opts.Genesis, err)
		}
		if g.ChainID == "" {
			return nil, fmt.Errorf("--genesis %s: no chain_id", opts.Genesis)
		}
		cfg.Node.ChainID = g.ChainID
	case opts.ChainID != "":
		cfg.Node.ChainID = opts.ChainID
	default:
		var b [4]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, err
		}
		cfg.Node.ChainID = "deepmarket-local-" + hex.EncodeToString(b[:])
	}
	return genesis, nil
}

// clearHome makes way for a new home at h: an empty or missing dir is
// fine; one with files in it is refused unless force, which renames it to
// the backup path it returns.
func clearHome(h Home, force bool) (backup string, err error) {
	entries, err := os.ReadDir(h.Dir)
	if err != nil || len(entries) == 0 {
		return "", nil
	}
	if !force {
		return "", fmt.Errorf("%w at %s: pass --force to move it aside and start over, or use another --home", ErrHomeExists, h.Dir)
	}
	backup = fmt.Sprintf("%s.backup-%d", strings.TrimRight(h.Dir, "/"), time.Now().Unix())
	if err := os.Rename(h.Dir, backup); err != nil {
		return "", fmt.Errorf("move old home aside: %w", err)
	}
	return backup, nil
}

// localGenesis makes the genesis of a network of one: this node, with key,
// validates, issues and holds credits.
func localGenesis(cfg Config, key *identity.Key, params *ledger.Params) ([]byte, error) {
	doc, err := ledger.NewGenesis(cfg.Node.ChainID,
		[]ledger.GenesisValidator{{Name: cfg.Node.Moniker, PubKey: key.Public(), Power: 10}},
		ledger.GenesisState{
			Issuers:  []ledger.GenesisIssuer{{Address: string(key.Address()), Name: cfg.Node.Site, Quota: LocalIssuerQuota}},
			Balances: []ledger.GenesisBalance{{Address: string(key.Address()), Amount: LocalStarterCredit}},
			Params:   params,
		})
	if err != nil {
		return nil, fmt.Errorf("make genesis: %w", err)
	}
	genesis, err := cmtjson.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("make genesis: %w", err)
	}
	return genesis, nil
}

// writeHomeFiles writes the node key, a new API token, the genesis and the
// config text into h, in that order.
func writeHomeFiles(h Home, key *identity.Key, genesis []byte, configText string) error {
	if err := identity.SaveKey(h.KeyPath(), key); err != nil {
		return err
	}
	var tok [32]byte
	if _, err := rand.Read(tok[:]); err != nil {
		return err
	}
	if err := writeFileAtomic(h.TokenPath(), []byte(hex.EncodeToString(tok[:])+"\n"), 0o600); err != nil {
		return fmt.Errorf("write API token: %w", err)
	}
	if err := writeFileAtomic(h.GenesisPath(), genesis, 0o644); err != nil {
		return fmt.Errorf("write genesis: %w", err)
	}
	if err := writeFileAtomic(h.ConfigPath(), []byte(configText), 0o644); err != nil {
		return fmt.Errorf("write config: %w", err)
	}
	return nil
}

// writeFileAtomic writes via a temporary file and rename, so a crash never
// leaves a half-written file.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
