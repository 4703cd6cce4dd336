package tunnel_test

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/net/swarm"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/p2p/tunnel"
)

const (
	chain = "deepmarket-test"
	job   = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
)

// node is one machine: a real libp2p host on loopback and its tunnel.
type node struct {
	h  host.Host
	tn *tunnel.Service
	// closed holds the listen addresses cut closed, which connect opens
	// again.
	closed []ma.Multiaddr
}

func newNode(t *testing.T, seed byte, transport string) *node {
	t.Helper()
	k, err := identity.KeyFromSeed(bytes.Repeat([]byte{seed}, 32))
	if err != nil {
		t.Fatal(err)
	}
	listen := "/ip4/127.0.0.1/tcp/0"
	if transport == "quic" {
		listen = "/ip4/127.0.0.1/udp/0/quic-v1"
	}
	h, err := p2p.NewHost(p2p.HostParams{Key: k, Listen: []string{listen}, Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	log := slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	tn := tunnel.New(h, chain, log)
	t.Cleanup(tn.Close)
	return &node{h: h, tn: tn}
}

// tWriter routes a logger into t.Log, and drops lines once t is done.
type tWriter struct{ t *testing.T }

func (w tWriter) Write(b []byte) (int, error) {
	defer func() { recover() }() // t.Log after the test ended panics
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

func connect(t *testing.T, a, b *node) {
	t.Helper()
	if b.closed != nil {
		if err := b.h.Network().Listen(b.closed...); err != nil {
			t.Fatal(err)
		}
		b.closed = nil
		if sw, ok := a.h.Network().(interface{ Backoff() *swarm.DialBackoff }); ok {
			sw.Backoff().Clear(b.h.ID()) // from cut's check that B was out of reach
		}
	}
	if err := a.h.Connect(t.Context(), peer.AddrInfo{ID: b.h.ID(), Addrs: b.h.Addrs()}); err != nil {
		t.Fatal(err)
	}
}

// server is a worker stand-in on 127.0.0.1: it runs fn on each connection.
type server struct {
	ln       net.Listener
	accepted atomic.Int64
	wg       sync.WaitGroup
}

func serve(t *testing.T, fn func(c *net.TCPConn)) *server {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &server{ln: ln}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.accepted.Add(1)
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer c.Close()
				c.SetDeadline(time.Now().Add(time.Minute))
				fn(c.(*net.TCPConn))
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		s.wg.Wait()
	})
	return s
}

func (s *server) port() int { return s.ln.Addr().(*net.TCPAddr).Port }

// echo sends back what it reads, and half-closes when the client does.
func echo(c *net.TCPConn) {
	io.Copy(c, c)
	c.CloseWrite()
}

func dial(t *testing.T, addr string) *net.TCPConn {
	t.Helper()
	c, err := net.Dial("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(30 * time.Second))
	t.Cleanup(func() { c.Close() })
	return c.(*net.TCPConn)
}

// pair is machine A forwarding to worker 1 of job on machine B.
func pair(t *testing.T, transport string, worker func(*net.TCPConn)) (a, b *node, addr string, srv *server) {
	t.Helper()
	a, b = newNode(t, 1, transport), newNode(t, 2, transport)
	connect(t, a, b)
	srv = serve(t, worker)
	b.tn.Expose(job, 1, srv.port(), []peer.ID{a.h.ID()})
	addr, closer, err := a.tn.Forward(t.Context(), job, 1, b.h.ID())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closer.Close() })
	return a, b, addr, srv
}

type halfCloser interface {
	io.ReadWriter
	CloseWrite() error
}

// roundTrip sends data through c and checks that the same comes back.
func roundTrip(t *testing.T, c halfCloser, data []byte) error {
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(data)
		if err == nil {
			err = c.CloseWrite()
		}
		errc <- err
	}()
	got, err := io.ReadAll(c)
	if werr := <-errc; werr != nil {
		return fmt.Errorf("write: %w", werr)
	}
	if err != nil {
		return fmt.Errorf("read: %w", err)
	}
	if !bytes.Equal(got, data) {
		return fmt.Errorf("got %d bytes back, want the %d sent", len(got), len(data))
	}
	return nil
}

// refused checks that a connection to addr is closed without any data
// coming back.
func refused(t *testing.T, addr string) {
	t.Helper()
	c, err := net.Dial("tcp4", addr)
	if errors.Is(err, syscall.ECONNRESET) {
		return // cut before the dial had even returned
	}
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	c.Write([]byte("GET / HTTP/1.1\r\n\r\n")) // may fail once the RST is in
	got, err := io.ReadAll(c)
	var nerr net.Error
	if errors.As(err, &nerr) && nerr.Timeout() {
		t.Fatal("connection neither carried nor refused")
	}
	if len(got) != 0 {
		t.Fatalf("refused connection returned %q", got)
	}
}

// noTunnelGoroutines waits briefly for the package's goroutines to end
// and fails the test with the stacks of any that remain.
func noTunnelGoroutines(t *testing.T) {
	t.Helper()
	var left []string
	for range 100 {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		left = left[:0]
		for _, g := range strings.Split(string(buf), "\n\n") {
			if strings.Contains(g, "deepmarket/p2p/tunnel.") {
				left = append(left, g)
			}
		}
		if len(left) == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Errorf("%d tunnel goroutines left:\n%s", len(left), strings.Join(left, "\n\n"))
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestRoundTrip10MB(t *testing.T) {
	for _, transport := range []string{"tcp", "quic"} {
		t.Run(transport, func(t *testing.T) {
			a, b, addr, _ := pair(t, transport, echo)
			data := make([]byte, 10<<20)
			rand.Read(data)
			if err := roundTrip(t, dial(t, addr), data); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the link to close", func() bool { return a.tn.Stats().Live == 0 && b.tn.Stats().Live == 0 })
			as, bs := a.tn.Stats().Jobs[job], b.tn.Stats().Jobs[job]
			n := uint64(len(data))
			if as.Sent != n || as.Received != n || bs.Sent != n || bs.Received != n || as.Conns != 1 || bs.Conns != 1 {
				t.Fatalf("stats: A %+v, B %+v; want %d bytes each way over 1 connection", as, bs, n)
			}
		})
	}
}

func TestManyConnections(t *testing.T) {
	const conns = 50
	a, b, addr, _ := pair(t, "tcp", echo)
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	open := make([]*net.TCPConn, conns)
	for i := range open {
		open[i] = dial(t, addr)
	}
	// Every connection sends its first bytes before any finishes, so that
	// all 50 are carried at once.
	for i, c := range open {
		if _, err := c.Write([]byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "50 live links on both sides", func() bool {
		return a.tn.Stats().Live == conns && b.tn.Stats().Jobs[job].Live == conns
	})
	for i, c := range open {
		wg.Add(1)
		go func() {
			defer wg.Done()
			data := make([]byte, 256<<10)
			rand.Read(data)
			var first [1]byte
			if _, err := io.ReadFull(c, first[:]); err != nil || first[0] != byte(i) {
				errs <- fmt.Errorf("conn %d: first byte %v, %v", i, first[0], err)
				return
			}
			if err := roundTrip(t, c, data); err != nil {
				errs <- fmt.Errorf("conn %d: %w", i, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	eventually(t, "all links to close", func() bool { return a.tn.Stats().Live == 0 && b.tn.Stats().Live == 0 })
	if got := b.tn.Stats().Jobs[job].Conns; got != conns {
		t.Fatalf("B carried %d connections, want %d", got, conns)
	}
}

func TestRefusesPeerNotAllowed(t *testing.T) {
	_, b, addr, srv := pair(t, "tcp", echo)
	if err := roundTrip(t, dial(t, addr), []byte("allowed")); err != nil {
		t.Fatal(err)
	}
	c := newNode(t, 3, "tcp")
	connect(t, c, b)
	caddr, closer, err := c.tn.Forward(t.Context(), job, 1, b.h.ID())
	if err != nil {
		t.Fatal(err)
	}
	defer closer.Close()
	refused(t, caddr)
	if got := srv.accepted.Load(); got != 1 {
		t.Fatalf("the worker saw %d connections, want only A's", got)
	}
	if b.tn.Stats().Refused != 1 {
		t.Fatalf("B refused %d streams, want 1", b.tn.Stats().Refused)
	}
}

func TestRefusesUnexposedWorker(t *testing.T) {
	a, b, _, srv := pair(t, "tcp", echo)
	for _, w := range []struct {
		job   string
		index int
	}{{job, 0}, {job, 2}, {strings.Repeat("0", 64), 1}} {
		addr, closer, err := a.tn.Forward(t.Context(), w.job, w.index, b.h.ID())
		if err != nil {
			t.Fatal(err)
		}
		refused(t, addr)
		closer.Close()
	}
	if srv.accepted.Load() != 0 || b.tn.Stats().Refused != 3 {
		t.Fatalf("worker saw %d connections, B refused %d; want 0 and 3", srv.accepted.Load(), b.tn.Stats().Refused)
	}
}

func TestUnexpose(t *testing.T) {
	a, b := newNode(t, 1, "tcp"), newNode(t, 2, "tcp")
	connect(t, a, b)
	srv := serve(t, echo)
	unexpose := b.tn.Expose(job, 0, srv.port(), []peer.ID{a.h.ID()})
	addr, closer, err := a.tn.Forward(t.Context(), job, 0, b.h.ID())
	if err != nil {
		t.Fatal(err)
	}
	defer closer.Close()
	open := dial(t, addr)
	if _, err := open.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	var buf [4]byte
	if _, err := io.ReadFull(open, buf[:]); err != nil {
		t.Fatal(err)
	}
	unexpose()
	unexpose() // idempotent
	// The open connection is cut, as an error rather than a clean end.
	if _, err := io.ReadAll(open); err == nil {
		t.Fatal("a connection open at unexpose ended cleanly")
	}
	refused(t, addr)
	if srv.accepted.Load() != 1 {
		t.Fatalf("worker saw %d connections after unexpose", srv.accepted.Load()-1)
	}
	if _, ok := b.tn.Stats().Jobs[job]; ok {
		t.Fatal("B still counts the job after its only Expose was withdrawn")
	}
}

// Exposing a worker again (it restarted on another port, say) sends new
// connections to the new port; Close still cuts those of the first.
func TestExposeAgain(t *testing.T) {
	a, b, addr, first := pair(t, "tcp", echo)
	old := dial(t, addr)
	if _, err := old.Write([]byte("old")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the first link", func() bool { return b.tn.Stats().Live == 1 })
	second := serve(t, func(c *net.TCPConn) { c.Write([]byte("second")) })
	b.tn.Expose(job, 1, second.port(), []peer.ID{a.h.ID()})
	got, err := io.ReadAll(dial(t, addr))
	if err != nil || string(got) != "second" {
		t.Fatalf("after Expose again: %q, %v", got, err)
	}
	if first.accepted.Load() != 1 {
		t.Fatalf("first worker saw %d connections", first.accepted.Load())
	}
	b.tn.Close()
	if got, err := io.ReadAll(old); err == nil || len(got) > 3 {
		t.Fatalf("old connection: %q, %v after Close", got, err)
	}
}

func TestHalfClose(t *testing.T) {
	// Client to worker: the worker reads to EOF, then answers with what it
	// read, and the client, its write side closed, reads the answer.
	t.Run("client first", func(t *testing.T) {
		_, _, addr, _ := pair(t, "tcp", func(c *net.TCPConn) {
			h := sha256.New()
			n, _ := io.Copy(h, c)
			fmt.Fprintf(c, "%d %x", n, h.Sum(nil))
			c.CloseWrite()
		})
		data := make([]byte, 1<<20)
		rand.Read(data)
		c := dial(t, addr)
		if _, err := c.Write(data); err != nil {
			t.Fatal(err)
		}
		if err := c.CloseWrite(); err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(c)
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("%d %x", len(data), sha256.Sum256(data)); string(got) != want {
			t.Fatalf("got %q, want %q", got, want)
		}
	})
	// Worker to client: the worker greets and half-closes; the client reads
	// to EOF and only then sends, and the worker reads that to EOF.
	t.Run("worker first", func(t *testing.T) {
		heard := make(chan string, 1)
		_, _, addr, _ := pair(t, "tcp", func(c *net.TCPConn) {
			c.Write([]byte("hello"))
			c.CloseWrite()
			b, _ := io.ReadAll(c)
			heard <- string(b)
		})
		c := dial(t, addr)
		got, err := io.ReadAll(c)
		if err != nil || string(got) != "hello" {
			t.Fatalf("greeting %q, %v", got, err)
		}
		if _, err := c.Write([]byte("bye")); err != nil {
			t.Fatal(err)
		}
		c.CloseWrite()
		if h := <-heard; h != "bye" {
			t.Fatalf("worker heard %q", h)
		}
	})
}

// A connection the worker aborts must reach the client as an error, not
// as a clean end that would pass truncated data off as complete.
func TestAbortPropagates(t *testing.T) {
	_, _, addr, _ := pair(t, "tcp", func(c *net.TCPConn) {
		var buf [4]byte
		io.ReadFull(c, buf[:])
		c.Write([]byte("partial"))
		c.SetLinger(0)
		c.Close()
	})
	c := dial(t, addr)
	c.Write([]byte("ping"))
	got, err := io.ReadAll(c)
	if err == nil {
		t.Fatalf("aborted connection ended cleanly after %q", got)
	}
}

// TestHTTP2 speaks cleartext HTTP/2, gRPC's protocol, through the tunnel:
// many concurrent requests multiplexed over one connection.
func TestHTTP2(t *testing.T) {
	a, b := newNode(t, 1, "tcp"), newNode(t, 2, "tcp")
	connect(t, a, b)
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Protocols: &protos, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Proto", r.Proto)
		io.Copy(w, r.Body)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	b.tn.Expose(job, 0, ln.Addr().(*net.TCPAddr).Port, []peer.ID{a.h.ID()})
	addr, closer, err := a.tn.Forward(t.Context(), job, 0, b.h.ID())
	if err != nil {
		t.Fatal(err)
	}
	defer closer.Close()
	tr := &http.Transport{Protocols: &protos}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}

	// One request first: the client dials one connection for requests made
	// before it has one, and the test is of the tunnel, not of that.
	resp, err := client.Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := make([]byte, 64<<10+i)
			rand.Read(body)
			resp, err := client.Post("http://"+addr+"/echo", "application/octet-stream", bytes.NewReader(body))
			if err != nil {
				errs <- err
				return
			}
			defer resp.Body.Close()
			got, err := io.ReadAll(resp.Body)
			if err != nil || !bytes.Equal(got, body) || resp.Header.Get("X-Proto") != "HTTP/2.0" {
				errs <- fmt.Errorf("request %d: %d bytes back over %s, %v", i, len(got), resp.Header.Get("X-Proto"), err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := b.tn.Stats().Jobs[job].Conns; n != 1 {
		t.Errorf("20 HTTP/2 requests took %d connections, want 1", n)
	}
}

func TestForwardLoopbackOnly(t *testing.T) {
	a, b, addr, _ := pair(t, "tcp", echo)
	if host, _, _ := net.SplitHostPort(addr); host != "127.0.0.1" {
		t.Fatalf("forwarder listens on %s", addr)
	}
	// A chosen port, as TF_CONFIG may fix ports before the forwarders open.
	free, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := free.Addr().(*net.TCPAddr).Port
	free.Close()
	got, closer, err := a.tn.ForwardPort(t.Context(), port, job, 1, b.h.ID())
	if err != nil {
		t.Fatal(err)
	}
	defer closer.Close()
	if want := fmt.Sprintf("127.0.0.1:%d", port); got != want {
		t.Fatalf("forwarder at %s, want %s", got, want)
	}
	if err := roundTrip(t, dial(t, got), []byte("fixed port")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.tn.Forward(t.Context(), job, 1, a.h.ID()); err == nil {
		t.Fatal("forward to this machine's own worker accepted")
	}
}

// TestClose cuts open connections on both sides, refuses new ones, and
// leaves none of the package's goroutines behind.
func TestClose(t *testing.T) {
	a, b, addr, srv := pair(t, "tcp", echo)
	open := make([]*net.TCPConn, 10)
	for i := range open {
		open[i] = dial(t, addr)
		open[i].Write([]byte("x"))
	}
	eventually(t, "10 live links", func() bool { return b.tn.Stats().Live == 10 })
	// A stream that never sends its header must not hold Close up.
	stalled, err := a.h.NewStream(t.Context(), b.h.ID(), tunnel.Protocol(chain))
	if err != nil {
		t.Fatal(err)
	}
	stalled.Write([]byte{0x20}) // a length, then nothing
	defer stalled.Reset()
	time.Sleep(50 * time.Millisecond)

	start := time.Now()
	b.tn.Close()
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Close took %v", d)
	}
	for i, c := range open {
		// The echo of "x" may have come back before Close; then an error.
		if got, err := io.ReadAll(c); err == nil || len(got) > 1 {
			t.Errorf("connection %d: %q, %v when B closed", i, got, err)
		}
	}
	refused(t, addr)
	before := srv.accepted.Load()
	// A's forwarder still accepts, finds no B and resets the connection:
	// fast enough, and the dial itself sees the reset.
	if c, err := net.Dial("tcp4", addr); err == nil {
		if err := roundTrip(t, c.(*net.TCPConn), []byte("after")); err == nil {
			t.Fatal("B carried a connection after Close")
		}
	}
	if srv.accepted.Load() != before {
		t.Fatal("the worker saw a connection after Close")
	}
	a.tn.Close()
	a.tn.Close() // idempotent
	if _, _, err := a.tn.Forward(t.Context(), job, 1, b.h.ID()); !errors.Is(err, tunnel.ErrClosed) {
		t.Fatalf("Forward after Close: %v", err)
	}
	if _, err := net.Dial("tcp4", addr); err == nil {
		t.Fatal("forwarder still listening after Close")
	}
	if a.tn.Stats().Live != 0 || b.tn.Stats().Live != 0 {
		t.Fatalf("live links after Close: A %d, B %d", a.tn.Stats().Live, b.tn.Stats().Live)
	}
	noTunnelGoroutines(t)
}

// TestLimitsSpareOtherProtocols opens more tunnel connections than the
// resource manager lets one peer have on one protocol: each is either
// carried or refused cleanly, and the host's other protocols still work.
func TestLimitsSpareOtherProtocols(t *testing.T) {
	const conns = 300
	a, b, addr, _ := pair(t, "tcp", echo)
	const ping = "/deepmarket-test/ping/1"
	b.h.SetStreamHandler(ping, func(s network.Stream) {
		defer s.Close()
		io.Copy(s, s)
	})
	var open []net.Conn
	for range conns {
		c, err := net.Dial("tcp4", addr)
		if errors.Is(err, syscall.ECONNRESET) {
			continue // refused before the dial had returned
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.Write([]byte("x"))
		open = append(open, c)
	}
	carried := 0
	for i, c := range open {
		var one [1]byte
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err := io.ReadFull(c, one[:])
		var nerr net.Error
		switch {
		case err == nil:
			carried++
		case errors.As(err, &nerr) && nerr.Timeout():
			t.Fatalf("connection %d neither carried nor refused", i)
		}
	}
	t.Logf("%d of %d connections carried, %d live on A", carried, conns, a.tn.Stats().Live)
	if carried == 0 {
		t.Fatal("no connection carried")
	}
	s, err := a.h.NewStream(t.Context(), b.h.ID(), ping)
	if err != nil {
		t.Fatalf("another protocol, with %d tunnel streams open: %v", carried, err)
	}
	defer s.Close()
	s.SetDeadline(time.Now().Add(10 * time.Second))
	if err := roundTrip(t, s, []byte("still here")); err != nil {
		t.Fatalf("another protocol, with %d tunnel streams open: %v", carried, err)
	}
}

// TestWaitsForAStartingWorker: a connection through the tunnel to a
// worker that is not listening yet (its machine still fetching its
// image) waits for it and then goes through, as torch.distributed's
// store client needs: it does not dial again after a reset.
func TestWaitsForAStartingWorker(t *testing.T) {
	a, b := newNode(t, 1, "tcp"), newNode(t, 2, "tcp")
	connect(t, a, b)
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close() // nothing listens there yet
	b.tn.Expose(job, 0, port, []peer.ID{a.h.ID()})
	addr, closer, err := a.tn.Forward(t.Context(), job, 0, b.h.ID())
	if err != nil {
		t.Fatal(err)
	}
	defer closer.Close()
	c := dial(t, addr)
	if _, err := c.Write([]byte("early")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	ln, err = net.Listen("tcp4", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		w, err := ln.Accept()
		if err == nil {
			io.Copy(w, w)
			w.Close()
		}
	}()
	var buf [5]byte
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, buf[:]); err != nil || string(buf[:]) != "early" {
		t.Fatalf("the connection made before the worker listened: %q %v", buf, err)
	}
}
