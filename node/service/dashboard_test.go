package service

import (
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/jobs"
)

// TestDescribeSaysWhatMovedCredits: each kind of transaction counts as
// credits in, out, locked or refunded for the account whose history it is.
func TestDescribeSaysWhatMovedCredits(t *testing.T) {
	const me, other, third = "dm1me", "dm1other", "dm1third"
	mine := map[string]bool{me: true, "dm1mymachine": true}
	entry := func(typ string, attrs map[string]string, paid ...string) ledger.HistoryEntry {
		return ledger.HistoryEntry{Height: 7, Hash: "AB", Type: typ, Attrs: attrs, Paid: paid}
	}
	for _, tc := range []struct {
		name                      string
		e                         ledger.HistoryEntry
		in, out, locked, unlocked uint64
		counterparty              string
	}{
		{"transfer out", entry(ledger.TypeTransfer, map[string]string{"from": me, "to": other, "amount": "5"}), 0, 5, 0, 0, other},
		{"transfer in", entry(ledger.TypeTransfer, map[string]string{"from": other, "to": me, "amount": "6"}), 6, 0, 0, 0, other},
		{"transfer to self", entry(ledger.TypeTransfer, map[string]string{"from": me, "to": me, "amount": "6"}), 0, 0, 0, 0, ""},
		{"grant received", entry(ledger.TypeGrant, map[string]string{"from": other, "to": me, "amount": "100"}), 100, 0, 0, 0, other},
		{"grant given from quota", entry(ledger.TypeGrant, map[string]string{"from": me, "to": other, "amount": "100"}), 0, 0, 0, 0, other},
		{"escrow opened", entry(ledger.TypeOpenEscrow, map[string]string{"from": me, "job": "j1", "amount": "1000"}), 0, 0, 1000, 0, ""},
		{"my job settled", entry(ledger.TypeSettle, map[string]string{"from": me, "job": "j1", "refund": "900"}, other+"=60", third+"=40"), 0, 100, 0, 900, ""},
		// Spent is all the job paid; what its own machine earned comes back as earned.
		{"my job on my own machine", entry(ledger.TypeSettle, map[string]string{"from": me, "job": "j1", "refund": "900"}, other+"=60", me+"=40"), 40, 100, 0, 900, ""},
		{"my machines paid", entry(ledger.TypeSettle, map[string]string{"from": other, "job": "j2", "refund": "1"}, third+"=10", "dm1mymachine=30", me+"=20"), 50, 0, 0, 0, other},
		{"claimed for me", entry(ledger.TypeClaim, map[string]string{"job": "j3", "to": me, "amount": "12"}), 12, 0, 0, 0, ""},
		{"claimed from me", entry(ledger.TypeClaim, map[string]string{"job": "j3", "to": other, "amount": "12"}), 0, 12, 0, 0, other},
		{"escrow expired", entry(ledger.TypeExpire, map[string]string{"job": "j4", "refund": "77"}), 0, 0, 0, 77, ""},
	} {
		got := describe(tc.e, me, mine)
		if got.In != tc.in || got.Out != tc.out || got.Locked != tc.locked || got.Unlocked != tc.unlocked || got.Counterparty != tc.counterparty || got.What == "" {
			t.Errorf("%s: %+v", tc.name, got)
		}
	}
}

func TestOfferedFor(t *testing.T) {
	at := func(h, m int) time.Time { return time.Date(2026, 11, 2, h, m, 0, 0, time.Local) }
	for _, tc := range []struct {
		window string
		from   time.Time
		want   time.Duration
	}{
		{"", at(10, 0), 24 * time.Hour},
		{"19:00-07:00", at(10, 0), 12 * time.Hour},
		{"19:00-07:00", at(20, 0), 12 * time.Hour},
		{"09:00-17:00", at(16, 0), 8 * time.Hour},
		{"09:00-09:30", at(12, 0), 30 * time.Minute},
		{"bad", at(12, 0), 0},
	} {
		if got := offeredFor(tc.window, tc.from, 24*time.Hour); got != tc.want {
			t.Errorf("window %q from %s: %s, want %s", tc.window, tc.from.Format("15:04"), got, tc.want)
		}
	}
}

func TestJobCost24h(t *testing.T) {
	now := time.Now()
	job := func(confirmed bool, started time.Time, perHour, maxPrice, cost uint64, maxDur time.Duration) *jobs.Job {
		return &jobs.Job{State: jobs.Running, Confirmed: confirmed, Cost: cost,
			Spec: jobs.Spec{MaxPrice: maxPrice, MaxDuration: maxDur},
			Runs: []jobs.Run{{PerHour: perHour, Started: started}}}
	}
	for _, tc := range []struct {
		name string
		j    *jobs.Job
		want uint64
	}{
		{"runs the whole day", job(true, now, 1000, 1_000_000, 0, 48*time.Hour), 24_000},
		{"two hours left", job(true, now.Add(-time.Hour), 1000, 1_000_000, 0, 3*time.Hour), 2_000},
		{"within its max price", job(true, now, 1000, 5_000, 1_000, 48*time.Hour), 4_000},
		{"not confirmed", job(false, time.Time{}, 1000, 1_000_000, 0, 48*time.Hour), 0},
	} {
		if got := jobCost24h(tc.j, now); got+1 < tc.want || got > tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}
