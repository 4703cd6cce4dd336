package sandbox

import (
	"os/exec"
	"testing"
	"time"
)

// BenchmarkCPUBound runs the same single-threaded busy loop (about 3 s)
// bare and in the sandbox (quota 1 core), interleaved in one run and in
// alternating order so that drift on a shared machine hits both alike,
// and reports the ratios of wall time and of CPU time (the latter shrugs
// off other load on the machine better). The sandbox costs a fixed time per job (re-exec,
// cgroup setup and removal, uid lease, bubblewrap's namespaces, giving
// the dir back to root), reported apart as fixed-ms (a sandboxed true,
// start to end) and start-ms (Start until the job runs), plus the seccomp
// filters' cost per system call and any CFS throttling of a job that
// stays under its quota.
func BenchmarkCPUBound(b *testing.B) {
	needRoot(b)
	const script = `i=0; while [ $i -lt 1000000 ]; do i=$((i+1)); done`
	dir := jobDir(b)
	var bare, boxed, bareCPU, boxedCPU, start, fixed time.Duration
	runBare := func() {
		t0 := time.Now()
		cmd := exec.Command("sh", "-c", script)
		if err := cmd.Run(); err != nil {
			b.Fatal(err)
		}
		bare += time.Since(t0)
		bareCPU += cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	}
	sandboxed := func(argv ...string) (started, total, cpu time.Duration) {
		t0 := time.Now()
		p, err := Start(b.Context(), Spec{Name: "bench", Dir: dir, Argv: argv, Limits: Limits{Cores: 1}})
		if err != nil {
			b.Fatal(err)
		}
		started = time.Since(t0)
		e, err := p.Wait()
		if err != nil || e.Code != 0 {
			b.Fatalf("sandboxed run: %+v, %v", e, err)
		}
		return started, time.Since(t0), e.CPU
	}
	runBoxed := func() {
		s, total, cpu := sandboxed("sh", "-c", script)
		start += s
		boxed += total
		boxedCPU += cpu
		_, total, _ = sandboxed("true")
		fixed += total
	}
	n := 0
	for b.Loop() {
		if n%2 == 0 {
			runBare()
			runBoxed()
		} else {
			runBoxed()
			runBare()
		}
		n++
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(n) }
	b.ReportMetric(ms(bare), "bare-ms/run")
	b.ReportMetric(ms(boxed), "sandbox-ms/run")
	b.ReportMetric(ms(start), "start-ms")
	b.ReportMetric(ms(fixed), "fixed-ms")
	b.ReportMetric(float64(boxed)/float64(bare), "sandbox/bare")
	b.ReportMetric(float64(boxedCPU)/float64(bareCPU), "sandbox/bare-cpu")
}
