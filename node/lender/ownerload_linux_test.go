package lender

import (
	"context"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/node/sandbox"
	"github.com/deepmarket/deepmarket/node/sandbox/sandboxtest"
	"golang.org/x/sys/unix"
)

// TestOwnerLoadOnThisMachine: with a job burning CPU in its sandbox and
// this test spinning beside it, the samples count the job among the jobs
// and the test's spinning as the owner's load.
func TestOwnerLoadOnThisMachine(t *testing.T) {
	sandboxtest.Need(t)
	job, err := sandbox.Start(context.Background(), sandbox.Spec{
		Name: "owner-load-" + randomJobID(t)[:8], Dir: filepath.Join(reapWorkDir(t), "job"),
		Argv: []string{"sh", "-c", "while :; do :; done"}, Limits: sandbox.Limits{Cores: 0.5},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { job.Stop(0); job.Wait() })

	a, err := ReadCPUSample()
	if err != nil {
		t.Fatal(err)
	}
	job0, err := job.CPUUsage()
	if err != nil {
		t.Fatal(err)
	}
	spun := spin(t, time.Second)
	job1, err := job.CPUUsage()
	if err != nil {
		t.Fatal(err)
	}
	b, err := ReadCPUSample()
	if err != nil {
		t.Fatal(err)
	}

	if b.CPUs == 0 || b.CPUs != a.CPUs || b.Total <= a.Total {
		t.Fatalf("samples %+v then %+v", a, b)
	}
	if job1 <= job0 || b.Jobs-a.Jobs < job1-job0 {
		t.Errorf("all jobs used %s while the burning job used %s", b.Jobs-a.Jobs, job1-job0)
	}
	wall := (b.Total - a.Total) / time.Duration(b.CPUs)
	owner := time.Duration(OwnerLoad(a, b) * float64(wall))
	t.Logf("over %s: owner %.2f cores, jobs %s, the test spun %s", wall, OwnerLoad(a, b), b.Jobs-a.Jobs, spun)
	// /proc/stat samples who runs at each tick: allow for its error.
	if owner < spun/2 {
		t.Errorf("the owner used %s, less than the %s this test spun", owner, spun)
	}
}

// spin burns CPU on one thread for d and says how much it got.
func spin(t *testing.T, d time.Duration) time.Duration {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var before, after unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &before); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(d); time.Now().Before(end); {
	}
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &after); err != nil {
		t.Fatal(err)
	}
	cpu := func(r unix.Rusage) time.Duration {
		return time.Duration(r.Utime.Nano() + r.Stime.Nano())
	}
	return cpu(after) - cpu(before)
}
