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

// reuseAddr sets SO_REUSEADDR and SO_REUSEPORT on a punch's sockets, so
// that its listener and each of its connects may bind the same port.
func reuseAddr(_, _ string, rc syscall.RawConn) error {
	var serr error
	if err := rc.Control(func(fd uintptr) {
		if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); serr == nil {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		}
	}); err != nil {
		return err
	}
	return serr
}
