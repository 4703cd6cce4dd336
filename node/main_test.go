package node

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/deepmarket/deepmarket/node/sandbox"
)

// parallel is how many of the tests that call t.Parallel run at once
// unless -test.parallel says otherwise. They wait on gossip, the ledger's
// blocks and their jobs' sleeps far more than they compute, so one per
// CPU (go test's default) would leave a two-core machine mostly idle. The
// tests that train, measure time or set package variables do not call
// t.Parallel: they run first, one at a time. (Training tests run two at a
// time beside the others made the package faster alone, but under make
// test's load their clusters' TensorFlow probes outran the minute the
// tests give lenders to offer.)
const parallel = 4

func TestMain(m *testing.M) {
	// Sandboxed workers start by re-executing this test binary.
	sandbox.MaybeRunTrampoline()
	// make test's tmpfs for the nodes' homes (scripts/test.sh says why);
	// the jobs' work dirs are in /var/tmp either way.
	if d := os.Getenv("DM_TEST_STATE_DIR"); d != "" {
		os.Setenv("TMPDIR", d)
	}
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		flag.Set("test.parallel", fmt.Sprint(parallel))
	}
	os.Exit(m.Run())
}
