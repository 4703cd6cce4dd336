package ledger

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	rpchttp "github.com/cometbft/cometbft/rpc/client/http"
	ctypes "github.com/cometbft/cometbft/rpc/core/types"
	cmttypes "github.com/cometbft/cometbft/types"
	"github.com/fxamacker/cbor/v2"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/wire"
)

// rpcChain is one validator with its RPC on loopback.
type rpcChain struct {
	app   *App
	chain *Chain
	url   string
	http  *rpchttp.HTTP
	doc   *cmttypes.GenesisDoc
}

func startRPCChain(t *testing.T, val *identity.Key, g GenesisState) *rpcChain {
	t.Helper()
	doc, err := NewGenesis(testChain, []GenesisValidator{{Name: "v", PubKey: val.Public(), Power: 10}}, g)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	app, err := OpenApp(filepath.Join(dir, "app"), nil)
	if err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	chain, err := StartChain(ChainParams{Dir: dir, Key: val, Genesis: doc, App: app, P2PListen: fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t)),
		RPCListen: fmt.Sprintf("tcp://127.0.0.1:%d", port), Configure: fastBlocks})
	if err != nil {
		app.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		chain.Stop()
		app.Close()
	})
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	cl, err := rpchttp.New(url, "/websocket")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := chain.WaitHeight(ctx, 2); err != nil {
		t.Fatal(err)
	}
	return &rpcChain{app: app, chain: chain, url: url, http: cl, doc: doc}
}

// cborText and cborBytes encode one CBOR string.
func cborText(t *testing.T, s string) []byte {
	b, err := wire.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func cborBytes(t *testing.T, s []byte) []byte {
	b, err := wire.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestNonCanonicalTxsRefusedByNode: a signed transfer whose envelope a
// third party re-encodes (an extra key, a duplicate key, a non-minimal
// integer, trailing bytes) keeps a valid signature and would get another
// hash; sent as raw bytes to a real node's RPC (broadcast_tx_sync over
// HTTP) each is refused and changes nothing. The canonical bytes then
// commit, once.
func TestNonCanonicalTxsRefusedByNode(t *testing.T) {
	issuer, alice, bob := key(t, 1), key(t, 2), key(t, 3)
	c := startRPCChain(t, key(t, 99), genesis(issuer, map[*identity.Key]uint64{alice: 10 * credit}, bob))
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	good, err := NewTx(alice, testChain, TypeTransfer, 0, &Transfer{To: string(bob.Address()), Amount: 3 * credit})
	if err != nil {
		t.Fatal(err)
	}
	var tx Tx
	if err := wire.Unmarshal(good, &tx); err != nil {
		t.Fatal(err)
	}
	// The envelope by hand: {1: type, 2: signer, 3: nonce, 4: body, 5: sig}.
	envelope := func(head byte, nonce []byte, extra ...byte) []byte {
		b := []byte{head, 0x01}
		b = append(b, cborText(t, tx.Type)...)
		b = append(append(b, 0x02), cborBytes(t, tx.Signer)...)
		b = append(append(b, 0x03), nonce...)
		b = append(append(b, 0x04), cborBytes(t, tx.Body)...)
		b = append(append(b, 0x05), cborBytes(t, tx.Sig)...)
		return append(b, extra...)
	}
	if !bytes.Equal(envelope(0xa5, []byte{0x00}), good) {
		t.Fatal("the hand-made envelope is not NewTx's: the variants below would test nothing")
	}
	variants := map[string][]byte{
		"extra key":           envelope(0xa6, []byte{0x00}, 0x06, 0x00),
		"duplicate key":       envelope(0xa6, []byte{0x00}, 0x03, 0x00),
		"non-minimal integer": envelope(0xa5, []byte{0x18, 0x00}),
		"trailing bytes":      append(append([]byte(nil), good...), 0x00),
	}
	before := c.app.Snapshot()
	for name, b := range variants {
		d, err := decodeLoosely(b)
		if err != nil || !verify(d.Signer, d.signBytes(testChain), d.Sig) {
			t.Fatalf("%s: not a validly signed variant (%v): it would test nothing", name, err)
		}
		res, err := c.http.BroadcastTxSync(ctx, b)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if res.Code != CodeMalformed || !bytes.Contains([]byte(res.Log), []byte("malformed encoding")) {
			t.Fatalf("%s: code %d %q, want %d (malformed encoding)", name, res.Code, res.Log, CodeMalformed)
		}
		if TxHashHex(b) == TxHashHex(good) {
			t.Fatalf("%s: same hash", name)
		}
	}
	// A few blocks later nothing moved.
	if err := c.chain.WaitHeight(ctx, before.Height+3); err != nil {
		t.Fatal(err)
	}
	after := c.app.Snapshot()
	if !bytes.Equal(after.AppHash, before.AppHash) || after.Accounts[string(alice.Address())].Nonce != 0 {
		t.Fatalf("the refused variants changed the state")
	}
	cl := NewClient(c.http, alice, testChain)
	if err := cl.Broadcast(ctx, &Prepared{Hash: TxHashHex(good), Tx: good}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Wait(ctx, TxHashHex(good)); err != nil {
		t.Fatal(err)
	}
	for name, b := range variants {
		if res, err := c.http.BroadcastTxSync(ctx, b); err != nil || res.Code != CodeMalformed {
			t.Fatalf("%s after the original committed: %v %+v", name, err, res)
		}
	}
	if got := c.app.BalanceOf(bob.Address()); got != 3*credit {
		t.Fatalf("bob holds %d, want one transfer of 3 credits", got)
	}
}

// decodeLoosely reads a transaction envelope as a lenient decoder would:
// what the strict one refuses must still carry a valid signature.
func decodeLoosely(b []byte) (*Tx, error) {
	var tx Tx
	err := looseDecode(b, &tx)
	return &tx, err
}

// flakyRPC sits between a client and a node. It can lose a broadcast on
// the way (mode dropTx: the node never sees it) or lose the answer (mode
// dropAnswer: the node took it), and it records every tx sent.
type flakyRPC struct {
	RPC
	mu    sync.Mutex
	mode  string
	left  int // broadcasts to disturb; -1: all
	sent  [][]byte
	calls int
}

var errReset = errors.New("connection reset by peer")

func (f *flakyRPC) BroadcastTxSync(ctx context.Context, tx cmttypes.Tx) (*ctypes.ResultBroadcastTx, error) {
	f.mu.Lock()
	f.sent = append(f.sent, append([]byte(nil), tx...))
	f.calls++
	mode := f.mode
	if f.left == 0 {
		mode = ""
	} else if f.left > 0 {
		f.left--
	}
	f.mu.Unlock()
	switch mode {
	case "dropTx":
		return nil, errReset
	case "dropAnswer":
		f.RPC.BroadcastTxSync(ctx, tx)
		return nil, errReset
	}
	return f.RPC.BroadcastTxSync(ctx, tx)
}

func (f *flakyRPC) set(mode string, left int) {
	f.mu.Lock()
	f.mode, f.left = mode, left
	f.mu.Unlock()
}

// memOutbox is an Outbox in memory, as a node's store would keep it.
type memOutbox struct {
	mu sync.Mutex
	m  map[string]OutboxEntry
}

func (o *memOutbox) Put(e OutboxEntry) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.m[e.Hash] = e
	return nil
}

func (o *memOutbox) Delete(h string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.m, h)
	return nil
}

func (o *memOutbox) List() ([]OutboxEntry, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []OutboxEntry
	for _, e := range o.m {
		out = append(out, e)
	}
	return out, nil
}

// TestClientOutcomes drives the client through a real node and a flaky
// link to it: a retry sends the same bytes and never pays twice; a lost
// answer is an unknown outcome that names the hash, never a rejection,
// and TxStatus then finds it committed; a lost transaction whose nonce
// another takes is dropped; one refused by CheckTx is rejected; an outbox
// lets a new client finish what a crashed one sent; and a later nonce
// refused as too high makes the client send its lost earlier ones again.
func TestClientOutcomes(t *testing.T) {
	issuer, alice, bob := key(t, 1), key(t, 2), key(t, 3)
	c := startRPCChain(t, key(t, 99), genesis(issuer, map[*identity.Key]uint64{alice: 100 * credit}, bob))
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	rpc := c.chain.Client()
	balance := func() uint64 { return c.app.BalanceOf(bob.Address()) }

	t.Run("retry sends the same bytes", func(t *testing.T) {
		f := &flakyRPC{RPC: rpc}
		f.set("dropAnswer", 2) // the node takes it; the client hears nothing, twice
		cl := NewClient(f, alice, testChain)
		was := balance()
		if _, err := cl.Transfer(ctx, bob.Address(), 2*credit, ""); err != nil {
			t.Fatal(err)
		}
		if len(f.sent) != 3 || !bytes.Equal(f.sent[0], f.sent[1]) || !bytes.Equal(f.sent[1], f.sent[2]) {
			t.Fatalf("%d broadcasts, not all the same bytes", len(f.sent))
		}
		if got := balance(); got != was+2*credit {
			t.Fatalf("bob got %d, want one transfer of 2 credits", got-was)
		}
	})

	t.Run("a lost answer is an unknown outcome", func(t *testing.T) {
		f := &flakyRPC{RPC: rpc}
		f.set("dropAnswer", -1)
		cl := NewClient(f, alice, testChain)
		short, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := cl.Transfer(short, bob.Address(), credit, "")
		var unknown *UnknownOutcomeError
		var rejected *Error
		if !errors.Is(err, ErrUnknownOutcome) || !errors.As(err, &unknown) || errors.As(err, &rejected) {
			t.Fatalf("lost answers: %v", err)
		}
		if unknown.Hash != TxHashHex(f.sent[0]) {
			t.Fatalf("the error names %s, the client sent %s", unknown.Hash, TxHashHex(f.sent[0]))
		}
		st := waitState(ctx, t, cl, unknown.Hash, TxCommitted)
		if st.Height == 0 || st.Code != CodeOK {
			t.Fatalf("status %+v", st)
		}
	})

	t.Run("a lost transaction whose nonce is taken is dropped", func(t *testing.T) {
		f := &flakyRPC{RPC: rpc}
		f.set("dropTx", -1)
		lost := NewClient(f, alice, testChain)
		short, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := lost.Transfer(short, bob.Address(), 5*credit, "lost")
		var unknown *UnknownOutcomeError
		if !errors.As(err, &unknown) {
			t.Fatalf("a transaction lost on the way: %v", err)
		}
		if st, err := lost.TxStatus(ctx, unknown.Hash); err != nil || st.State != TxUnknown {
			t.Fatalf("before its nonce is taken: %+v %v", st, err)
		}
		was := balance()
		if _, err := NewClient(rpc, alice, testChain).Transfer(ctx, bob.Address(), credit, "other"); err != nil {
			t.Fatal(err)
		}
		st := waitState(ctx, t, lost, unknown.Hash, TxDropped)
		if st.Nonce == nil || balance() != was+credit {
			t.Fatalf("status %+v, bob got %d", st, balance()-was)
		}
	})

	t.Run("refused by CheckTx is rejected", func(t *testing.T) {
		cl := NewClient(rpc, alice, testChain)
		_, err := cl.Transfer(ctx, bob.Address(), 1000*credit, "")
		var rejected *Error
		if !errors.As(err, &rejected) || rejected.Code != CodeInsufficientFunds || errors.Is(err, ErrUnknownOutcome) {
			t.Fatalf("an overdraft: %v", err)
		}
	})

	t.Run("an outbox finishes what a crashed client sent", func(t *testing.T) {
		box := &memOutbox{m: map[string]OutboxEntry{}}
		f := &flakyRPC{RPC: rpc}
		f.set("dropTx", -1) // it crashes before its transaction reaches the node
		crashed := NewClient(f, alice, testChain, WithOutbox(box))
		short, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		p, err := crashed.Prepare(short, TypeTransfer, &Transfer{To: string(bob.Address()), Amount: 4 * credit})
		if err != nil {
			t.Fatal(err)
		}
		if err := crashed.Broadcast(short, p); !errors.Is(err, ErrUnknownOutcome) {
			t.Fatalf("broadcast into a dead link: %v", err)
		}
		was := balance()
		restarted := NewClient(rpc, alice, testChain, WithOutbox(box))
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- restarted.Run(rctx) }()
		st := waitState(ctx, t, restarted, p.Hash, TxCommitted)
		stop()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if balance() != was+4*credit || st.Nonce == nil || *st.Nonce != p.Nonce {
			t.Fatalf("bob got %d; status %+v", balance()-was, st)
		}
		if e := box.m[p.Hash]; e.Final == nil || e.Final.State != TxCommitted {
			t.Fatalf("outbox entry %+v", e)
		}
	})

	t.Run("a nonce refused as too high sends the lost ones again", func(t *testing.T) {
		f := &flakyRPC{RPC: rpc}
		cl := NewClient(f, alice, testChain)
		f.set("dropTx", -1)
		short, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		first, err := cl.Submit(short, TypeTransfer, &Transfer{To: string(bob.Address()), Amount: credit})
		if !errors.Is(err, ErrUnknownOutcome) {
			t.Fatalf("first: %v", err)
		}
		f.set("", 0)
		was := balance()
		if _, err := cl.Transfer(ctx, bob.Address(), credit, "second"); err != nil {
			t.Fatal(err)
		}
		if st := waitState(ctx, t, cl, first, TxCommitted); balance() != was+2*credit {
			t.Fatalf("bob got %d; first %+v", balance()-was, st)
		}
	})
}

// waitState polls TxStatus until the transaction reaches want.
func waitState(ctx context.Context, t *testing.T, cl *Client, hash string, want TxState) TxStatus {
	t.Helper()
	for {
		st, err := cl.TxStatus(ctx, hash)
		if err != nil {
			t.Fatal(err)
		}
		if st.State == want {
			return st
		}
		if st.State.Final() {
			t.Fatalf("%s is %s (%s), want %s", hash, st.State, st.Reason, want)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s still %s, want %s", hash, st.State, want)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// looseDecode decodes the first CBOR item of b with fxamacker's defaults:
// duplicate keys overwrite, unknown keys are skipped, any integer width,
// trailing bytes ignored.
func looseDecode(b []byte, v any) error {
	_, err := cbor.UnmarshalFirst(b, v)
	return err
}
