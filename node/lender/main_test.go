package lender

import (
	"os"
	"testing"

	"github.com/deepmarket/deepmarket/node/sandbox"
)

func TestMain(m *testing.M) {
	// Sandboxed workers start by re-executing this test binary.
	sandbox.MaybeRunTrampoline()
	os.Exit(m.Run())
}
