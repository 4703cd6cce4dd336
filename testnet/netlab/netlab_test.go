package netlab

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// needRoot skips a test that makes namespaces where it can't, and fails it
// there under DM_REQUIRE_ROOT=1.
func needRoot(t *testing.T) {
	t.Helper()
	need(t, Available)
}

// need skips t unless it runs as root on a machine where available returns
// nil. Under DM_REQUIRE_ROOT=1, which `make test` sets, it fails t instead,
// as internal/testutil.NeedRoot does (netlab imports no DeepMarket
// package, its tests included): a suite must not pass by not running.
func need(t *testing.T, available func() error) {
	t.Helper()
	why := ""
	if os.Geteuid() != 0 {
		why = "this test makes network namespaces and needs root: run `sudo go test ./testnet/netlab/`"
	} else if err := available(); err != nil {
		why = fmt.Sprintf("this machine can't run a lab: %v", err)
	}
	if why == "" {
		return
	}
	if os.Getenv("DM_REQUIRE_ROOT") == "1" {
		t.Fatalf("netlab: DM_REQUIRE_ROOT=1, but %s", why)
	}
	t.Skip("netlab: " + why)
}

// newTag returns a fresh tag whose leftovers are removed when the test
// ends, pass or fail.
func newTag(t *testing.T) string {
	t.Helper()
	tag := fmt.Sprintf("nlt%05x", rand.IntN(1<<20))
	t.Cleanup(func() {
		if err := Cleanup(tag); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return tag
}

// leftovers lists what `ip netns list` and `ip link` show of tag.
func leftovers(t *testing.T, tag string) []string {
	t.Helper()
	var found []string
	for _, args := range [][]string{{"netns", "list"}, {"-o", "link", "show"}} {
		out, err := exec.Command(lookTool("ip"), args...).CombinedOutput()
		if err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
		for _, line := range strings.Split(string(out), "\n") {
			if strings.Contains(line, tag+"-") || strings.Contains(line, " "+hostLink(tag)+"@") || strings.Contains(line, " "+hostLink(tag)+":") {
				found = append(found, strings.TrimSpace(line))
			}
		}
	}
	return found
}

func routeExists(t *testing.T, octet int) bool {
	t.Helper()
	out, err := exec.Command(lookTool("ip"), "route", "show", fmt.Sprintf("10.%d.0.0/16", octet)).CombinedOutput()
	if err != nil {
		t.Fatalf("ip route: %v: %s", err, out)
	}
	return strings.TrimSpace(string(out)) != ""
}

const echoPort = 7007

// startEcho runs a UDP echo server on a node; stop closes it.
func startEcho(t *testing.T, l *Lab, site, i int) (addr *net.UDPAddr, stop func()) {
	t.Helper()
	addr = &net.UDPAddr{IP: l.IP(site, i), Port: echoPort}
	var c *net.UDPConn
	if err := l.Do(site, i, func() (err error) {
		c, err = net.ListenUDP("udp4", addr)
		return err
	}); err != nil {
		t.Fatalf("echo on s%dn%d: %v", site, i, err)
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
	stop = func() {
		c.Close()
		<-done
	}
	t.Cleanup(stop)
	return addr, stop
}

// dial opens a UDP socket from a node (site >= 0) or from the host (site
// -1) to addr.
func dial(t *testing.T, l *Lab, site, i int, addr *net.UDPAddr) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	open := func() (err error) {
		c, err = net.DialUDP("udp4", nil, addr)
		return err
	}
	var err error
	if site < 0 {
		err = open()
	} else {
		err = l.Do(site, i, open)
	}
	if err != nil {
		t.Fatalf("dial %v: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

var seq atomic.Uint64

// probe sends one datagram and waits for its echo.
func probe(c *net.UDPConn, timeout time.Duration) (time.Duration, bool) {
	n := seq.Add(1)
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], n)
	start := time.Now()
	c.SetDeadline(start.Add(timeout))
	if _, err := c.Write(b[:]); err != nil {
		return 0, false
	}
	var r [64]byte
	for {
		m, err := c.Read(r[:])
		if err != nil {
			return 0, false
		}
		if m == 8 && binary.BigEndian.Uint64(r[:8]) == n {
			return time.Since(start), true
		}
	}
}

// rtt is the least of nine echoes, after one that warms up ARP: the
// link's delay is a floor that a busy machine (the test suite runs
// packages side by side on two cores) only adds to, so the least echo is
// the one that measures the link rather than the scheduler.
func rtt(t *testing.T, c *net.UDPConn) time.Duration {
	t.Helper()
	probe(c, 2*time.Second)
	var rs []time.Duration
	for range 9 {
		if d, ok := probe(c, 2*time.Second); ok {
			rs = append(rs, d)
		}
	}
	if len(rs) < 7 {
		t.Fatalf("%d of 9 echoes to %v came back", len(rs), c.RemoteAddr())
	}
	return slices.Min(rs)
}

// reachable reports whether any of three echoes comes back.
func reachable(c *net.UDPConn) bool {
	for range 3 {
		if _, ok := probe(c, 300*time.Millisecond); ok {
			return true
		}
	}
	return false
}

func within(t *testing.T, what string, got, want time.Duration, tol float64) {
	t.Helper()
	lo, hi := time.Duration(float64(want)*(1-tol)), time.Duration(float64(want)*(1+tol))
	if got < lo || got > hi {
		t.Errorf("%s RTT %v, want %v ±%.0f%%", what, got, want, tol*100)
	} else {
		t.Logf("%s RTT %v (nominal %v)", what, got, want)
	}
}

// TestLab builds two sites of two nodes on the multi-dc profile with each
// shaper this machine has, and checks round trips, partition, heal,
// reshaping and that Close leaves nothing.
func TestLab(t *testing.T) {
	needRoot(t)
	for _, s := range []Shaper{ShaperNetem, ShaperUserspace} {
		t.Run(s.String(), func(t *testing.T) {
			testLab(t, s, true)
		})
	}
	// Bare veth pairs: everything but the delays, which must be absent.
	t.Run("none", func(t *testing.T) { testLab(t, ShaperNone, false) })
	// The netem shaper's veth topology, with a plain FIFO for netem, on
	// a kernel that lacks netem: everything but the delays.
	t.Run("veth-fifo", func(t *testing.T) {
		tl := mustTools(t)
		if err := inProbeNS(tl, func(ctx context.Context, ns string) error { return netemWorks(ctx, tl, ns) }); err == nil {
			t.Skip("the kernel has netem: the netem subtest covers the veth topology")
		}
		qdiscArgs = func(Link) []string { return []string{"pfifo", "limit", "10000"} }
		probeQdisc = func(context.Context, tools, string) error { return nil }
		t.Cleanup(func() { qdiscArgs, probeQdisc = netemArgs, netemWorks })
		testLab(t, ShaperNetem, false)
	})
}

func mustTools(t *testing.T) tools {
	t.Helper()
	tl, err := findTools()
	if err != nil {
		t.Fatal(err)
	}
	return tl
}

// testLab runs the lab checks; shaped says whether the links really delay.
func testLab(t *testing.T, s Shaper, shaped bool) {
	tag := newTag(t)
	p, err := ProfileByName("multi-dc")
	if err != nil {
		t.Fatal(err)
	}
	l, err := Create(t.Context(), Config{Tag: tag, Sites: []int{2, 2}, Profile: p, Shaper: s})
	if errors.Is(err, ErrUnavailable) {
		t.Skipf("the %v shaper doesn't work here: %v", s, err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	t.Logf("lab %s: 10.%d.0.0/16, shaper %v", tag, l.octet, l.Shaper())

	a00, stop00 := startEcho(t, l, 0, 0)
	a01, stop01 := startEcho(t, l, 0, 1)
	a10, stop10 := startEcho(t, l, 1, 0)
	a11, stop11 := startEcho(t, l, 1, 1)

	// Intra-site: the profile's 0.2 ms, plus what the shaper costs; a
	// loose bound, as it only has to be far below the WAN's.
	for _, c := range []*net.UDPConn{dial(t, l, 0, 1, a00), dial(t, l, 1, 0, a11)} {
		if got := rtt(t, c); got > 5*time.Millisecond {
			t.Errorf("intra-site RTT %v to %v, want under 5ms (nominal %v)", got, c.RemoteAddr(), p.RTT(0, 0))
		} else {
			t.Logf("intra-site RTT %v (nominal %v)", got, p.RTT(0, 0))
		}
	}
	s0to1 := dial(t, l, 0, 0, a10)
	s1to0 := dial(t, l, 1, 0, a01)
	host := dial(t, l, -1, 0, a10)
	if shaped {
		within(t, "site 0 to site 1", rtt(t, s0to1), p.RTT(0, 1), 0.4)
		within(t, "site 1 to site 0", rtt(t, s1to0), p.RTT(1, 0), 0.4)
		within(t, "host to site 1", rtt(t, host), p.HostRTT(1), 0.4)
	} else {
		for _, c := range []*net.UDPConn{s0to1, s1to0, host} {
			d := rtt(t, c)
			t.Logf("unshaped RTT to %v: %v", c.RemoteAddr(), d)
			if s == ShaperNone && d >= p.RTT(0, 1)/4 {
				t.Errorf("RTT %v to %v over bare links: the profile's %v applies", d, c.RemoteAddr(), p.RTT(0, 1))
			}
		}
	}

	if err := l.Partition(1); err != nil {
		t.Fatal(err)
	}
	if reachable(s0to1) {
		t.Error("site 0 reaches site 1 across the partition")
	}
	if reachable(s1to0) {
		t.Error("site 1 reaches site 0 across the partition")
	}
	if !reachable(dial(t, l, 1, 1, a10)) {
		t.Error("partitioned site 1's nodes don't reach each other")
	}
	if !reachable(host) {
		t.Error("the host doesn't reach partitioned site 1")
	}
	if !reachable(dial(t, l, 0, 0, a01)) {
		t.Error("site 0's nodes don't reach each other while site 1 is cut off")
	}
	if err := l.Heal(1); err != nil {
		t.Fatal(err)
	}
	if !reachable(s0to1) || !reachable(s1to0) {
		t.Error("sites 0 and 1 don't reach each other after Heal")
	}

	// A firewall between sites 0 and 1: they no longer reach each other,
	// while the host (another network) still reaches site 1.
	if err := l.Block(1, 0); err != nil {
		t.Fatal(err)
	}
	if reachable(s0to1) || reachable(s1to0) {
		t.Error("sites 0 and 1 reach each other through Block")
	}
	if !reachable(host) {
		t.Error("the host doesn't reach site 1 while it is blocked from site 0")
	}
	if err := l.Unblock(0, 1); err != nil {
		t.Fatal(err)
	}
	if !reachable(s0to1) || !reachable(s1to0) {
		t.Error("sites 0 and 1 don't reach each other after Unblock")
	}

	lan, _ := ProfileByName("lan")
	if err := l.SetProfile(lan); err != nil {
		t.Fatal(err)
	}
	if got := rtt(t, s0to1); got > 5*time.Millisecond {
		t.Errorf("site 0 to site 1 RTT %v on lan, want under 5ms", got)
	}

	for _, stop := range []func(){stop00, stop01, stop10, stop11} {
		stop()
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if left := leftovers(t, tag); len(left) > 0 {
		t.Errorf("Close left %q", left)
	}
	if routeExists(t, l.octet) {
		t.Errorf("Close left the route to 10.%d.0.0/16", l.octet)
	}
	if err := l.Partition(0); !errors.Is(err, errClosed) {
		t.Errorf("Partition after Close: %v, want %v", err, errClosed)
	}
}

func TestCreateBadConfig(t *testing.T) {
	lan, _ := ProfileByName("lan")
	bad := lan
	bad.Intra.Loss = 150
	neg := lan
	neg.WAN = []Link{{Delay: -time.Millisecond}}
	for _, c := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no tag", Config{Sites: []int{1}, Profile: lan}, "Config.Tag"},
		{"long tag", Config{Tag: "abcdefghijklm", Sites: []int{1}, Profile: lan}, "Config.Tag"},
		{"tag with dash", Config{Tag: "a-b", Sites: []int{1}, Profile: lan}, "Config.Tag"},
		{"no sites", Config{Tag: "nltbad", Profile: lan}, "Config.Sites has 0 sites"},
		{"empty site", Config{Tag: "nltbad", Sites: []int{2, 0}, Profile: lan}, "Config.Sites[1] is 0 nodes"},
		{"big site", Config{Tag: "nltbad", Sites: []int{MaxNodes + 1}, Profile: lan}, "Config.Sites[0]"},
		{"no profile", Config{Tag: "nltbad", Sites: []int{1}}, "profile has no name"},
		{"loss", Config{Tag: "nltbad", Sites: []int{1}, Profile: bad}, "loss 150%"},
		{"negative delay", Config{Tag: "nltbad", Sites: []int{1}, Profile: neg}, "WAN[0]: delay -1ms is negative"},
		{"octet", Config{Tag: "nltbad", Octet: 300, Sites: []int{1}, Profile: lan}, "Config.Octet 300"},
		{"shaper", Config{Tag: "nltbad", Sites: []int{1}, Profile: lan, Shaper: 7}, "Config.Shaper"},
		{"nat length", Config{Tag: "nltbad", Sites: []int{1, 1}, Profile: lan, NAT: []NAT{NATCone}}, "Config.NAT has 1 entries for 2 sites"},
		{"nat kind", Config{Tag: "nltbad", Sites: []int{1}, Profile: lan, NAT: []NAT{3}}, "Config.NAT[0] is NAT(3)"},
		{"nat site", Config{Tag: "nltbad", Sites: slices.Repeat([]int{1}, MaxNATSite+2), Profile: lan,
			NAT: append(make([]NAT, MaxNATSite+1), NATCone)}, "Config.NAT[64] is cone: only sites 0 to 63"},
	} {
		t.Run(c.name, func(t *testing.T) {
			l, err := Create(t.Context(), c.cfg)
			if err == nil {
				l.Close()
				t.Fatal("Create succeeded")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q, want it to say %q", err, c.want)
			}
			if os.Geteuid() == 0 && c.cfg.Tag != "" {
				if left := leftovers(t, c.cfg.Tag); len(left) > 0 {
					t.Errorf("left %q", left)
				}
			}
		})
	}
}

// TestCreateFailsCleanly fails Create at several of its commands and checks
// that each time nothing is left; with a NAT site, among them the router's
// first command and its nft.
func TestCreateFailsCleanly(t *testing.T) {
	lan, _ := ProfileByName("lan")
	t.Run("public", func(t *testing.T) {
		needRoot(t)
		testCreateFailsCleanly(t, Config{Sites: []int{2, 1}, Profile: lan})
	})
	t.Run("nat", func(t *testing.T) {
		needNAT(t)
		testCreateFailsCleanly(t, Config{Sites: []int{2, 1}, Profile: lan, NAT: []NAT{NATNone, NATCone}})
	})
}

func testCreateFailsCleanly(t *testing.T, cfg Config) {
	var count atomic.Int64
	t.Cleanup(func() { beforeCommand = nil })
	var points []int // the commands that make a NAT router, and its rules
	beforeCommand = func(args []string) error {
		n := int(count.Add(1))
		if slices.ContainsFunc(args, func(a string) bool { return strings.HasSuffix(a, "-r1") }) || strings.HasPrefix(args[0], "table ip netlab") {
			points = append(points, n)
		}
		return nil
	}
	tag := newTag(t)
	cfg.Tag = tag
	l, err := Create(t.Context(), cfg)
	beforeCommand = nil
	if err != nil {
		t.Fatal(err)
	}
	total := int(count.Load())
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	failAt := []int{1, 2, 3, 5, 8, total / 2, total - 1, total}
	if cfg.NAT != nil {
		if len(points) == 0 {
			t.Fatal("no command made a NAT router")
		}
		failAt = append(failAt, points[0], points[len(points)-1])
	}
	injected := errors.New("injected failure")
	for _, n := range failAt {
		count.Store(0)
		beforeCommand = func([]string) error {
			if int(count.Add(1)) == n {
				return injected
			}
			return nil
		}
		l, err := Create(t.Context(), cfg)
		beforeCommand = nil
		if err == nil {
			l.Close()
			t.Fatalf("Create with command %d of %d failing succeeded", n, total)
		}
		if !errors.Is(err, injected) {
			t.Errorf("command %d of %d failing: error %v, want the injected one", n, total, err)
		}
		if left := leftovers(t, tag); len(left) > 0 {
			t.Errorf("command %d of %d failing left %q", n, total, left)
		}
	}
}

// TestCreateRefusesTakenNames checks that a second lab can't take a running
// lab's octet or tag, and leaves nothing when it fails.
func TestCreateRefusesTakenNames(t *testing.T) {
	needRoot(t)
	lan, _ := ProfileByName("lan")
	tag := newTag(t)
	l, err := Create(t.Context(), Config{Tag: tag, Sites: []int{1}, Profile: lan})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	other := newTag(t)
	_, err = Create(t.Context(), Config{Tag: other, Octet: l.octet, Sites: []int{1}, Profile: lan})
	if err == nil || !strings.Contains(err.Error(), "overlaps") {
		t.Errorf("second lab on octet %d: error %v, want it to say the /16 overlaps", l.octet, err)
	}
	if left := leftovers(t, other); len(left) > 0 {
		t.Errorf("left %q", left)
	}
	_, err = Create(t.Context(), Config{Tag: tag, Sites: []int{1}, Profile: lan})
	if err == nil || !strings.Contains(err.Error(), "netlab.Cleanup") {
		t.Errorf("second lab with tag %s: error %v, want it to point at Cleanup", tag, err)
	}
}

// TestCleanupAfterCrash leaves a lab unclosed, as a crash would, and checks
// that Cleanup removes it by name.
func TestCleanupAfterCrash(t *testing.T) {
	needRoot(t)
	lan, _ := ProfileByName("lan")
	tag := newTag(t)
	l, err := Create(t.Context(), Config{Tag: tag, Sites: []int{1, 1}, Profile: lan})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close() // stops the userspace shaper's goroutines
	if len(leftovers(t, tag)) == 0 {
		t.Fatal("the lab is not visible in ip netns list / ip link")
	}
	if err := Cleanup(tag); err != nil {
		t.Fatal(err)
	}
	if left := leftovers(t, tag); len(left) > 0 {
		t.Errorf("Cleanup left %q", left)
	}
	if routeExists(t, l.octet) {
		t.Errorf("Cleanup left the route to 10.%d.0.0/16", l.octet)
	}
}
