package market

import (
	"net"
	"slices"
	"time"

	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"

	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/scheduler"
)

// Reachable says whether machines a and b, by their offers, can have a
// direct connection, which a job's bulk traffic (bundles, datasets,
// worker tunnels) needs: one of them is public (or does not say), both
// are behind NATs a hole punch crosses, or they share a private network
// (an address in the same /24: one campus LAN, behind one NAT).
func Reachable(a, b p2p.Offer) bool {
	open := func(o p2p.Offer) bool { return o.Reach == "" || o.Reach == p2p.ReachPublic }
	switch {
	case open(a) || open(b):
		return true
	case a.Reach == p2p.ReachNAT && b.Reach == p2p.ReachNAT:
		return true
	}
	return sameLAN(a.Addrs, b.Addrs)
}

func sameLAN(a, b []string) bool {
	nets := map[string]bool{}
	for _, s := range a {
		if n, ok := lan(s); ok {
			nets[n] = true
		}
	}
	for _, s := range b {
		if n, ok := lan(s); ok && nets[n] {
			return true
		}
	}
	return false
}

// lan is the private /24 of an advertised IPv4 address; a relayed
// address names the relay's, not the machine's.
func lan(s string) (string, bool) {
	m, err := ma.NewMultiaddr(s)
	if err != nil {
		return "", false
	}
	if _, err := m.ValueForProtocol(ma.P_CIRCUIT); err == nil {
		return "", false
	}
	ip, err := manet.ToIP(m)
	if err != nil || ip.To4() == nil || !ip.IsPrivate() {
		return "", false
	}
	return ip.Mask(net.CIDRMask(24, 32)).String(), true
}

// AllReachable says whether every two machines of a placement
// (indexes into offers) can reach each other directly.
func AllReachable(offers []p2p.Offer, machines []int) bool {
	for i, a := range machines {
		for _, b := range machines[i+1:] {
			if a != b && !Reachable(offers[a], offers[b]) {
				return false
			}
		}
	}
	return true
}

// ReachClasses splits the machines of offers into groups whose members
// all reach each other: the public machines and those behind NATs a hole
// punch crosses; and, for each private network whose machines only a
// relay reaches (symmetric NATs), the public machines with that network's.
// A multi-worker job is placed within one group.
func ReachClasses(offers []p2p.Offer) [][]int {
	var open, public []int
	relayLANs := map[string][]int{}
	var order []string
	for i, o := range offers {
		switch o.Reach {
		case "", p2p.ReachPublic:
			open = append(open, i)
			public = append(public, i)
		case p2p.ReachNAT:
			open = append(open, i)
		default:
			key := "relay " + o.Machine // alone, unless it shares a LAN
			for _, s := range o.Addrs {
				if n, ok := lan(s); ok {
					key = n
					break
				}
			}
			if relayLANs[key] == nil {
				order = append(order, key)
			}
			relayLANs[key] = append(relayLANs[key], i)
		}
	}
	classes := [][]int{open}
	for _, k := range order {
		c := append(slices.Clone(public), relayLANs[k]...)
		slices.Sort(c)
		classes = append(classes, c)
	}
	return classes
}

// Restrict is the view and offers of the machines keep (indexes into
// offers), with measured round trips carried over.
func Restrict(v scheduler.View, offers []p2p.Offer, keep []int) (scheduler.View, []p2p.Offer) {
	out := scheduler.View{Machines: make([]scheduler.Machine, len(keep))}
	sub := make([]p2p.Offer, len(keep))
	for j, i := range keep {
		out.Machines[j] = v.Machines[i]
		sub[j] = offers[i]
	}
	if v.RTT != nil {
		orig := slices.Clone(keep)
		out.RTT = func(i, j int) (time.Duration, bool) { return v.RTT(orig[i], orig[j]) }
	}
	return out, sub
}
