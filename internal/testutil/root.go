package testutil

import (
	"os"
	"testing"
)

// NeedRoot skips t unless it runs as root on a machine where available
// (nil, or a probe such as the job sandbox's) returns nil. Under
// DM_REQUIRE_ROOT=1, which `make test` sets, it fails t instead: a suite
// that guards the lender must not pass by not running.
func NeedRoot(t testing.TB, available func() error) {
	t.Helper()
	why := ""
	if os.Geteuid() != 0 {
		why = "needs root"
	} else if available != nil {
		if err := available(); err != nil {
			why = err.Error()
		}
	}
	if why == "" {
		return
	}
	if os.Getenv("DM_REQUIRE_ROOT") == "1" {
		t.Fatalf("DM_REQUIRE_ROOT=1, but %s: run the tests as root on a machine with the job sandbox (`make deps` installs it)", why)
	}
	t.Skip(why)
}
