package tunnel

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
)

// The direct path through a NAT. A machine behind a NAT answers
// DirectProtocol with no port: its NAT forwards nothing to its listener.
// When the two nodes' libp2p connection is direct (hole punched), the
// forwarder asks for a punched connection instead (PunchProtocol), once
// per tunnelled connection:
//
//  1. it picks a fresh local port and sends it (two bytes, big-endian);
//  2. the receiver picks a fresh port of its own and answers it (0: no);
//  3. both connect from their port to the other's public address at the
//     other's port, again and again for up to punchWindow, until a SYN of
//     each has crossed: a TCP simultaneous open, through two NATs that
//     keep a flow's source port (endpoint-independent mapping, as Linux's
//     masquerade does), whose filters let the other's SYN in once their
//     own has gone out.
//
// The forwarder then runs the TLS handshake as client and the receiver as
// server (handleDirect), whatever TCP made of the open: the connection is
// the direct path's from there on. A NAT that picks a new port per flow
// (symmetric) defeats it; the forwarder then uses streams of the libp2p
// connection for directRetry, as before. The public addresses are those of
// the nodes' hole-punched libp2p connection; the ports are the NATs'
// mappings of the fresh ports, when they keep them.

// PunchProtocol is the stream protocol of the punched direct path.
func PunchProtocol(chainID string) protocol.ID {
	return protocol.ID("/deepmarket/" + chainID + "/tunnel-punch/1")
}

// punchWindow bounds one punch: both sides connect until then.
// punchPause is the pause between two connects of one side (a NAT that
// answers a SYN it has no mapping for with a reset fails a connect at
// once).
const (
	punchWindow = 3 * time.Second
	punchPause  = 20 * time.Millisecond
)

// punchTarget is the direct target of a forwarder whose peer is behind a
// NAT: each connection punches (punchDial) rather than dials an address.
const punchTarget = "punch"

// errNoPort is a DirectProtocol answer of no port.
var errNoPort = errors.New("no direct port")

// handlePunch answers PunchProtocol on a machine behind a NAT: it binds a
// fresh port, answers it and connects from it to the asker's port until
// the connection is made or punchWindow passes, then serves it as an
// incoming direct connection. A machine not behind a NAT, a relayed
// asker, a peer no exposed worker allows (a stranger must not hold the
// direct path's handshake slots and ports for 3 s each), or one more
// punch than maxHandshakes at once gets port 0.
func (s *Service) handlePunch(st network.Stream) {
	if !s.enterHandler() {
		st.Reset()
		return
	}
	defer s.handlers.Done()
	st.SetDeadline(time.Now().Add(headerTimeout))
	var b [2]byte
	if _, err := io.ReadFull(st, b[:]); err != nil {
		st.Reset()
		return
	}
	theirs := int(binary.BigEndian.Uint16(b[:]))
	ip := directIP([]network.Conn{st.Conn()})
	var ln *net.TCPListener
	ours := 0
	if theirs != 0 && ip != nil && s.behindNAT() && s.allowsAny(st.Conn().RemotePeer()) {
		select {
		case s.handshakes <- struct{}{}: // released by handleDirect, or below
			var err error
			if ln, err = listenReuse(s.localIP()); err != nil {
				<-s.handshakes
			} else {
				ours = ln.Addr().(*net.TCPAddr).Port
			}
		default:
		}
	}
	binary.BigEndian.PutUint16(b[:], uint16(ours))
	if _, err := st.Write(b[:]); err != nil || ours == 0 {
		if ln != nil {
			ln.Close()
			<-s.handshakes
		}
		if err != nil {
			st.Reset()
		} else {
			st.Close() // the answer, no: delivered
		}
		return
	}
	st.Close()
	ctx, cancel := context.WithTimeout(s.ctx, punchWindow)
	c, err := openOrAccept(ctx, ln, s.localIP(), ours, net.JoinHostPort(ip.String(), strconv.Itoa(theirs)))
	cancel()
	if err != nil {
		<-s.handshakes
		s.log.Debug("punched direct connection", "from", st.Conn().RemotePeer(), "err", err)
		return
	}
	if !s.enterHandler() {
		<-s.handshakes
		c.Close()
		return
	}
	go s.handleDirect(c)
}

// punchDial opens a punched direct connection to p at ip (its public
// address), within ctx: it sends a fresh port, reads p's and connects.
func (s *Service) punchDial(ctx context.Context, p peer.ID, ip net.IP) (*net.TCPConn, error) {
	ours, err := freePort(s.localIP())
	if err != nil {
		return nil, err
	}
	st, err := s.h.NewStream(network.WithNoDial(ctx, "punch"), p, s.pproto)
	if err != nil {
		return nil, fmt.Errorf("ask for a punch: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { st.Reset() })
	defer stop()
	st.SetDeadline(time.Now().Add(setupTimeout))
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], uint16(ours))
	if _, err := st.Write(b[:]); err != nil {
		st.Reset()
		return nil, fmt.Errorf("ask for a punch: %w", err)
	}
	if _, err := io.ReadFull(st, b[:]); err != nil {
		st.Reset()
		return nil, fmt.Errorf("read the punch's port: %w", err)
	}
	st.Close()
	theirs := int(binary.BigEndian.Uint16(b[:]))
	if theirs == 0 {
		return nil, errors.New("the peer punches no direct connection")
	}
	pctx, cancel := context.WithTimeout(ctx, punchWindow)
	defer cancel()
	return simultaneousOpen(pctx, s.localIP(), ours, net.JoinHostPort(ip.String(), strconv.Itoa(theirs)))
}

// localIP is the direct listener's IP address: punched connections leave
// from it, as direct ones arrive at it.
func (s *Service) localIP() net.IP {
	if s.directLn == nil {
		return nil
	}
	return s.directLn.Addr().(*net.TCPAddr).IP
}

// freePort is a TCP port free on ip now: the kernel's pick for a listener
// it then closes.
func freePort(ip net.IP) (int, error) {
	if ip == nil {
		return 0, errors.New("no direct listener")
	}
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: ip})
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// listenReuse listens on a fresh port of ip that connects may bind too
// (SO_REUSEADDR and SO_REUSEPORT).
func listenReuse(ip net.IP) (*net.TCPListener, error) {
	if ip == nil {
		return nil, errors.New("no direct listener")
	}
	lc := net.ListenConfig{Control: reuseAddr}
	ln, err := lc.Listen(context.Background(), "tcp", net.JoinHostPort(ip.String(), "0"))
	if err != nil {
		return nil, err
	}
	return ln.(*net.TCPListener), nil
}

// openOrAccept is the receiver's end of a punch: whichever comes first of
// its connects from port to addr (simultaneousOpen) and a connection the
// asker's connect makes to ln (where nothing stands between the two, or
// the asker's SYN crosses the NAT after this side's has opened it), until
// ctx ends. ln is closed when it returns.
func openOrAccept(ctx context.Context, ln *net.TCPListener, ip net.IP, port int, addr string) (*net.TCPConn, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		c   *net.TCPConn
		err error
	}
	got := make(chan result, 2)
	go func() {
		c, err := simultaneousOpen(ctx, ip, port, addr)
		got <- result{c, err}
	}()
	go func() {
		if d, ok := ctx.Deadline(); ok {
			ln.SetDeadline(d)
		}
		c, err := ln.AcceptTCP()
		got <- result{c, err}
	}()
	first := <-got
	cancel()
	ln.Close()
	second := <-got
	if first.err != nil {
		first, second = second, first
	}
	if second.c != nil { // both made one: keep the first
		second.c.Close()
	}
	return first.c, first.err
}

// simultaneousOpen connects from ip:port to addr until a connection is
// made or ctx ends: the other side does the same towards this one.
func simultaneousOpen(ctx context.Context, ip net.IP, port int, addr string) (*net.TCPConn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: ip, Port: port}, Control: reuseAddr}
	var last error
	for {
		actx, cancel := context.WithTimeout(ctx, time.Second)
		c, err := d.DialContext(actx, "tcp", addr)
		cancel()
		if err == nil {
			return c.(*net.TCPConn), nil
		}
		last = err
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("simultaneous open from port %d to %s: %w", port, addr, last)
		case <-time.After(punchPause):
		}
	}
}
