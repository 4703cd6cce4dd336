package tunnel

import (
	"context"
	"net"
)

// SetDirectDialer routes s's direct connections through dial, a test's
// proxy; call it before s forwards anything.
func SetDirectDialer(s *Service, dial func(ctx context.Context, addr string) (net.Conn, error)) {
	s.dialDirect = dial
}
