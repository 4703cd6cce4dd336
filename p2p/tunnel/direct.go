package tunnel

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/event"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	libp2ptls "github.com/libp2p/go-libp2p/p2p/security/tls"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
)

// The direct path carries each tunnelled connection over a TCP connection
// of its own between the two machines' nodes, instead of a stream of their
// libp2p connection: no muxer, no Noise, and AES-GCM frames instead of
// ChaCha20-Poly1305 messages (see frame.go), for about half the CPU per
// byte. The connection is secured by libp2p's TLS 1.3 handshake, which
// authenticates both nodes by their libp2p keys; the header then travels
// in one TLS record, and the bytes in frames under keys exported from the
// handshake. A forwarder learns the port of the other node's direct
// listener through DirectProtocol and falls back to a stream whenever the
// direct path cannot be had: no listener, a firewall, a relayed peer.
// While the nodes' libp2p connection is down, it dials the address of its
// last direct connection, which the handshake authenticates like any
// other.
const (
	// directDialTimeout bounds the dial of a direct connection, so that a
	// firewall dropping it costs the first connection a short wait, not
	// setupTimeout, before the stream path takes over.
	directDialTimeout = 3 * time.Second
	// directHandshakeTimeout bounds a direct connection's TLS handshake,
	// well within setupTimeout, so that a listener that accepts and then
	// stalls counts as a failure of the direct path rather than as a
	// connection that gave up.
	directHandshakeTimeout = 5 * time.Second
	// directRetry is how long a forwarder uses streams after the direct
	// path failed, before it tries it again.
	directRetry = time.Minute
	// maxHandshakes bounds the direct connections being authenticated at
	// once; more wait in the listen backlog.
	maxHandshakes = 64
	// directFrames is how many frames a direct link's buffer holds per
	// direction once it has grown, 1 MiB. A link starts with one frame's
	// buffer each way (about what a stream link reserves) and grows the
	// first time a read fills it, if the resource manager has room, so
	// that only bulk transfers hold the memory. 1 GB through the tunnel in
	// 1 MiB reads and writes cost 5-10% less CPU than in 256 KiB ones and
	// 10-15% less than in 64 KiB ones; 2 and 4 MiB did no better.
	directFrames = 16
	// exporterLabel names the frame keys among the TLS session's exported
	// secrets (RFC 8446, section 7.5).
	exporterLabel = "EXPORTER-deepmarket-tunnel-frames"
)

// DirectProtocol is the stream protocol through which a forwarder asks a
// machine on the network chainID for the port of its direct listener. The
// same string is the direct connections' TLS ALPN, so that neither a
// libp2p handshake nor another network's can be mistaken for one.
func DirectProtocol(chainID string) protocol.ID {
	return protocol.ID("/deepmarket/" + chainID + "/tunnel-direct/1")
}

// WithDirect turns the direct path on or off (default on). Off, the
// Service neither listens for direct connections nor opens them: every
// tunnelled connection is a libp2p stream, as before the direct path.
func WithDirect(on bool) Option {
	return func(s *Service) { s.direct = on }
}

// WithDirectAddr sets the host:port the direct listener binds (default:
// the IP of the host's first listen address, on a port the system picks).
// A fixed port is for firewalls: forwarders learn the port either way.
func WithDirectAddr(addr string) Option {
	return func(s *Service) { s.directAddr = addr }
}

// startDirect makes the TLS identity both roles need and, when it can, the
// listener; without the identity the direct path stays off.
func (s *Service) startDirect() {
	key := s.h.Peerstore().PrivKey(s.h.ID())
	if key == nil {
		s.log.Warn("direct path off: the host's private key is not in its peerstore")
		return
	}
	id, err := libp2ptls.NewIdentity(key)
	if err != nil {
		s.log.Warn("direct path off", "err", err)
		return
	}
	s.tlsID = id
	addr := s.directAddr
	if addr == "" {
		if addr, err = listenAddrOf(s.h.Network().ListenAddresses()); err != nil {
			s.log.Info("no direct listener: peers reach this machine's workers through streams", "err", err)
			return
		}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		s.log.Warn("no direct listener: peers reach this machine's workers through streams", "addr", addr, "err", err)
		return
	}
	s.directLn = ln.(*net.TCPListener)
	s.followReachability()
	s.h.SetStreamHandler(s.dproto, s.handlePortQuery)
	s.h.SetStreamHandler(s.pproto, s.handlePunch)
	s.bg.Add(1)
	go s.acceptDirect()
	s.log.Debug("direct listener", "addr", ln.Addr())
}

// listenAddrOf is host:0 for the first IP address among addrs.
func listenAddrOf(addrs []ma.Multiaddr) (string, error) {
	for _, a := range addrs {
		if _, err := a.ValueForProtocol(ma.P_CIRCUIT); err == nil {
			continue
		}
		if ip, err := manet.ToIP(a); err == nil {
			return net.JoinHostPort(ip.String(), "0"), nil
		}
	}
	return "", errors.New("the host listens on no IP address")
}

// DirectAddr is where the direct listener listens, or "" if there is none.
func (s *Service) DirectAddr() string {
	if s.directLn == nil {
		return ""
	}
	return s.directLn.Addr().String()
}

// handlePortQuery answers DirectProtocol: the direct listener's port, two
// bytes big-endian. It answers any peer: the port is no secret, the
// handshake and the allow lists are the gate.
func (s *Service) handlePortQuery(st network.Stream) {
	if !s.enterHandler() {
		st.Reset()
		return
	}
	defer s.handlers.Done()
	var b [2]byte
	if s.reachableFrom(st.Conn().RemoteMultiaddr()) {
		binary.BigEndian.PutUint16(b[:], uint16(s.directLn.Addr().(*net.TCPAddr).Port))
	} // else port 0: the asker's direct dial would die in this machine's NAT

	st.SetWriteDeadline(time.Now().Add(headerTimeout))
	if _, err := st.Write(b[:]); err != nil {
		st.Reset()
		return
	}
	st.Close()
}

// followReachability keeps s.private up to date with AutoNAT's verdict on
// this host, until the Service closes.
func (s *Service) followReachability() {
	sub, err := s.h.EventBus().Subscribe(new(event.EvtLocalReachabilityChanged))
	if err != nil {
		return
	}
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		defer sub.Close()
		for {
			select {
			case <-s.ctx.Done():
				return
			case e, ok := <-sub.Out():
				if !ok {
					return
				}
				s.private.Store(e.(event.EvtLocalReachabilityChanged).Reachability == network.ReachabilityPrivate)
			}
		}
	}()
}

// reachableFrom says whether a peer at remote can dial the direct
// listener: always from a private address (the same campus), and from a
// public one unless AutoNAT found this machine behind a NAT, which
// forwards nothing to the listener's port. Such a peer's connections go
// over streams of the nodes' (hole-punched) libp2p connection instead.
func (s *Service) reachableFrom(remote ma.Multiaddr) bool {
	if s.natTest.Load() {
		return false
	}
	return !s.private.Load() || !manet.IsPublicAddr(remote)
}

// behindNAT says whether AutoNAT found this host behind a NAT.
func (s *Service) behindNAT() bool { return s.private.Load() || s.natTest.Load() }

// enterHandler counts a handler in, unless the Service is closed.
func (s *Service) enterHandler() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.handlers.Add(1)
	return true
}

func (s *Service) acceptDirect() {
	defer s.bg.Done()
	for {
		select {
		case s.handshakes <- struct{}{}:
		case <-s.ctx.Done():
			return
		}
		c, err := s.directLn.AcceptTCP()
		if err != nil {
			<-s.handshakes
			if errors.Is(err, net.ErrClosed) {
				return
			}
			s.log.Warn("direct listener accept", "err", err)
			select {
			case <-s.ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		if !s.enterHandler() {
			<-s.handshakes
			c.Close()
			return
		}
		go s.handleDirect(c)
	}
}

// handleDirect serves one incoming direct connection: handshake, scope,
// header, checks, dial, then the pipe, as handle does for a stream.
func (s *Service) handleDirect(c *net.TCPConn) {
	defer s.handlers.Done()
	inHandshake := true
	leave := func() {
		if inHandshake {
			inHandshake = false
			<-s.handshakes
		}
	}
	defer leave()
	var from peer.ID
	refuse := func(reason string, args ...any) {
		s.refused.Add(1)
		s.log.Debug("direct tunnel refused", append([]any{"from", from, "remote", c.RemoteAddr(), "reason", reason}, args...)...)
		c.SetLinger(0)
		c.Close()
	}
	// Until the pipe starts, Close must not wait for a slow peer.
	stop := context.AfterFunc(s.ctx, func() { c.SetLinger(0); c.Close() })
	defer stop()
	c.SetDeadline(time.Now().Add(headerTimeout))
	conf, keys := s.tlsID.ConfigForPeer("")
	conf.NextProtos = []string{string(s.dproto)}
	tc := tls.Server(&recordConn{TCPConn: c}, conf)
	if err := tc.Handshake(); err != nil {
		refuse("handshake", "err", err)
		return
	}
	pub, ok := <-keys
	if !ok {
		refuse("no peer key")
		return
	}
	from, err := peer.IDFromPublicKey(pub)
	if err != nil {
		refuse("peer key", "err", err)
		return
	}
	cs := tc.ConnectionState()
	if cs.NegotiatedProtocol != string(s.dproto) {
		refuse("protocol", "alpn", cs.NegotiatedProtocol)
		return
	}
	scope, err := s.openScope(from, network.DirInbound)
	if err != nil {
		refuse("resource limit", "err", err)
		return
	}
	far, err := s.newDirectEnd(c, cs, false, scope)
	if err != nil {
		scope.Done()
		refuse("keys", "err", err)
		return
	}
	h, err := readHeader(tc)
	if err != nil {
		scope.Done()
		refuse("bad header", "err", err)
		return
	}
	e := s.lookup(h, from)
	if e == nil {
		scope.Done()
		refuse("worker not exposed to this peer", "job", h.Job, "index", h.Index)
		return
	}
	leave()
	ctx, cancel := context.WithTimeout(s.ctx, workerStartWait)
	wc, err := s.dialStarting(ctx, e)
	cancel()
	if !stop() || err != nil {
		s.log.Debug("worker unreachable", "job", h.Job, "index", h.Index, "err", err)
		far.reset()
		far.finish(false)
		if wc != nil {
			wc.Close()
		}
		return
	}
	c.SetDeadline(time.Time{})
	s.carry(&link{tc: wc, far: far}, &e.links, e.stats)
}

// openScope accounts a direct link to the resource manager as a stream of
// the tunnel's protocol and service, so that direct and stream links share
// one budget per peer, and reserves its first buffers.
func (s *Service) openScope(p peer.ID, dir network.Direction) (network.StreamManagementScope, error) {
	sc, err := s.h.Network().ResourceManager().OpenStream(p, dir)
	if err != nil {
		return nil, fmt.Errorf("open scope: %w", err)
	}
	if err := sc.SetProtocol(s.proto); err != nil {
		sc.Done()
		return nil, fmt.Errorf("set protocol: %w", err)
	}
	if err := sc.SetService(ServiceName); err != nil {
		sc.Done()
		return nil, fmt.Errorf("set service: %w", err)
	}
	if err := sc.ReserveMemory(2*frameStride, network.ReservationPriorityHigh); err != nil {
		sc.Done()
		return nil, fmt.Errorf("reserve buffers: %w", err)
	}
	return sc, nil
}

// recordConn is a direct connection as crypto/tls reads it during the
// handshake and the header: it never reads past the end of the TLS record
// it is in, so that the first byte after the last record, the first
// frame's, is left in the connection for the frames' reader.
type recordConn struct {
	*net.TCPConn
	hdr     [5]byte
	pending []byte // record header bytes read and not yet passed on
	left    int    // bytes of the record's body not yet read
}

func (c *recordConn) Read(p []byte) (int, error) {
	if len(c.pending) == 0 && c.left == 0 {
		if _, err := io.ReadFull(c.TCPConn, c.hdr[:]); err != nil {
			return 0, err
		}
		c.pending = c.hdr[:]
		c.left = int(binary.BigEndian.Uint16(c.hdr[3:]))
	}
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	n, err := c.TCPConn.Read(p[:min(len(p), c.left)])
	c.left -= n
	return n, err
}

// directTarget is where f's direct connections go: the port the worker's
// machine gave, at the address f's host reaches it at over libp2p or,
// while f's host has no libp2p connection to it, at the address of f's
// last direct connection. It returns an error wrapping errNoDirect while
// the direct path is out of reach, and ctx's own if ctx ends first. The
// network round trips of a lookup (reconnecting, asking for the port) run
// once for all the connections that need them at the same time, without
// dmu held, and each of those waits only as long as its ctx allows.
func (f *forwarder) directTarget(ctx context.Context) (string, error) {
	if f.s.tlsID == nil {
		return "", errNoDirect
	}
	f.dmu.Lock()
	if time.Now().Before(f.noDirectUntil) {
		f.dmu.Unlock()
		return "", errNoDirect
	}
	conns := f.s.h.Network().ConnsToPeer(f.peer)
	ip := directIP(conns)
	switch {
	case ip != nil && f.punch:
		f.dmu.Unlock()
		return punchTarget, nil
	case ip != nil && f.directPort != 0:
		addr := net.JoinHostPort(ip.String(), strconv.Itoa(f.directPort))
		f.dmu.Unlock()
		return addr, nil
	case len(conns) == 0 && f.lastDirect != "":
		// libp2p is down for now, which says nothing of the direct
		// listener; the handshake authenticates whatever answers there.
		addr := f.lastDirect
		f.dmu.Unlock()
		return addr, nil
	case len(conns) > 0 && ip == nil:
		f.dmu.Unlock()
		return "", f.noDirect(errors.New("no direct address for the peer: relayed"))
	}
	d := f.finding
	if d == nil {
		d = &directFind{done: make(chan struct{})}
		f.finding = d
		f.wg.Add(1) // the connection being opened holds one: f is not closed yet
		go f.find(d)
	}
	f.dmu.Unlock()
	select {
	case <-d.done:
		return d.addr, d.err
	case <-ctx.Done():
		return "", fmt.Errorf("find the direct listener: %w", context.Cause(ctx))
	}
}

// directFind is one lookup of a forwarder's direct target; addr and err
// are set when done closes.
type directFind struct {
	done chan struct{}
	addr string
	err  error
}

// find runs d, within setupTimeout of its own rather than that of the
// connection that started it: connections may stop waiting for it, and
// what it learns serves the next ones.
func (f *forwarder) find(d *directFind) {
	defer f.wg.Done()
	ctx, cancel := context.WithTimeout(f.ctx, setupTimeout)
	defer cancel()
	d.addr, d.err = f.lookUpDirect(ctx)
	f.dmu.Lock()
	f.finding = nil
	f.dmu.Unlock()
	close(d.done)
}

// lookUpDirect finds the direct target over libp2p, reconnecting to the
// peer if f's host has no connection to it and asking for the port if f
// does not know it.
func (f *forwarder) lookUpDirect(ctx context.Context) (string, error) {
	s := f.s
	if len(s.h.Network().ConnsToPeer(f.peer)) == 0 {
		if err := s.h.Connect(ctx, peer.AddrInfo{ID: f.peer}); err != nil {
			return f.libp2pDown(fmt.Errorf("connect: %w", err))
		}
	}
	conns := s.h.Network().ConnsToPeer(f.peer)
	ip := directIP(conns)
	if ip == nil {
		if len(conns) == 0 {
			return f.libp2pDown(errors.New("the connection closed"))
		}
		return "", f.noDirect(errors.New("no direct address for the peer: relayed"))
	}
	f.dmu.Lock()
	port := f.directPort
	f.dmu.Unlock()
	if port == 0 {
		var err error
		if port, err = s.queryPort(ctx, f.peer); errors.Is(err, errNoPort) && s.directLn != nil {
			// Behind a NAT: each connection punches (punch.go).
			f.dmu.Lock()
			f.punch = true
			f.dmu.Unlock()
			return punchTarget, nil
		}
		if err != nil {
			if f.ctx.Err() != nil || len(s.h.Network().ConnsToPeer(f.peer)) == 0 {
				// f closed, or libp2p went down in the middle: not an
				// answer from the peer.
				return f.libp2pDown(err)
			}
			return "", f.noDirect(err)
		}
		f.dmu.Lock()
		f.directPort = port
		f.dmu.Unlock()
	}
	return net.JoinHostPort(ip.String(), strconv.Itoa(port)), nil
}

// directIP is the IP address of the first of conns that is not relayed,
// or nil.
func directIP(conns []network.Conn) net.IP {
	for _, c := range conns {
		a := c.RemoteMultiaddr()
		if _, err := a.ValueForProtocol(ma.P_CIRCUIT); err == nil {
			continue
		}
		if ip, err := manet.ToIP(a); err == nil {
			return ip
		}
	}
	return nil
}

// libp2pDown is the direct target when f's host cannot reach the peer
// over libp2p (err): the address of f's last direct connection, if there
// is one. The direct path is not marked failed: its listener may be up.
func (f *forwarder) libp2pDown(err error) (string, error) {
	f.dmu.Lock()
	addr := f.lastDirect
	f.dmu.Unlock()
	if addr != "" {
		return addr, nil
	}
	f.s.log.Debug("no direct path for now: libp2p cannot reach the peer", "peer", f.peer, "err", err)
	return "", fmt.Errorf("%w: %v", errNoDirect, err)
}

// noDirect sends f's connections through streams for directRetry, as the
// peer's direct listener is out of reach (err), and returns err wrapping
// errNoDirect.
func (f *forwarder) noDirect(err error) error {
	f.dmu.Lock()
	f.noDirectUntil = time.Now().Add(directRetry)
	f.dmu.Unlock()
	f.s.log.Debug("no direct path", "peer", f.peer, "err", err)
	return fmt.Errorf("%w: %v", errNoDirect, err)
}

// directFailed sends f's connections through streams for a while, and
// forgets the peer's direct listener: a direct connection to it failed.
func (f *forwarder) directFailed(err error) {
	f.dmu.Lock()
	f.directPort, f.punch = 0, false
	f.lastDirect = ""
	f.noDirectUntil = time.Now().Add(directRetry)
	f.dmu.Unlock()
	f.s.log.Debug("direct path failed: streams for a while", "peer", f.peer, "err", err)
}

// directWorked remembers addr, where a direct connection to the peer has
// just been made.
func (f *forwarder) directWorked(addr string) {
	f.dmu.Lock()
	f.lastDirect = addr
	f.dmu.Unlock()
}

// queryPort asks p for its direct listener's port, within ctx.
func (s *Service) queryPort(ctx context.Context, p peer.ID) (int, error) {
	st, err := s.h.NewStream(ctx, p, s.dproto)
	if err != nil {
		return 0, fmt.Errorf("ask for the direct port: %w", err)
	}
	defer st.Close()
	stop := context.AfterFunc(ctx, func() { st.Reset() })
	defer stop()
	st.SetReadDeadline(time.Now().Add(setupTimeout))
	var b [2]byte
	if _, err := io.ReadFull(st, b[:]); err != nil {
		st.Reset()
		return 0, fmt.Errorf("read the direct port: %w", err)
	}
	port := int(binary.BigEndian.Uint16(b[:]))
	if port == 0 {
		return 0, errNoPort
	}
	return port, nil
}

// errNoDirect says that the direct path is out of reach, not that the
// connection was refused: the stream path may still carry it.
var errNoDirect = errors.New("no direct path")

// openDirect opens a direct connection for one tunnelled connection to
// f's worker: dial, handshake, header. An error wrapping errNoDirect
// leaves the connection to the stream path; any other refuses it. A dial
// or handshake that fails marks the direct path failed (directFailed),
// unless ctx ended first: a connection that gave up says nothing of it.
func (f *forwarder) openDirect(ctx context.Context) (*directEnd, error) {
	s := f.s
	addr, err := f.directTarget(ctx)
	if err != nil {
		return nil, err
	}
	scope, err := s.openScope(f.peer, network.DirOutbound)
	if err != nil {
		return nil, err
	}
	fail := func(c net.Conn, err error) (*directEnd, error) {
		if c != nil {
			c.Close()
		}
		scope.Done()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("direct connection to %s: %w (%v)", addr, context.Cause(ctx), err)
		}
		f.directFailed(err)
		return nil, fmt.Errorf("%w: %v", errNoDirect, err)
	}
	var c net.Conn
	if addr == punchTarget {
		ip := directIP(s.h.Network().ConnsToPeer(f.peer))
		if ip == nil {
			return fail(nil, errors.New("punch: no direct libp2p connection to the peer"))
		}
		c, err = s.punchDial(ctx, f.peer, ip)
		if err != nil {
			return fail(nil, err)
		}
	} else {
		dctx, cancel := context.WithTimeout(ctx, directDialTimeout)
		c, err = s.dialDirect(dctx, addr)
		cancel()
		if err != nil {
			return fail(nil, err)
		}
	}
	tcp, ok := c.(*net.TCPConn)
	if !ok {
		return fail(c, fmt.Errorf("dial %s: not a TCP connection", addr))
	}
	conf, _ := s.tlsID.ConfigForPeer(f.peer)
	conf.NextProtos = []string{string(s.dproto)}
	tc := tls.Client(&recordConn{TCPConn: tcp}, conf)
	hctx, cancel := context.WithTimeout(ctx, directHandshakeTimeout)
	err = tc.HandshakeContext(hctx)
	cancel()
	if err != nil {
		return fail(c, fmt.Errorf("handshake with %s: %w", addr, err))
	}
	cs := tc.ConnectionState()
	if cs.NegotiatedProtocol != string(s.dproto) {
		return fail(c, fmt.Errorf("handshake with %s: protocol %q", addr, cs.NegotiatedProtocol))
	}
	far, err := s.newDirectEnd(tcp, cs, true, scope)
	if err != nil {
		return fail(c, err)
	}
	if _, err := tc.Write(f.header); err != nil {
		return fail(c, fmt.Errorf("send header: %w", err))
	}
	if addr != punchTarget { // the next connection punches anew
		f.directWorked(addr)
	}
	return far, nil
}

// directEnd is a link's far end over a direct connection.
type directEnd struct {
	c       *net.TCPConn
	out, in *frameKey
	scope   network.StreamManagementScope
	bufs    *framePools
	log     *slog.Logger
}

var _ farEnd = (*directEnd)(nil)

func (s *Service) newDirectEnd(c *net.TCPConn, cs tls.ConnectionState, dialer bool, scope network.StreamManagementScope) (*directEnd, error) {
	km, err := cs.ExportKeyingMaterial(exporterLabel, nil, keysSize)
	if err != nil {
		return nil, fmt.Errorf("export frame keys: %w", err)
	}
	out, in, err := newFrameKeys(km, dialer)
	if err != nil {
		return nil, err
	}
	return &directEnd{c: c, out: out, in: in, scope: scope, bufs: &s.frameBufs, log: s.log}, nil
}

// framePools holds direct links' buffers, of one frame and of
// directFrames frames.
type framePools struct{ small, large sync.Pool }

// get takes a buffer of frames frames, 1 or directFrames.
func (p *framePools) get(frames int) *[]byte {
	if frames == 1 {
		if b, ok := p.small.Get().(*[]byte); ok {
			return b
		}
		b := make([]byte, frameStride)
		return &b
	}
	if b, ok := p.large.Get().(*[]byte); ok {
		return b
	}
	b := make([]byte, directFrames*frameStride)
	return &b
}

func (p *framePools) put(b *[]byte) {
	if len(*b) == frameStride {
		p.small.Put(b)
	} else {
		p.large.Put(b)
	}
}

// grow reserves the memory for one direction's larger buffer.
func (d *directEnd) grow() bool {
	return d.scope.ReserveMemory((directFrames-1)*frameStride, network.ReservationPriorityMedium) == nil
}

// send reads l.tc with readv straight into the payload slots of up to
// directFrames frames, seals them in place and writes them with one write.
func (d *directEnd) send(l *link, n *atomic.Uint64) {
	rc, err := l.tc.SyscallConn()
	if err != nil {
		l.abort()
		return
	}
	frames := 1
	bp := d.bufs.get(frames)
	defer func() { d.bufs.put(bp) }()
	buf := *bp
	iov := make([][]byte, 0, directFrames)
	for {
		iov = iov[:0]
		for f := range frames {
			at := f*frameStride + frameHeaderLen
			iov = append(iov, buf[at:at+maxFramePayload])
		}
		k, rerr := readv(l.tc, rc, iov)
		if k > 0 {
			end := 0
			for f, left := 0, k; left > 0; f++ {
				m := min(left, maxFramePayload)
				end = f*frameStride + len(d.out.seal(buf[f*frameStride:], frameData, m))
				left -= m
			}
			if _, err := d.c.Write(buf[:end]); err != nil {
				l.abort()
				return
			}
			n.Add(uint64(k))
			if k == frames*maxFramePayload && frames < directFrames && d.grow() {
				d.bufs.put(bp)
				frames = directFrames
				bp = d.bufs.get(frames)
				buf = *bp
			}
		}
		switch {
		case rerr == io.EOF:
			if _, err := d.c.Write(d.out.seal(buf, frameEnd, 0)); err != nil {
				l.abort()
				return
			}
			if err := d.c.CloseWrite(); err != nil {
				l.abort()
			}
			return
		case rerr != nil:
			l.abort()
			return
		}
	}
}

// receive opens every whole frame that one read brought, in place, and
// writes their payloads to l.tc with one writev. A frame that does not
// open, or an end of the connection without an end frame, aborts l: the
// local application sees a reset, never bytes that were not sent or a
// clean end that was not.
func (d *directEnd) receive(l *link, n *atomic.Uint64) {
	frames := 1
	bp := d.bufs.get(frames)
	defer func() { d.bufs.put(bp) }()
	buf := *bp
	start, end := 0, 0 // buf[start:end] is read and not yet opened
	vec := make(net.Buffers, 0, directFrames+1)
	for {
		if len(buf)-start < frameStride {
			end = copy(buf, buf[start:end])
			start = 0
		}
		k, rerr := d.c.Read(buf[end:])
		end += k
		opened, used, total, fin, err := d.in.openFrames(buf[start:end], vec[:0])
		vec = opened[:0] // its array, for the next read; WriteTo consumes opened
		if err != nil {
			d.log.Warn("direct tunnel cut", "remote", d.c.RemoteAddr(), "err", err)
			l.abort()
			return
		}
		start += used
		if total > 0 {
			if _, err := opened.WriteTo(l.tc); err != nil {
				l.abort()
				return
			}
			n.Add(uint64(total))
		}
		if fin {
			if err := l.tc.CloseWrite(); err != nil {
				l.abort()
			}
			return
		}
		if start == end {
			start, end = 0, 0
		}
		if rerr != nil {
			// EOF included: without an end frame, the connection was cut.
			l.abort()
			return
		}
		if end == len(buf) && frames < directFrames && d.grow() {
			nb := d.bufs.get(directFrames)
			end = copy(*nb, buf[start:end])
			start = 0
			d.bufs.put(bp)
			bp, buf, frames = nb, *nb, directFrames
		}
	}
}

func (d *directEnd) reset() {
	d.c.SetLinger(0)
	d.c.Close()
}

func (d *directEnd) finish(clean bool) {
	if clean {
		d.c.Close()
	}
	d.scope.Done()
}

// dialer dials direct connections; tests route them through a proxy.
type dialer func(ctx context.Context, addr string) (net.Conn, error)

func dialTCP(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr)
}
