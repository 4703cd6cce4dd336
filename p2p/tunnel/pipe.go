package tunnel

import (
	"io"
	"net"
	"sync"
	"sync/atomic"

	"github.com/libp2p/go-libp2p/core/network"
)

// link is one tunnelled connection: a local TCP connection and the far
// end that carries it to the other machine.
type link struct {
	tc      *net.TCPConn
	far     farEnd
	aborted atomic.Bool
}

// farEnd is how a link reaches the other machine: a libp2p stream, or a
// direct connection of its own.
type farEnd interface {
	// send carries l.tc's bytes to the other machine until l.tc ends and
	// then passes the end on; receive carries the other way. Each counts
	// the bytes it delivers in n and aborts l on any failure.
	send(l *link, n *atomic.Uint64)
	receive(l *link, n *atomic.Uint64)
	// reset cuts the far end at once; any goroutine may call it.
	reset()
	// finish releases what the far end holds once both directions have
	// ended, closing it if they ended cleanly.
	finish(clean bool)
}

// abort cuts both sides at once: the far end is reset and the TCP
// connection closed with an RST, so that neither application mistakes a
// broken connection for a clean end.
func (l *link) abort() {
	if l.aborted.CompareAndSwap(false, true) {
		l.far.reset()
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
		l.far.finish(false)
		return
	}
	defer ls.remove(l)
	s.live.Add(1)
	defer s.live.Add(-1)
	c.conns.Add(1)
	if _, ok := l.far.(*directEnd); ok {
		c.direct.Add(1)
	}
	c.live.Add(1)
	defer c.live.Add(-1)

	done := make(chan struct{})
	go func() {
		defer close(done)
		l.far.send(l, &c.sent)
	}()
	l.far.receive(l, &c.received)
	<-done
	clean := !l.aborted.Load()
	if clean {
		l.tc.Close()
	}
	l.far.finish(clean)
}

// streamEnd is a link's far end over a libp2p stream.
type streamEnd struct {
	st   network.Stream
	bufs *sync.Pool
}

var _ farEnd = streamEnd{}

func (e streamEnd) send(l *link, n *atomic.Uint64) {
	copyHalf(l, e.st, l.tc, e.st.CloseWrite, n, e.bufs)
}

func (e streamEnd) receive(l *link, n *atomic.Uint64) {
	copyHalf(l, l.tc, e.st, l.tc.CloseWrite, n, e.bufs)
}

func (e streamEnd) reset() { e.st.Reset() }

func (e streamEnd) finish(clean bool) {
	if clean {
		e.st.Close()
	}
}

// copyHalf copies one direction of l, from src to dst, until src ends. A
// clean end (EOF) is passed on as a half-close of dst, which is how gRPC
// and HTTP see the other side finish sending; any other failure aborts
// the link both ways. It reads and writes directly rather than through
// io.Copy, which would use net.TCPConn's own 32 KiB buffers instead of
// ours.
func copyHalf(l *link, dst io.Writer, src io.Reader, closeWrite func() error, n *atomic.Uint64, bufs *sync.Pool) {
	bp := bufs.Get().(*[]byte)
	defer bufs.Put(bp)
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
