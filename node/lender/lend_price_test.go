package lender

import (
	"testing"

	"github.com/deepmarket/deepmarket/p2p"
)

// A lend that names some prices keeps the others: what is lent now, else
// the configured defaults (--price core=... once set the GPU's to 0).
func TestMergePriceKeepsThePricesNotGiven(t *testing.T) {
	defaults := p2p.Prices{CoreHour: 100, MemGiBHour: 10, GPUHour: 2000}
	l, err := NewLender(LenderParams{Store: newMemStore(), Defaults: defaults})
	if err != nil {
		t.Fatal(err)
	}
	if got := l.mergePrice(p2p.Prices{CoreHour: 300}, []string{"core"}); *got != (p2p.Prices{CoreHour: 300, MemGiBHour: 10, GPUHour: 2000}) {
		t.Errorf("not lending: %+v", *got)
	}
	l.set = &LendSettings{Price: p2p.Prices{CoreHour: 300, MemGiBHour: 20, GPUHour: 5000}}
	if got := l.mergePrice(p2p.Prices{MemGiBHour: 0, GPUHour: 7}, []string{"mem", "gpu"}); *got != (p2p.Prices{CoreHour: 300, GPUHour: 7}) {
		t.Errorf("lending: %+v", *got)
	}
}
