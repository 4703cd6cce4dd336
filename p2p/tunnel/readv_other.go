//go:build !unix

package tunnel

import (
	"net"
	"syscall"
)

// readv reads into iov[0] alone where there is no readv(2).
func readv(c *net.TCPConn, _ syscall.RawConn, iov [][]byte) (int, error) {
	return c.Read(iov[0])
}

// reuseAddr leaves a punch's socket as it is where there is no
// SO_REUSEADDR to set this way.
func reuseAddr(_, _ string, _ syscall.RawConn) error { return nil }
