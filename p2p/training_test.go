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

// A held job's thresholds and validation batch are part of its bid,
// within bounds that keep refusing from being the rule; they reach the
// holder as DM_CHECK_* and DM_VALIDATION_CID. FillHeld gives the defaults
// of those a spec leaves out.
func TestTrainingChecks(t *testing.T) {
	const batch = "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"
	held := Training{Mode: "diloco", Holder: HolderSubmitter, Checks: &Checks{Echo: 0.95}, Validation: batch}
	held.FillHeld()
	if *held.Checks != (Checks{Tolerance: 0.1, NormFactor: 10, Echo: 0.95, Residual: 0.9, Duplicate: 0.98}) || held.Verify == nil {
		t.Fatalf("FillHeld: %+v %+v", *held.Checks, held.Verify)
	}
	if err := held.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := held.ValidateInputs(); err != nil {
		t.Fatal(err)
	}
	env := held.Env()
	for _, want := range []string{"DM_CHECK_ECHO=0.95", "DM_CHECK_TOLERANCE=0.1", "DM_CHECK_NORM_FACTOR=10", "DM_VALIDATION_CID=" + batch} {
		if !slices.Contains(env, want) {
			t.Errorf("env %v lacks %s", env, want)
		}
	}
	bad := func(c Checks) Training {
		return Training{Mode: "diloco", Holder: HolderSubmitter, Checks: &c}
	}
	d := *DefaultChecks()
	for _, tr := range []Training{
		{Mode: "diloco", Checks: DefaultChecks()},    // not held
		{Mode: "diloco", Validation: batch},          // not held
		bad(Checks{0, 10, 0.98, 0.9, 0.98}),          // refuses every noisy update
		bad(Checks{0.1, 10, 0, 0.9, 0.98}),           // refuses every update that points the model's way
		bad(Checks{0.1, 10, 0.98, 0.9, 0.5}),         // refuses workers that agree
		bad(Checks{0.1, 1, 0.98, 0.9, 0.98}),         // refuses any update over the median
		bad(Checks{0.1, 10, 0.98, 0.1, 0.98}),        // refuses most of a converging run
		bad(Checks{math.NaN(), 10, 0.98, 0.9, 0.98}), // NaN
	} {
		if err := tr.Validate(); err == nil {
			t.Errorf("%+v %+v: no error", tr, tr.Checks)
		}
	}
	if tr := bad(d); tr.Validate() != nil {
		t.Errorf("the defaults: %v", tr.Validate())
	}
	notCID := Training{Mode: "diloco", Holder: HolderSubmitter, Validation: "/home/me/val.npz"}
	if err := notCID.ValidateInputs(); err == nil {
		t.Error("a bid naming its validation batch by path: no error")
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
