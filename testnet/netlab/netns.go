package netlab

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// netnsDir is where `ip netns add` mounts the namespaces it names.
const netnsDir = "/var/run/netns"

// inNetNS runs f on an OS thread switched into the named network namespace.
// Sockets and TAP devices that f opens belong to that namespace for their
// whole life; goroutines that f starts do not run in it.
//
// f runs on a goroutine of its own, so that when the thread cannot be
// switched back it can stay locked and the runtime retires it, rather than
// let another goroutine run in the wrong namespace.
func inNetNS(name string, f func() error) error {
	target, err := os.Open(netnsDir + "/" + name)
	if err != nil {
		return fmt.Errorf("open network namespace %s: %w", name, err)
	}
	defer target.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		self, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open this thread's network namespace: %w", err)
			return
		}
		defer self.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter network namespace %s: %w", name, err)
			return
		}
		ferr := f()
		if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
			// Left locked on purpose: the thread dies with this goroutine.
			errc <- fmt.Errorf("leave network namespace %s: %w (after: %v)", name, err, ferr)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}
