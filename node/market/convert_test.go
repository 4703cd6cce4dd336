package market

import (
	"testing"

	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/scheduler"
)

// A bid's training block becomes the scheduler's workload: with the job's
// own steps_ratio its statistics, else none (the shipped table).
func TestSchedulerTraining(t *testing.T) {
	bid := func(tr p2p.Training) p2p.Bid { return p2p.Bid{Duration: 600, Training: &tr} }
	tr, compute, ok := SchedulerTraining(bid(p2p.Training{Mode: "diloco", Steps: 1000, Params: 10, StepMillis: 100}))
	if !ok || tr.Efficiency != nil || tr.Sync || tr.SyncEvery != defaultSyncEvery || compute.Seconds() != 100 {
		t.Fatalf("diloco without steps_ratio: %+v %v %v", tr, compute, ok)
	}
	tr, _, ok = SchedulerTraining(bid(p2p.Training{Mode: "sync", Steps: 1000, Params: 10, StepsRatio: []float64{1, 0.7, 0.5}}))
	if !ok || tr.Efficiency == nil || tr.Efficiency.Ratio(true, 2) != 0.7 || tr.Efficiency.Ratio(true, 3) != 0.5 {
		t.Fatalf("sync with steps_ratio: %+v %v", tr, ok)
	}
	p, err := scheduler.Predict(tr, 0, []float64{1, 1, 1}, nil)
	if err != nil || p.Steps != 500 {
		t.Fatalf("3 workers at ratio 0.5: %+v %v, want 500 steps each", p, err)
	}
	if _, _, ok := SchedulerTraining(bid(p2p.Training{Mode: "sync", Steps: 1000, Params: 10, StepsRatio: []float64{1, 0.2}})); ok {
		t.Error("a ratio better than perfect scaling was taken")
	}
}
