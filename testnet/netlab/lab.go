package netlab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"sync"
	"time"
)

// ErrUnavailable is what Available and Create return, wrapped, when this
// machine can't run a lab: not root, no iproute2, or a kernel that can
// shape links neither with netem nor through TAP devices.
var ErrUnavailable = errors.New("network lab unavailable")

// errClosed is returned by a closed Lab's methods.
var errClosed = errors.New("netlab: the lab is closed")

// Shaper is how a lab shapes its links.
type Shaper int

const (
	// ShaperAuto uses netem when the kernel has it, else the userspace
	// shaper.
	ShaperAuto Shaper = iota
	// ShaperNetem shapes with tc netem qdiscs on veth pairs: the kernel
	// does the work and the lab's process may exit.
	ShaperNetem
	// ShaperUserspace joins the ends of each link with TAP devices and
	// shapes in this process, with netem's rules; the links carry
	// nothing once this process exits. For kernels built without
	// sch_netem.
	ShaperUserspace
	// ShaperNone shapes nothing: each link is a bare veth pair, as fast
	// as the kernel moves frames. For many nodes on a kernel without
	// netem, where one process moving every frame would be the
	// bottleneck; the profile's delay, rate and loss do not apply.
	ShaperNone
)

func (s Shaper) String() string {
	switch s {
	case ShaperAuto:
		return "auto"
	case ShaperNetem:
		return "netem"
	case ShaperUserspace:
		return "userspace"
	case ShaperNone:
		return "none"
	}
	return "Shaper(" + strconv.Itoa(int(s)) + ")"
}

// Limits of one lab.
const (
	MaxSites = 200 // sites are 10.B.0.0/24 up to 10.B.199.0/24
	MaxNodes = 240 // nodes per site are .10 up to .249
)

// The octets tried, in order, for a Config with no Octet.
const firstOctet, lastOctet = 77, 99

// Config describes a lab.
type Config struct {
	// Tag prefixes the name of everything the lab makes: its namespaces
	// are TAG-core, TAG-sKnI and, for a site behind a NAT, TAG-rK, its
	// one interface in the root namespace TAGh. 1 to 12 lowercase
	// letters and digits, starting with a letter; unique among the labs
	// that run at once.
	Tag string
	// Octet is B in the lab's addresses, 10.B.0.0/16. 0 picks the first
	// of 77 to 99 whose /16 no route of this host overlaps.
	Octet int
	// Sites holds how many nodes each site has.
	Sites []int
	// Profile is the network to emulate.
	Profile Profile
	// Shaper says how to shape links; the zero value is ShaperAuto.
	Shaper Shaper
	// NAT holds the NAT each site sits behind: empty for every site
	// public, else one entry per site. Only sites 0 to MaxNATSite can be
	// behind a NAT. A lab with NAT sites needs nftables (AvailableNAT).
	NAT []NAT
}

var tagPattern = regexp.MustCompile(`^[a-z][a-z0-9]{0,11}$`)

func (c *Config) validate() error {
	if !tagPattern.MatchString(c.Tag) {
		return fmt.Errorf("netlab: Config.Tag %q: want 1 to 12 lowercase letters and digits, starting with a letter (it prefixes the lab's namespace and interface names)", c.Tag)
	}
	if c.Octet < 0 || c.Octet > 254 {
		return fmt.Errorf("netlab: Config.Octet %d: want 1 to 254, or 0 to pick a free one", c.Octet)
	}
	if len(c.Sites) == 0 || len(c.Sites) > MaxSites {
		return fmt.Errorf("netlab: Config.Sites has %d sites: want 1 to %d", len(c.Sites), MaxSites)
	}
	for k, n := range c.Sites {
		if n < 1 || n > MaxNodes {
			return fmt.Errorf("netlab: Config.Sites[%d] is %d nodes: want 1 to %d", k, n, MaxNodes)
		}
	}
	if err := c.Profile.validate(); err != nil {
		return fmt.Errorf("netlab: Config.Profile: %w", err)
	}
	if c.Shaper < ShaperAuto || c.Shaper > ShaperNone {
		return fmt.Errorf("netlab: Config.Shaper %v is not a shaper", c.Shaper)
	}
	return c.validateNAT()
}

// A Lab is a running network of namespaces; see the package documentation
// for its shape. Its methods are safe for concurrent use.
type Lab struct {
	tag    string
	octet  int
	sites  []int
	nat    []NAT // nil: every site public
	tools  tools
	shaper Shaper
	links  []*link

	mu          sync.Mutex
	profile     Profile
	partitioned map[int]bool
	blocked     map[[2]int]bool // Block's pairs, smaller site first
	closed      bool
}

// A link joins two devices, a and b, each in a namespace: a node's eth0 and
// its port on the site's bridge, or a site's gateway and the bridge.
type link struct {
	a, b   end
	site   int
	uplink bool  // a site's gateway link, shaped by the WAN profile
	w      *wire // userspace shaper only
}

type end struct{ ns, dev string }

// hops is how lk shapes a→b and b→a under profile p.
func (lk *link) hops(p Profile) (ab, ba Link) {
	if lk.uplink {
		return p.wan(lk.site), p.wan(lk.site)
	}
	h := intraHop(p.Intra)
	return h, h
}

// Create builds a lab. It takes a host-wide lock while it picks addresses,
// so labs may be created concurrently, from several processes. On error it
// removes what it made.
func Create(ctx context.Context, cfg Config) (*Lab, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if os.Geteuid() != 0 {
		return nil, errNotRoot
	}
	t, err := findTools()
	if err != nil {
		return nil, err
	}
	var nat []NAT
	if cfg.hasNAT() {
		if t.nft == "" {
			return nil, errNoNft
		}
		nat = append([]NAT(nil), cfg.NAT...)
	}
	unlock, err := lockHost(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := checkLeftovers(cfg.Tag); err != nil {
		return nil, err
	}
	octet, err := chooseOctet(ctx, t, cfg.Octet)
	if err != nil {
		return nil, err
	}
	l := &Lab{
		tag:         cfg.Tag,
		octet:       octet,
		sites:       append([]int(nil), cfg.Sites...),
		nat:         nat,
		tools:       t,
		shaper:      cfg.Shaper,
		profile:     cfg.Profile,
		partitioned: map[int]bool{},
		blocked:     map[[2]int]bool{},
	}
	if err := l.build(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("netlab: create lab %s: %w", cfg.Tag, err), l.teardown())
	}
	return l, nil
}

func (l *Lab) build(ctx context.Context) error {
	core := l.coreNS()
	ip := func(args ...string) error { return run(ctx, l.tools.ip, args...) }
	if err := l.addNS(ctx, core); err != nil {
		return err
	}
	if err := l.pickShaper(ctx); err != nil {
		return err
	}
	// Forwarding in the core only; the host's own sysctls are left alone.
	if err := inNetNS(core, func() error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644)
	}); err != nil {
		return fmt.Errorf("enable forwarding in %s: %w", core, err)
	}

	host := hostLink(l.tag)
	b := strconv.Itoa(l.octet)
	steps := [][]string{
		{"link", "add", "name", host, "type", "veth", "peer", "name", "host", "netns", core},
		{"addr", "add", l.HostIP().String() + "/30", "dev", host},
		{"link", "set", "dev", host, "up"},
		{"-n", core, "addr", "add", "10." + b + ".255.2/30", "dev", "host"},
		{"-n", core, "link", "set", "dev", "host", "up"},
		{"route", "add", "10." + b + ".0.0/16", "via", "10." + b + ".255.2", "dev", host},
	}
	for _, s := range steps {
		if err := ip(s...); err != nil {
			return err
		}
	}

	for k, n := range l.sites {
		br, gw, up := "br"+strconv.Itoa(k), "gw"+strconv.Itoa(k), "up"+strconv.Itoa(k)
		// The site's gateway: the core's gwK, or its NAT router's.
		gwNS := core
		if l.NATOf(k) != NATNone {
			gwNS = l.routerNS(k)
			if err := l.addRouter(ctx, k); err != nil {
				return err
			}
		}
		if err := ip("-n", core, "link", "add", "name", br, "type", "bridge"); err != nil {
			return err
		}
		if err := ip("-n", core, "link", "set", "dev", br, "up"); err != nil {
			return err
		}
		if err := l.addLink(ctx, &link{a: end{gwNS, gw}, b: end{core, up}, site: k, uplink: true}); err != nil {
			return err
		}
		for _, s := range [][]string{
			{"-n", core, "link", "set", "dev", up, "master", br, "up"},
			{"-n", gwNS, "addr", "add", l.gateway(k).String() + "/24", "dev", gw},
			{"-n", gwNS, "link", "set", "dev", gw, "up"},
		} {
			if err := ip(s...); err != nil {
				return err
			}
		}
		if gwNS != core {
			if err := loadNAT(ctx, l.tools, gwNS, natRules(l.NATOf(k), gw)); err != nil {
				return fmt.Errorf("nftables rules of %s: %w", gwNS, err)
			}
		}
		for i := range n {
			ns, port := l.NS(k, i), "s"+strconv.Itoa(k)+"n"+strconv.Itoa(i)
			if err := l.addNS(ctx, ns); err != nil {
				return err
			}
			if err := l.addLink(ctx, &link{a: end{ns, "eth0"}, b: end{core, port}, site: k}); err != nil {
				return err
			}
			for _, s := range [][]string{
				{"-n", core, "link", "set", "dev", port, "master", br, "up"},
				{"-n", ns, "addr", "add", l.IP(k, i).String() + "/24", "dev", "eth0"},
				{"-n", ns, "link", "set", "dev", "eth0", "up"},
				{"-n", ns, "route", "add", "default", "via", l.gateway(k).String()},
			} {
				if err := ip(s...); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// addNS makes a namespace with its loopback up.
func (l *Lab) addNS(ctx context.Context, ns string) error {
	if err := run(ctx, l.tools.ip, "netns", "add", ns); err != nil {
		return err
	}
	return run(ctx, l.tools.ip, "-n", ns, "link", "set", "dev", "lo", "up")
}

// pickShaper settles ShaperAuto, and checks that the shaper asked for works,
// probing in the core namespace.
func (l *Lab) pickShaper(ctx context.Context) error {
	core := l.coreNS()
	switch l.shaper {
	case ShaperNetem:
		if err := probeQdisc(ctx, l.tools, core); err != nil {
			return fmt.Errorf("%w: netem: %v: load sch_netem (modprobe sch_netem) or use ShaperUserspace", ErrUnavailable, err)
		}
	case ShaperUserspace:
		if err := tapWorks(core); err != nil {
			return fmt.Errorf("%w: %v", ErrUnavailable, err)
		}
	case ShaperNone:
	default:
		netemErr := probeQdisc(ctx, l.tools, core)
		if netemErr == nil {
			l.shaper = ShaperNetem
			return nil
		}
		if tapErr := tapWorks(core); tapErr != nil {
			return fmt.Errorf("%w: no netem (%v) and no TAP devices (%v): load sch_netem or tun", ErrUnavailable, netemErr, tapErr)
		}
		l.shaper = ShaperUserspace
	}
	return nil
}

// addLink makes lk's two devices, joined, and shapes them under the lab's
// profile.
func (l *Lab) addLink(ctx context.Context, lk *link) error {
	ab, ba := lk.hops(l.profile)
	if l.shaper == ShaperNetem || l.shaper == ShaperNone {
		// gso_max_segs 1: the stack hands netem one packet per skb, not
		// 64 kB TSO bursts that it would drop or pass as one.
		gso := []string{"gso_max_segs", "1"}
		if l.shaper == ShaperNone {
			gso = nil
		}
		args := append(append([]string{"-n", lk.a.ns, "link", "add", "name", lk.a.dev}, gso...), "type", "veth", "peer", "name", lk.b.dev)
		if err := run(ctx, l.tools.ip, append(append(args, gso...), "netns", lk.b.ns)...); err != nil {
			return err
		}
		l.links = append(l.links, lk)
		if l.shaper == ShaperNone {
			return nil
		}
		return l.shapeNetem(ctx, lk, ab, ba)
	}
	fa, err := openTAP(lk.a.ns, lk.a.dev)
	if err != nil {
		return err
	}
	fb, err := openTAP(lk.b.ns, lk.b.dev)
	if err != nil {
		fa.Close()
		return err
	}
	w, err := newWire(fa, fb, ab, ba)
	if err != nil {
		fa.Close()
		fb.Close()
		return err
	}
	lk.w = w
	l.links = append(l.links, lk)
	return nil
}

func (l *Lab) shapeNetem(ctx context.Context, lk *link, ab, ba Link) error {
	if err := netemShape(ctx, l.tools, lk.a.ns, lk.a.dev, ab); err != nil {
		return err
	}
	return netemShape(ctx, l.tools, lk.b.ns, lk.b.dev, ba)
}

// Shaper is how the lab shapes its links: ShaperNetem, ShaperUserspace or
// ShaperNone.
func (l *Lab) Shaper() Shaper { return l.shaper }

// Sites returns how many nodes each site has.
func (l *Lab) Sites() []int { return append([]int(nil), l.sites...) }

// NS is the name of node i of site k's network namespace, for
// `ip netns exec`. It panics when there is no such node.
func (l *Lab) NS(site, i int) string {
	l.check(site, i)
	return l.tag + "-s" + strconv.Itoa(site) + "n" + strconv.Itoa(i)
}

// IP is node i of site k's address, 10.B.k.(i+10), on its eth0. It panics
// when there is no such node.
func (l *Lab) IP(site, i int) net.IP {
	l.check(site, i)
	return net.IPv4(10, byte(l.octet), byte(site), byte(i+10)).To4()
}

// HostIP is the root namespace's address on the lab, 10.B.255.1, which
// every node reaches: bind a service there that nodes should see.
func (l *Lab) HostIP() net.IP { return net.IPv4(10, byte(l.octet), 255, 1).To4() }

func (l *Lab) gateway(site int) net.IP { return net.IPv4(10, byte(l.octet), byte(site), 1).To4() }

func (l *Lab) coreNS() string { return l.tag + "-core" }

func (l *Lab) check(site, i int) {
	if site < 0 || site >= len(l.sites) || i < 0 || i >= l.sites[site] {
		panic(fmt.Sprintf("netlab: lab %s has no node %d in site %d", l.tag, i, site))
	}
}

// Cmd returns a command that runs name in node i of site k's namespace,
// through `ip netns exec`.
func (l *Lab) Cmd(ctx context.Context, site, i int, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, l.tools.ip, append([]string{"netns", "exec", l.NS(site, i), name}, args...)...)
}

// Do runs f on an OS thread inside node i of site k's namespace, and waits
// for it. Sockets that f opens stay in that namespace, whichever goroutine
// uses them later: how a test puts an in-process listener or dialer on a
// node. Goroutines that f starts run in the root namespace.
func (l *Lab) Do(site, i int, f func() error) error {
	return inNetNS(l.NS(site, i), f)
}

// Partition cuts site k off from the other sites: packets between them are
// dropped silently, as on a cut link, while the site's nodes still reach one
// another and the host. For a site behind a NAT the cut is between its
// router and the core; the router keeps its conntrack entries, so flows go
// on after Heal unless their mappings timed out meanwhile. Partitioning a
// partitioned site does nothing.
func (l *Lab) Partition(site int) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.usable(site); err != nil {
		return err
	}
	if l.partitioned[site] {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	for j, r := range l.partitionRules(site) {
		args := append([]string{"-n", l.coreNS(), "rule", "add"}, r...)
		if err := run(ctx, l.tools.ip, args...); err != nil {
			// Leave no half partition behind.
			return errors.Join(fmt.Errorf("netlab: partition site %d: %w", site, err), l.delRules(ctx, site, j))
		}
	}
	l.partitioned[site] = true
	return nil
}

// Heal undoes Partition. Healing a site that isn't partitioned does nothing.
func (l *Lab) Heal(site int) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.usable(site); err != nil {
		return err
	}
	if !l.partitioned[site] {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	if err := l.delRules(ctx, site, len(l.partitionRules(site))); err != nil {
		return fmt.Errorf("netlab: heal site %d: %w", site, err)
	}
	delete(l.partitioned, site)
	return nil
}

// Block drops the traffic between sites a and b, both ways, as a firewall
// between two campuses would (a hole punch between them fails), while each
// still reaches every other site. Unblock undoes it. Blocking a blocked
// pair does nothing.
func (l *Lab) Block(a, b int) error { return l.block(a, b, true) }

// Unblock undoes Block. Unblocking a pair that isn't blocked does nothing.
func (l *Lab) Unblock(a, b int) error { return l.block(a, b, false) }

func (l *Lab) block(a, b int, on bool) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if a > b {
		a, b = b, a
	}
	if err := l.usable(a); err != nil {
		return err
	}
	if err := l.usable(b); err != nil {
		return err
	}
	if a == b || b >= maxBlockSites {
		return fmt.Errorf("netlab: block sites %d and %d: want two sites under %d", a, b, maxBlockSites)
	}
	pair := [2]int{a, b}
	if l.blocked[pair] == on {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	na, nb := l.siteNet(a), l.siteNet(b)
	prio := blockPrio + 2*(a*maxBlockSites+b)
	rules := [][]string{
		{"prio", strconv.Itoa(prio), "from", na, "to", nb, "blackhole"},
		{"prio", strconv.Itoa(prio + 1), "from", nb, "to", na, "blackhole"},
	}
	var errs []error
	for _, r := range rules {
		if on {
			if err := run(ctx, l.tools.ip, append([]string{"-n", l.coreNS(), "rule", "add"}, r...)...); err != nil {
				errs = append(errs, err)
			}
		} else if err := run(ctx, l.tools.ip, "-n", l.coreNS(), "rule", "del", "prio", r[1]); err != nil && !notFound(err) {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		if on { // leave no half block behind
			for _, r := range rules {
				_ = run(ctx, l.tools.ip, "-n", l.coreNS(), "rule", "del", "prio", r[1])
			}
		}
		return fmt.Errorf("netlab: block sites %d and %d (%v): %w", a, b, on, errors.Join(errs...))
	}
	if on {
		l.blocked[pair] = true
	} else {
		delete(l.blocked, pair)
	}
	return nil
}

// siteNet is what the core sees of site k's traffic: its /24, or its
// router's /30 behind a NAT.
func (l *Lab) siteNet(site int) string {
	if l.NATOf(site) != NATNone {
		return l.wanNet(site)
	}
	return "10." + strconv.Itoa(l.octet) + "." + strconv.Itoa(site) + ".0/24"
}

// Block's rule priorities: after Partition's, before main's (32766).
const (
	blockPrio     = 12000
	maxBlockSites = 64
)

// commandTimeout bounds the commands of the methods that take no context.
const commandTimeout = 30 * time.Second

// partitionRules are the core's policy-routing rules that cut site k off.
// Traffic within a site is bridged and never routed, so no rule sees it;
// traffic to or from other sites is routed by the core, and blackholed
// unless it is the host's. A NATed site's traffic reaches the core from
// its router's public address, so the rules name the router's /30 rather
// than the site's /24.
func (l *Lab) partitionRules(site int) [][]string {
	b := strconv.Itoa(l.octet)
	subnet := "10." + b + "." + strconv.Itoa(site) + ".0/24"
	if l.NATOf(site) != NATNone {
		subnet = l.wanNet(site)
	}
	hostNet := "10." + b + ".255.0/30"
	prio := func(j int) string { return strconv.Itoa(partitionPrio + 4*site + j) }
	return [][]string{
		{"prio", prio(0), "from", subnet, "to", hostNet, "lookup", "main"},
		{"prio", prio(1), "iif", "host", "to", subnet, "lookup", "main"},
		{"prio", prio(2), "from", subnet, "blackhole"},
		{"prio", prio(3), "to", subnet, "blackhole"},
	}
}

// partitionPrio is the first rule priority Partition uses: after the local
// table's (0), before main's (32766).
const partitionPrio = 10000

// delRules deletes the first n of site k's partition rules.
func (l *Lab) delRules(ctx context.Context, site, n int) error {
	var errs []error
	for j := range n {
		prio := strconv.Itoa(partitionPrio + 4*site + j)
		if err := run(ctx, l.tools.ip, "-n", l.coreNS(), "rule", "del", "prio", prio); err != nil && !notFound(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (l *Lab) usable(site int) error {
	if l.closed {
		return errClosed
	}
	if site < 0 || site >= len(l.sites) {
		return fmt.Errorf("netlab: lab %s has no site %d", l.tag, site)
	}
	return nil
}

// SetProfile reshapes every link to p; partitions stay as they are.
func (l *Lab) SetProfile(p Profile) error {
	if err := p.validate(); err != nil {
		return fmt.Errorf("netlab: %w", err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return errClosed
	}
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	for _, lk := range l.links {
		ab, ba := lk.hops(p)
		if lk.w != nil {
			lk.w.set(ab, ba)
			continue
		}
		if l.shaper == ShaperNone {
			continue
		}
		if err := l.shapeNetem(ctx, lk, ab, ba); err != nil {
			return fmt.Errorf("netlab: set profile %s: %w", p.Name, err)
		}
	}
	l.profile = p
	return nil
}

// Profile returns the profile the links are shaped by.
func (l *Lab) Profile() Profile {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.profile
}

// Close removes the lab: its namespaces, its interface and route in the root
// namespace, and, with the userspace shaper, stops shaping. Stop the
// processes started in the lab first: a namespace outlives its bind mount
// while a process runs in it. Closing twice does nothing.
func (l *Lab) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	if err := l.teardown(); err != nil {
		return fmt.Errorf("netlab: close lab %s: %w", l.tag, err)
	}
	return nil
}

// teardown stops the wires and removes everything named after the tag.
func (l *Lab) teardown() error {
	for _, lk := range l.links {
		if lk.w != nil {
			lk.w.close()
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	return removeTagged(ctx, l.tools, l.tag)
}
