package lender

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/deepmarket/deepmarket/node/sandbox"
)

// clockTick is the unit of /proc/stat: USER_HZ, which Linux fixes at 100
// on every architecture Go builds for.
const clockTick = 10 * time.Millisecond

// CPUSample is one reading of the machine's CPU counters; OwnerLoad
// compares two.
type CPUSample struct {
	// CPUs is how many CPUs /proc/stat counts.
	CPUs int
	// Total is the time of every CPU since boot, idle and stolen time
	// included; Busy is the part spent running something.
	Total, Busy time.Duration
	// Jobs is the CPU time the sandboxed jobs have used
	// (sandbox.JobsCPUUsage).
	Jobs time.Duration
}

// OwnerLoad is the CPU, in cores, that the machine spent on work other
// than its jobs between samples a and b, taken in that order: the owner's
// own programs, and the node itself. It is 0 when b does not follow a.
func OwnerLoad(a, b CPUSample) float64 {
	total := b.Total - a.Total
	if b.CPUs <= 0 || total <= 0 {
		return 0
	}
	// /proc/stat counts in ticks and cgroups in nanoseconds: over a short
	// interval the jobs may seem to have used more than the machine did.
	other := max((b.Busy-a.Busy)-(b.Jobs-a.Jobs), 0)
	wall := total / time.Duration(b.CPUs)
	return min(float64(other)/float64(wall), float64(b.CPUs))
}

// ReadCPUSample reads the machine's counters from /proc/stat and the jobs'
// from their cgroups.
func ReadCPUSample() (CPUSample, error) {
	return readCPUSample("/proc/stat", sandbox.JobsCPUUsage)
}

func readCPUSample(procStat string, jobs func() (time.Duration, error)) (CPUSample, error) {
	b, err := os.ReadFile(procStat)
	if err != nil {
		return CPUSample{}, fmt.Errorf("read CPU counters: %w", err)
	}
	s, err := parseProcStat(b)
	if err != nil {
		return CPUSample{}, fmt.Errorf("%s: %w", procStat, err)
	}
	if s.Jobs, err = jobs(); err != nil {
		return CPUSample{}, err
	}
	return s, nil
}

// parseProcStat reads the "cpu" line of /proc/stat (user nice system idle
// iowait irq softirq steal guest guest_nice, in ticks) and counts the
// "cpuN" lines. Guest time is already in user and nice; time waiting on
// I/O or stolen by a hypervisor is not busy.
func parseProcStat(b []byte) (CPUSample, error) {
	var s CPUSample
	found := false
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 0 || !strings.HasPrefix(f[0], "cpu"):
		case f[0] != "cpu":
			s.CPUs++
		case len(f) < 9:
			return CPUSample{}, fmt.Errorf("cpu line has %d fields, want at least 8 counters", len(f))
		default:
			found = true
			var n [8]uint64
			for i := range n {
				v, err := strconv.ParseUint(f[i+1], 10, 64)
				if err != nil {
					return CPUSample{}, fmt.Errorf("cpu line: %w", err)
				}
				n[i] = v
			}
			user, nice, system, idle, iowait, irq, softirq, steal := n[0], n[1], n[2], n[3], n[4], n[5], n[6], n[7]
			busy := user + nice + system + irq + softirq
			s.Busy = time.Duration(busy) * clockTick
			s.Total = time.Duration(busy+idle+iowait+steal) * clockTick
		}
	}
	if !found || s.CPUs == 0 {
		return CPUSample{}, errors.New("no cpu counters")
	}
	return s, nil
}
