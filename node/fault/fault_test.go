package fault

import (
	"errors"
	"fmt"
	"io"
	"testing"
)

func TestKindOfSeesThroughWrapping(t *testing.T) {
	err := fmt.Errorf("cancel: %w", New(Conflict, "id", "job %s is %s", "j1", "done"))
	k, ok := KindOf(err)
	if !ok || k != Conflict {
		t.Fatalf("KindOf = %v, %v; want conflict, true", k, ok)
	}
	if err.Error() != "cancel: job j1 is done" {
		t.Fatalf("message %q", err.Error())
	}
	if _, ok := KindOf(io.EOF); ok {
		t.Fatal("KindOf found a kind in a plain error")
	}
}

func TestWrapKeepsTheCause(t *testing.T) {
	err := Wrap(Unavailable, "", io.ErrUnexpectedEOF)
	if !errors.Is(err, io.ErrUnexpectedEOF) || err.Error() != io.ErrUnexpectedEOF.Error() {
		t.Fatalf("Wrap lost its cause: %v", err)
	}
	if Kind(200).String() != "kind(200)" || Timeout.String() != "timeout" {
		t.Fatal("Kind names")
	}
}
