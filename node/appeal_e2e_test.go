package node

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/p2p"
)

// greedyHolder wraps the job's program: as the holder, it refuses every
// update of the workers plan names, whatever they are, naming them in
// its accounts as the stock holder does (what the payer's node signs). A
// greedy job program, run by the stock node.
const greedyHolder = `import os, runpy, sys
greedy = {int(r) for r in sys.argv[1].split(",") if r}
if os.environ.get("DM_ROLE") == "holder":
    from deepmarket.train import holder as H
    vet = H.Holder._vet
    def _vet(self, j, r, delta, h=None, payload=b""):
        d, why = vet(self, j, r, delta, h, payload)
        if j not in greedy or d is None:
            return d, why
        why = "its update is not good enough"
        with self._cv:
            v = self._verdicts.get(j)
            if v is not None and v[0] == r:
                self._verdicts[j] = (r, False, why, v[3], 0.0)
            a = self._account(j)
            a["last_refusal"] = "round %d: %s" % (r, why)
            a["refusal"] = self._bound(r, self._state, delta)
        return None, why
    H.Holder._vet = _vet
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
`

// TestRefereesPayARefusedHonestWorker: a held job whose program's holder
// refuses every update of worker 1, an honest worker, and averages the
// others (the stock node runs it: a greedy job program). The settlement
// pays worker 1's machine its floor and withholds what its refused rounds
// would have paid. That machine's node recomputes the refusal from the
// evidence its worker kept (the round's weights and its update, whose
// digests the payer's signed answer names) with the referees' program,
// finds the update good, and appeals with the evidence's content address.
// The validator the appeal draws (worker 0's machine, outside the case)
// fetches the evidence and the bid's validation batch, checks the payer's
// signature, recomputes in its sandbox and votes: overturned. The machine
// is paid what was withheld, and its bond comes back. Without the
// recomputation (no vote), the case would lapse and the withheld credit
// burn.
func TestRefereesPayARefusedHonestWorker(t *testing.T) {
	py := jobPython(t)
	params := testLedgerParams()
	params.DisputeWindow = 240 // the appellant's and the referee's recomputations take TensorFlow's start
	c := startJobClusterOn(t, py, 2, api.LendRequest{Cores: 1, MemBytes: 2 << 30}, params, nil)
	a := c.sub
	// Both machines become validators, small ones (the submitter's node
	// still makes blocks alone), and each owner can lock a bond: the one
	// whose worker the holder refuses appeals, the other judges.
	const stake = 1_000_000
	for _, l := range c.lenders {
		if _, err := a.ledger.VoteValidator(t.Context(), l.key.Public(), 1, filepath.Base(l.home.Dir)); err != nil {
			t.Fatal(err)
		}
		if _, err := a.ledger.Transfer(t.Context(), l.key.Address(), stake, "for an appeal's bond"); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, time.Minute, "the machines to be validators", func() bool {
		vs, err := c.lenders[1].ledger.Validators(t.Context())
		return err == nil && len(vs.Validators) == 3
	})

	bundle := t.TempDir()
	os.Chmod(bundle, 0o755)
	train, err := os.ReadFile("../examples/fashion-mnist/train.py")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(bundle, "train.py"), train, 0o644)
	os.WriteFile(filepath.Join(bundle, "greedy.py"), []byte(greedyHolder), 0o644)
	batch := validationBatch(t, py, bundle)
	spec := jobs.File{Name: "greedy", Framework: "tensorflow", Bundle: bundle,
		Command: []string{"python3", "greedy.py", "1", "train.py", "--epochs", "2", "--steps-per-epoch", "60",
			"--join-timeout", "30", "--round-timeout", "20", "--no-overlap"},
		Dataset: "/usr/share/datasets/fashion-mnist", Workers: 2, Cores: 1, Memory: "2GiB", MaxPrice: "5", MaxDuration: "15m",
		Training: &p2p.Training{Mode: "diloco", SyncEvery: 20, Compress: "int8", Holder: p2p.HolderSubmitter, Validation: batch}}
	j, err := a.client.Submit(t.Context(), api.SubmitRequest{Spec: spec, Yes: true})
	if err != nil {
		t.Fatal(err)
	}
	j = waitJob(t, a, j.ID, 8*time.Minute)
	ended := time.Now()
	log := jobLog(t, a, j.ID)
	if j.State != jobs.Succeeded || len(j.Runs) != 1 {
		t.Fatalf("the job: %s (%s), %d run(s)\n%s", j.State, j.Reason, len(j.Runs), log)
	}
	run := j.Current()
	ws := run.Workers
	referee := c.lenders[0]
	if ws[1].Payee == string(referee.key.Address()) {
		referee = c.lenders[1]
	}
	if ws[1].Accepted != 0 || ws[1].Refused < 1 || ws[1].Refusal == nil || ws[0].Accepted < 3 || run.Withheld == 0 {
		t.Fatalf("the greedy holder's accounts: %+v, withheld %d\n%s", ws, run.Withheld, log)
	}

	// The appeal, and its verdict.
	var k ledger.Case
	var withheld uint64
	var appealed, decided time.Time
	for deadline := time.Now().Add(6 * time.Minute); k.Verdict == ""; time.Sleep(250 * time.Millisecond) {
		if time.Now().After(deadline) {
			appellant := c.lenders[0]
			if appellant == referee {
				appellant = c.lenders[1]
			}
			var did string
			found, err := appellant.store.Get("appealed/"+run.ID, &did)
			t.Fatalf("no verdict on the appellant's case within 6 minutes: %+v; the appellant's record of its appeal: %q (found %v, %v)",
				k, did, found, err)
		}
		e, err := a.ledger.Escrow(t.Context(), run.ID)
		if err != nil {
			continue
		}
		for _, w := range e.Withheld {
			if w.Payee == ws[1].Payee {
				withheld = max(withheld, w.Amount)
			}
		}
		if i := slices.IndexFunc(e.Cases, func(k ledger.Case) bool { return k.Appellant == ws[1].Payee }); i >= 0 {
			k = e.Cases[i]
			if appealed.IsZero() {
				appealed = time.Now()
			}
		}
	}
	decided = time.Now()
	t.Logf("job ended to appeal committed: %s (the settlement, then the appellant's own recomputation); appeal to verdict: %s (the referee's)",
		appealed.Sub(ended).Round(100*time.Millisecond), decided.Sub(appealed).Round(100*time.Millisecond))
	if k.Verdict != ledger.VerdictOverturned || !slices.Equal(k.Referees, []string{string(referee.key.Address())}) ||
		k.Claim != withheld || withheld == 0 {
		t.Fatalf("the case: %+v (withheld %d)", k, withheld)
	}
	// Paid its floor at the settlement, and what was withheld on appeal;
	// its bond came back.
	bal, err := a.client.Balance(t.Context(), ws[1].Payee)
	if err != nil {
		t.Fatal(err)
	}
	floor := jobs.FloorOf(run, &ws[1], time.Now())
	if bal.Balance < stake+floor+withheld {
		t.Errorf("the appellant holds %d: want %d, its floor %d and the %d withheld", bal.Balance, stake, floor, withheld)
	}
}
