// Package fault is the roles' vocabulary for a request that failed: what
// kind of failure it is and which field of the request is at fault. The
// roles (submitter, lender, market) return a *Error; node/api maps each
// Kind to an HTTP status in one table, so that no role speaks HTTP.
package fault

import (
	"errors"
	"fmt"
)

// Kind says why a request failed, in the roles' terms.
type Kind uint8

const (
	// Internal is a failure of this node, not of the request.
	Internal Kind = iota
	// Malformed is a request that cannot be read: a bad duration, a
	// non-hex hash.
	Malformed
	// Invalid is a well-formed request the role refuses as asked: too
	// many workers, a path that does not exist.
	Invalid
	// NotFound names something this node does not have: a job, a hold,
	// a pinned block.
	NotFound
	// Conflict is a request at odds with the current state: cancelling
	// a finished job, releasing a hold in use.
	Conflict
	// Unavailable is a request that may succeed later: the node is
	// starting, the network is down.
	Unavailable
	// Timeout is a request whose outcome is not known in time.
	Timeout
)

var kindNames = [...]string{"internal", "malformed", "invalid", "not found", "conflict", "unavailable", "timeout"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", k)
}

// Error is a failed request: its Kind, the request Field at fault (empty
// when none is) and a message for the user.
type Error struct {
	Kind    Kind
	Field   string
	Message string
	// Err is the cause, when there is one; errors.Is and errors.As see it.
	Err error
}

func (e *Error) Error() string { return e.Message }

func (e *Error) Unwrap() error { return e.Err }

// New returns an Error of kind at field, its message formatted.
func New(kind Kind, field, format string, args ...any) *Error {
	return &Error{Kind: kind, Field: field, Message: fmt.Sprintf(format, args...)}
}

// Wrap returns err as an Error of kind at field, its message err's.
func Wrap(kind Kind, field string, err error) *Error {
	return &Error{Kind: kind, Field: field, Message: err.Error(), Err: err}
}

// KindOf is the Kind of the first *Error in err's chain, and whether there
// is one.
func KindOf(err error) (Kind, bool) {
	var fe *Error
	if errors.As(err, &fe) {
		return fe.Kind, true
	}
	return Internal, false
}
