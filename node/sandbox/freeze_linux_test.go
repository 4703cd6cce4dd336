package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// burner is a job that spins on half a core until stopped, after it wrote
// ready; half a core leaves the test machine's other work room to run.
func burner(t *testing.T) (*Process, Spec) {
	t.Helper()
	s := spec(t, nil, "sh", "-c", `echo up > ready; while :; do :; done`)
	s.Limits.Cores = 0.5
	p, err := Start(t.Context(), s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(0); p.Wait() })
	waitForFile(t, filepath.Join(s.Dir, "ready"))
	return p, s
}

func cpuUsage(t *testing.T, p *Process) time.Duration {
	t.Helper()
	d, err := p.CPUUsage()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// awaitCPU waits until the job has used more than from of CPU; the test's
// own timeout bounds it.
func awaitCPU(t *testing.T, p *Process, from time.Duration) time.Duration {
	t.Helper()
	for {
		if d := cpuUsage(t, p); d > from+50*time.Millisecond {
			return d
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestFreezeStopsTheJobAndThawResumesIt(t *testing.T) {
	needRoot(t)
	p, _ := burner(t)
	awaitCPU(t, p, 0)
	if p.Frozen() {
		t.Fatal("a running job reads as frozen")
	}
	if err := p.Freeze(); err != nil {
		t.Fatal(err)
	}
	if !p.Frozen() {
		t.Fatal("Freeze returned, yet the job is not frozen")
	}
	before := cpuUsage(t, p)
	time.Sleep(time.Second)
	if after := cpuUsage(t, p); after != before {
		t.Fatalf("the frozen job used %s of CPU in a second", after-before)
	}
	if err := p.Freeze(); err != nil {
		t.Fatalf("freezing a frozen job: %v", err)
	}
	if err := p.Thaw(); err != nil {
		t.Fatal(err)
	}
	if p.Frozen() {
		t.Fatal("Thaw returned, yet the job is frozen")
	}
	awaitCPU(t, p, before)

	p.Stop(0)
	e, err := p.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Freeze(); !errors.Is(err, ErrEnded) {
		t.Errorf("Freeze after Wait: err = %v, want ErrEnded", err)
	}
	if err := p.Thaw(); !errors.Is(err, ErrEnded) {
		t.Errorf("Thaw after Wait: err = %v, want ErrEnded", err)
	}
	if got := cpuUsage(t, p); got != e.CPU || got < before {
		t.Errorf("CPUUsage after Wait = %s, want the exit's %s", got, e.CPU)
	}
}

// TestFreezeThenStopKillsTheWholeJob: a frozen job that ignores SIGTERM and left a
// daemon behind dies whole when stopped, and leaves nothing.
func TestFreezeThenStopKillsTheWholeJob(t *testing.T) {
	needRoot(t)
	s := spec(t, nil, "sh", "-c",
		`trap "" TERM; sh -c 'trap "" TERM; sleep 600 & echo up > ready'; while :; do :; done`)
	s.Limits.Cores = 0.5
	p, err := Start(t.Context(), s)
	if err != nil {
		t.Fatal(err)
	}
	waitForFile(t, filepath.Join(s.Dir, "ready"))
	before, _ := p.cg.pids()
	if err := p.Freeze(); err != nil {
		t.Fatal(err)
	}
	stopKillsWhole(t, p, before)
}

// TestFreezeThenStopGivesTheJobItsGrace: Stop thaws a frozen job, so that its
// SIGTERM handler runs.
func TestFreezeThenStopGivesTheJobItsGrace(t *testing.T) {
	needRoot(t)
	s := spec(t, nil, "sh", "-c",
		`trap 'echo saved > state; exit 0' TERM; echo up > ready; sleep 600 & wait`)
	p, err := Start(t.Context(), s)
	if err != nil {
		t.Fatal(err)
	}
	waitForFile(t, filepath.Join(s.Dir, "ready"))
	if err := p.Freeze(); err != nil {
		t.Fatal(err)
	}
	p.Stop(time.Minute)
	e, err := p.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if !e.Stopped || e.Code != 0 || e.Signal != "" {
		t.Errorf("exit = %+v, want a clean exit from the job's SIGTERM handler", e)
	}
	if got := readOrEmpty(filepath.Join(s.Dir, "state")); got != "saved" {
		t.Errorf("state = %q, want the handler's output", got)
	}
	assertCgroupGone(t, p)
}

// TestJobsCPUUsageCountsEndedJobs: the machine-wide count grows with a
// job's use, and keeps it once the job's cgroup is gone.
func TestJobsCPUUsageCountsEndedJobs(t *testing.T) {
	needRoot(t)
	p, _ := burner(t)
	all0, err := JobsCPUUsage()
	if err != nil {
		t.Fatal(err)
	}
	job0 := cpuUsage(t, p)
	job1 := awaitCPU(t, p, job0)
	all1, err := JobsCPUUsage()
	if err != nil {
		t.Fatal(err)
	}
	if all1-all0 < job1-job0 {
		t.Errorf("all jobs used %s while one of them used %s", all1-all0, job1-job0)
	}
	p.Stop(0)
	e, err := p.Wait()
	if err != nil {
		t.Fatal(err)
	}
	assertCgroupGone(t, p)
	all2, err := JobsCPUUsage()
	if err != nil {
		t.Fatal(err)
	}
	if all2-all0 < e.CPU-job0 {
		t.Errorf("after the job's cgroup went, all jobs used %s since the start, the job alone %s", all2-all0, e.CPU-job0)
	}
}

// TestV2FreezeWaitsForTheKernel: setFrozen returns once cgroup.events says
// the state was reached, and fails past its timeout while it does not.
func TestV2FreezeWaitsForTheKernel(t *testing.T) {
	cg := &cgroupV2Job{dir: t.TempDir()}
	events := cg.path("cgroup.events")
	write := func(s string) {
		if err := os.WriteFile(events, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("populated 1\nfrozen 0\n")
	if err := cg.setFrozen(true, 50*time.Millisecond); !errors.Is(err, errStillFreezing) {
		t.Fatalf("kernel never freezes: err = %v, want errStillFreezing", err)
	}
	if got := readBack(t, cg.path("cgroup.freeze")); got != "1" {
		t.Fatalf("cgroup.freeze = %q, want 1", got)
	}
	write("populated 1\nfrozen 1\n")
	if err := cg.setFrozen(true, time.Second); err != nil {
		t.Fatal(err)
	}
	if f, _ := cg.frozen(); !f {
		t.Fatal("frozen 1 in cgroup.events reads as not frozen")
	}
	write("populated 1\n")
	if err := cg.setFrozen(true, time.Second); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("no freezer in the kernel: err = %v, want ErrUnsupported", err)
	}
}

// TestV1FreezeNeedsTheFreezer: without a freezer hierarchy a job cannot be
// frozen, and says why.
func TestV1FreezeNeedsTheFreezer(t *testing.T) {
	cg := &cgroupV1Job{dirs: map[string]string{"memory": t.TempDir(), "pids": t.TempDir()}}
	if err := cg.setFrozen(true, time.Second); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("err = %v, want ErrUnsupported", err)
	}
}
