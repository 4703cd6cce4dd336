package sandbox

import (
	"os/exec"
	"testing"
	"time"
)

// BenchmarkCPUBound runs the same single-threaded busy loop bare and in the
// sandbox (quota 1 core), interleaved in one run so that drift on a shared
// machine hits both alike, and reports the ratio. The sandbox's cost is per
// job start (re-exec, cgroup setup and removal, uid lease, bubblewrap's
// namespaces, the seccomp filter), plus the filter's cost per system call
// and any CFS throttling of a job that stays under its quota.
func BenchmarkCPUBound(b *testing.B) {
	needRoot(b)
	const script = `i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done`
	dir := jobDir(b)
	var bare, boxed time.Duration
	n := 0
	for b.Loop() {
		start := time.Now()
		if err := exec.Command("sh", "-c", script).Run(); err != nil {
			b.Fatal(err)
		}
		bare += time.Since(start)
		start = time.Now()
		p, err := Start(b.Context(), Spec{Name: "bench", Dir: dir, Argv: []string{"sh", "-c", script}, Limits: Limits{Cores: 1}})
		if err != nil {
			b.Fatal(err)
		}
		if e, err := p.Wait(); err != nil || e.Code != 0 {
			b.Fatalf("sandboxed run: %+v, %v", e, err)
		}
		boxed += time.Since(start)
		n++
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(n) }
	b.ReportMetric(ms(bare), "bare-ms/run")
	b.ReportMetric(ms(boxed), "sandbox-ms/run")
	b.ReportMetric(float64(boxed)/float64(bare), "sandbox/bare")
}
