package lender

import (
	"slices"
	"testing"
)

// TestPickCPUs: workers get CPUs of their own, highest first, from the
// configured pool; when they outnumber the CPUs, or the machine shares
// its CPUs ([executor] share_cpus), they are pinned to none and only
// their quota holds them.
func TestPickCPUs(t *testing.T) {
	e := &Executor{cpuPool: []int{0, 1, 2}, cpus: map[int]string{}}
	got, err := e.pickCPUs("a", 2)
	if err != nil || !slices.Equal(got, []int{1, 2}) {
		t.Fatalf("first worker: %v %v, want [1 2]", got, err)
	}
	if got, _ := e.pickCPUs("b", 1); !slices.Equal(got, []int{0}) {
		t.Errorf("second worker: %v, want [0]", got)
	}
	if got, _ := e.pickCPUs("c", 1); got != nil {
		t.Errorf("a worker beyond the CPUs is pinned to %v", got)
	}
	shared := &Executor{cpuPool: []int{0, 1}, shareCPUs: true, cpus: map[int]string{}}
	if got, err := shared.pickCPUs("a", 1); got != nil || err != nil || len(shared.cpus) != 0 {
		t.Errorf("with share_cpus: pinned to %v (%v), taken %v", got, err, shared.cpus)
	}
}
