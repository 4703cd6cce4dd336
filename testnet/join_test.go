package testnet

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	cmttypes "github.com/cometbft/cometbft/types"

	"github.com/deepmarket/deepmarket/internal/testutil"
	"github.com/deepmarket/deepmarket/node"
	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/jobs"
)

// dm runs the deepmarket CLI and returns its output; a failure fails the
// test.
func dm(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("deepmarket %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	return out.String()
}

// TestJoinAsNewUniversity follows docs/testnet.md: a new university gets
// genesis.json and seeds.json, inits its node with them, starts, syncs,
// is granted starter credits by an issuer, lends, and earns from a job.
// Then the validators vote its node in, and it signs blocks.
func TestJoinAsNewUniversity(t *testing.T) {
	t.Parallel()
	n := startNet(t, Params{Validators: 2, Sites: 2, Python: jobPython()}, RunOptions{})
	n.waitHeights(t, all(n), 2, time.Minute)
	// What the network sends the newcomer.
	var seeds Seeds
	b, err := os.ReadFile(filepath.Join(n.Dir, SeedsFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &seeds); err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(t.TempDir(), "newu")
	base := testutil.FreePortRange(t, 4)
	dm(t, "init", "--home", home, "--genesis", filepath.Join(n.Dir, GenesisFile), "--moniker", "newu-lab1", "--site", "univ-new",
		"--bootstrap", strings.Join(seeds.Bootstrap, ","), "--ledger-peers", strings.Join(seeds.LedgerPeers, ","),
		"--listen", fmt.Sprintf("/ip4/127.0.0.1/tcp/%d", base+1), "--api", fmt.Sprintf("127.0.0.1:%d", base),
		"--ledger-p2p", fmt.Sprintf("tcp://127.0.0.1:%d", base+2), "--ledger-rpc", fmt.Sprintf("tcp://127.0.0.1:%d", base+3))
	// Lenders run jobs with the test's Python; and no mDNS on a shared host.
	h := node.Home{Dir: home}
	cfg, err := node.LoadConfig(h.ConfigPath())
	if err != nil {
		t.Fatal(err)
	}
	cfg.Inventory.Python, cfg.P2P.MDNS = jobPython(), false
	if err := node.SaveConfig(h.ConfigPath(), cfg); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(home, LogFile))
	if err != nil {
		t.Fatal(err)
	}
	run := exec.Command(binary, "node", "run", "--home", home)
	run.Stdout, run.Stderr = logf, logf
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		run.Process.Signal(os.Interrupt)
		run.Wait()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(home, LogFile))
			t.Logf("--- newcomer's log:\n%s", b)
		}
	})
	var nc *api.Client
	deadline := time.Now().Add(time.Minute)
	for {
		if nc, err = ClientOf(h); err == nil {
			if _, err = nc.Status(t.Context()); err == nil {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the new node does not answer: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Synced: it reaches the network's height and audits the same chain.
	top := n.Heights(t.Context(), []int{0})[0]
	for {
		st, _ := nc.Status(t.Context())
		if st.Height >= top {
			break
		}
		if time.Now().After(deadline.Add(time.Minute)) {
			t.Fatalf("the new node is at height %d, the network at %d", st.Height, top)
		}
		time.Sleep(300 * time.Millisecond)
	}
	rep, err := nc.Audit(t.Context())
	if err != nil || !rep.OK {
		t.Fatalf("the new node's audit: %+v %v", rep, err)
	}
	// Starter credits from an issuer (val0 issues univ-a's credits).
	var keys struct {
		Address         string `json:"address"`
		ValidatorPubKey string `json:"validator_pubkey"`
	}
	if err := json.Unmarshal([]byte(dm(t, "--home", home, "keys", "show", "--json")), &keys); err != nil {
		t.Fatal(err)
	}
	dm(t, "--home", n.Home(0).Dir, "ledger", "grant", keys.Address, "10")
	// Lend, and earn from a job a member places there.
	dm(t, "--home", home, "lend", "--cores", "1", "--mem", "1GiB")
	sub, _ := n.Client(1)
	waitOffers(t, n, 1, 1, time.Minute)
	spec := workSpec(workBundle(t), 3, "1", "5m")
	spec.Site = "univ-new"
	j, err := sub.Submit(t.Context(), api.SubmitRequest{Spec: spec, Yes: true})
	if err != nil {
		t.Fatal(err)
	}
	if j = waitJob(t, sub, j.ID, 3*time.Minute); j.State != jobs.Succeeded || j.Cost == 0 {
		t.Fatalf("the job on the new university's machine: %s (%s), cost %d\n%s", j.State, j.Reason, j.Cost, jobLog(t, sub, j.ID))
	}
	// The settlement is on the submitter's replica; the newcomer's may
	// be a block behind.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		bal, err := nc.Balance(t.Context(), "")
		if err == nil && bal.Balance == 10_000_000+j.Cost {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the new node holds %+v (%v), want its grant and the job's %d", bal, err, j.Cost)
		}
	}

	// Becoming a validator: each validator votes it in (2 of 2: more than
	// two thirds of the power).
	for i := range 2 {
		dm(t, "--home", n.Home(i).Dir, "ledger", "validator", "vote", keys.ValidatorPubKey, "--power", "10", "--name", "univ-new")
	}
	rpc, err := n.RPC(0)
	if err != nil {
		t.Fatal(err)
	}
	st, err := nc.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var addr []byte
	deadline = time.Now().Add(time.Minute)
	for {
		h := n.Heights(t.Context(), []int{0})[0]
		vals, err := rpc.Validators(t.Context(), &h, nil, nil)
		if err == nil && len(vals.Validators) == 3 {
			for _, v := range vals.Validators {
				if strings.EqualFold(v.Address.String(), st.LedgerNodeID) {
					addr = v.Address
				}
			}
			if addr != nil {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the new node is not a validator at height %d: %v %v", h, vals, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	// It signs: a transfer makes a block, and the next commit carries its
	// signature.
	dm(t, "--home", n.Home(1).Dir, "ledger", "transfer", keys.Address, "1")
	h0 := n.Heights(t.Context(), []int{0})[0]
	commit, err := rpc.Commit(t.Context(), &h0)
	if err != nil {
		t.Fatal(err)
	}
	signed := false
	for _, s := range commit.Commit.Signatures {
		signed = signed || (s.BlockIDFlag == cmttypes.BlockIDFlagCommit && bytes.Equal(s.ValidatorAddress, addr))
	}
	if !signed {
		t.Fatalf("the new validator did not sign block %d", h0)
	}
	n.check(t, all(n), true)
	if rep, err := nc.Audit(t.Context()); err != nil || !rep.OK {
		t.Fatalf("the new node's audit: %+v %v", rep, err)
	}
}
