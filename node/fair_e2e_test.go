package node

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/jobs"
)

// TestEarlySettlementPaysTheReceipt: a greedy submitter, its node
// modified, settles a running job's escrow at once for 0.01 credit after
// signing its lender receipts for more, through the real ledger (a settle
// transaction its own key signs). The lender's stock node sees the
// settlement, lodges its latest receipt in the dispute window and is paid
// all it covers; the escrow closes by itself once the window ends; the
// submitter's own settlement at the job's end is refused and changes
// nothing.
func TestEarlySettlementPaysTheReceipt(t *testing.T) {
	t.Parallel()
	py := jobPython(t)
	c := startJobClusterLending(t, py, 1, api.LendRequest{Cores: 1, MemBytes: 1 << 30})
	a, l := c.sub, c.lenders[0]
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "job.py"), []byte("import time\nprint('working', flush=True)\ntime.sleep(60)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := jobs.File{Name: "greedy", Framework: "generic", Command: []string{"python3", "job.py"}, Bundle: dir,
		Workers: 1, Cores: 1, Memory: "256MiB", MaxPrice: "5", MaxDuration: "10m"}
	j, err := a.client.Submit(t.Context(), api.SubmitRequest{Spec: spec, Yes: true})
	if err != nil {
		t.Fatal(err)
	}
	// Wait for the submitter to have signed its lender two receipts.
	var run jobs.Run
	eventually(t, 3*time.Minute, "two receipts signed for the lender", func() bool {
		cur, err := a.client.Job(t.Context(), j.ID)
		if err != nil || len(cur.Runs) == 0 {
			return false
		}
		run = *cur.Current()
		return len(run.Workers) == 1 && run.Workers[0].ReceiptSeq >= 2 && run.Workers[0].Receipt > 0
	})
	payee := run.Workers[0].Payee
	before, err := a.client.Balance(t.Context(), payee)
	if err != nil {
		t.Fatal(err)
	}
	signed := run.Workers[0].Receipt
	if _, err := a.ledger.Settle(t.Context(), ledger.Settle{Job: run.ID, Payments: []ledger.Payment{{Machine: payee, Amount: 10_000}}}); err != nil {
		t.Fatalf("the greedy settlement: %v", err)
	}
	// The lender lodges what it holds (at least the receipt signed before
	// the settlement) well within the window.
	eventually(t, testDisputeWindow, "the lender paid what the submitter's receipt covers", func() bool {
		b, err := l.client.Balance(t.Context(), "")
		return err == nil && b.Balance >= before.Balance+signed
	})
	waitRefunded(t, a, &jobs.Job{Runs: []jobs.Run{run}})
	if _, err := a.ledger.Escrow(t.Context(), run.ID); ledger.CodeOf(err) != ledger.CodeUnknownEscrow {
		t.Fatalf("the escrow after its window: %v", err)
	}
	done := waitJob(t, a, j.ID, 2*time.Minute)
	got, err := l.client.Balance(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	if done.Current().Settled || got.Balance < before.Balance+signed {
		t.Errorf("after the job: settled again %v; the lender holds %d, %d more than before the settlement (the receipt covered %d)",
			done.Current().Settled, got.Balance, got.Balance-before.Balance, signed)
	}
	if rec, err := a.ledger.PayerRecord(t.Context(), string(a.key.Address())); err != nil || rec.Closed != 1 || rec.Paid != 10_000 || rec.Owed < signed {
		t.Errorf("the payer's record %+v (%v): want its 0.01 paid against at least %d owed", rec, err, signed)
	}
}
