package lender

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestSavedSettingsOfferNothingOnAMachineThatCannotRunJobs: settings
// saved before the job sandbox went missing (bubblewrap uninstalled) are
// not offered, and the state says why rather than "Lending".
func TestSavedSettingsOfferNothingOnAMachineThatCannotRunJobs(t *testing.T) {
	store := newMemStore()
	if err := store.Put(lendKey, LendSettings{Cores: 2, MemBytes: 1 << 30, Since: time.Now()}); err != nil {
		t.Fatal(err)
	}
	l, err := NewLender(LenderParams{Store: store, Capable: func() error { return errors.New("no bubblewrap") }})
	if err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	err = l.syncLocked(t.Context(), time.Now(), false) // no topic: an offer would panic
	l.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	st := l.State(time.Now())
	if st.Offering || !strings.Contains(st.Unable, "bubblewrap") {
		t.Fatalf("a machine that cannot run jobs: offering %v, unable %q", st.Offering, st.Unable)
	}
}
