package ledger

import (
	"encoding/binary"
	"testing"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/wire"
)

// TestABlockFindsEachBadSignature: a block of 300 transfers from 300
// accounts, none of them checked by CheckTx, is verified in batches; two
// carry a signature that does not verify (another transaction's, and one
// with a flipped bit). Exactly those two are refused as bad signatures,
// wherever they fall in their batches, and the rest transfer.
func TestABlockFindsEachBadSignature(t *testing.T) {
	issuer, sink := key(t, 1), key(t, 2)
	keys := make([]*identity.Key, 300)
	balances := map[*identity.Key]uint64{}
	for i := range keys {
		seed := make([]byte, 32)
		binary.BigEndian.PutUint64(seed, uint64(1000+i))
		k, err := identity.KeyFromSeed(seed)
		if err != nil {
			t.Fatal(err)
		}
		keys[i], balances[k] = k, 10*credit
	}
	h := newHarness(t, nil, genesis(issuer, balances, keys...))
	txs := make([][]byte, len(keys))
	for i, k := range keys {
		txs[i] = h.tx(k, TypeTransfer, &Transfer{To: string(sink.Address()), Amount: credit})
	}
	bad := map[int]bool{7: true, 263: true}
	resign := func(i int, sig []byte) {
		var tx Tx
		if err := wire.Unmarshal(txs[i], &tx); err != nil {
			t.Fatal(err)
		}
		tx.Sig = sig
		b, err := wire.Marshal(&tx)
		if err != nil {
			t.Fatal(err)
		}
		txs[i] = b
	}
	var other Tx
	if err := wire.Unmarshal(txs[8], &other); err != nil {
		t.Fatal(err)
	}
	resign(7, other.Sig)
	var flip Tx
	wire.Unmarshal(txs[263], &flip)
	flip.Sig[10] ^= 0x01
	resign(263, flip.Sig)

	results := h.block(txs...)
	for i, r := range results {
		switch {
		case bad[i] && r.Code != CodeBadSignature:
			t.Errorf("tx %d with a bad signature: code %d %s", i, r.Code, r.Log)
		case !bad[i] && r.Code != CodeOK:
			t.Errorf("tx %d: code %d %s", i, r.Code, r.Log)
		}
	}
	if got := h.balance(sink.Address()); got != uint64(len(keys)-len(bad))*credit {
		t.Errorf("the sink got %d, want %d transfers", got, len(keys)-len(bad))
	}
}
