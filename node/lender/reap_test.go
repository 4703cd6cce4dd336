package lender

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/sandbox"
	"github.com/deepmarket/deepmarket/node/sandbox/sandboxtest"
)

// TestReapLeftoverWorkers: a node killed with SIGKILL left a worker
// running; its executor's next start (Run reaps first) kills that worker
// and removes its work dir, keeps what the machine is owed, and leaves
// alone a worker of another node on the same machine.
func TestReapLeftoverWorkers(t *testing.T) {
	sandboxtest.Need(t)
	work := reapWorkDir(t)
	otherWork := reapWorkDir(t)
	job, otherJob := randomJobID(t), randomJobID(t)

	// What the previous run left: a worker still running in its sandbox,
	// its record, and a receipt for its work.
	mine := workerName(job, 0) + "-prevrun0"
	mineDir := filepath.Join(work, workerName(job, 0))
	leftover := startSleeper(t, mine, mineDir)
	// Another node's worker on this machine, recorded in its own home only.
	theirs := workerName(otherJob, 0) + "-othernod"
	theirDir := filepath.Join(otherWork, workerName(otherJob, 0))
	other := startSleeper(t, theirs, theirDir)

	st := newMemStore()
	receipt := ledger.Receipt{Job: job, Payee: "m", Amount: 7, Seq: 3, Sig: []byte("sig")}
	for k, v := range map[string]any{sandboxesKey + mine: sandboxRecord{Job: job, Index: 0, Dir: mineDir}, "receipts/" + job: receipt} {
		if err := st.Put(k, v); err != nil {
			t.Fatal(err)
		}
	}

	e := workAreaExecutor(t, work, st)
	// Its warnings say why a record stayed.
	e.log = slog.New(slog.NewTextHandler(t.Output(), nil))
	e.reapLeftovers()
	var r sandboxRecord
	if found, err := st.Get(sandboxesKey+mine, &r); err != nil || found {
		t.Errorf("the leftover's record is still there (%v)", err)
	}

	// The leftover is this test's child: collect it.
	exited := make(chan sandbox.Exit, 1)
	go func() {
		e, _ := leftover.Wait()
		exited <- e
	}()
	select {
	case e := <-exited:
		if e.Signal != "SIGKILL" {
			t.Errorf("leftover exit = %+v, want killed by SIGKILL", e)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the leftover worker is still running after the node started")
	}
	if dirs := cgroupDirs(t, mine); len(dirs) > 0 {
		t.Errorf("the leftover's cgroup is still there: %v", dirs)
	}
	if _, err := os.Stat(mineDir); !os.IsNotExist(err) {
		t.Errorf("the leftover's work dir is still there (%v)", err)
	}
	var got ledger.Receipt
	if found, err := st.Get("receipts/"+job, &got); !found || err != nil || got.Amount != receipt.Amount {
		t.Errorf("receipt after reaping = %+v (found %v, %v), want it kept", got, found, err)
	}

	if err := syscall.Kill(other.Pid(), 0); err != nil {
		t.Errorf("another node's worker was killed: %v", err)
	}
	if len(cgroupDirs(t, theirs)) == 0 {
		t.Error("another node's worker lost its cgroup")
	}
	if _, err := os.Stat(theirDir); err != nil {
		t.Errorf("another node's work dir: %v", err)
	}
}

// reapWorkDir makes an executor work dir the job user can reach.
func reapWorkDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("/var/tmp", "deepmarket-test-reap-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	if err := os.Chmod(d, 0o711); err != nil {
		t.Fatal(err)
	}
	return d
}

func randomJobID(t *testing.T) string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// startSleeper runs one sleeping worker in sandbox name, stopped when the
// test ends if nothing killed it before.
func startSleeper(t *testing.T, name, dir string) *sandbox.Process {
	t.Helper()
	p, err := sandbox.Start(context.Background(), sandbox.Spec{Name: name, Dir: dir, Argv: []string{"sleep", "300"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Stop(0)
		p.Wait()
	})
	return p
}

// cgroupDirs lists the dirs of cgroup deepmarket/name on this machine.
func cgroupDirs(t *testing.T, name string) []string {
	t.Helper()
	var dirs []string
	for _, pat := range []string{"/sys/fs/cgroup/deepmarket/", "/sys/fs/cgroup/*/deepmarket/"} {
		m, err := filepath.Glob(pat + name)
		if err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, m...)
	}
	return dirs
}
