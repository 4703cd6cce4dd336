package netlab

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
)

// NAT is the kind of NAT a site sits behind, as on a campus network whose
// machines have private addresses only.
type NAT int

const (
	// NATNone: the site is public; its nodes' addresses are routed by the
	// core, and any node of the lab reaches them.
	NATNone NAT = iota
	// NATCone: a router masquerades the site behind one public address
	// (nftables `masquerade`). Its mapping is endpoint-independent: one
	// local socket keeps one external port, its own when free, whatever
	// it sends to. Its filtering is address-and-port-dependent: only a
	// peer the socket has sent to gets in. UDP hole punching works.
	NATCone
	// NATSymmetric: as NATCone, but each new flow gets an external port of
	// its own, drawn at random (`masquerade fully-random`): a peer can't
	// learn from a third party which port to send to, and hole punching
	// fails.
	NATSymmetric
)

func (n NAT) String() string {
	switch n {
	case NATNone:
		return "none"
	case NATCone:
		return "cone"
	case NATSymmetric:
		return "symmetric"
	}
	return "NAT(" + strconv.Itoa(int(n)) + ")"
}

// MaxNATSite is the highest site number that can be behind a NAT: router k's
// public address is 10.B.254.(4k+2), on a /30 of its own.
const MaxNATSite = 63

// validateNAT checks Config.NAT against Config.Sites.
func (c *Config) validateNAT() error {
	if len(c.NAT) == 0 {
		return nil
	}
	if len(c.NAT) != len(c.Sites) {
		return fmt.Errorf("netlab: Config.NAT has %d entries for %d sites: want one per site, or none for every site public", len(c.NAT), len(c.Sites))
	}
	for k, n := range c.NAT {
		if n < NATNone || n > NATSymmetric {
			return fmt.Errorf("netlab: Config.NAT[%d] is %v: want NATNone, NATCone or NATSymmetric", k, n)
		}
		if n != NATNone && k > MaxNATSite {
			return fmt.Errorf("netlab: Config.NAT[%d] is %v: only sites 0 to %d can be behind a NAT (router k's public /30 is 10.B.254.4k/30); put the NATed sites first", k, n, MaxNATSite)
		}
	}
	return nil
}

func (c *Config) hasNAT() bool {
	for _, n := range c.NAT {
		if n != NATNone {
			return true
		}
	}
	return false
}

// errNoNft is what a lab with NAT sites gets where nftables is missing.
var errNoNft = fmt.Errorf("%w: NAT sites need nftables' nft: install nftables (scripts/netlab-env.sh does)", ErrUnavailable)

// AvailableNAT is Available for a lab with NAT sites: it also checks that
// nftables' nft is installed and that the kernel takes a NAT router's rules
// (nf_tables, conntrack, masquerade), in a namespace of its own. Its errors
// wrap ErrUnavailable.
func AvailableNAT() error {
	if err := Available(); err != nil {
		return err
	}
	t, err := findTools()
	if err != nil {
		return err
	}
	if t.nft == "" {
		return errNoNft
	}
	return inProbeNS(t, func(ctx context.Context, ns string) error {
		if err := loadNAT(ctx, t, ns, natRules(NATSymmetric, "gw0")); err != nil {
			return fmt.Errorf("%w: the kernel does not take a NAT router's nftables rules (nf_tables, nf_nat, masquerade): %v", ErrUnavailable, err)
		}
		return nil
	})
}

// natRules is the nftables ruleset of a NAT router whose site side is the
// device gw and whose public side is wan. Nothing from wan gets in or
// through but replies (conntrack's established and related); the rest is
// dropped, not refused, as a real NAT does, so that TCP simultaneous open
// and UDP hole punching work.
func natRules(n NAT, gw string) string {
	masq := "masquerade"
	if n == NATSymmetric {
		masq += " fully-random"
	}
	return `table ip netlab {
	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		oifname "wan" ` + masq + `
	}
	chain forward {
		type filter hook forward priority filter; policy drop;
		ct state established,related accept
		iifname "` + gw + `" accept
	}
	chain input {
		type filter hook input priority filter; policy accept;
		iifname "wan" ct state established,related accept
		iifname "wan" drop
	}
}`
}

// loadNAT loads rules with nft run inside namespace ns: the child process
// is forked from a thread in there.
func loadNAT(ctx context.Context, t tools, ns, rules string) error {
	return inNetNS(ns, func() error { return run(ctx, t.nft, rules) })
}

// addRouter makes site k's NAT router: namespace TAG-rK, forwarding on, a
// veth wan to the core (an unshaped /30 of 10.B.254.0/24) and a default
// route through it. The uplink to the site's bridge and the nftables rules
// come after.
func (l *Lab) addRouter(ctx context.Context, site int) error {
	core, r := l.coreNS(), l.routerNS(site)
	if err := l.addNS(ctx, r); err != nil {
		return err
	}
	if err := inNetNS(r, func() error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644)
	}); err != nil {
		return fmt.Errorf("enable forwarding in %s: %w", r, err)
	}
	coreEnd := "r" + strconv.Itoa(site)
	for _, s := range [][]string{
		{"-n", r, "link", "add", "name", "wan", "type", "veth", "peer", "name", coreEnd, "netns", core},
		{"-n", r, "addr", "add", l.PublicIP(site).String() + "/30", "dev", "wan"},
		{"-n", r, "link", "set", "dev", "wan", "up"},
		{"-n", core, "addr", "add", l.wanPeer(site).String() + "/30", "dev", coreEnd},
		{"-n", core, "link", "set", "dev", coreEnd, "up"},
		{"-n", r, "route", "add", "default", "via", l.wanPeer(site).String(), "dev", "wan"},
	} {
		if err := run(ctx, l.tools.ip, s...); err != nil {
			return err
		}
	}
	return nil
}

// NATOf is the NAT site k sits behind; NATNone for a public site. It panics
// when there is no such site.
func (l *Lab) NATOf(site int) NAT {
	l.checkSite(site)
	if len(l.nat) == 0 {
		return NATNone
	}
	return l.nat[site]
}

// PublicIP is the address that the rest of the lab sees site k's nodes
// come from when the site is behind a NAT: its router's, 10.B.254.(4k+2).
// It is nil for a public site, whose nodes are seen at their own
// addresses. It panics when there is no such site.
func (l *Lab) PublicIP(site int) net.IP {
	if l.NATOf(site) == NATNone {
		return nil
	}
	return net.IPv4(10, byte(l.octet), 254, byte(4*site+2)).To4()
}

// wanPeer is the core's end of NAT router k's wan link, 10.B.254.(4k+1).
func (l *Lab) wanPeer(site int) net.IP {
	return net.IPv4(10, byte(l.octet), 254, byte(4*site+1)).To4()
}

// wanNet is NAT router k's /30, 10.B.254.4k/30, as ip writes it.
func (l *Lab) wanNet(site int) string {
	return "10." + strconv.Itoa(l.octet) + ".254." + strconv.Itoa(4*site) + "/30"
}

// PublicCIDRs are the ranges that stand for the internet in this lab: each
// public site's /24, 10.B.254.0/24 where the NAT routers' public addresses
// are, and the host's 10.B.255.0/30. Every address a node can reach
// unasked is in them; the private /24s of NATed sites are not. A node that
// filters private addresses out (libp2p does) should be told to take these
// as public.
func (l *Lab) PublicCIDRs() []*net.IPNet {
	b := byte(l.octet)
	cidr := func(c byte, ones int) *net.IPNet {
		return &net.IPNet{IP: net.IPv4(10, b, c, 0).To4(), Mask: net.CIDRMask(ones, 32)}
	}
	var nets []*net.IPNet
	for k := range l.sites {
		if l.NATOf(k) == NATNone {
			nets = append(nets, cidr(byte(k), 24))
		}
	}
	return append(nets, cidr(254, 24), cidr(255, 30))
}

func (l *Lab) routerNS(site int) string { return l.tag + "-r" + strconv.Itoa(site) }

func (l *Lab) checkSite(site int) {
	if site < 0 || site >= len(l.sites) {
		panic(fmt.Sprintf("netlab: lab %s has no site %d", l.tag, site))
	}
}
