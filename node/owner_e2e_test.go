package node

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/node/lender"
)

// syntheticOwner counts one process as the machine's owner: the owner
// policy's samples see its CPU time, as the whole machine's less the jobs'
// and the node's would be on a machine nothing else uses. (This machine
// runs other tests meanwhile, whose CPU would count as the owner's.)
type syntheticOwner struct {
	mu    sync.Mutex
	pid   int
	spent time.Duration // CPU of owner processes that have exited
	start time.Time
}

func (o *syntheticOwner) sample() (lender.CPUSample, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	busy := o.spent
	if o.pid != 0 {
		busy += procCPU(o.pid)
	}
	// Busy counts the node's own CPU too, as /proc/stat would; the policy
	// takes it out again.
	var node time.Duration
	if b, err := os.ReadFile("/proc/self/stat"); err == nil {
		node = statCPU(string(b))
	}
	return lender.CPUSample{CPUs: 1, Total: time.Since(o.start), Busy: busy + node}, nil
}

// spin starts the owner's busy loop; stop ends it. The loop runs at the
// highest priority, as an owner's foreground work would win over this
// machine's other tests: at the default one, two cores shared with a
// package of testnet nodes gave it under half a core at times, which the
// policy rightly took for the owner leaving.
func (o *syntheticOwner) spin(t *testing.T) (stop func()) {
	cmd := exec.Command("python3", "-c", "while True: pass")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Setpriority(syscall.PRIO_PROCESS, cmd.Process.Pid, -20); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("the owner's loop at priority -20: %v", err)
	}
	o.mu.Lock()
	o.pid = cmd.Process.Pid
	o.mu.Unlock()
	return func() {
		o.mu.Lock()
		o.spent += procCPU(o.pid)
		o.pid = 0
		o.mu.Unlock()
		cmd.Process.Kill()
		cmd.Wait()
	}
}

// procCPU is a process's user and system time so far.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	return statCPU(string(b))
}

// statCPU reads utime and stime (fields 14 and 15, in ticks of 10 ms)
// from a /proc/PID/stat line.
func statCPU(line string) time.Duration {
	f := strings.Fields(line[strings.LastIndexByte(line, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+s) * 10 * time.Millisecond
}

// TestOwnerComesFirst: a lender whose owner policy suspends its jobs
// above half a core of the owner's load. A job runs there; the owner
// starts a busy loop: within 5 s the job's sandbox is frozen, the machine
// offers nothing, and the submitter sees the worker suspended. The owner
// stops: the job resumes after resume_idle, the machine offers itself
// again, and the job finishes. The machine is paid its price for the time
// the job ran less the time it was suspended, to the micro-credit.
func TestOwnerComesFirst(t *testing.T) {
	py := genericPython(t)
	owner := &syntheticOwner{start: time.Now()}
	ownerSample, ownerInput = owner.sample, func() time.Time { return time.Time{} }
	t.Cleanup(func() { ownerSample, ownerInput = nil, nil })
	policy := func(c *Config) {
		c.Owner = OwnerConfig{SuspendAbove: 0.5, ResumeIdle: Duration{2 * time.Second}, VacateAfter: Duration{time.Hour}}
	}
	c := startJobClusterLending(t, py, 1, api.LendRequest{Cores: 1, MemBytes: 1 << 30}, policy)
	sub, lend := c.sub, c.lenders[0]
	ctx := t.Context()
	dir := t.TempDir()
	// 20 s of work in 0.1 s steps: a suspension delays it, loses none of it.
	script := "import sys, time\nfor i in range(int(sys.argv[1])):\n    time.sleep(0.1)\nprint('done')\n"
	if err := os.WriteFile(filepath.Join(dir, "job.py"), []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	f := jobs.File{Name: "owner-first", Framework: "generic", Command: []string{"python3", "job.py", "200"}, Bundle: dir,
		Workers: 1, Cores: 1, Memory: "128MiB", MaxPrice: "1", MaxDuration: "5m"}
	before, err := lend.client.Balance(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	j, err := sub.client.Submit(ctx, api.SubmitRequest{Spec: f, Yes: true})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the job to run", func() bool {
		cur, _ := sub.client.Job(ctx, j.ID)
		return cur.State == jobs.Running
	})
	frozen := func() bool {
		for _, s := range lend.exec.Sandboxes() {
			if s.Job == j.ID && s.Frozen {
				return true
			}
		}
		return false
	}
	time.Sleep(2 * time.Second)
	if frozen() {
		t.Fatal("the job is suspended before the owner came")
	}

	stop := owner.spin(t)
	came := time.Now()
	for !frozen() {
		if time.Since(came) > 5*time.Second {
			stop()
			t.Fatal("the job was not suspended within 5 s of the owner's load")
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("suspended %s after the owner came", time.Since(came).Round(10*time.Millisecond))
	eventually(t, 10*time.Second, "the machine to withdraw its offer, and the submitter to see the worker suspended", func() bool {
		st, _ := lend.client.Lend(ctx)
		cur, _ := sub.client.Job(ctx, j.ID)
		return !st.Offering && strings.Contains(st.OwnerBusy, "owner") && len(cur.Workers) == 1 && cur.Workers[0].SuspendedNow &&
			!hasOffer(sub, lend.host.ID().String())
	})
	time.Sleep(3 * time.Second)
	stop()
	left := time.Now()
	eventually(t, 15*time.Second, "the job to resume", func() bool { return !frozen() })
	// Idle is judged on one-second samples: the last busy one may end up
	// to a second before the owner's loop did.
	if d := time.Since(left); d < time.Second {
		t.Errorf("resumed %s after the owner left: resume_idle is 2 s", d)
	}
	eventually(t, 20*time.Second, "the machine to offer itself again", func() bool { return hasOffer(sub, lend.host.ID().String()) })

	done := waitJob(t, sub, j.ID, 2*time.Minute)
	if done.State != jobs.Succeeded || !done.Current().Settled {
		t.Fatalf("the job: %s (%s)\n%s", done.State, done.Reason, jobLog(t, sub, j.ID))
	}
	w := done.Current().Workers[0]
	if w.Suspended < 3*time.Second || w.SuspendedNow {
		t.Errorf("the worker's suspension: %s (now %v), want at least the 3 s the owner was busy", w.Suspended, w.SuspendedNow)
	}
	paid := done.Current().Paid
	want := uint64(float64(w.PerHour) * (w.Ended.Sub(w.Started) - w.Suspended).Hours())
	whole := uint64(float64(w.PerHour) * w.Ended.Sub(w.Started).Hours())
	if paid != want || paid >= whole {
		t.Errorf("paid %d for %s run and %s suspended at %d an hour: want %d (the whole run would be %d)", paid,
			w.Ended.Sub(w.Started), w.Suspended, w.PerHour, want, whole)
	}
	eventually(t, 10*time.Second, "the lender's balance to show the payment", func() bool {
		after, err := lend.client.Balance(ctx, "")
		return err == nil && after.Balance-before.Balance == paid
	})
}

// TestOwnerStaysVacates: the owner stays busy past vacate_after. The job
// is vacated (stopped with a checkpoint); its submitter re-places it,
// and since the only machine offers nothing while its owner is busy, the
// job waits in the queue until the owner leaves, then runs again there
// and finishes. Each run's machine time is paid less its suspension.
func TestOwnerStaysVacates(t *testing.T) {
	py := genericPython(t)
	owner := &syntheticOwner{start: time.Now()}
	ownerSample, ownerInput = owner.sample, func() time.Time { return time.Time{} }
	t.Cleanup(func() { ownerSample, ownerInput = nil, nil })
	policy := func(c *Config) {
		c.Owner = OwnerConfig{SuspendAbove: 0.5, ResumeIdle: Duration{time.Second}, VacateAfter: Duration{3 * time.Second}}
	}
	c := startJobClusterLending(t, py, 1, api.LendRequest{Cores: 1, MemBytes: 1 << 30}, policy)
	sub, lend := c.sub, c.lenders[0]
	ctx := t.Context()
	j, err := sub.client.Submit(ctx, api.SubmitRequest{Spec: sleepJob("vacated", sleepBundle(t), 15), Yes: true})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the job to run", func() bool {
		cur, _ := sub.client.Job(ctx, j.ID)
		return cur.State == jobs.Running
	})
	stop := owner.spin(t)
	var cur *jobs.Job
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if cur, err = sub.client.Job(ctx, j.ID); err == nil && cur.State == jobs.Waiting && len(cur.Runs) == 1 {
			break
		}
		if time.Now().After(deadline) {
			stop()
			st, _ := lend.client.Lend(ctx)
			t.Fatalf("the job was not vacated to wait in the queue within 30 s: %+v %v\nthe machine: %+v\n%s", cur, err, st, jobLog(t, sub, j.ID))
		}
	}
	stop()
	done := waitJob(t, sub, j.ID, 2*time.Minute)
	log := jobLog(t, sub, j.ID)
	if done.State != jobs.Succeeded || len(done.Runs) != 2 || !strings.Contains(log, "owner") {
		t.Fatalf("the vacated job: %s (%s), %d runs\n%s", done.State, done.Reason, len(done.Runs), log)
	}
	first := done.Runs[0]
	w := first.Workers[0]
	if w.State != "stopped" || !strings.Contains(w.Reason, "owner") || w.Suspended < 2*time.Second {
		t.Errorf("the vacated run's worker: %s (%s), suspended %s", w.State, w.Reason, w.Suspended)
	}
	if want := uint64(float64(w.PerHour) * (w.Ended.Sub(w.Started) - w.Suspended).Hours()); first.Paid != want {
		t.Errorf("the vacated run paid %d, want %d (its run less its suspension)", first.Paid, want)
	}
	rep, err := settledAudit(t, sub)
	if err != nil || !rep.OK || rep.Escrowed != 0 {
		t.Fatalf("audit: %+v %v", rep, err)
	}
}
