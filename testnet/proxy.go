package testnet

import (
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/deepmarket/deepmarket/testnet/netlab"
)

// proxy forwards a port on the host's loopback to the same port on a
// network namespace's loopback: how the CLI, a browser and the tests
// reach a namespaced node's API and ledger RPC.
type proxy struct {
	ln    net.Listener
	dial  func() (net.Conn, error) // to the port inside the namespace
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

// newProxy listens on the host's 127.0.0.1:port and forwards each
// connection to node i of site s's 127.0.0.1:port: the socket is made
// inside that namespace (netlab's Lab.Do).
func newProxy(lab *netlab.Lab, site, i, port int) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return nil, fmt.Errorf("forward port %d from the host: %w", port, err)
	}
	dial := func() (c net.Conn, err error) {
		err = lab.Do(site, i, func() error {
			c, err = net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), 5*time.Second)
			return err
		})
		return c, err
	}
	p := &proxy{ln: ln, dial: dial, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

func (p *proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.pipe(c)
		}()
	}
}

func (p *proxy) track(c net.Conn, on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on {
		p.conns[c] = struct{}{}
	} else {
		delete(p.conns, c)
	}
}

func (p *proxy) pipe(c net.Conn) {
	defer c.Close()
	up, err := p.dial()
	if err != nil {
		return
	}
	defer up.Close()
	p.track(c, true)
	p.track(up, true)
	defer p.track(c, false)
	defer p.track(up, false)
	done := make(chan struct{}, 2)
	go func() { io.Copy(up, c); up.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
	go func() { io.Copy(c, up); c.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
	<-done
	<-done
}

// Close stops listening and cuts the open connections.
func (p *proxy) Close() {
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
