package testnet

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"time"

	cmted "github.com/cometbft/cometbft/crypto/ed25519"
	cmtjson "github.com/cometbft/cometbft/libs/json"
	cmtp2p "github.com/cometbft/cometbft/p2p"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node"
)

// Defaults for Init.
const (
	DefaultBasePort = 27100
	// PortsPerNode: API, libp2p, ledger p2p, ledger RPC.
	PortsPerNode = 4
	// DefaultIssuerQuota is what each site's issuer may grant, and
	// DefaultStarter what every node's account holds at genesis
	// (micro-credits).
	DefaultIssuerQuota = 1_000_000 * 1_000_000
	DefaultStarter     = 1_000 * 1_000_000
	// MaxNodes bounds one testnet on one machine (bench-scale runs 100).
	MaxNodes = 128
)

// Params says what testnet Init makes.
type Params struct {
	Validators int // nodes that validate, spread over the sites
	Nodes      int // further full nodes (lab machines)
	// Sites are the universities; default: one per validator. Sites
	// beyond the validators run none: their machines are labs whose
	// network's public nodes are the other universities' validators (under
	// a NAT profile, the smallest real network: one public validator).
	Sites    int
	Out      string
	BasePort int    // ports BasePort … BasePort+4×(nodes)-1 on 127.0.0.1
	ChainID  string // default deepmarket-testnet-<random>
	// IssuerQuota and Starter override the defaults.
	IssuerQuota, Starter uint64
	// Python is the interpreter lenders run jobs with (config
	// [inventory] python); empty keeps the default.
	Python string
	// Configure, if set, adjusts each node's config before it is written.
	Configure func(n *Node, cfg *node.Config)
	// LedgerParams, if set, are the ledger's rules in the genesis
	// (default ledger.DefaultParams).
	LedgerParams *ledger.Params
}

func (p *Params) check() error {
	if p.Validators < 1 {
		return errors.New("--validators must be at least 1")
	}
	if p.Nodes < 0 {
		return errors.New("--nodes must not be negative")
	}
	if p.Sites == 0 {
		p.Sites = p.Validators
	}
	if p.Sites < 1 || p.Sites > p.Validators+p.Nodes {
		return fmt.Errorf("--sites %d: want 1 to %d (every site runs at least one machine)", p.Sites, p.Validators+p.Nodes)
	}
	if p.Sites > 26 {
		return errors.New("--sites: at most 26")
	}
	if n := p.Validators + p.Nodes; n > MaxNodes {
		return fmt.Errorf("%d nodes: at most %d on one machine", n, MaxNodes)
	}
	if p.Out == "" {
		return errors.New("--out DIR is required")
	}
	if p.BasePort == 0 {
		p.BasePort = DefaultBasePort
	}
	if last := p.BasePort + PortsPerNode*(p.Validators+p.Nodes) - 1; p.BasePort < 1024 || last > 65535 {
		return fmt.Errorf("--base-port %d: the ports %d-%d must lie in 1024-65535", p.BasePort, p.BasePort, last)
	}
	if p.IssuerQuota == 0 {
		p.IssuerQuota = DefaultIssuerQuota
	}
	if p.Starter == 0 {
		p.Starter = DefaultStarter
	}
	if p.ChainID == "" {
		var b [3]byte
		if _, err := rand.Read(b[:]); err != nil {
			return err
		}
		p.ChainID = "deepmarket-testnet-" + hex.EncodeToString(b[:])
	}
	return nil
}

// SiteName is the label of site i: univ-a, univ-b, …
func SiteName(i int) string { return "univ-" + string(rune('a'+i)) }

// Init makes a testnet in p.Out: genesis.json (one validator and one
// issuer per site, a starter balance for every node), a home per node
// with distinct ports, bootstrap and ledger peers filled in, and
// testnet.json describing it all. It refuses a non-empty directory.
func Init(p Params) (*Manifest, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	if entries, err := os.ReadDir(p.Out); err == nil && len(entries) > 0 {
		return nil, fmt.Errorf("%s is not empty: choose another --out or remove it", p.Out)
	}
	out, err := filepath.Abs(p.Out)
	if err != nil {
		return nil, err
	}
	m := &Manifest{ChainID: p.ChainID, Created: time.Now().UTC().Truncate(time.Second)}
	for s := range p.Sites {
		m.Sites = append(m.Sites, SiteName(s))
	}
	keys := make([]*identity.Key, p.Validators+p.Nodes)
	perSite := make([]int, p.Sites)
	for i := range keys {
		k, err := identity.GenerateKey()
		if err != nil {
			return nil, err
		}
		keys[i] = k
		n := Node{Validator: i < p.Validators}
		site := i % p.Sites
		if n.Validator {
			n.Name = fmt.Sprintf("val%d", i)
			n.Issuer = i < p.Sites // the site's first validator issues its credits
		} else {
			n.Name = fmt.Sprintf("node%d", i-p.Validators)
		}
		n.Site = m.Sites[site]
		n.Index = perSite[site]
		perSite[site]++
		n.Home = n.Name
		n.PeerID = k.PeerID().String()
		n.Account = string(k.Address())
		n.PubKey = k.Public()
		n.LedgerID = LedgerNodeID(k.Public())
		base := p.BasePort + PortsPerNode*i
		n.Ports = Ports{API: base, P2P: base + 1, LedgerP2P: base + 2, LedgerRPC: base + 3}
		m.Nodes = append(m.Nodes, n)
	}

	var vals []ledger.GenesisValidator
	app := ledger.GenesisState{Params: p.LedgerParams}
	for i, n := range m.Nodes {
		if n.Validator {
			vals = append(vals, ledger.GenesisValidator{Name: n.Name, PubKey: keys[i].Public(), Power: 10})
		}
		if n.Issuer {
			app.Issuers = append(app.Issuers, ledger.GenesisIssuer{Address: n.Account, Name: n.Site, Quota: p.IssuerQuota})
		}
		app.Balances = append(app.Balances, ledger.GenesisBalance{Address: n.Account, Amount: p.Starter})
	}
	doc, err := ledger.NewGenesis(p.ChainID, vals, app)
	if err != nil {
		return nil, err
	}
	genesis, err := cmtjson.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, err
	}
	genesisPath := filepath.Join(out, GenesisFile)
	if err := os.WriteFile(genesisPath, genesis, 0o644); err != nil {
		return nil, err
	}
	addrs := Loopback(m)
	for i := range m.Nodes {
		n := &m.Nodes[i]
		_, err := node.Init(node.Home{Dir: filepath.Join(out, n.Home)}, node.InitOptions{
			Moniker: n.Name, Site: n.Site, Genesis: genesisPath, Key: keys[i],
			Configure: func(cfg *node.Config) {
				applyAddrs(m, i, addrs, cfg)
				cfg.P2P.MDNS = false // testnets on one host must not find each other
				cfg.Executor.CPUs = spreadCPUs(i, runtime.NumCPU())
				if p.Python != "" {
					cfg.Inventory.Python = p.Python
				}
				if p.Configure != nil {
					p.Configure(n, cfg)
				}
			},
		})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", n.Name, err)
		}
	}
	if err := m.save(out); err != nil {
		return nil, err
	}
	if err := writeSeeds(out, m, addrs); err != nil {
		return nil, err
	}
	return m, nil
}

// spreadCPUs is node i's CPU pool: all of them, ordered so that the
// nodes of one machine pin their first workers to different CPUs (the
// executor takes CPUs from the end of its pool).
func spreadCPUs(i, n int) []int {
	pool := make([]int, n)
	for j := range pool {
		pool[j] = (i + 1 + j) % n
	}
	return pool
}

// LedgerNodeID is the CometBFT node ID of a node key (the ledger's peer
// ID: NODE_ID@HOST:PORT).
func LedgerNodeID(pub ed25519.PublicKey) string {
	return string(cmtp2p.PubKeyToID(cmted.PubKey(pub)))
}

// Seeds is what a joining university receives with genesis.json: where
// to reach the network.
type Seeds struct {
	ChainID     string   `json:"chain_id"`
	Bootstrap   []string `json:"bootstrap"`    // libp2p multiaddrs of the validators
	LedgerPeers []string `json:"ledger_peers"` // NODE_ID@HOST:PORT of the validators
}

func writeSeeds(dir string, m *Manifest, a Addrs) error {
	s := Seeds{ChainID: m.ChainID}
	for i, n := range m.Nodes {
		if n.Validator {
			s.Bootstrap = append(s.Bootstrap, a.P2P(m, i))
			s.LedgerPeers = append(s.LedgerPeers, a.LedgerPeer(m, i))
		}
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, SeedsFile), append(b, '\n'), 0o644)
}
