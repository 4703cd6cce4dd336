package ledger

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"
	"time"

	cmted "github.com/cometbft/cometbft/crypto/ed25519"
	cmttypes "github.com/cometbft/cometbft/types"
)

// TestNetworkValidatorVotedIn: a second university's full node joins a
// one-validator network on loopback and syncs; the validator votes it in
// (10 of 10, over 2/3); CometBFT's /validators has it from height H+2 and
// not before, its signature is on the commits from then on (with 10 of 20
// each, no block commits without it), both apps hold the same set, and the
// audit replays the vote.
func TestNetworkValidatorVotedIn(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two CometBFT nodes")
	}
	vals, doc := startValidators(t, 1, genesis(key(t, 1), nil))
	v0 := vals[0]
	uni := &testValidator{key: key(t, 150), dir: filepath.Join(t.TempDir(), "uni"), p2p: freePort(t)}
	uni.start(t, doc, []*testValidator{v0, uni})
	t.Cleanup(uni.stop)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	waitAll(ctx, t, []*testValidator{v0, uni}, 3)

	cl := NewClient(v0.chain.Client(), v0.key, testChain)
	res, err := cl.VoteValidator(ctx, uni.key.Public(), 10, "uni-b")
	if err != nil {
		t.Fatal(err)
	}
	h := res.Height
	set, err := cl.Validators(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if set.TotalPower != 20 || len(set.Validators) != 2 || len(set.Proposals) != 0 {
		t.Fatalf("ledger's set after the vote at %d: %+v", h, set)
	}

	addr := cmted.PubKey(uni.key.Public()).Address()
	inSet := func(height int64) bool {
		t.Helper()
		r, err := v0.chain.Client().Validators(ctx, &height, nil, nil)
		if err != nil {
			t.Fatalf("/validators at %d: %v", height, err)
		}
		for _, v := range r.Validators {
			if bytes.Equal(v.Address, addr) {
				return true
			}
		}
		return false
	}
	waitAll(ctx, t, []*testValidator{v0, uni}, h+5)
	if inSet(h + 1) {
		t.Fatalf("CometBFT's set at %d, the block after the vote, has the new validator", h+1)
	}
	for height := h + 2; height <= h+4; height++ {
		if !inSet(height) {
			t.Fatalf("CometBFT's set at %d lacks the validator voted in at %d", height, h)
		}
		c, err := v0.chain.Client().Commit(ctx, &height)
		if err != nil {
			t.Fatal(err)
		}
		signed := false
		for _, sig := range c.Commit.Signatures {
			signed = signed || (bytes.Equal(sig.ValidatorAddress, addr) && sig.BlockIDFlag == cmttypes.BlockIDFlagCommit)
		}
		if !signed {
			t.Fatalf("commit of block %d lacks the new validator's signature", height)
		}
	}
	a, b := v0.app.Snapshot(), uni.app.Snapshot()
	if len(b.Validators) != 2 || b.Validators[keyOf(uni.key.Public())].Name != "uni-b" {
		t.Fatalf("the new node's app has set %v", b.Validators)
	}
	checkAgreement(ctx, t, []*testValidator{v0, uni}, min(a.Height, b.Height))

	rep, err := AuditWith(ctx, v0.chain.Client(), AuditOptions{Genesis: doc})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK || rep.TxsOK != 1 {
		t.Fatalf("audit: %+v", rep)
	}
}
