package tunnel

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/p2p/net/swarm"
	libp2ptls "github.com/libp2p/go-libp2p/p2p/security/tls"
)

// ServiceName is the resource manager service that tunnel streams, and
// direct connections as if they were streams, are accounted to, so that a
// job's many connections are held to the service's limits instead of
// crowding out other protocols.
const ServiceName = "deepmarket-tunnel"

// DefaultBufferSize is the copy buffer per direction of a connection
// carried by a stream. Larger buffers measured no faster on that path
// (bench/tunnel: 32 KiB to 256 KiB are within noise), and each connection
// reserves both of its buffers from the resource manager, whose default
// limit per protocol and peer is 16 MiB. The direct path sizes its own
// buffers in frames (see directFrames).
const DefaultBufferSize = 64 << 10

const (
	// headerTimeout bounds reading the header of an incoming stream.
	headerTimeout = 10 * time.Second
	// setupTimeout bounds opening a stream to the worker's machine, and that
	// machine's dial to the worker.
	setupTimeout = 10 * time.Second
)

// ErrClosed is returned by Forward once the Service is closed.
var ErrClosed = errors.New("tunnel service closed")

// Protocol is the tunnel's stream protocol on the network chainID.
func Protocol(chainID string) protocol.ID {
	return protocol.ID("/deepmarket/" + chainID + "/tunnel/1")
}

// Option adjusts a Service.
type Option func(*Service)

// WithBufferSize sets the copy buffer per direction of each connection
// carried by a stream (default DefaultBufferSize). Each such connection
// reserves twice this much memory from the resource manager.
func WithBufferSize(n int) Option {
	return func(s *Service) {
		if n > 0 {
			s.bufSize = n
		}
	}
}

// Service carries tunnelled connections in both roles: it serves direct
// connections and streams for workers this machine Exposes, and Forwards
// loopback ports to workers on other machines. Its methods are safe for
// concurrent use.
type Service struct {
	h       host.Host
	proto   protocol.ID
	log     *slog.Logger
	bufSize int
	bufs    sync.Pool

	// The direct path (direct.go); tlsID is nil while it is off.
	direct     bool
	directAddr string
	dproto     protocol.ID
	pproto     protocol.ID // PunchProtocol (punch.go)
	tlsID      *libp2ptls.Identity
	directLn   *net.TCPListener // nil: no direct listener
	handshakes chan struct{}    // direct connections being authenticated
	frameBufs  framePools       // direct links' buffers
	dialDirect dialer
	bg         sync.WaitGroup // the direct listener's accept loop, the reachability follower
	private    atomic.Bool    // AutoNAT found this host behind a NAT
	natTest    atomic.Bool    // tests: behind a NAT, whatever AutoNAT says and whoever asks

	// ctx ends with Close: it cuts short stream opens, direct handshakes,
	// local dials and header reads.
	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	closed   bool
	exposed  map[workerKey]*exposure // what new streams may reach
	exposes  map[*exposure]struct{}  // every Expose in place, replaced or not
	forwards map[*forwarder]struct{}
	jobs     map[string]*jobCounters
	tags     uint64 // numbers connection manager tags

	live     atomic.Int64
	refused  atomic.Uint64
	handlers sync.WaitGroup // inbound streams and direct connections being handled
}

// New registers the tunnel's stream handlers on h, opens the direct
// listener (see WithDirect) and returns the Service; log may be nil.
func New(h host.Host, chainID string, log *slog.Logger, opts ...Option) *Service {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Service{
		h: h, proto: Protocol(chainID), log: log.With("module", "tunnel"), bufSize: DefaultBufferSize,
		ctx: ctx, cancel: cancel,
		direct: true, dproto: DirectProtocol(chainID), pproto: PunchProtocol(chainID), handshakes: make(chan struct{}, maxHandshakes), dialDirect: dialTCP,
		exposed: map[workerKey]*exposure{}, exposes: map[*exposure]struct{}{},
		forwards: map[*forwarder]struct{}{}, jobs: map[string]*jobCounters{},
	}
	for _, o := range opts {
		o(s)
	}
	s.bufs.New = func() any {
		b := make([]byte, s.bufSize)
		return &b
	}
	h.SetStreamHandler(s.proto, s.handle)
	if s.direct {
		s.startDirect()
	}
	return s
}

// Close removes the stream handler, closes every forwarder and cuts every
// tunnelled connection, and returns once all of the Service's goroutines
// have ended. Unexpose funcs and forwarders' closers may still be called
// afterwards; they do nothing more.
func (s *Service) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	exps := make([]*exposure, 0, len(s.exposes))
	for e := range s.exposes {
		exps = append(exps, e)
	}
	fwds := make([]*forwarder, 0, len(s.forwards))
	for f := range s.forwards {
		fwds = append(fwds, f)
	}
	s.mu.Unlock()

	s.h.RemoveStreamHandler(s.proto)
	if s.directLn != nil {
		s.h.RemoveStreamHandler(s.dproto)
		s.h.RemoveStreamHandler(s.pproto)
		s.directLn.Close()
	}
	s.cancel()
	for _, e := range exps {
		e.links.close()
		for p := range e.allowed {
			s.h.ConnManager().Unprotect(p, e.tag)
		}
	}
	for _, f := range fwds {
		f.Close()
	}
	s.handlers.Wait()
	s.bg.Wait()
}

// Stats is a snapshot of what a Service carries.
type Stats struct {
	Live    int                 // tunnelled connections open now, both roles
	Refused uint64              // incoming streams and direct connections refused since New
	Jobs    map[string]JobStats // jobs with an Expose or a Forward in place
}

// JobStats counts one job's tunnelled connections on this machine.
type JobStats struct {
	Sent     uint64 // bytes read from local connections and carried to peers
	Received uint64 // bytes carried from peers and written to local connections
	Conns    uint64 // connections carried since the job's first Expose or Forward
	Direct   uint64 // of Conns, those carried by direct connections
	Live     int    // connections open now
}

// Stats returns the counters. A job's counters last while it has an
// Expose or a Forward in place.
func (s *Service) Stats() Stats {
	st := Stats{Live: int(s.live.Load()), Refused: s.refused.Load(), Jobs: map[string]JobStats{}}
	s.mu.Lock()
	defer s.mu.Unlock()
	for job, c := range s.jobs {
		st.Jobs[job] = JobStats{Sent: c.sent.Load(), Received: c.received.Load(), Conns: c.conns.Load(), Direct: c.direct.Load(), Live: int(c.live.Load())}
	}
	return st
}

type jobCounters struct {
	refs                          int // Exposes and Forwards in place; under Service.mu
	sent, received, conns, direct atomic.Uint64
	live                          atomic.Int64
}

func (s *Service) acquireJobLocked(job string) *jobCounters {
	c := s.jobs[job]
	if c == nil {
		c = &jobCounters{}
		s.jobs[job] = c
	}
	c.refs++
	return c
}

func (s *Service) releaseJobLocked(job string) {
	if c := s.jobs[job]; c != nil {
		if c.refs--; c.refs <= 0 {
			delete(s.jobs, job)
		}
	}
}

func (s *Service) newTagLocked() string {
	s.tags++
	return ServiceName + "-" + strconv.FormatUint(s.tags, 10)
}

type workerKey struct {
	job   string
	index int
}

// exposure is one worker this machine serves, and its connections.
type exposure struct {
	key     workerKey
	port    int
	ns      Namespace // nil: this host's loopback
	allowed map[peer.ID]struct{}
	tag     string
	stats   *jobCounters
	links   linkSet
}

// Expose lets the peers in allowed (the job's other machines) reach worker
// index of job, listening on 127.0.0.1:port on this machine. Every other
// peer, and every (job, index) not exposed, is refused. Exposing the same
// worker again replaces its port and peers for new connections. The
// returned func withdraws this Expose and cuts its open connections; it
// may be called more than once.
//
// The allowed peers' connections are protected from the connection
// manager's trimming while the worker is exposed.
func (s *Service) Expose(job string, index int, port int, allowed []peer.ID) (unexpose func()) {
	return s.ExposeIn(nil, job, index, port, allowed)
}

// Namespace is where a job's workers listen: a network namespace of their
// own, whose loopback the node reaches through it.
type Namespace interface {
	ListenTCP(port int) (*net.TCPListener, error)
	DialTCP(ctx context.Context, port int) (*net.TCPConn, error)
}

// ExposeIn is Expose for a worker listening on port of ns's loopback (nil:
// this host's).
func (s *Service) ExposeIn(ns Namespace, job string, index int, port int, allowed []peer.ID) (unexpose func()) {
	if err := (header{Job: job, Index: index}).validate(); err != nil || port <= 0 || port > 65535 {
		s.log.Error("worker not exposed: bad arguments", "job", job, "index", index, "port", port, "err", err)
		return func() {}
	}
	e := &exposure{key: workerKey{job, index}, port: port, ns: ns, allowed: make(map[peer.ID]struct{}, len(allowed))}
	for _, p := range allowed {
		e.allowed[p] = struct{}{}
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return func() {}
	}
	s.exposed[e.key] = e
	s.exposes[e] = struct{}{}
	e.stats = s.acquireJobLocked(job)
	e.tag = s.newTagLocked()
	for p := range e.allowed {
		s.h.ConnManager().Protect(p, e.tag)
	}
	s.mu.Unlock()
	s.log.Debug("worker exposed", "job", job, "index", index, "port", port, "peers", len(e.allowed))
	return sync.OnceFunc(func() {
		s.mu.Lock()
		if s.exposed[e.key] == e {
			delete(s.exposed, e.key)
		}
		delete(s.exposes, e)
		s.releaseJobLocked(job)
		s.mu.Unlock()
		e.links.close()
		for p := range e.allowed {
			s.h.ConnManager().Unprotect(p, e.tag)
		}
	})
}

// lookup returns the exposure a stream from p for h may use, or nil.
func (s *Service) lookup(h header, p peer.ID) *exposure {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.exposed[workerKey{h.Job, h.Index}]
	if e == nil {
		return nil
	}
	if _, ok := e.allowed[p]; !ok {
		return nil
	}
	return e
}

// allowsAny says whether some worker this machine exposes lets p reach it.
func (s *Service) allowsAny(p peer.ID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.exposed {
		if _, ok := e.allowed[p]; ok {
			return true
		}
	}
	return false
}

// handle serves one incoming stream: header, checks, dial, then the pipe.
func (s *Service) handle(st network.Stream) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		st.Reset()
		return
	}
	s.handlers.Add(1)
	s.mu.Unlock()
	defer s.handlers.Done()

	from := st.Conn().RemotePeer()
	refuse := func(reason string, args ...any) {
		s.refused.Add(1)
		s.log.Debug("tunnel refused", append([]any{"from", from, "reason", reason}, args...)...)
		st.Reset()
	}
	if err := s.reserve(st); err != nil {
		refuse("resource limit", "err", err)
		return
	}
	// Until the pipe starts, Close must not wait for a slow peer.
	stop := context.AfterFunc(s.ctx, func() { st.Reset() })
	st.SetReadDeadline(time.Now().Add(headerTimeout))
	h, err := readHeader(st)
	if err != nil {
		stop()
		refuse("bad header", "err", err)
		return
	}
	st.SetReadDeadline(time.Time{})
	e := s.lookup(h, from)
	if e == nil {
		stop()
		refuse("worker not exposed to this peer", "job", h.Job, "index", h.Index)
		return
	}
	ctx, cancel := context.WithTimeout(s.ctx, workerStartWait)
	c, err := s.dialStarting(ctx, e)
	cancel()
	stop()
	if err != nil {
		s.log.Debug("worker unreachable", "job", h.Job, "index", h.Index, "err", err)
		st.Reset()
		return
	}
	s.carry(&link{tc: c, far: streamEnd{st: st, bufs: &s.bufs}}, &e.links, e.stats)
}

// workerStartWait is how long a stream waits for its worker to listen:
// the workers of a run start on their machines when each has fetched
// their inputs and image, so one may dial another that has yet to.
// TensorFlow's gRPC dials again after a reset, but torch.distributed's
// store client does not: to it the tunnel's listener has accepted.
const workerStartWait = 2 * time.Minute

// dialStarting dials e's worker, again every workerRedial while nothing
// listens on its port yet (and it is still exposed), until ctx ends.
func (s *Service) dialStarting(ctx context.Context, e *exposure) (*net.TCPConn, error) {
	for {
		c, err := s.dialWorker(ctx, e)
		if err == nil || !errors.Is(err, syscall.ECONNREFUSED) || !s.isExposed(e) {
			return c, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(workerRedial):
		}
	}
}

const workerRedial = 200 * time.Millisecond

// isExposed says whether e is still exposed.
func (s *Service) isExposed(e *exposure) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.exposes[e]
	return ok
}

// dialWorker connects to e's worker on its loopback.
func (s *Service) dialWorker(ctx context.Context, e *exposure) (*net.TCPConn, error) {
	if e.ns != nil {
		return e.ns.DialTCP(ctx, e.port)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(e.port)))
	if err != nil {
		return nil, err
	}
	return c.(*net.TCPConn), nil
}

// reserve accounts a stream to the tunnel service and reserves its copy
// buffers.
func (s *Service) reserve(st network.Stream) error {
	if err := st.Scope().SetService(ServiceName); err != nil {
		return fmt.Errorf("set service: %w", err)
	}
	if err := st.Scope().ReserveMemory(2*s.bufSize, network.ReservationPriorityHigh); err != nil {
		return fmt.Errorf("reserve buffers: %w", err)
	}
	return nil
}

// forwarder is one loopback listener carrying connections to one remote
// worker.
type forwarder struct {
	s      *Service
	ln     *net.TCPListener
	peer   peer.ID
	job    string
	header []byte
	tag    string
	stats  *jobCounters
	links  linkSet
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once

	// The direct path's state (direct.go). dmu is never held across a
	// network round trip.
	dmu           sync.Mutex
	directPort    int         // the peer's direct listener; 0: not known
	punch         bool        // the peer is behind a NAT: each connection punches (punch.go)
	lastDirect    string      // the address of the last direct connection made; "": none since the last failure
	noDirectUntil time.Time   // streams only until then
	finding       *directFind // the lookup of the direct listener under way, or nil
}

// connectTries and connectPause bound how a forwarder's first connection
// to its peer is retried: a job's machines start their workers at about
// the same moment, on machines that may be busy, and one failed dial
// (which also puts the peer in libp2p's dial backoff) must not fail the
// worker.
const (
	connectTries = 3
	connectPause = 750 * time.Millisecond
)

// connect connects s's host to p, within ctx, trying again after a pause
// with the peer's dial backoff cleared.
func (s *Service) connect(ctx context.Context, p peer.ID) error {
	var err error
	for try := range connectTries {
		if try > 0 {
			select {
			case <-ctx.Done():
				return err
			case <-time.After(time.Duration(try) * connectPause):
			}
			if b, ok := s.h.Network().(interface{ Backoff() *swarm.DialBackoff }); ok {
				b.Backoff().Clear(p)
			}
		}
		if err = s.h.Connect(ctx, peer.AddrInfo{ID: p}); err == nil {
			return nil
		}
	}
	return err
}

// Forward opens a listener on 127.0.0.1 at a port the system picks, whose
// connections are carried to worker index of job on peer p, and returns
// its address. ctx bounds only connecting to p, which must be in the
// peerstore or reachable through routing. Closing the returned Closer
// closes the listener and cuts its open connections.
func (s *Service) Forward(ctx context.Context, job string, index int, p peer.ID) (addr string, closer io.Closer, err error) {
	return s.ForwardPort(ctx, 0, job, index, p)
}

// ForwardPort is Forward on 127.0.0.1:port (0 lets the system pick).
func (s *Service) ForwardPort(ctx context.Context, port int, job string, index int, p peer.ID) (addr string, closer io.Closer, err error) {
	return s.ForwardIn(ctx, nil, port, job, index, p)
}

// ForwardIn is ForwardPort listening on ns's loopback (nil: this host's).
func (s *Service) ForwardIn(ctx context.Context, ns Namespace, port int, job string, index int, p peer.ID) (addr string, closer io.Closer, err error) {
	hdr, err := header{Job: job, Index: index}.marshal()
	if err != nil {
		return "", nil, fmt.Errorf("forward: %w", err)
	}
	if port < 0 || port > 65535 {
		return "", nil, fmt.Errorf("forward: port %d out of range", port)
	}
	if p == s.h.ID() {
		return "", nil, fmt.Errorf("forward to worker %d of job %s: it is on this machine, use its own port", index, job)
	}
	if err := s.connect(ctx, p); err != nil {
		return "", nil, fmt.Errorf("forward: connect to %s: %w", p, err)
	}
	// Loopback only, always: the other end runs anything it is sent.
	var ln *net.TCPListener
	if ns != nil {
		ln, err = ns.ListenTCP(port)
	} else {
		ln, err = net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
	}
	if err != nil {
		return "", nil, fmt.Errorf("forward: %w", err)
	}
	f := &forwarder{s: s, ln: ln, peer: p, job: job, header: hdr}
	f.ctx, f.cancel = context.WithCancel(s.ctx)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		f.cancel()
		ln.Close()
		return "", nil, ErrClosed
	}
	s.forwards[f] = struct{}{}
	f.stats = s.acquireJobLocked(job)
	f.tag = s.newTagLocked()
	s.h.ConnManager().Protect(p, f.tag)
	s.mu.Unlock()
	f.wg.Add(1)
	go f.serve()
	return ln.Addr().String(), f, nil
}

// Close closes the listener, cuts its connections and waits for them.
func (f *forwarder) Close() error {
	f.once.Do(func() {
		f.cancel()
		f.ln.Close()
		f.links.close()
		f.wg.Wait()
		f.s.mu.Lock()
		delete(f.s.forwards, f)
		f.s.releaseJobLocked(f.job)
		f.s.mu.Unlock()
		f.s.h.ConnManager().Unprotect(f.peer, f.tag)
	})
	return nil
}

func (f *forwarder) serve() {
	defer f.wg.Done()
	for {
		c, err := f.ln.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors, say: back off instead of spinning.
			f.s.log.Warn("forwarder accept", "err", err)
			select {
			case <-f.ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		f.wg.Add(1)
		go f.open(c)
	}
}

// open carries one accepted connection to the remote worker.
func (f *forwarder) open(c *net.TCPConn) {
	defer f.wg.Done()
	ctx, cancel := context.WithTimeout(f.ctx, setupTimeout)
	far, err := f.connect(ctx)
	cancel()
	if err != nil {
		f.s.log.Debug("tunnel open failed", "peer", f.peer, "job", f.job, "err", err)
		c.SetLinger(0)
		c.Close()
		return
	}
	f.s.carry(&link{tc: c, far: far}, &f.links, f.stats)
}

// connect opens the far end of one connection to the remote worker: a
// direct connection where it can, else a stream.
func (f *forwarder) connect(ctx context.Context) (farEnd, error) {
	d, err := f.openDirect(ctx)
	switch {
	case err == nil:
		return d, nil
	case !errors.Is(err, errNoDirect):
		return nil, err
	}
	st, err := f.s.h.NewStream(ctx, f.peer, f.s.proto)
	if err != nil {
		return nil, err
	}
	if err = f.s.reserve(st); err == nil {
		_, err = st.Write(f.header)
	}
	if err != nil {
		st.Reset()
		return nil, err
	}
	return streamEnd{st: st, bufs: &f.s.bufs}, nil
}
