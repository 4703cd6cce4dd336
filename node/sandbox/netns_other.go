//go:build !linux

package sandbox

import (
	"context"
	"net"
)

// NetNS is a network namespace (Linux only).
type NetNS struct{}

// NewNetNS is unsupported here.
func NewNetNS() (*NetNS, error) { return nil, ErrUnsupported }

// ListenTCP is unsupported here.
func (n *NetNS) ListenTCP(port int) (*net.TCPListener, error) { return nil, ErrUnsupported }

// DialTCP is unsupported here.
func (n *NetNS) DialTCP(ctx context.Context, port int) (*net.TCPConn, error) {
	return nil, ErrUnsupported
}

// SetPortRange is unsupported here.
func (n *NetNS) SetPortRange(lo, hi int) error { return ErrUnsupported }

// Close does nothing here.
func (n *NetNS) Close() error { return nil }
