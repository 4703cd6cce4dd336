package lender

import (
	"sync"
	"testing"

	"github.com/deepmarket/deepmarket/internal/testutil"
	"github.com/deepmarket/deepmarket/node/sandbox"
)

var (
	sandboxOnce sync.Once
	sandboxErr  error
)

// needSandbox skips a test that runs real workers where this machine
// cannot sandbox them (not root, no cgroups, no bubblewrap), and fails it
// there under DM_REQUIRE_ROOT=1.
func needSandbox(t testing.TB) {
	t.Helper()
	testutil.NeedRoot(t, func() error {
		sandboxOnce.Do(func() { sandboxErr = sandbox.Probe().Essential() })
		return sandboxErr
	})
}
