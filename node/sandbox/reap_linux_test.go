package sandbox

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"
)

func TestReapKillsAnOrphanedJob(t *testing.T) {
	needRoot(t)
	{
		var out bytes.Buffer
		// A worker with a child of its own, as a TensorFlow worker has.
		s := spec(t, &out, "sh", "-c", `sleep 300 & echo up > ready; exec sleep 300`)
		// No context stops it: its node is about to die.
		p, err := Start(context.Background(), s)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			p.Stop(0)
			p.Wait()
		})
		waitForFile(t, filepath.Join(s.Dir, "ready"))
		before, err := p.cg.pids()
		if err != nil || len(before) < 2 {
			t.Fatalf("cgroup holds %v (%v), want the job and its child", before, err)
		}

		// The node died without stopping the job; its next run reaps it by
		// name alone.
		killed, err := Reap(s.Name)
		if err != nil {
			t.Fatalf("Reap: %v", err)
		}
		if killed != len(before) {
			t.Errorf("Reap killed %d processes, want the %d in the cgroup", killed, len(before))
		}
		// The main process is this test's child: collect it, so that it
		// does not linger as a zombie.
		type result struct {
			e   Exit
			err error
		}
		waited := make(chan result, 1)
		go func() {
			e, err := p.Wait()
			waited <- result{e, err}
		}()
		select {
		case r := <-waited:
			if r.err != nil || r.e.Signal != "SIGKILL" {
				t.Errorf("exit = %+v, %v; want killed by SIGKILL", r.e, r.err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the job's main process outlived Reap")
		}
		for _, pid := range before {
			eventuallyGone(t, pid)
		}
		if left := liveProcsOfUID(t, p.UID()); len(left) > 0 {
			t.Errorf("processes of the job's uid survive Reap: %v", left)
		}
		assertCgroupGone(t, p)

		if killed, err := Reap(s.Name); killed != 0 || err != nil {
			t.Errorf("second Reap = %d, %v; want 0, nil", killed, err)
		}
	}
}

// eventuallyGone waits until pid is gone or a zombie: an orphan killed
// outside this process's tree is collected by init in its own time.
func eventuallyGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for syscall.Kill(pid, 0) == nil && procStateOrZ(pid)[0] != 'Z' {
		if time.Now().After(deadline) {
			t.Errorf("pid %d survived Reap (%s)", pid, procStateOrZ(pid))
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestReapUnknownSandbox(t *testing.T) {
	needRoot(t)
	killed, err := Reap(fmt.Sprintf("no-such-sandbox-%d", os.Getpid()))
	if killed != 0 || err != nil {
		t.Fatalf("Reap = %d, %v; want 0, nil", killed, err)
	}
}

func TestReapRejectsBadNames(t *testing.T) {
	for _, name := range []string{"", ".", ".."} {
		if _, err := Reap(name); err == nil {
			t.Errorf("Reap(%q) succeeded", name)
		}
	}
}

// open finds a job cgroup when any of its dirs is left, and only then.
func TestOpenFindsLeftovers(t *testing.T) {
	root := fakeV2(t, "cpu memory pids")
	v2 := &cgroupV2{root: root}
	if _, ok := v2.open("j"); ok {
		t.Error("v2 open found a cgroup that was never created")
	}
	if err := os.MkdirAll(filepath.Join(root, parentCgroup, "j"), 0o755); err != nil {
		t.Fatal(err)
	}
	if cg, ok := v2.open("j"); !ok || cg.cloneDir() != filepath.Join(root, parentCgroup, "j") {
		t.Errorf("v2 open = %v, %v; want the job's dir", cg, ok)
	}

	base := t.TempDir()
	mounts := map[string]string{}
	for _, c := range []string{"cpu", "memory", "pids", "freezer"} {
		mounts[c] = filepath.Join(base, c)
	}
	v1 := &cgroupV1{mounts: mounts}
	if _, ok := v1.open("j"); ok {
		t.Error("v1 open found a cgroup that was never created")
	}
	// A node that died while creating the cgroup left one hierarchy's dir.
	if err := os.MkdirAll(filepath.Join(mounts["memory"], parentCgroup, "j"), 0o755); err != nil {
		t.Fatal(err)
	}
	cg, ok := v1.open("j")
	if !ok {
		t.Fatal("v1 open missed a dir left in one hierarchy")
	}
	var dirs []string
	for _, d := range cg.(*cgroupV1Job).dirs {
		dirs = append(dirs, d)
	}
	if !slices.Contains(dirs, filepath.Join(mounts["pids"], parentCgroup, "j")) || len(dirs) != len(mounts) {
		t.Errorf("v1 open dirs = %v, want one per hierarchy", dirs)
	}
	if pids, err := cg.pids(); len(pids) != 0 || err != nil {
		t.Errorf("pids of a half-made cgroup = %v, %v; want none", pids, err)
	}
}

// A kill round whose cgroup is removed under it, by another killer of the
// same job that saw it empty (the reap of the job's Process, racing Reap),
// has done its work: the cgroup holds nothing any more.
func TestKillLoopEndsWhenTheCgroupGoes(t *testing.T) {
	// What thawing a removed cgroup gets from the kernel: ENOENT when the
	// cgroup went before the open, ENODEV when it went after it.
	for name, thawErr := range map[string]func(dir string) error{
		"before the open": func(dir string) error { return writeFile(filepath.Join(dir, "freezer.state"), "THAWED") },
		"after the open": func(dir string) error {
			return &os.PathError{Op: "write", Path: filepath.Join(dir, "freezer.state"), Err: syscall.ENODEV}
		},
	} {
		t.Run(name, func(t *testing.T) {
			job := exec.Command("sleep", "300")
			if err := job.Start(); err != nil {
				t.Fatal(err)
			}
			waited := false
			t.Cleanup(func() {
				if !waited {
					job.Process.Kill()
					job.Wait()
				}
			})
			dir := filepath.Join(t.TempDir(), "job") // stands for the job's cgroup
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), fmt.Appendf(nil, "%d\n", job.Process.Pid), 0o644); err != nil {
				t.Fatal(err)
			}
			list := func() ([]int, error) { return readPids(filepath.Join(dir, "cgroup.procs")) }
			freeze := func() error { return writeFile(filepath.Join(dir, "freezer.state"), "FROZEN") }
			thaw := func() error {
				// The other killer, between this round's signal and its thaw.
				if err := os.RemoveAll(dir); err != nil {
					t.Fatal(err)
				}
				return thawErr(dir)
			}
			if err := killLoop(list, freeze, thaw); err != nil {
				t.Fatalf("killLoop: %v", err)
			}
			err := job.Wait()
			waited = true
			if ws, ok := job.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
				t.Errorf("job ended with %v, want killed by SIGKILL", err)
			}
		})
	}
}
