package lender

import (
	"slices"
	"strings"
	"testing"
)

// TestFrameworkEnv: a torch worker gets torchrun's contract, its local
// rank counted among the job's workers on its own machine; a TensorFlow
// worker gets TF_CONFIG; every framework gets the chief's address.
func TestFrameworkEnv(t *testing.T) {
	addrs := []string{"10.0.0.1:7000", "10.0.0.2:7001", "10.0.0.3:7002"}
	world := []string{"m1", "m2", "m1"}
	got := frameworkEnv("torch", 2, addrs, world)
	for _, want := range []string{"MASTER_ADDR=10.0.0.1", "MASTER_PORT=7000", "RANK=2", "WORLD_SIZE=3", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2"} {
		if !slices.Contains(got, want) {
			t.Errorf("torch worker 2: %v lacks %s", got, want)
		}
	}
	if got := frameworkEnv("torch", 1, addrs, world); !slices.Contains(got, "LOCAL_RANK=0") || !slices.Contains(got, "LOCAL_WORLD_SIZE=1") {
		t.Errorf("torch worker 1, alone on its machine: %v", got)
	}
	tf := frameworkEnv("tensorflow", 1, addrs, world)
	const want = `TF_CONFIG={"cluster":{"worker":["10.0.0.1:7000","10.0.0.2:7001","10.0.0.3:7002"]},"task":{"index":1,"type":"worker"}}`
	if !slices.Contains(tf, want) || slices.ContainsFunc(tf, func(e string) bool { return strings.HasPrefix(e, "RANK=") }) {
		t.Errorf("tensorflow worker 1: %v", tf)
	}
	if g := frameworkEnv("generic", 0, addrs, world); len(g) != 2 {
		t.Errorf("generic worker 0: %v, want MASTER_ADDR and MASTER_PORT only", g)
	}
}
