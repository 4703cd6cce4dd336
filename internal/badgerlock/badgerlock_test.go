package badgerlock

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	badger "github.com/dgraph-io/badger/v4"
)

// TestOpenWaitsForAForkedLock: a child process that inherited the
// directory's locked descriptor holds badger's lock after the database
// closed; Open succeeds once the child lets it go, where a plain open
// fails.
func TestOpenWaitsForAForkedLock(t *testing.T) {
	dir := t.TempDir()
	opts := badger.DefaultOptions(dir).WithLogger(nil)
	db, err := badger.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	// Stand in for a fork that has not exec'd yet: a child given a
	// descriptor of the same open directory, locked by this process.
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	child := exec.Command("sleep", "0.5")
	child.ExtraFiles = []*os.File{d}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(d.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	d.Close() // only the child holds the lock now
	defer child.Wait()

	if _, err := badger.Open(opts); !Locked(err) {
		t.Fatalf("a plain open while the child holds the lock: %v, want badger's lock error", err)
	}
	start := time.Now()
	db, err = Open(func() (*badger.DB, error) { return badger.Open(opts) })
	if err != nil {
		t.Fatalf("Open after the child let go: %v", err)
	}
	db.Close()
	if waited := time.Since(start); waited < 100*time.Millisecond {
		t.Errorf("Open succeeded after %s: the child still held the lock, so it should have waited", waited)
	}
}

// TestOpenGivesUpAfterWait: a lock held for good is reported after Wait.
func TestOpenGivesUpAfterWait(t *testing.T) {
	dir := t.TempDir()
	opts := badger.DefaultOptions(filepath.Join(dir, "db")).WithLogger(nil)
	db, err := badger.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	start := time.Now()
	if _, err := Open(func() (*badger.DB, error) { return badger.Open(opts) }); !Locked(err) {
		t.Fatalf("open of a database in use: %v, want the lock error", err)
	}
	if waited := time.Since(start); waited < Wait {
		t.Errorf("gave up after %s, before Wait (%s)", waited, Wait)
	}
}
