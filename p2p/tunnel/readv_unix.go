//go:build unix

package tunnel

import (
	"io"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// readv reads from c into the buffers of iov, in order, with one system
// call once c is readable; rc is c's, through Go's poller as c.Read.
func readv(_ *net.TCPConn, rc syscall.RawConn, iov [][]byte) (int, error) {
	var n int
	var err error
	if cerr := rc.Read(func(fd uintptr) bool {
		for {
			n, err = unix.Readv(int(fd), iov)
			if err != unix.EINTR {
				break
			}
		}
		return err != unix.EAGAIN
	}); cerr != nil {
		return 0, cerr
	}
	switch {
	case err != nil:
		return 0, err
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}
