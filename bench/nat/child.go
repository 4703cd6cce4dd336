package main

import (
	"bufio"
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/protocol/holepunch"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/p2p/tunnel"
)

// The children: each runs one role in its node's network namespace, from
// its start (the parent forks it from a thread inside the namespace) to
// its end, so that every socket libp2p opens, from whatever goroutine, is
// the node's. They read one JSON request a line on stdin and answer each
// with one JSON line on stdout, the first line being their ready message;
// they exit when stdin closes.

const (
	chain = "deepmarket-bench"
	job   = "bench"
)

// request is what the parent asks a child.
type request struct {
	Cmd      string   `json:"cmd"`
	Peer     string   `json:"peer,omitempty"`     // the target host (A)
	Addrs    []string `json:"addrs,omitempty"`    // its full multiaddrs, to dial it directly
	Relay    string   `json:"relay,omitempty"`    // the relay's full multiaddrs, comma-separated
	Peers    string   `json:"peers,omitempty"`    // the other public nodes' (peerList)
	N        int      `json:"n,omitempty"`        // attempts
	Parallel int      `json:"parallel,omitempty"` // attempts at once
	WaitMs   int      `json:"wait_ms,omitempty"`  // bound on one attempt
	Size     int64    `json:"size,omitempty"`     // bytes to send
	Name     string   `json:"name,omitempty"`     // a throughput path
	TCPOnly  bool     `json:"tcp_only,omitempty"` // fresh hosts listen on TCP only
	Streams  bool     `json:"streams,omitempty"`  // the tunnel without its direct path
	Settled  bool     `json:"settled,omitempty"`  // B settles among the public nodes before it dials (settleFor)
	Stock    bool     `json:"stock,omitempty"`    // fresh hosts get libp2p's stock hole punch (NATParams.Stock)
}

// reply is a child's answer; Err is set when the command failed.
type reply struct {
	Err      string           `json:"err,omitempty"`
	ID       string           `json:"id,omitempty"`
	Addrs    []string         `json:"addrs,omitempty"`
	NAT      *p2p.NATStatus   `json:"nat,omitempty"`
	Relayed  float64          `json:"relayed,omitempty"`
	Attempts []attemptResult  `json:"attempts,omitempty"`
	Forward  string           `json:"forward,omitempty"` // the tunnel's loopback end
	Conn     string           `json:"conn,omitempty"`    // the direct connection's remote address
	Tries    int              `json:"tries,omitempty"`
	Seconds  float64          `json:"seconds,omitempty"`
	Stats    *tunnel.JobStats `json:"stats,omitempty"`
	Conns    []string         `json:"conns,omitempty"`  // the host's connections to the peer
	Public   []string         `json:"public,omitempty"` // the public addresses the host advertises
}

// attemptResult is one hole punch attempt, as B saw it; the times run
// from just before B's fresh key and host were made.
type attemptResult struct {
	OK bool `json:"ok"`
	// ToDirectMs: until B held a direct connection to A.
	ToDirectMs float64 `json:"to_direct_ms,omitempty"`
	// RelayMs: until B was connected to the relay; ReadyMs: until B's
	// hole punch service was up (it waits for a public address, which the
	// relay's identify gives); RelayedMs: until B's connection to A
	// through the relay was up.
	RelayMs   float64 `json:"relay_ms,omitempty"`
	ReadyMs   float64 `json:"ready_ms,omitempty"`
	RelayedMs float64 `json:"relayed_ms,omitempty"`
	Conn      string  `json:"conn,omitempty"` // the direct connection's remote address
	Err       string  `json:"err,omitempty"`
	// Advertised: B advertised its NAT's mapping when it dialled (settled
	// attempts only).
	Advertised bool `json:"advertised,omitempty"`
}

// childFlags are the hidden flags of a child.
type childFlags struct {
	role, ip, cidrs, relay, peers string
	tcpOnly, stock                bool
}

func childMain(f childFlags) error {
	var nets []*net.IPNet
	for _, s := range strings.Split(f.cidrs, ",") {
		if s == "" {
			continue
		}
		_, n, err := net.ParseCIDR(s)
		if err != nil {
			return fmt.Errorf("-cidrs: %w", err)
		}
		nets = append(nets, n)
	}
	if err := p2p.TreatAsPublic(nets); err != nil {
		return err
	}
	c := &childIO{enc: json.NewEncoder(os.Stdout), in: bufio.NewScanner(os.Stdin)}
	c.in.Buffer(make([]byte, 64<<10), 1<<20)
	switch f.role {
	case "relay":
		return runRelay(c, f)
	case "serve":
		return runServe(c, f)
	case "dial":
		return runDial(c, f)
	}
	return fmt.Errorf("unknown role %q", f.role)
}

// childIO is a child's end of the control pipe.
type childIO struct {
	enc *json.Encoder
	in  *bufio.Scanner
}

func (c *childIO) send(r reply) { c.enc.Encode(r) }

// serve answers requests with handle until "quit" or the end of stdin.
func (c *childIO) serve(handle func(request) reply) {
	for c.in.Scan() {
		var req request
		if err := json.Unmarshal(c.in.Bytes(), &req); err != nil {
			c.send(reply{Err: "bad request: " + err.Error()})
			continue
		}
		if req.Cmd == "quit" {
			c.send(reply{})
			return
		}
		c.send(handle(req))
	}
}

// listenOn is a host's listen addresses: TCP and QUIC, as a node's
// default, or TCP only.
func listenOn(ip string, port int, tcpOnly bool) []string {
	if tcpOnly {
		return []string{fmt.Sprintf("/ip4/%s/tcp/%d", ip, port)}
	}
	return []string{fmt.Sprintf("/ip4/%s/tcp/%d", ip, port), fmt.Sprintf("/ip4/%s/udp/%d/quic-v1", ip, port)}
}

// runRelay is the public relay: the relay service on from the start, for
// everyone, and its metrics.
func runRelay(c *childIO, f childFlags) error {
	k, err := identity.GenerateKey()
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	h, err := p2p.NewHost(p2p.HostParams{Key: k, Listen: listenOn(f.ip, 0, false), Version: "bench", Moniker: "relay", Registerer: reg,
		NAT: p2p.NATParams{RelayService: p2p.RelayOn, Member: func(peer.ID) bool { return true }}})
	if err != nil {
		return err
	}
	defer h.Close()
	c.send(reply{ID: h.ID().String(), Addrs: p2p.FullAddrs(h)})
	c.serve(func(req request) reply {
		switch req.Cmd {
		case "metrics":
			v, err := relayedBytes(reg)
			if err != nil {
				return reply{Err: err.Error()}
			}
			return reply{Relayed: v}
		case "status":
			st := p2p.NATOf(h)
			return reply{NAT: &st}
		}
		return reply{Err: "unknown command " + req.Cmd}
	})
	return nil
}

// relayedBytes is what the relay service has relayed, both ways, from
// its metrics.
func relayedBytes(g prometheus.Gatherer) (float64, error) {
	mfs, err := g.Gather()
	if err != nil {
		return 0, err
	}
	var sum float64 // 0 until the relay relays its first byte
	for _, mf := range mfs {
		if mf.GetName() != "libp2p_relaysvc_data_transferred_bytes_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue()
		}
	}
	return sum, nil
}

// runServe is A: a host behind a NAT (or, for the baseline, not) with the
// relay as its static relay, and its tunnel Service exposing a sink.
func runServe(c *childIO, f childFlags) error {
	relay, err := parseRelay(f.relay)
	if err != nil {
		return fmt.Errorf("-relay: %w", err)
	}
	k, err := identity.GenerateKey()
	if err != nil {
		return err
	}
	peers, err := peerList(f.peers)
	if err != nil {
		return fmt.Errorf("-peers: %w", err)
	}
	h, err := p2p.NewHost(p2p.HostParams{Key: k, Listen: listenOn(f.ip, 0, f.tcpOnly), Version: "bench", Moniker: "A",
		NAT: p2p.NATParams{Relays: []peer.AddrInfo{*relay}, RelayService: p2p.RelayOff, Stock: f.stock}})
	if err != nil {
		return err
	}
	defer h.Close()
	// The network's other public nodes, as a lab machine's bootstrap
	// list gives them.
	if err := connectAll(context.Background(), h, peers); err != nil {
		return err
	}
	sink, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer sink.Close()
	go serveSink(sink)
	tn := tunnel.New(h, chain, nil)
	defer tn.Close()
	port := sink.Addr().(*net.TCPAddr).Port
	var allowed []peer.ID
	unexpose := tn.Expose(job, 0, port, allowed)
	c.send(reply{ID: h.ID().String(), Addrs: p2p.FullAddrs(h)})
	c.serve(func(req request) reply {
		switch req.Cmd {
		case "status":
			st := p2p.NATOf(h)
			return reply{NAT: &st, Public: publicAddrs(h)}
		case "allow":
			p, err := peer.Decode(req.Peer)
			if err != nil {
				return reply{Err: err.Error()}
			}
			allowed = append(allowed, p)
			// Exposing the worker again replaces its peers; the old
			// Expose is then withdrawn (it carries nothing yet).
			next := tn.Expose(job, 0, port, allowed)
			unexpose()
			unexpose = next
			return reply{}
		case "stats":
			st := tn.Stats().Jobs[job]
			return reply{Stats: &st}
		}
		return reply{Err: "unknown command " + req.Cmd}
	})
	unexpose()
	return nil
}

// serveSink reads each connection to EOF and answers with the count,
// little-endian, as bench/tunnel's sink does.
func serveSink(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			buf := make([]byte, 256<<10)
			var n uint64
			for {
				k, err := c.Read(buf)
				n += uint64(k)
				if err != nil {
					break
				}
			}
			c.Write(binary.LittleEndian.AppendUint64(nil, n))
			c.(*net.TCPConn).CloseWrite()
		}()
	}
}

// dialer is B: fresh hosts for the hole punch attempts, and a host with
// a tunnel forwarder for each throughput path.
type dialer struct {
	ip    string
	paths map[string]*tputPath
}

// tputPath is one throughput path's host and forwarder.
type tputPath struct {
	h       host.Host
	tn      *tunnel.Service
	fwd     string
	closeFw io.Closer
	target  peer.ID
}

func runDial(c *childIO, f childFlags) error {
	d := &dialer{ip: f.ip, paths: map[string]*tputPath{}}
	defer func() {
		for _, p := range d.paths {
			p.close()
		}
	}()
	c.send(reply{})
	c.serve(func(req request) reply {
		switch req.Cmd {
		case "attempts":
			return d.attempts(req)
		case "tput-open":
			return d.openThroughput(req)
		case "tput-send":
			return d.send(req)
		case "tput-stats":
			return d.stats(req)
		}
		return reply{Err: "unknown command " + req.Cmd}
	})
	return nil
}

// parseRelay reads the relay's full multiaddrs, comma-separated.
func parseRelay(s string) (*peer.AddrInfo, error) {
	ais, err := p2p.AddrInfos(strings.Split(s, ","))
	if err != nil {
		return nil, err
	}
	if len(ais) != 1 {
		return nil, fmt.Errorf("%d relays in %q, want one", len(ais), s)
	}
	return &ais[0], nil
}

// peerList reads public nodes' full multiaddrs: ";" between nodes, ","
// between one node's addresses.
func peerList(s string) ([]peer.AddrInfo, error) {
	var out []peer.AddrInfo
	for _, node := range strings.Split(s, ";") {
		if node == "" {
			continue
		}
		ais, err := p2p.AddrInfos(strings.Split(node, ","))
		if err != nil {
			return nil, err
		}
		out = append(out, ais...)
	}
	return out, nil
}

// connectAll connects h to every peer at once.
func connectAll(ctx context.Context, h host.Host, peers []peer.AddrInfo) error {
	errs := make(chan error, len(peers))
	for _, p := range peers {
		go func() { errs <- h.Connect(ctx, p) }()
	}
	var first error
	for range peers {
		if err := <-errs; err != nil && first == nil {
			first = fmt.Errorf("connect to a public node: %w", err)
		}
	}
	return first
}

// publicAddrs is what h advertises of its public addresses (relay
// addresses left out).
func publicAddrs(h host.Host) []string {
	var out []string
	for _, a := range h.Addrs() {
		if manet.IsPublicAddr(a) && !isCircuit(a) {
			out = append(out, a.String())
		}
	}
	return out
}

func isCircuit(a ma.Multiaddr) bool {
	_, err := a.ValueForProtocol(ma.P_CIRCUIT)
	return err == nil
}

// circuitInfo is target's AddrInfo through the relay: every relay
// address with /p2p/RELAY/p2p-circuit.
func circuitInfo(relay *peer.AddrInfo, target peer.ID) (peer.AddrInfo, error) {
	suffix, err := ma.NewMultiaddr("/p2p/" + relay.ID.String() + "/p2p-circuit")
	if err != nil {
		return peer.AddrInfo{}, err
	}
	ai := peer.AddrInfo{ID: target}
	for _, a := range relay.Addrs {
		ai.Addrs = append(ai.Addrs, a.Encapsulate(suffix))
	}
	return ai, nil
}

// attempts runs req.N attempts, req.Parallel at a time.
func (d *dialer) attempts(req request) reply {
	relay, err := parseRelay(req.Relay)
	if err != nil {
		return reply{Err: err.Error()}
	}
	target, err := peer.Decode(req.Peer)
	if err != nil {
		return reply{Err: err.Error()}
	}
	peers, err := peerList(req.Peers)
	if err != nil {
		return reply{Err: err.Error()}
	}
	n, par := max(req.N, 1), max(req.Parallel, 1)
	out := make([]attemptResult, n)
	sem := make(chan struct{}, par)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = d.attempt(relay, peers, target, time.Duration(req.WaitMs)*time.Millisecond, req)
			<-sem
		}()
	}
	wg.Wait()
	return reply{Attempts: out}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }

// attempt is one hole punch: a fresh host connects to the relay and the
// other public nodes (peers), dials A through the relay and waits, up to
// wait from its start, for a direct connection to A.
func (d *dialer) attempt(relay *peer.AddrInfo, peers []peer.AddrInfo, target peer.ID, wait time.Duration, req request) (r attemptResult) {
	settled := req.Settled
	start := time.Now()
	if settled {
		wait += settleFor
	}
	ctx, cancel := context.WithDeadline(context.Background(), start.Add(wait))
	defer cancel()
	h, err := freshHost(d.ip, req.TCPOnly, req.Stock)
	if err != nil {
		r.Err = "host: " + err.Error()
		return r
	}
	defer h.Close()
	if err := punchTo(ctx, h, relay, peers, target, start, settled, &r); err != nil {
		r.Err = err.Error()
		return r
	}
	r.OK = true
	return r
}

func freshHost(ip string, tcpOnly, stock bool) (host.Host, error) {
	k, err := identity.GenerateKey()
	if err != nil {
		return nil, err
	}
	return p2p.NewHost(p2p.HostParams{Key: k, Listen: listenOn(ip, 0, tcpOnly), Version: "bench", Moniker: "B",
		NAT: p2p.NATParams{RelayService: p2p.RelayOff, Stock: stock}})
}

// settleFor is how long a settled B stays among the public nodes before
// it dials: longer than libp2p took to activate its observed address with
// four observers (about 5 s).
const settleFor = 6 * time.Second

// punchTo connects h to the relay and the other public nodes (peers),
// waits for h's hole punch service (and, settled, until h advertises its
// public address, as a node that has run a while among enough observers
// does), dials target through the relay and waits for a direct
// connection to it, filling r's times (from start) on the way.
func punchTo(ctx context.Context, h host.Host, relay *peer.AddrInfo, peers []peer.AddrInfo, target peer.ID, start time.Time, settled bool, r *attemptResult) error {
	if err := connectAll(ctx, h, append([]peer.AddrInfo{*relay}, peers...)); err != nil {
		return err
	}
	r.RelayMs = ms(time.Since(start))
	// libp2p's hole punch service answers DCUtR only once the host has a
	// public address (here the one the relay observed): before that, A's
	// DCUtR stream would find no handler, and A does not try again.
	for !slices.Contains(h.Mux().Protocols(), holepunch.Protocol) {
		if err := sleep(ctx, 5*time.Millisecond); err != nil {
			return errors.New("no hole punch service: the relay observed no public address")
		}
	}
	if settled {
		if err := sleep(ctx, settleFor); err != nil {
			return err
		}
		r.Advertised = len(publicAddrs(h)) > 0
	}
	r.ReadyMs = ms(time.Since(start))
	ai, err := circuitInfo(relay, target)
	if err != nil {
		return err
	}
	if err := h.Connect(network.WithAllowLimitedConn(ctx, "bench-nat"), ai); err != nil {
		return fmt.Errorf("connect through the relay: %w", err)
	}
	r.RelayedMs = ms(time.Since(start))
	for !p2p.Direct(h, target) {
		if err := sleep(ctx, 2*time.Millisecond); err != nil {
			return errors.New("no direct connection in time")
		}
	}
	r.ToDirectMs = ms(time.Since(start))
	r.Conn = directConn(h, target)
	return nil
}

// directConn is the remote address of h's first direct connection to p.
func directConn(h host.Host, p peer.ID) string {
	for _, c := range h.Network().ConnsToPeer(p) {
		if !p2p.Relayed(c) {
			return c.RemoteMultiaddr().String()
		}
	}
	return ""
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// openThroughput starts path req.Name: a fresh host and its forwarder to
// A's sink, through the relay and a hole punch (req.Relay set), else
// directly to req.Addrs. A hole punch that fails is tried again with a
// fresh host, up to three times.
func (d *dialer) openThroughput(req request) reply {
	if p := d.paths[req.Name]; p != nil {
		p.close()
		delete(d.paths, req.Name)
	}
	target, err := peer.Decode(req.Peer)
	if err != nil {
		return reply{Err: err.Error()}
	}
	var tries int
	var h host.Host
	for tries = 1; tries <= 3; tries++ {
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(req.WaitMs)*time.Millisecond)
		h, err = freshHost(d.ip, req.TCPOnly, false)
		if err != nil {
			cancel()
			return reply{Err: err.Error()}
		}
		if req.Relay != "" {
			var relay *peer.AddrInfo
			if relay, err = parseRelay(req.Relay); err == nil {
				var r attemptResult
				err = punchTo(ctx, h, relay, nil, target, start, false, &r)
			}
		} else {
			var ais []peer.AddrInfo
			if ais, err = p2p.AddrInfos(req.Addrs); err == nil {
				if len(ais) != 1 || ais[0].ID != target {
					err = fmt.Errorf("addresses %v are not all %s's", req.Addrs, target)
				} else {
					err = h.Connect(ctx, ais[0])
				}
			}
			if err == nil && !p2p.Direct(h, target) {
				err = errors.New("the connection is not direct")
			}
		}
		cancel()
		if err == nil {
			break
		}
		h.Close()
		h = nil
	}
	if h == nil {
		return reply{Err: fmt.Sprintf("after %d tries: %v", tries-1, err)}
	}
	p := &tputPath{h: h, target: target}
	p.tn = tunnel.New(h, chain, nil, tunnel.WithDirect(!req.Streams))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p.fwd, p.closeFw, err = p.tn.ForwardPort(ctx, 0, job, 0, target)
	if err != nil {
		p.close()
		return reply{Err: err.Error()}
	}
	d.paths[req.Name] = p
	return reply{ID: h.ID().String(), Forward: p.fwd, Conn: directConn(h, target), Tries: tries}
}

func (p *tputPath) close() {
	if p.closeFw != nil {
		p.closeFw.Close()
	}
	p.tn.Close()
	p.h.Close()
}

// payload is what the sender writes, over and over.
var payload = func() []byte {
	b := make([]byte, 1<<20)
	crand.Read(b)
	return b
}()

// send writes req.Size bytes through path req.Name's forwarder to A's
// sink and times it from the dial to the sink's answer.
func (d *dialer) send(req request) reply {
	p := d.paths[req.Name]
	if p == nil {
		return reply{Err: "no path " + req.Name}
	}
	start := time.Now()
	c, err := net.Dial("tcp4", p.fwd)
	if err != nil {
		return reply{Err: err.Error()}
	}
	defer c.Close()
	c.SetDeadline(start.Add(time.Duration(req.WaitMs) * time.Millisecond))
	for left := req.Size; left > 0; {
		k := min(left, int64(len(payload)))
		if _, err := c.Write(payload[:k]); err != nil {
			return reply{Err: "write: " + err.Error()}
		}
		left -= k
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return reply{Err: err.Error()}
	}
	var ack [8]byte
	if _, err := io.ReadFull(c, ack[:]); err != nil {
		return reply{Err: "the sink's answer: " + err.Error()}
	}
	secs := time.Since(start).Seconds()
	if got := int64(binary.LittleEndian.Uint64(ack[:])); got != req.Size {
		return reply{Err: fmt.Sprintf("the sink read %d bytes, want %d", got, req.Size)}
	}
	return reply{Seconds: secs}
}

// stats is path req.Name's forwarder counters and its host's connections
// to A.
func (d *dialer) stats(req request) reply {
	p := d.paths[req.Name]
	if p == nil {
		return reply{Err: "no path " + req.Name}
	}
	st := p.tn.Stats().Jobs[job]
	r := reply{Stats: &st}
	for _, c := range p.h.Network().ConnsToPeer(p.target) {
		kind := "direct"
		if p2p.Relayed(c) {
			kind = "relayed"
		}
		r.Conns = append(r.Conns, kind+" "+c.RemoteMultiaddr().String())
	}
	return r
}
