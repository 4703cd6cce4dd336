package sandbox

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// Start re-executes this test binary as the trampoline.
	MaybeRunTrampoline()
	if os.Getenv(trampolineEnv) != "" {
		panic("unreachable: the trampoline execs or exits")
	}
	goleak.VerifyTestMain(m)
}
