package netlab

import (
	"errors"
	"net"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// needNAT is needRoot for a lab with NAT sites, which needs nftables too.
func needNAT(t *testing.T) {
	t.Helper()
	need(t, AvailableNAT)
}

// TestNATNeedsNft checks that a lab with NAT sites that finds no nft says
// so as ErrUnavailable.
func TestNATNeedsNft(t *testing.T) {
	if !errors.Is(errNoNft, ErrUnavailable) || !strings.Contains(errNoNft.Error(), "install nftables") {
		t.Errorf("errNoNft = %v: want ErrUnavailable, saying to install nftables", errNoNft)
	}
}

func TestNATString(t *testing.T) {
	for n, want := range map[NAT]string{NATNone: "none", NATCone: "cone", NATSymmetric: "symmetric", 7: "NAT(7)"} {
		if got := n.String(); got != want {
			t.Errorf("NAT(%d).String() = %q, want %q", int(n), got, want)
		}
	}
}

// TestNATAddresses checks a lab's public addresses and ranges, and the
// partition rules of a NATed site, on a Lab value that was never created.
func TestNATAddresses(t *testing.T) {
	l := &Lab{tag: "x", octet: 77, sites: []int{1, 1, 1}, nat: []NAT{NATCone, NATNone, NATSymmetric}}
	for k, want := range []struct {
		nat NAT
		ip  string
	}{{NATCone, "10.77.254.2"}, {NATNone, "<nil>"}, {NATSymmetric, "10.77.254.10"}} {
		if got := l.NATOf(k); got != want.nat {
			t.Errorf("NATOf(%d) = %v, want %v", k, got, want.nat)
		}
		if got := l.PublicIP(k).String(); got != want.ip {
			t.Errorf("PublicIP(%d) = %s, want %s", k, got, want.ip)
		}
	}
	cidrs := func(l *Lab) []string {
		var s []string
		for _, n := range l.PublicCIDRs() {
			s = append(s, n.String())
		}
		return s
	}
	if got, want := cidrs(l), []string{"10.77.1.0/24", "10.77.254.0/24", "10.77.255.0/30"}; !slices.Equal(got, want) {
		t.Errorf("PublicCIDRs = %v, want %v", got, want)
	}
	public := &Lab{tag: "x", octet: 77, sites: []int{1, 1}}
	if got, want := cidrs(public), []string{"10.77.0.0/24", "10.77.1.0/24", "10.77.254.0/24", "10.77.255.0/30"}; !slices.Equal(got, want) {
		t.Errorf("PublicCIDRs of a lab without NAT = %v, want %v", got, want)
	}
	if public.NATOf(1) != NATNone || public.PublicIP(1) != nil {
		t.Errorf("a lab without NAT: NATOf(1) = %v, PublicIP(1) = %v", public.NATOf(1), public.PublicIP(1))
	}
	for _, c := range []struct {
		site int
		net  string
	}{{0, "10.77.0.0/24"}, {2, "10.77.254.8/30"}} {
		l := &Lab{tag: "x", octet: 77, sites: []int{1, 1, 1}, nat: []NAT{NATNone, NATNone, NATCone}}
		for _, r := range l.partitionRules(c.site) {
			if !slices.Contains(r, c.net) {
				t.Errorf("site %d's partition rule %q does not name %s", c.site, r, c.net)
			}
		}
	}
}

// TestNAT builds five sites, each of one node but the public site 1 of
// two, on the lan profile: 0 and 2 behind cone NATs, 3 and 4 behind
// symmetric ones. It checks that a NATed node reaches out and is seen at
// its router's address, that nothing gets in unasked and is dropped rather
// than refused, how each NAT maps ports, that UDP hole punching works
// through cone NATs and not through symmetric ones, and that a NATed site
// can be partitioned and healed.
func TestNAT(t *testing.T) {
	needNAT(t)
	lan, _ := ProfileByName("lan")
	tag := newTag(t)
	l, err := Create(t.Context(), Config{
		Tag: tag, Sites: []int{1, 2, 1, 1, 1}, Profile: lan,
		NAT: []NAT{NATCone, NATNone, NATCone, NATSymmetric, NATSymmetric},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	t.Logf("lab %s: 10.%d.0.0/16, shaper %v, public %v", tag, l.octet, l.Shaper(), l.PublicCIDRs())

	t.Run("outbound", func(t *testing.T) {
		// A TCP connection from a NATed node to a public one: the
		// public node sees the router's address, and under a cone NAT
		// the node's own port.
		srv := listenTCP(t, l, 1, 0, 7100)
		type accepted struct {
			from *net.TCPAddr
			err  error
		}
		got := make(chan accepted, 1)
		go func() {
			c, err := srv.AcceptTCP()
			if err != nil {
				got <- accepted{err: err}
				return
			}
			defer c.Close()
			buf := make([]byte, 5)
			c.SetDeadline(time.Now().Add(3 * time.Second))
			if _, err := c.Read(buf); err == nil {
				_, err = c.Write(buf)
			}
			got <- accepted{c.RemoteAddr().(*net.TCPAddr), err}
		}()
		c, err := dialTCP(l, 0, 0, &net.TCPAddr{IP: l.IP(1, 0), Port: 7100}, 3*time.Second)
		if err != nil {
			t.Fatalf("NATed node to public node: %v", err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(3 * time.Second))
		buf := []byte("hello")
		if _, err := c.Write(buf); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Read(buf); err != nil {
			t.Fatalf("no echo over the connection: %v", err)
		}
		a := <-got
		if a.err != nil {
			t.Fatal(a.err)
		}
		local := c.LocalAddr().(*net.TCPAddr)
		if !a.from.IP.Equal(l.PublicIP(0)) || a.from.Port != local.Port {
			t.Errorf("the public node sees the connection from %v, want %s:%d (the router's address, the node's port)", a.from, l.PublicIP(0), local.Port)
		} else {
			t.Logf("%v is seen as %v", local, a.from)
		}
	})

	t.Run("inbound", func(t *testing.T) {
		// A public node can't reach a NATed node: not at its private
		// address, which the core has no route to, nor at its router's
		// on the port it listens on, where the router drops the SYN.
		srv := listenTCP(t, l, 0, 0, 7101)
		if c, err := dialTCP(l, 1, 0, &net.TCPAddr{IP: l.IP(0, 0), Port: 7101}, time.Second); err == nil {
			c.Close()
			t.Error("a public node reaches a NATed node at its private address")
		} else {
			t.Logf("to the private address: %v", err)
		}
		start := time.Now()
		c, err := dialTCP(l, 1, 0, &net.TCPAddr{IP: l.PublicIP(0), Port: 7101}, 1500*time.Millisecond)
		var ne net.Error
		switch {
		case err == nil:
			c.Close()
			t.Error("a public node reaches a NATed node at its router's address")
		case errors.Is(err, syscall.ECONNREFUSED):
			t.Errorf("the router refused a connection from outside (%v): want it dropped", err)
		case !errors.As(err, &ne) || !ne.Timeout():
			t.Errorf("a dial to the router's address failed with %v after %v: want a timeout (dropped)", err, time.Since(start))
		default:
			t.Logf("to the router's address: %v after %v", err, time.Since(start).Round(time.Millisecond))
		}
		srv.SetDeadline(time.Now().Add(10 * time.Millisecond))
		if c, err := srv.Accept(); err == nil {
			c.Close()
			t.Errorf("the NATed node accepted a connection from %v", c.RemoteAddr())
		}
	})

	t.Run("mapping", func(t *testing.T) {
		t.Run("cone", func(t *testing.T) { testMapping(t, l, 0, 7102, true) })
		t.Run("symmetric", func(t *testing.T) { testMapping(t, l, 3, 7103, false) })
	})

	t.Run("holepunch", func(t *testing.T) {
		t.Run("cone", func(t *testing.T) {
			a, b := punch(t, l, 0, 2, 7104, 3*time.Second)
			if a == nil || b == nil {
				t.Fatalf("hole punching through two cone NATs: site 0 heard %v, site 2 heard %v", a, b)
			}
			if want := (&net.UDPAddr{IP: l.PublicIP(2), Port: 7104}); a.String() != want.String() {
				t.Errorf("site 0 heard site 2 from %v, want %v", a, want)
			}
			if want := (&net.UDPAddr{IP: l.PublicIP(0), Port: 7104}); b.String() != want.String() {
				t.Errorf("site 2 heard site 0 from %v, want %v", b, want)
			}
		})
		t.Run("symmetric", func(t *testing.T) {
			a, b := punch(t, l, 3, 4, 7105, 1500*time.Millisecond)
			if a != nil || b != nil {
				t.Errorf("hole punching through two symmetric NATs worked: site 3 heard %v, site 4 heard %v", a, b)
			}
		})
	})

	t.Run("simultaneous-open", func(t *testing.T) {
		// Nodes behind two cone NATs dial each other's router from a
		// fixed port at once: the SYN that reaches a router first is
		// dropped, the other finds a mapping and gets through, and the
		// kernel retransmits the first. Both connect.
		type dialed struct {
			c   net.Conn
			err error
		}
		got := make(chan dialed, 2)
		for _, p := range [][2]int{{0, 2}, {2, 0}} {
			go func() {
				var d dialed
				if err := l.Do(p[0], 0, func() error {
					dl := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: l.IP(p[0], 0), Port: 7106}}
					d.c, d.err = dl.Dial("tcp4", (&net.TCPAddr{IP: l.PublicIP(p[1]), Port: 7106}).String())
					return nil
				}); err != nil {
					d.err = err
				}
				got <- d
			}()
		}
		for range 2 {
			d := <-got
			if d.err != nil {
				t.Errorf("TCP simultaneous open through two cone NATs: %v", d.err)
				continue
			}
			t.Logf("%v connected to %v", d.c.LocalAddr(), d.c.RemoteAddr())
			d.c.Close()
		}
	})

	t.Run("partition", func(t *testing.T) {
		pub, _ := startEcho(t, l, 1, 0)
		host := startHostEcho(t, l)
		out := dial(t, l, 0, 0, pub)
		toHost := dial(t, l, 0, 0, host)
		other := dial(t, l, 2, 0, pub)
		if !reachable(out) || !reachable(other) || !reachable(toHost) {
			t.Fatal("NATed sites don't reach the public site or the host")
		}
		if err := l.Partition(0); err != nil {
			t.Fatal(err)
		}
		if reachable(out) {
			t.Error("partitioned NATed site 0 reaches site 1")
		}
		if !reachable(toHost) {
			t.Error("partitioned NATed site 0 doesn't reach the host")
		}
		if !reachable(other) {
			t.Error("NATed site 2 doesn't reach site 1 while site 0 is cut off")
		}
		if err := l.Heal(0); err != nil {
			t.Fatal(err)
		}
		if !reachable(out) {
			t.Error("NATed site 0 doesn't reach site 1 after Heal")
		}
	})

	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if left := leftovers(t, tag); len(left) > 0 {
		t.Errorf("Close left %q", left)
	}
}

// testMapping sends from one socket of NATed site's node to both nodes of
// public site 1, and checks the external ports they see: the socket's own
// under a cone NAT, a different one for each under a symmetric NAT.
func testMapping(t *testing.T, l *Lab, site, port int, cone bool) {
	var c *net.UDPConn
	if err := l.Do(site, 0, func() (err error) {
		c, err = net.ListenUDP("udp4", &net.UDPAddr{IP: l.IP(site, 0)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	local := c.LocalAddr().(*net.UDPAddr).Port
	var seen []*net.UDPAddr
	for i := range 2 {
		peer := listenUDP(t, l, 1, i, port)
		from := sendUntilHeard(c, peer, &net.UDPAddr{IP: l.IP(1, i), Port: port}, 2*time.Second)
		if from == nil {
			t.Fatalf("node %d of site 1 heard nothing from site %d", i, site)
		}
		if !from.IP.Equal(l.PublicIP(site)) {
			t.Errorf("node %d of site 1 heard site %d from %v, want the router's %s", i, site, from, l.PublicIP(site))
		}
		seen = append(seen, from)
	}
	t.Logf("local port %d; seen as %v and %v", local, seen[0], seen[1])
	if cone && (seen[0].Port != local || seen[1].Port != local) {
		t.Errorf("cone NAT: seen at ports %d and %d, want the socket's own, %d, at both", seen[0].Port, seen[1].Port, local)
	}
	if !cone && seen[0].Port == seen[1].Port {
		t.Errorf("symmetric NAT: both peers see port %d, want one each", seen[0].Port)
	}
}

// punch has node 0 of sites a and b each send from port to the other's
// router's address and that port, ten times a second until both have
// heard the other or for d, and returns whom each heard from (nil: no one).
func punch(t *testing.T, l *Lab, a, b, port int, d time.Duration) (aHeard, bHeard *net.UDPAddr) {
	ca, cb := listenUDP(t, l, a, 0, port), listenUDP(t, l, b, 0, port)
	heard := make([]*net.UDPAddr, 2)
	var mu sync.Mutex
	var wg sync.WaitGroup
	deadline := time.Now().Add(d)
	for j, c := range []*net.UDPConn{ca, cb} {
		c.SetReadDeadline(deadline)
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 16)
			if _, from, err := c.ReadFromUDP(buf); err == nil {
				mu.Lock()
				heard[j] = from
				mu.Unlock()
			}
		}()
	}
	toB := &net.UDPAddr{IP: l.PublicIP(b), Port: port}
	toA := &net.UDPAddr{IP: l.PublicIP(a), Port: port}
	for time.Now().Before(deadline) {
		ca.WriteToUDP([]byte("punch"), toB)
		cb.WriteToUDP([]byte("punch"), toA)
		time.Sleep(100 * time.Millisecond)
		mu.Lock()
		done := heard[0] != nil && heard[1] != nil
		mu.Unlock()
		if done {
			break
		}
	}
	ca.SetReadDeadline(time.Now())
	cb.SetReadDeadline(time.Now())
	wg.Wait()
	return heard[0], heard[1]
}

// sendUntilHeard sends from c to addr, where peer listens, every 200 ms
// until peer reads it or for d, and returns whom peer heard it from.
func sendUntilHeard(c, peer *net.UDPConn, addr *net.UDPAddr, d time.Duration) *net.UDPAddr {
	buf := make([]byte, 16)
	for end := time.Now().Add(d); time.Now().Before(end); {
		c.WriteToUDP([]byte("map"), addr)
		peer.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if _, from, err := peer.ReadFromUDP(buf); err == nil {
			return from
		}
	}
	return nil
}

func listenUDP(t *testing.T, l *Lab, site, i, port int) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	if err := l.Do(site, i, func() (err error) {
		c, err = net.ListenUDP("udp4", &net.UDPAddr{IP: l.IP(site, i), Port: port})
		return err
	}); err != nil {
		t.Fatalf("listen on s%dn%d: %v", site, i, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func listenTCP(t *testing.T, l *Lab, site, i, port int) *net.TCPListener {
	t.Helper()
	var ln *net.TCPListener
	if err := l.Do(site, i, func() (err error) {
		ln, err = net.ListenTCP("tcp4", &net.TCPAddr{IP: l.IP(site, i), Port: port})
		return err
	}); err != nil {
		t.Fatalf("listen on s%dn%d: %v", site, i, err)
	}
	ln.SetDeadline(time.Now().Add(10 * time.Second))
	t.Cleanup(func() { ln.Close() })
	return ln
}

// dialTCP dials addr from node i of site k, giving up after timeout.
func dialTCP(l *Lab, site, i int, addr *net.TCPAddr, timeout time.Duration) (c net.Conn, err error) {
	if derr := l.Do(site, i, func() error {
		d := net.Dialer{Timeout: timeout}
		c, err = d.Dial("tcp4", addr.String())
		return nil
	}); derr != nil {
		return nil, derr
	}
	return c, err
}

// startHostEcho runs a UDP echo server in the root namespace, on the
// lab's host address.
func startHostEcho(t *testing.T, l *Lab) *net.UDPAddr {
	t.Helper()
	addr := &net.UDPAddr{IP: l.HostIP(), Port: echoPort}
	c, err := net.ListenUDP("udp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64)
		for {
			n, from, err := c.ReadFromUDP(buf)
			if err != nil {
				return
			}
			c.WriteToUDP(buf[:n], from)
		}
	}()
	t.Cleanup(func() {
		c.Close()
		<-done
	})
	return addr
}
