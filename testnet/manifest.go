// Package testnet makes and runs a multi-university DeepMarket network on
// one machine: a genesis with a validator and an issuer per site, a home
// per node, and the node processes, on loopback or, with a network
// profile, each in its own network namespace (see testnet/netlab).
package testnet

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/deepmarket/deepmarket/node"
)

// Files in a testnet directory.
const (
	ManifestFile = "testnet.json"
	GenesisFile  = "genesis.json"
	SeedsFile    = "seeds.json"
	LogFile      = "node.log" // in each node's home
)

// Manifest describes a testnet: written by Init, read by Run and Status.
type Manifest struct {
	ChainID string    `json:"chain_id"`
	Created time.Time `json:"created"`
	Sites   []string  `json:"sites"`
	Nodes   []Node    `json:"nodes"`
}

// Node is one node of a testnet.
type Node struct {
	Name      string `json:"name"`
	Site      string `json:"site"`
	Index     int    `json:"index"` // within its site
	Validator bool   `json:"validator"`
	Issuer    bool   `json:"issuer"`
	Home      string `json:"home"` // relative to the testnet directory
	PeerID    string `json:"peer_id"`
	Account   string `json:"account"`
	PubKey    []byte `json:"pubkey"` // ed25519: account, libp2p and validator key
	LedgerID  string `json:"ledger_node_id"`
	Ports     Ports  `json:"ports"`
}

// Ports are a node's ports: distinct across the testnet, so that its
// nodes can share one address on loopback.
type Ports struct {
	API       int `json:"api"`
	P2P       int `json:"p2p"`
	LedgerP2P int `json:"ledger_p2p"`
	LedgerRPC int `json:"ledger_rpc"`
}

// Load reads the manifest of the testnet in dir.
func Load(dir string) (*Manifest, error) {
	b, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s is not a testnet (no %s): make one with 'deepmarket testnet init --out %s'", dir, ManifestFile, dir)
	}
	if err != nil {
		return nil, err
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, ManifestFile), err)
	}
	if len(m.Nodes) == 0 {
		return nil, fmt.Errorf("%s: no nodes", filepath.Join(dir, ManifestFile))
	}
	return &m, nil
}

func (m *Manifest) save(dir string) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "."+ManifestFile+".tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, ManifestFile))
}

// Find returns the index of the node called name.
func (m *Manifest) Find(name string) (int, error) {
	for i, n := range m.Nodes {
		if n.Name == name {
			return i, nil
		}
	}
	return -1, fmt.Errorf("no node %q in this testnet", name)
}

// SiteIndex is the index of a node's site.
func (m *Manifest) SiteIndex(i int) int {
	for s, name := range m.Sites {
		if name == m.Nodes[i].Site {
			return s
		}
	}
	return 0
}

// Addrs gives each node's IP address: all 127.0.0.1 on loopback, one per
// network namespace under a profile.
type Addrs []string

// Loopback puts every node on 127.0.0.1.
func Loopback(m *Manifest) Addrs {
	a := make(Addrs, len(m.Nodes))
	for i := range a {
		a[i] = "127.0.0.1"
	}
	return a
}

// P2P is node i's libp2p multiaddr, with its peer ID.
func (a Addrs) P2P(m *Manifest, i int) string {
	return fmt.Sprintf("/ip4/%s/tcp/%d/p2p/%s", a[i], m.Nodes[i].Ports.P2P, m.Nodes[i].PeerID)
}

// LedgerPeer is node i's ledger address, NODE_ID@HOST:PORT.
func (a Addrs) LedgerPeer(m *Manifest, i int) string {
	return m.Nodes[i].LedgerID + "@" + a[i] + ":" + strconv.Itoa(m.Nodes[i].Ports.LedgerP2P)
}

// applyAddrs points node i's config at its own addresses and at the
// validators: its bootstrap peers and ledger peers. The API and the
// ledger RPC stay on the node's loopback.
func applyAddrs(m *Manifest, i int, a Addrs, cfg *node.Config) {
	n := m.Nodes[i]
	cfg.P2P.Listen = []string{fmt.Sprintf("/ip4/%s/tcp/%d", a[i], n.Ports.P2P)}
	if a[i] != "127.0.0.1" {
		// A node of its own (a namespace under a profile) listens on QUIC
		// too, at the same port number, as a node does by default: NAT
		// traversal punches both. On loopback the UDP port is not
		// reserved, and the nodes meet over TCP alone.
		cfg.P2P.Listen = append(cfg.P2P.Listen, fmt.Sprintf("/ip4/%s/udp/%d/quic-v1", a[i], n.Ports.P2P))
	}
	cfg.API.Listen = fmt.Sprintf("127.0.0.1:%d", n.Ports.API)
	cfg.Ledger.P2PListen = fmt.Sprintf("tcp://%s:%d", a[i], n.Ports.LedgerP2P)
	cfg.Ledger.RPCListen = fmt.Sprintf("tcp://127.0.0.1:%d", n.Ports.LedgerRPC)
	cfg.P2P.Bootstrap, cfg.Ledger.Peers = nil, nil
	for j, v := range m.Nodes {
		if j == i || !v.Validator {
			continue
		}
		cfg.P2P.Bootstrap = append(cfg.P2P.Bootstrap, a.P2P(m, j))
		if a[j] != "127.0.0.1" {
			cfg.P2P.Bootstrap = append(cfg.P2P.Bootstrap, fmt.Sprintf("/ip4/%s/udp/%d/quic-v1/p2p/%s", a[j], v.Ports.P2P, v.PeerID))
		}
		cfg.Ledger.Peers = append(cfg.Ledger.Peers, a.LedgerPeer(m, j))
	}
}

// configure rewrites every node's addresses for a run on a, and applies
// extra (when set) to each node's config.
func configure(dir string, m *Manifest, a Addrs, extra func(i int, cfg *node.Config)) error {
	for i, n := range m.Nodes {
		h := node.Home{Dir: filepath.Join(dir, n.Home)}
		cfg, err := node.LoadConfig(h.ConfigPath())
		if err != nil {
			return fmt.Errorf("%s: %w", n.Name, err)
		}
		applyAddrs(m, i, a, &cfg)
		if extra != nil {
			extra(i, &cfg)
		}
		if err := node.SaveConfig(h.ConfigPath(), cfg); err != nil {
			return fmt.Errorf("%s: %w", n.Name, err)
		}
	}
	return writeSeeds(dir, m, a)
}
