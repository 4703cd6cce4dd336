package tunnel

import (
	"io"
	"net"
	"sync"
	"sync/atomic"

	"github.com/libp2p/go-libp2p/core/network"
)

// link is one tunnelled connection: a local TCP connection and the stream
// that carries it.
type link struct {
	st      network.Stream
	tc      *net.TCPConn
	aborted atomic.Bool
}

// abort cuts both sides at once: the stream is reset and the TCP
// connection closed with an RST, so that neither application mistakes a
// broken connection for a clean end.
func (l *link) abort() {
	if l.aborted.CompareAndSwap(false, true) {
		l.st.Reset()
		l.tc.SetLinger(0)
		l.tc.Close()
	}
}

// linkSet holds the open links of one Expose or Forward, so that they can
// be cut together.
type linkSet struct {
	mu     sync.Mutex
	closed bool
	m      map[*link]struct{}
}

func (ls *linkSet) add(l *link) bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.closed {
		return false
	}
	if ls.m == nil {
		ls.m = map[*link]struct{}{}
	}
	ls.m[l] = struct{}{}
	return true
}

func (ls *linkSet) remove(l *link) {
	ls.mu.Lock()
	delete(ls.m, l)
	ls.mu.Unlock()
}

// close refuses new links and aborts the open ones.
func (ls *linkSet) close() {
	ls.mu.Lock()
	ls.closed = true
	m := ls.m
	ls.m = nil
	ls.mu.Unlock()
	for l := range m {
		l.abort()
	}
}

// carry copies l both ways until both directions have ended, in ls while
// it does.
func (s *Service) carry(l *link, ls *linkSet, c *jobCounters) {
	if !ls.add(l) {
		l.abort()
		return
	}
	defer ls.remove(l)
	s.live.Add(1)
	defer s.live.Add(-1)
	c.conns.Add(1)
	c.live.Add(1)
	defer c.live.Add(-1)

	done := make(chan struct{})
	go func() {
		defer close(done)
		s.copyHalf(l, l.st, l.tc, l.st.CloseWrite, &c.sent)
	}()
	s.copyHalf(l, l.tc, l.st, l.tc.CloseWrite, &c.received)
	<-done
	if !l.aborted.Load() {
		l.st.Close()
		l.tc.Close()
	}
}

// copyHalf copies one direction of l, from src to dst, until src ends. A
// clean end (EOF) is passed on as a half-close of dst, which is how gRPC
// and HTTP see the other side finish sending; any other failure aborts
// the link both ways. It reads and writes directly rather than through
// io.Copy, which would use net.TCPConn's own 32 KiB buffers instead of
// ours.
func (s *Service) copyHalf(l *link, dst io.Writer, src io.Reader, closeWrite func() error, n *atomic.Uint64) {
	bp := s.bufs.Get().(*[]byte)
	defer s.bufs.Put(bp)
	buf := *bp
	for {
		nr, rerr := src.Read(buf)
		if nr > 0 {
			nw, werr := dst.Write(buf[:nr])
			n.Add(uint64(nw))
			if werr != nil {
				l.abort()
				return
			}
		}
		switch {
		case rerr == io.EOF:
			if err := closeWrite(); err != nil {
				l.abort()
			}
			return
		case rerr != nil:
			l.abort()
			return
		}
	}
}
