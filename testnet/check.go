package testnet

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/deepmarket/deepmarket/node/api"
)

// NodeStatus is one row of `testnet status`.
type NodeStatus struct {
	Name      string      `json:"name"`
	Site      string      `json:"site"`
	Validator bool        `json:"validator"`
	Up        bool        `json:"up"`
	Error     string      `json:"error,omitempty"`
	Status    *api.Status `json:"status,omitempty"`
	Balance   uint64      `json:"balance"`
}

// Status asks every node of the testnet in dir for its status.
func Status(ctx context.Context, dir string) ([]NodeStatus, error) {
	m, err := Load(dir)
	if err != nil {
		return nil, err
	}
	n := &Network{Dir: dir, Manifest: m}
	out := make([]NodeStatus, len(m.Nodes))
	for i, nd := range m.Nodes {
		row := NodeStatus{Name: nd.Name, Site: nd.Site, Validator: nd.Validator}
		c, err := n.Client(i)
		if err == nil {
			sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			var st api.Status
			if st, err = c.Status(sctx); err == nil {
				row.Up, row.Status = true, &st
				if b, err := c.Balance(sctx, ""); err == nil {
					row.Balance = b.Balance
				}
			}
			cancel()
		}
		if err != nil {
			row.Error = err.Error()
		}
		out[i] = row
	}
	return out, nil
}

// Consistency is what Check found.
type Consistency struct {
	Height  int64  // the common height compared
	AppHash string // the same on every node
}

// Check asks every running node for its ledger audit, which must pass
// with nothing escrowed if wantNoEscrow, and compares the block and app
// hashes at the highest height every node has: one chain, no fork.
func (n *Network) Check(ctx context.Context, nodes []int, wantNoEscrow bool) (*Consistency, error) {
	if nodes == nil {
		for i := range n.Manifest.Nodes {
			nodes = append(nodes, i)
		}
	}
	var problems []string
	height := int64(-1)
	for _, i := range nodes {
		name := n.Manifest.Nodes[i].Name
		c, err := n.Client(i)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", name, err))
			continue
		}
		rep, err := c.Audit(ctx)
		switch {
		case err != nil:
			problems = append(problems, fmt.Sprintf("%s: audit: %v", name, err))
			continue
		case !rep.OK:
			problems = append(problems, fmt.Sprintf("%s: audit failed at height %d: %s", name, rep.Height, strings.Join(rep.Problems, "; ")))
		case wantNoEscrow && rep.Escrowed != 0:
			problems = append(problems, fmt.Sprintf("%s: %d micro-credits still in escrow", name, rep.Escrowed))
		}
		if height < 0 || rep.Height < height {
			height = rep.Height
		}
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("%s", strings.Join(problems, "\n"))
	}
	res := &Consistency{Height: height}
	var blockHash, appHash []byte
	var first string
	for _, i := range nodes {
		name := n.Manifest.Nodes[i].Name
		rpc, err := n.RPC(i)
		if err != nil {
			return nil, err
		}
		b, err := rpc.Block(ctx, &height)
		if err != nil {
			return nil, fmt.Errorf("%s: block %d: %w", name, height, err)
		}
		if blockHash == nil {
			blockHash, appHash, first = b.BlockID.Hash, b.Block.AppHash, name
			res.AppHash = fmt.Sprintf("%X", appHash)
			continue
		}
		if !bytes.Equal(b.BlockID.Hash, blockHash) {
			return nil, fmt.Errorf("fork at height %d: %s has block %X, %s has %X", height, first, blockHash, name, b.BlockID.Hash)
		}
		if !bytes.Equal(b.Block.AppHash, appHash) {
			return nil, fmt.Errorf("app hash differs at height %d: %s %X, %s %X", height, first, appHash, name, b.Block.AppHash)
		}
	}
	return res, nil
}

// Heights is each listed node's latest block height (-1 if it does not
// answer).
func (n *Network) Heights(ctx context.Context, nodes []int) []int64 {
	out := make([]int64, len(nodes))
	for k, i := range nodes {
		out[k] = -1
		rpc, err := n.RPC(i)
		if err != nil {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := rpc.Status(sctx)
		cancel()
		if err == nil {
			out[k] = st.SyncInfo.LatestBlockHeight
		}
	}
	return out
}
