package main

import (
	"context"
	"fmt"
	"time"

	"github.com/deepmarket/deepmarket/ledger"
)

// audit replays the single-validator ledger chain, from genesis, through
// validator 0's HTTP RPC with ledger.Audit, and reports how fast it went.
func audit(ctx context.Context, nw *network) map[string]any {
	url := fmt.Sprintf("http://127.0.0.1:%d", nw.rpcPort)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	start := time.Now()
	rep, err := ledger.Audit(ctx, url, ledger.AuditOptions{Genesis: nw.genesis, GenesisSource: "the bench genesis"})
	el := time.Since(start)
	if err != nil {
		return map[string]any{"summary": "audit failed: " + err.Error(), "error": err.Error()}
	}
	tps := float64(rep.Txs) / el.Seconds()
	pass := rep.OK && tps >= 30_000
	r := map[string]any{
		"rpc": url, "height": rep.Height, "txs": rep.Txs, "txs_ok": rep.TxsOK, "ok": rep.OK, "problems": rep.Problems,
		"seconds": el.Seconds(), "tx_per_s": tps, "goal": ">= 30000 tx/s", "pass": pass,
	}
	r["summary"] = fmt.Sprintf("replayed %d blocks, %d txs in %v: %.0f tx/s (goal >= 30,000: %v), report OK %v",
		rep.Height, rep.Txs, el.Round(time.Millisecond), tps, tps >= 30_000, rep.OK)
	fmt.Println("  audit:", r["summary"])
	return r
}
