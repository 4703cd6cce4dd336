package sandbox

import (
	"os"
	"os/exec"
	"testing"
	"time"
)

// BenchmarkCPUBound runs the same single-threaded busy loop bare and in the
// sandbox (quota 1 core; with and without bwrap), interleaved in one run so
// that drift on a shared machine hits all alike, and reports the ratios.
// The sandbox's cost is per job start (re-exec, cgroup setup and removal,
// namespaces), plus any CFS throttling of a job that stays under its quota.
func BenchmarkCPUBound(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root: creates cgroups")
	}
	if _, err := machine(); err != nil {
		b.Skipf("no usable cgroups here: %v", err)
	}
	const script = `i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done`
	withBwrap := bwrapFor(defaultIdentity()) != ""
	dir := jobDir(b)
	sandboxed := func(noBwrap bool) time.Duration {
		start := time.Now()
		p, err := Start(b.Context(), Spec{Name: "bench", Dir: dir, Argv: []string{"sh", "-c", script},
			Limits: Limits{Cores: 1}, noBwrap: noBwrap})
		if err != nil {
			b.Fatal(err)
		}
		if e, err := p.Wait(); err != nil || e.Code != 0 {
			b.Fatalf("sandboxed run: %+v, %v", e, err)
		}
		return time.Since(start)
	}
	var bare, plain, bw time.Duration
	n := 0
	for b.Loop() {
		start := time.Now()
		if err := exec.Command("sh", "-c", script).Run(); err != nil {
			b.Fatal(err)
		}
		bare += time.Since(start)
		plain += sandboxed(true)
		if withBwrap {
			bw += sandboxed(false)
		}
		n++
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(n) }
	b.ReportMetric(ms(bare), "bare-ms/run")
	b.ReportMetric(ms(plain), "sandbox-ms/run")
	b.ReportMetric(float64(plain)/float64(bare), "sandbox/bare")
	if withBwrap {
		b.ReportMetric(ms(bw), "bwrap-ms/run")
		b.ReportMetric(float64(bw)/float64(bare), "bwrap/bare")
	}
}
