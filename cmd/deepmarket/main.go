// Command deepmarket is DeepMarket's one binary: the node daemon and the
// CLI that talks to it over its local API.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/sandbox"
)

// Exit statuses: 1 for errors, exitUsage for bad command lines,
// exitUnknown when a transaction's outcome is unknown (it may still
// commit; the message names it).
const (
	exitUsage   = 2
	exitUnknown = 3
)

// usageError marks errors in how a command was called.
type usageError struct{ error }

func main() {
	// A sandboxed job's first moments run this binary: nothing else first.
	sandbox.MaybeRunTrampoline()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRoot().ExecuteContext(ctx)
	stop()
	if err == nil {
		return
	}
	var ue usageError
	var apiErr *api.Error
	if errors.Is(err, ledger.ErrUnknownOutcome) {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(exitUnknown)
	}
	fmt.Fprintln(os.Stderr, "error:", err)
	switch {
	case errors.As(err, &ue):
		os.Exit(exitUsage)
	case errors.As(err, &apiErr) && apiErr.Status == 422 && apiErr.Field != "":
		os.Exit(exitUsage)
	}
	os.Exit(1)
}
