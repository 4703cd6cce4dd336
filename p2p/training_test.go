package p2p

import (
	"math"
	"slices"
	"testing"
)

// steps_ratio is the job's own measured statistics: 1 for one worker,
// then between perfect scaling and no gain; anything else is refused.
func TestTrainingStepsRatio(t *testing.T) {
	ok := Training{Mode: "sync", StepsRatio: []float64{1, 0.6, 0.45}}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, r := range [][]float64{{0.9}, {1, 0.4}, {1, 1.1}, {1, 0.6, 0.2}, make([]float64, MaxStepsRatio+1)} {
		tr := Training{Mode: "sync", StepsRatio: r}
		if err := tr.Validate(); err == nil {
			t.Errorf("steps_ratio %v: no error", r)
		}
	}
}

// holder is "workers" or "submitter", and a submitter holds a diloco
// job's model only.
func TestTrainingHolder(t *testing.T) {
	for _, tr := range []Training{{Mode: "diloco", Holder: HolderSubmitter}, {Mode: "diloco", Holder: HolderWorkers}, {Mode: "sync"}} {
		if err := tr.Validate(); err != nil {
			t.Errorf("%+v: %v", tr, err)
		}
	}
	for _, tr := range []Training{{Mode: "sync", Holder: HolderSubmitter}, {Mode: "diloco", Holder: "lender"}} {
		if err := tr.Validate(); err == nil {
			t.Errorf("%+v: no error", tr)
		}
	}
	if !(&Training{Mode: "diloco", Holder: HolderSubmitter}).Held() || (&Training{Mode: "diloco"}).Held() || (*Training)(nil).Held() {
		t.Error("Held")
	}
}

// Spot checks need a held job and shares within bounds, and reach the
// workers and the holder as DM_VERIFY_*.
func TestTrainingVerify(t *testing.T) {
	held := Training{Mode: "diloco", Holder: HolderSubmitter, Verify: &Verify{Rate: 0.1, Share: 0.2, Tolerance: 0.1}}
	if err := held.Validate(); err != nil {
		t.Fatal(err)
	}
	env := held.Env()
	for _, want := range []string{"DM_VERIFY_RATE=0.1", "DM_VERIFY_SHARE=0.2", "DM_VERIFY_TOLERANCE=0.1"} {
		if !slices.Contains(env, want) {
			t.Errorf("env %v lacks %s", env, want)
		}
	}
	for _, tr := range []Training{
		{Mode: "diloco", Verify: &Verify{Rate: 0.1, Tolerance: 0.1}},                                     // not held
		{Mode: "diloco", Holder: HolderSubmitter, Verify: &Verify{Rate: 0, Tolerance: 0.1}},              // checks nothing
		{Mode: "diloco", Holder: HolderSubmitter, Verify: &Verify{Rate: 1.5, Tolerance: 0.1}},            // over all rounds
		{Mode: "diloco", Holder: HolderSubmitter, Verify: &Verify{Rate: 0.1, Share: -1, Tolerance: 0.1}}, // negative share
		{Mode: "diloco", Holder: HolderSubmitter, Verify: &Verify{Rate: 0.1, Tolerance: math.NaN()}},     // NaN
	} {
		if err := tr.Validate(); err == nil {
			t.Errorf("%+v %+v: no error", tr, *tr.Verify)
		}
	}
}

// A machine's progress report out of bounds (NaN, an accuracy over 1, a
// count past the bound) is refused with its status: the submitter takes
// it as no answer.
func TestProgressValidate(t *testing.T) {
	ok := JobStatus{JobID: "j", State: WorkerRunning, Progress: &Progress{Units: 5, Loss: -0.3, Steps: 4, Total: 10, Accuracy: 0.9,
		EvalLoss: 0.4, EvalAccuracy: 0.85, EvalAt: 3}}
	if err := ok.Validate("j", 0); err != nil {
		t.Fatal(err)
	}
	for _, p := range []Progress{{Loss: math.NaN()}, {EvalLoss: math.Inf(1)}, {Accuracy: 1.5}, {EvalAccuracy: -0.1},
		{Accuracy: math.NaN()}, {Total: MaxProgressCount + 1}} {
		st := JobStatus{JobID: "j", State: WorkerRunning, Progress: &p}
		if err := st.Validate("j", 0); err == nil {
			t.Errorf("%+v: no error", p)
		}
	}
}
