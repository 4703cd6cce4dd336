package tunnel_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/net/swarm"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/p2p/tunnel"
)

// newNodeWith is newNode with the tunnel's options.
func newNodeWith(t *testing.T, seed byte, opts ...tunnel.Option) *node {
	t.Helper()
	k, err := identity.KeyFromSeed(bytes.Repeat([]byte{seed}, 32))
	if err != nil {
		t.Fatal(err)
	}
	h, err := p2p.NewHost(p2p.HostParams{Key: k, Listen: []string{"/ip4/127.0.0.1/tcp/0"}, Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	log := slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	tn := tunnel.New(h, chain, log, opts...)
	t.Cleanup(tn.Close)
	return &node{h: h, tn: tn}
}

// proxy is a TCP relay that a node's direct connections are dialed
// through: it records the bytes from the dialer and may change them.
type proxy struct {
	// to, if set, says where a dial for addr really goes.
	to func(addr string) string
	// up, if set, sees each chunk from the dialer at its offset in the
	// connection, may change it in place, and returns false to end the
	// connection there with a clean half-close.
	up func(off int, b []byte) bool

	dials    atomic.Int64
	mu       sync.Mutex
	recorded bytes.Buffer
	wg       sync.WaitGroup
}

func newProxy(t *testing.T) *proxy {
	p := &proxy{}
	t.Cleanup(p.wg.Wait)
	return p
}

// route sends n's direct dials through p: each gets a listener of its own
// on 127.0.0.1, relayed to where the dial was for.
func (p *proxy) route(n *node) {
	tunnel.SetDirectDialer(n.tn, func(ctx context.Context, addr string) (net.Conn, error) {
		p.dials.Add(1)
		target := addr
		if p.to != nil {
			target = p.to(addr)
		}
		var d net.Dialer
		up, err := d.DialContext(ctx, "tcp", target)
		if err != nil {
			return nil, err
		}
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			up.Close()
			return nil, err
		}
		p.wg.Add(1)
		go p.relay(ln, up.(*net.TCPConn))
		return d.DialContext(ctx, "tcp", ln.Addr().String())
	})
}

// relay carries the one connection accepted on ln to and from up.
func (p *proxy) relay(ln net.Listener, up *net.TCPConn) {
	defer p.wg.Done()
	c, err := ln.Accept()
	ln.Close()
	if err != nil {
		up.Close()
		return
	}
	down := c.(*net.TCPConn)
	cut := func() {
		up.SetLinger(0)
		down.SetLinger(0)
		up.Close()
		down.Close()
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 32<<10)
		for off := 0; ; {
			n, err := down.Read(buf)
			if n > 0 {
				p.mu.Lock()
				p.recorded.Write(buf[:n])
				p.mu.Unlock()
				if p.up != nil && !p.up(off, buf[:n]) {
					up.CloseWrite()
					io.Copy(io.Discard, down)
					return
				}
				off += n
				if _, err := up.Write(buf[:n]); err != nil {
					cut()
					return
				}
			}
			if err == io.EOF {
				up.CloseWrite()
				return
			}
			if err != nil {
				cut()
				return
			}
		}
	}()
	if _, err := io.Copy(down, up); err != nil {
		cut()
	} else {
		down.CloseWrite()
	}
	<-done
	up.Close()
	down.Close()
}

func (p *proxy) sawBytes(b []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return bytes.Contains(p.recorded.Bytes(), b)
}

// recorder is a worker that keeps what it reads and how its reading ended.
type recorder struct {
	got chan []byte
	err chan error
}

func record(t *testing.T) (*recorder, *server) {
	r := &recorder{got: make(chan []byte, 1), err: make(chan error, 1)}
	return r, serve(t, func(c *net.TCPConn) {
		b, err := io.ReadAll(c)
		r.got <- b
		r.err <- err
	})
}

// TestDirectRoundTrip carries a connection between two real hosts over a
// direct connection, and checks that its bytes are not on the wire in the
// clear.
func TestDirectRoundTrip(t *testing.T) {
	a, b := newNodeWith(t, 1), newNodeWith(t, 2)
	connect(t, a, b)
	p := newProxy(t)
	p.route(a)
	addr, _ := forwardEcho(t, a, b)
	marker := []byte("TENSOR-BYTES-IN-THE-CLEAR")
	data := make([]byte, 4<<20)
	rand.Read(data)
	for off := 0; off+len(marker) < len(data); off += 64 << 10 {
		copy(data[off:], marker)
	}
	if err := roundTrip(t, dial(t, addr), data); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the link to close", func() bool { return a.tn.Stats().Live == 0 && b.tn.Stats().Live == 0 })
	as, bs := a.tn.Stats().Jobs[job], b.tn.Stats().Jobs[job]
	n := uint64(len(data))
	if as.Direct != 1 || bs.Direct != 1 || as.Sent != n || as.Received != n || bs.Sent != n || bs.Received != n {
		t.Fatalf("stats: A %+v, B %+v; want %d bytes each way over 1 direct connection", as, bs, n)
	}
	if p.dials.Load() != 1 {
		t.Fatalf("%d direct dials, want 1", p.dials.Load())
	}
	if p.sawBytes(marker) || p.sawBytes(data[1000:1100]) {
		t.Fatal("the tunnelled bytes crossed the direct connection in the clear")
	}
	if host, _, _ := net.SplitHostPort(b.tn.DirectAddr()); host != "127.0.0.1" {
		t.Fatalf("direct listener at %s, want the host's own address", b.tn.DirectAddr())
	}
	a.tn.Close()
	b.tn.Close()
	noTunnelGoroutines(t)
}

// A peer that is not on the job's allow list is refused on the direct
// path itself, after its handshake: the worker never sees it.
func TestDirectRefusesPeerNotAllowed(t *testing.T) {
	a, b := newNodeWith(t, 1), newNodeWith(t, 2)
	connect(t, a, b)
	srv := serve(t, echo)
	b.tn.Expose(job, 1, srv.port(), []peer.ID{a.h.ID()})
	c := newNodeWith(t, 3)
	connect(t, c, b)
	caddr, closer, err := c.tn.Forward(t.Context(), job, 1, b.h.ID())
	if err != nil {
		t.Fatal(err)
	}
	defer closer.Close()
	refused(t, caddr)
	eventually(t, "C's link to end", func() bool { return c.tn.Stats().Live == 0 })
	if got := c.tn.Stats().Jobs[job]; got.Direct != 1 || got.Conns != 1 {
		t.Fatalf("C: %+v; want its one connection tried direct, and no fallback to a stream", got)
	}
	if srv.accepted.Load() != 0 || b.tn.Stats().Refused != 1 {
		t.Fatalf("worker saw %d connections, B refused %d; want 0 and 1", srv.accepted.Load(), b.tn.Stats().Refused)
	}
}

// A direct connection that reaches another node than the worker's is
// refused by the forwarder's handshake, even though that node would take
// it: the connection goes by stream to the right machine instead.
func TestDirectAuthenticatesTheWorkersMachine(t *testing.T) {
	a, b, impostor := newNodeWith(t, 1), newNodeWith(t, 2), newNodeWith(t, 3)
	connect(t, a, b)
	connect(t, a, impostor)
	good, bad := serve(t, echo), serve(t, echo)
	b.tn.Expose(job, 1, good.port(), []peer.ID{a.h.ID()})
	impostor.tn.Expose(job, 1, bad.port(), []peer.ID{a.h.ID()})
	p := newProxy(t)
	p.to = func(string) string { return impostor.tn.DirectAddr() }
	p.route(a)
	addr, closer, err := a.tn.Forward(t.Context(), job, 1, b.h.ID())
	if err != nil {
		t.Fatal(err)
	}
	defer closer.Close()
	if err := roundTrip(t, dial(t, addr), []byte("for B only")); err != nil {
		t.Fatal(err)
	}
	if bad.accepted.Load() != 0 || good.accepted.Load() != 1 {
		t.Fatalf("impostor's worker saw %d connections, B's %d", bad.accepted.Load(), good.accepted.Load())
	}
	if got := a.tn.Stats().Jobs[job]; got.Direct != 0 || got.Conns != 1 {
		t.Fatalf("A: %+v; want its connection carried by a stream", got)
	}
}

// TestDirectTamperedByte flips one bit of the frames between the two
// nodes: the worker gets only bytes that were sent, up to the bad frame,
// and then a reset; the client's connection ends in an error.
func TestDirectTamperedByte(t *testing.T) {
	a, b := newNodeWith(t, 1), newNodeWith(t, 2)
	connect(t, a, b)
	const at = 300 << 10 // well past the handshake, inside the frames
	p := newProxy(t)
	var flipped atomic.Bool
	p.up = func(off int, chunk []byte) bool {
		if off <= at && at < off+len(chunk) {
			chunk[at-off] ^= 0x10
			flipped.Store(true)
		}
		return true
	}
	p.route(a)
	r, srv := record(t)
	b.tn.Expose(job, 1, srv.port(), []peer.ID{a.h.ID()})
	addr, closer, err := a.tn.Forward(t.Context(), job, 1, b.h.ID())
	if err != nil {
		t.Fatal(err)
	}
	defer closer.Close()
	data := make([]byte, 1<<20)
	rand.Read(data)
	c := dial(t, addr)
	go func() {
		c.Write(data) // fails once the link is cut
		c.CloseWrite()
	}()
	if _, err := io.ReadAll(c); err == nil {
		t.Fatal("the client's connection ended cleanly")
	}
	got, werr := <-r.got, <-r.err
	if !flipped.Load() {
		t.Fatal("the proxy never reached the byte to flip")
	}
	if !bytes.HasPrefix(data, got) || len(got) >= len(data) {
		t.Fatalf("worker got %d bytes, not a strict prefix of the %d sent", len(got), len(data))
	}
	if werr == nil {
		t.Fatal("the worker's connection ended cleanly after a tampered frame")
	}
	if st := a.tn.Stats().Jobs[job]; st.Direct != 1 {
		t.Fatalf("A: %+v; want one direct connection", st)
	}
}

// TestDirectTruncated ends the direct connection early with a clean FIN,
// as an attacker could: the worker must see a reset, not a clean end that
// would pass truncated data off as complete.
func TestDirectTruncated(t *testing.T) {
	a, b := newNodeWith(t, 1), newNodeWith(t, 2)
	connect(t, a, b)
	p := newProxy(t)
	p.up = func(off int, chunk []byte) bool { return off < 200<<10 }
	p.route(a)
	r, srv := record(t)
	b.tn.Expose(job, 1, srv.port(), []peer.ID{a.h.ID()})
	addr, closer, err := a.tn.Forward(t.Context(), job, 1, b.h.ID())
	if err != nil {
		t.Fatal(err)
	}
	defer closer.Close()
	data := make([]byte, 1<<20)
	rand.Read(data)
	c := dial(t, addr)
	go func() {
		c.Write(data)
		c.CloseWrite()
	}()
	io.ReadAll(c)
	got, werr := <-r.got, <-r.err
	if werr == nil {
		t.Fatalf("the worker's connection ended cleanly after %d of %d bytes", len(got), len(data))
	}
	if !bytes.HasPrefix(data, got) {
		t.Fatal("the worker got bytes that were not sent")
	}
}

// Without a direct listener on the worker's machine, or when the direct
// dial fails, connections go by streams; a failed dial is not tried again
// for every connection.
func TestDirectFallsBackToStreams(t *testing.T) {
	t.Run("no direct listener", func(t *testing.T) {
		a, b := newNodeWith(t, 1), newNodeWith(t, 2, tunnel.WithDirect(false))
		connect(t, a, b)
		addr, _ := forwardEcho(t, a, b)
		if err := roundTrip(t, dial(t, addr), []byte("by stream")); err != nil {
			t.Fatal(err)
		}
		if b.tn.DirectAddr() != "" {
			t.Fatalf("direct listener at %s with WithDirect(false)", b.tn.DirectAddr())
		}
		if got := a.tn.Stats().Jobs[job]; got.Direct != 0 || got.Conns != 1 {
			t.Fatalf("A: %+v", got)
		}
	})
	t.Run("dial fails", func(t *testing.T) {
		a, b := newNodeWith(t, 1), newNodeWith(t, 2)
		connect(t, a, b)
		var dials atomic.Int64
		tunnel.SetDirectDialer(a.tn, func(ctx context.Context, addr string) (net.Conn, error) {
			dials.Add(1)
			return nil, errors.New("firewalled")
		})
		addr, _ := forwardEcho(t, a, b)
		for i := range 3 {
			if err := roundTrip(t, dial(t, addr), []byte{byte(i)}); err != nil {
				t.Fatal(err)
			}
		}
		if got := a.tn.Stats().Jobs[job]; got.Direct != 0 || got.Conns != 3 || dials.Load() != 1 {
			t.Fatalf("A: %+v after %d direct dials; want 3 connections by stream, 1 dial", got, dials.Load())
		}
	})
}

// A forwarder whose libp2p connection to the worker's machine has gone
// before its first connection reconnects to learn the direct listener's
// address, and goes direct; once it has gone direct, it goes direct again
// without the libp2p connection.
func TestDirectAfterReconnect(t *testing.T) {
	a, _, addr, _ := pair(t, "tcp", echo)
	for range 2 {
		for _, p := range a.h.Network().Peers() {
			a.h.Network().ClosePeer(p)
		}
		if err := roundTrip(t, dial(t, addr), []byte("hello")); err != nil {
			t.Fatal(err)
		}
	}
	if got := a.tn.Stats().Jobs[job]; got.Direct != 2 || got.Conns != 2 {
		t.Fatalf("A: %+v; want both connections direct", got)
	}
}

// cut closes the libp2p connection between a and b and makes each forget
// the other's addresses, so that neither can connect again until connect.
func cut(t *testing.T, a, b *node) {
	t.Helper()
	// B stops listening: clearing A's peerstore is not enough, as
	// identify puts the addresses of a peer that just disconnected back
	// in it, in its own time.
	sw, ok := b.h.Network().(*swarm.Swarm)
	if !ok {
		t.Fatalf("%T is not a swarm", b.h.Network())
	}
	b.closed = sw.ListenAddresses()
	sw.ListenClose(b.closed...)
	a.h.Network().ClosePeer(b.h.ID())
	b.h.Network().ClosePeer(a.h.ID())
	eventually(t, "the libp2p connection to close", func() bool {
		return len(a.h.Network().ConnsToPeer(b.h.ID())) == 0 && len(b.h.Network().ConnsToPeer(a.h.ID())) == 0
	})
	a.h.Peerstore().ClearAddrs(b.h.ID())
	b.h.Peerstore().ClearAddrs(a.h.ID())
	if err := a.h.Connect(t.Context(), peer.AddrInfo{ID: b.h.ID(), Addrs: b.closed}); err == nil {
		t.Fatal("A connected to B again")
	}
}

// While the nodes' libp2p connection is down and cannot be made again, a
// forwarder still reaches the worker's direct listener at the address that
// worked last, with the same handshake; once libp2p is back, it still goes
// direct rather than by streams.
func TestDirectWhileLibp2pIsDown(t *testing.T) {
	a, b, addr, _ := pair(t, "tcp", echo)
	if err := roundTrip(t, dial(t, addr), []byte("first")); err != nil {
		t.Fatal(err)
	}
	cut(t, a, b)
	if err := roundTrip(t, dial(t, addr), []byte("while libp2p is down")); err != nil {
		t.Fatalf("with libp2p down: %v", err)
	}
	if len(a.h.Network().ConnsToPeer(b.h.ID())) != 0 {
		t.Fatal("A reconnected to B: the test did not keep libp2p down")
	}
	connect(t, a, b)
	if err := roundTrip(t, dial(t, addr), []byte("libp2p is back")); err != nil {
		t.Fatal(err)
	}
	if got := a.tn.Stats().Jobs[job]; got.Direct != 3 || got.Conns != 3 {
		t.Fatalf("A: %+v; want all three connections direct", got)
	}
}

// The address that worked last is trusted no more than any other: a
// direct connection to it that reaches another node is refused by the
// forwarder's handshake, and the connection falls back to a stream, which
// fails while libp2p is down.
func TestDirectLastAddressIsAuthenticated(t *testing.T) {
	a, b, impostor := newNodeWith(t, 1), newNodeWith(t, 2), newNodeWith(t, 3)
	connect(t, a, b)
	good, bad := serve(t, echo), serve(t, echo)
	b.tn.Expose(job, 1, good.port(), []peer.ID{a.h.ID()})
	impostor.tn.Expose(job, 1, bad.port(), []peer.ID{a.h.ID()})
	p := newProxy(t)
	var toImpostor atomic.Bool
	p.to = func(addr string) string {
		if toImpostor.Load() {
			return impostor.tn.DirectAddr() // B's address is another node's now
		}
		return addr
	}
	p.route(a)
	addr, closer, err := a.tn.Forward(t.Context(), job, 1, b.h.ID())
	if err != nil {
		t.Fatal(err)
	}
	defer closer.Close()
	if err := roundTrip(t, dial(t, addr), []byte("first")); err != nil {
		t.Fatal(err)
	}
	cut(t, a, b)
	toImpostor.Store(true)
	refused(t, addr)
	if bad.accepted.Load() != 0 || good.accepted.Load() != 1 {
		t.Fatalf("impostor's worker saw %d connections, B's %d", bad.accepted.Load(), good.accepted.Load())
	}
	if p.dials.Load() != 2 {
		t.Fatalf("%d direct dials, want 2", p.dials.Load())
	}
}

// TestDirectSetupDoesNotQueue: new connections do not queue behind one
// whose direct setup is slow, a connection that gives up waiting does so
// when its own time is up, and a connection that gives up is not taken
// for a failure of the direct path, which would send the forwarder's
// connections through streams for directRetry.
func TestDirectSetupDoesNotQueue(t *testing.T) {
	const n = 8
	t.Run("slow port query", func(t *testing.T) {
		a, b := newNodeWith(t, 1), newNodeWith(t, 2)
		connect(t, a, b)
		_, port, err := net.SplitHostPort(b.tn.DirectAddr())
		if err != nil {
			t.Fatal(err)
		}
		pn, _ := strconv.Atoi(port)
		entered, release := make(chan struct{}, 1), make(chan struct{})
		answer := sync.OnceFunc(func() { close(release) })
		defer answer()
		b.h.SetStreamHandler(tunnel.DirectProtocol(chain), func(st network.Stream) {
			select {
			case entered <- struct{}{}:
			default:
			}
			select {
			case <-release:
			case <-time.After(30 * time.Second):
			}
			st.Write(binary.BigEndian.AppendUint16(nil, uint16(pn)))
			st.Close()
		})
		addr, closer := forwardEcho(t, a, b)

		// A connection with little time left asks for the port, and B is slow
		// to answer.
		ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		defer cancel()
		short := make(chan error, 1)
		start := time.Now()
		go func() {
			_, err := tunnel.OpenFar(ctx, closer)
			short <- err
		}()
		select {
		case <-entered:
		case <-time.After(10 * time.Second):
			t.Fatal("no port query")
		}
		// Many more arrive meanwhile.
		errs := make(chan error, n)
		for i := range n {
			go func() { errs <- roundTripTo(addr, []byte{byte(i)}) }()
		}
		select {
		case err := <-short:
			if err == nil {
				t.Error("a connection opened after its time ran out")
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("a connection waiting for the port gave up after %v, its time was 300ms", d)
			}
		case <-time.After(3 * time.Second):
			t.Error("a connection waiting for the port did not give up when its time ran out")
		}
		answer()
		for range n {
			if err := <-errs; err != nil {
				t.Error(err)
			}
		}
		if got := a.tn.Stats().Jobs[job]; got.Direct != n || got.Conns != n {
			t.Fatalf("A: %+v; want all %d connections direct", got, n)
		}
	})
	t.Run("cancelled dial", func(t *testing.T) {
		a, b := newNodeWith(t, 1), newNodeWith(t, 2)
		connect(t, a, b)
		var dials atomic.Int64
		tunnel.SetDirectDialer(a.tn, func(ctx context.Context, addr string) (net.Conn, error) {
			if dials.Add(1) == 1 {
				<-ctx.Done() // a dial that hangs, until its connection gives up
				return nil, ctx.Err()
			}
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		})
		addr, closer := forwardEcho(t, a, b)
		ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		defer cancel()
		if _, err := tunnel.OpenFar(ctx, closer); err == nil {
			t.Fatal("a connection opened after its time ran out")
		}
		allDirect(t, a, addr, n, fmt.Sprintf(" after %d direct dials", dials.Load()))
	})
}

// roundTripTo is roundTrip over a new connection to addr, for goroutines
// other than the test's.
func roundTripTo(addr string, data []byte) error {
	c, err := net.Dial("tcp4", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	return roundTrip(nil, c.(*net.TCPConn), data)
}

// allDirect opens n connections to addr at once, each a round trip, and
// checks that a's job carried every one of them directly; why says what
// else the failure should show.
func allDirect(t *testing.T, a *node, addr string, n int, why string) {
	t.Helper()
	errs := make(chan error, n)
	for i := range n {
		go func() { errs <- roundTripTo(addr, []byte{byte(i)}) }()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if got := a.tn.Stats().Jobs[job]; got.Direct != uint64(n) || got.Conns != uint64(n) {
		t.Fatalf("A: %+v%s; want all %d connections direct", got, why, n)
	}
}

// Whatever reaches the direct listener without a libp2p handshake, a
// scanner or a confused gRPC client, is refused before any worker is
// dialed.
func TestDirectListenerRefusesStrangers(t *testing.T) {
	a, b := newNodeWith(t, 1), newNodeWith(t, 2)
	connect(t, a, b)
	srv := serve(t, echo)
	b.tn.Expose(job, 1, srv.port(), []peer.ID{a.h.ID()})
	for _, hello := range [][]byte{
		[]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
		{0x16, 0x03, 0x01, 0x00, 0x05, 1, 2, 3, 4, 5},
	} {
		c, err := net.Dial("tcp4", b.tn.DirectAddr())
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(30 * time.Second))
		c.Write(hello)
		io.ReadAll(c)
		c.Close()
	}
	eventually(t, "B to refuse both", func() bool { return b.tn.Stats().Refused == 2 })
	if srv.accepted.Load() != 0 {
		t.Fatalf("the worker saw %d connections", srv.accepted.Load())
	}
}

// TestDirectPunchedThroughANAT: a worker's machine behind a NAT answers
// the direct port query with no port, so each connection to it is
// punched (PunchProtocol): both machines connect from fresh ports to each
// other at once, and the connection is the direct path's, authenticated
// and encrypted as any. (On loopback there is no NAT to cross: the NAT
// profile of make bench-nat crosses two; this checks the protocol, the
// roles and the accounting.)
func TestDirectPunchedThroughANAT(t *testing.T) {
	a, b := newNodeWith(t, 1), newNodeWith(t, 2)
	tunnel.BehindNAT(b.tn)
	connect(t, a, b)
	addr, _ := forwardEcho(t, a, b)
	data := make([]byte, 1<<20)
	rand.Read(data)
	for range 3 { // each connection punches anew: a 4-tuple serves one connection
		if err := roundTrip(t, dial(t, addr), data); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "the links to close", func() bool { return a.tn.Stats().Live == 0 && b.tn.Stats().Live == 0 })
	as, bs := a.tn.Stats().Jobs[job], b.tn.Stats().Jobs[job]
	if as.Direct != 3 || bs.Direct != 3 || as.Conns != 3 {
		t.Fatalf("stats: A %+v, B %+v; want 3 direct (punched) connections", as, bs)
	}
	a.tn.Close()
	b.tn.Close()
	noTunnelGoroutines(t)
}

// TestPunchRefusesStrangers: a stranger with a fresh key (a real libp2p
// host, directly connected) asks a machine behind a NAT for punched
// connections, many times: it is answered port 0 each time, so it holds
// none of the direct path's handshake slots or ports, and the job's own
// machine is still punched to at once.
func TestPunchRefusesStrangers(t *testing.T) {
	a, b, x := newNodeWith(t, 1), newNodeWith(t, 2), newNodeWith(t, 3)
	tunnel.BehindNAT(b.tn)
	connect(t, a, b)
	connect(t, x, b)
	srv := serve(t, echo)
	b.tn.Expose(job, 1, srv.port(), []peer.ID{a.h.ID()})
	for i := range 100 {
		st, err := x.h.NewStream(t.Context(), b.h.ID(), tunnel.PunchProtocol(chain))
		if err != nil {
			t.Fatal(err)
		}
		var port [2]byte
		binary.BigEndian.PutUint16(port[:], uint16(40000+i))
		if _, err := st.Write(port[:]); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(st, port[:]); err != nil {
			t.Fatalf("punch request %d: %v", i, err)
		}
		if got := binary.BigEndian.Uint16(port[:]); got != 0 {
			t.Fatalf("a stranger was given port %d to punch to", got)
		}
		st.Close()
	}
	addr, closer, err := a.tn.Forward(t.Context(), job, 1, b.h.ID())
	if err != nil {
		t.Fatal(err)
	}
	defer closer.Close()
	if err := roundTrip(t, dial(t, addr), []byte("punched")); err != nil {
		t.Fatal(err)
	}
	if got := a.tn.Stats().Jobs[job]; got.Direct != 1 {
		t.Fatalf("A: %+v, want its one connection punched and direct", got)
	}
}

// forwardEcho serves an echo worker on b's machine, exposed to a, and
// forwards to it from a: the address a's forward listens on, and the
// forward, closed with the test.
func forwardEcho(t *testing.T, a, b *node) (string, io.Closer) {
	t.Helper()
	srv := serve(t, echo)
	b.tn.Expose(job, 1, srv.port(), []peer.ID{a.h.ID()})
	addr, closer, err := a.tn.Forward(t.Context(), job, 1, b.h.ID())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closer.Close() })
	return addr, closer
}
