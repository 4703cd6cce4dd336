package storage

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// canary writes a file outside any tree an import is given, whose bytes
// must never reach the blockstore.
func canary(t *testing.T, dir string) (path string, secret []byte) {
	t.Helper()
	b := make([]byte, 32)
	rand.Read(b)
	secret = []byte("CANARY-" + hex.EncodeToString(b))
	path = filepath.Join(dir, "secret")
	if err := os.WriteFile(path, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	return path, secret
}

// assertNoBlockHolds scans every block in the store for secret.
func assertNoBlockHolds(t *testing.T, s *Store, secret []byte) {
	t.Helper()
	keys, err := s.Blockstore().AllKeysChan(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for k := range keys {
		b, err := s.Blockstore().Get(t.Context(), k)
		if err != nil {
			t.Fatal(err)
		}
		n++
		if bytes.Contains(b.RawData(), secret) {
			t.Fatalf("block %s holds the canary from outside the tree", k)
		}
	}
	if n == 0 {
		t.Fatal("the store holds no block at all: nothing was checked")
	}
}

// TestAddFromMatchesAdd: a tree imported beneath a root gets the CID the
// path import gives it, links included.
func TestAddFromMatchesAdd(t *testing.T) {
	s := openNode(t, "", Options{})
	base := t.TempDir()
	tree := filepath.Join(base, "out")
	randomFile(t, filepath.Join(tree, "a/model.bin"), 3<<20)
	randomFile(t, filepath.Join(tree, "b.json"), 100)
	if err := os.Symlink("a/model.bin", filepath.Join(tree, "latest")); err != nil {
		t.Fatal(err)
	}
	byPath, err := s.Add(t.Context(), tree, nil)
	if err != nil {
		t.Fatal(err)
	}
	root, err := os.OpenRoot(base)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	byRoot, err := s.AddFrom(t.Context(), root, "out", nil)
	if err != nil {
		t.Fatal(err)
	}
	if byRoot.CID != byPath.CID || byRoot.Name != "out" {
		t.Fatalf("AddFrom = %s %q, Add = %s", byRoot.CID, byRoot.Name, byPath.CID)
	}
}

// TestAddFromNeverLeavesTheRoot: links in the tree that point out of it
// (absolute, through "..", and a directory and a file that a concurrent
// process swaps for such links as fast as it can) never make the import
// read what is outside: thousands of imports race the swaps, and the
// canary's bytes reach no block.
func TestAddFromNeverLeavesTheRoot(t *testing.T) {
	s := openNode(t, "", Options{})
	outside := t.TempDir()
	secretPath, secret := canary(t, outside)
	base := t.TempDir()
	tree := filepath.Join(base, "out")
	randomFile(t, filepath.Join(tree, "sub/weights"), 4096)
	randomFile(t, filepath.Join(tree, "file"), 512)
	for target, link := range map[string]string{
		secretPath: "abs", "../../" + filepath.Base(outside) + "/secret": "dotdot", outside: "dir",
	} {
		if err := os.Symlink(target, filepath.Join(tree, link)); err != nil {
			t.Fatal(err)
		}
	}
	// The swap partners: exchanged atomically with the real entries.
	if err := os.Symlink(outside, filepath.Join(tree, ".sub")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secretPath, filepath.Join(tree, ".file")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(tree, ".fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	root, err := os.OpenRoot(base)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()

	var stop atomic.Bool
	var swaps atomic.Int64
	var wg sync.WaitGroup
	swap := func(a, b string) {
		defer wg.Done()
		for !stop.Load() {
			if err := unix.Renameat2(unix.AT_FDCWD, filepath.Join(tree, a), unix.AT_FDCWD, filepath.Join(tree, b), unix.RENAME_EXCHANGE); err != nil {
				t.Errorf("swap %s and %s: %v", a, b, err)
				return
			}
			swaps.Add(1)
		}
	}
	randomFile(t, filepath.Join(tree, "b"), 64)
	wg.Add(3)
	go swap("sub", ".sub")
	go swap("file", ".file")
	go swap("b", ".fifo")

	ok, failed := 0, 0
	for range 3000 {
		if _, err := s.AddFrom(t.Context(), root, "out", nil); err != nil {
			failed++
		} else {
			ok++
		}
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("%d imports succeeded, %d failed on a swapped entry, against %d swaps", ok, failed, swaps.Load())
	if ok == 0 {
		t.Error("no import succeeded: the race tested nothing but failures")
	}
	assertNoBlockHolds(t, s.Store, secret)
	if b, err := os.ReadFile(secretPath); err != nil || !bytes.Equal(b, secret) {
		t.Errorf("the canary changed: %q %v", b, err)
	}
}
