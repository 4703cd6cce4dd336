package p2p

import "testing"

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
