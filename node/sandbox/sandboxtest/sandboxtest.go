// Package sandboxtest is for the tests of packages that run real workers
// in the sandbox (node, node/lender): it checks this machine can.
package sandboxtest

import (
	"sync"
	"testing"

	"github.com/deepmarket/deepmarket/internal/testutil"
	"github.com/deepmarket/deepmarket/node/sandbox"
)

var (
	once  sync.Once
	probe error
)

// Need skips a test that runs real workers where this machine cannot
// sandbox them (not root, no cgroups, no bubblewrap), and fails it there
// under DM_REQUIRE_ROOT=1. The test binary's TestMain must call
// sandbox.MaybeRunTrampoline first.
func Need(t testing.TB) {
	t.Helper()
	testutil.NeedRoot(t, func() error {
		once.Do(func() { probe = sandbox.Probe().Essential() })
		return probe
	})
}
