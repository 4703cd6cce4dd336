package node

import (
	"crypto/rand"
	"fmt"
	"log/slog"
	"testing"
)

// TestStoreMaintenanceKeepsWritesFlowing: the store runs no background
// compactors, so Maintain must fold level 0 back down; with it, far more
// data than the stall limit is written without blocking, and reads back.
func TestStoreMaintenanceKeepsWritesFlowing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := OpenStore(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	val := make([]byte, 8<<10)
	rand.Read(val)
	maxL0 := 0
	for round := 0; round < 12; round++ {
		for i := 0; i < 1000; i++ { // 8 MiB a round: two memtables
			if err := s.Put(fmt.Sprintf("k/%d/%d", round, i), val); err != nil {
				t.Fatal(err)
			}
		}
		maxL0 = max(maxL0, s.level0Tables())
		if err := s.Maintain(); err != nil {
			t.Fatal(err)
		}
	}
	if maxL0 < 2 {
		t.Fatalf("level 0 never reached 2 tables (%d): the test wrote too little to exercise compaction", maxL0)
	}
	if l0 := s.level0Tables(); l0 >= 2 {
		t.Fatalf("level 0 holds %d tables after Maintain", l0)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = OpenStore(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var got []byte
	if found, err := s.Get("k/3/999", &got); err != nil || !found || string(got) != string(val) {
		t.Fatalf("read back after reopen: found=%v err=%v", found, err)
	}
}
