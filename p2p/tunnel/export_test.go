package tunnel

import (
	"context"
	"io"
	"net"
)

// SetDirectDialer routes s's direct connections through dial, a test's
// proxy; call it before s forwards anything.
func SetDirectDialer(s *Service, dial func(ctx context.Context, addr string) (net.Conn, error)) {
	s.dialDirect = dial
}

// OpenFar opens the far end of one connection of forward (a Forward's
// closer) as a new local connection would, but within ctx, and then
// resets it; direct says whether it was a direct connection.
func OpenFar(ctx context.Context, forward io.Closer) (direct bool, err error) {
	f := forward.(*forwarder)
	f.wg.Add(1)
	defer f.wg.Done()
	far, err := f.connect(ctx)
	if err != nil {
		return false, err
	}
	_, direct = far.(*directEnd)
	far.reset()
	far.finish(false)
	return direct, nil
}

// BehindNAT makes s answer as a machine behind a NAT does, to every peer:
// no direct port, and a punched connection when asked (punch.go).
func BehindNAT(s *Service) { s.natTest.Store(true) }
