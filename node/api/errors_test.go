package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/fault"
)

// TestErrorsMapToStatuses: each kind of failure a role or the ledger
// returns reaches the client with its status, field and message, through
// wrapping.
func TestErrorsMapToStatuses(t *testing.T) {
	for _, tc := range []struct {
		err     error
		status  int
		field   string
		message string
	}{
		{fault.New(fault.Invalid, "cores", "cores must be at least 1"), http.StatusUnprocessableEntity, "cores", "cores must be at least 1"},
		{fmt.Errorf("cancel: %w", fault.New(fault.Conflict, "", "job j1 is done")), http.StatusConflict, "", "cancel: job j1 is done"},
		{fault.New(fault.NotFound, "id", "no job"), http.StatusNotFound, "id", "no job"},
		{fault.New(fault.Malformed, "ttl", "ttl: want a duration"), http.StatusBadRequest, "ttl", "ttl: want a duration"},
		{fault.New(fault.Unavailable, "", "starting"), http.StatusServiceUnavailable, "", "starting"},
		{fault.New(fault.Timeout, "", "stalled"), http.StatusGatewayTimeout, "", "stalled"},
		{fault.New(fault.Kind(99), "", "odd"), http.StatusInternalServerError, "", "odd"},
		{&ledger.Error{Code: ledger.CodeInsufficientFunds, Reason: "balance 1 < 2"}, http.StatusUnprocessableEntity, "", "balance 1 < 2"},
		{ledger.ErrNotSent, http.StatusServiceUnavailable, "", ledger.ErrNotSent.Error()},
		{context.DeadlineExceeded, http.StatusServiceUnavailable, "", context.DeadlineExceeded.Error()},
		{errors.New("disk on fire"), http.StatusInternalServerError, "", "disk on fire"},
	} {
		got := toAPIError(tc.err)
		if got.Status != tc.status || got.Field != tc.field || got.Message != tc.message {
			t.Errorf("%v: got %d %q %q; want %d %q %q", tc.err, got.Status, got.Field, got.Message, tc.status, tc.field, tc.message)
		}
	}
	unknown := toAPIError(fmt.Errorf("send: %w", &ledger.UnknownOutcomeError{Hash: "AB12", Reason: "no commit", Timeout: true}))
	if unknown.Status != http.StatusGatewayTimeout || unknown.Hash != "AB12" || unknown.Outcome != OutcomeUnknown {
		t.Errorf("unknown outcome: %+v", unknown)
	}
	refused := toAPIError(&ledger.Error{Code: ledger.CodeInsufficientFunds, Reason: "x"})
	if refused.Code != ledger.CodeInsufficientFunds {
		t.Errorf("a refusal lost its code: %+v", refused)
	}
}
