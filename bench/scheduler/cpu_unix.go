//go:build unix

package main

import (
	"syscall"
	"time"
)

// cpuTime is the CPU time this process has used (every thread: the
// collector's and the runtime's too), or 0 where it cannot be read.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
