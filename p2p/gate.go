package p2p

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/connmgr"
	"github.com/libp2p/go-libp2p/core/control"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
	"golang.org/x/time/rate"
)

// Strangers' inbound connections, per IP address.
const (
	// strangerConns is how many inbound connections peers the ledger does
	// not back may open from one IP address a minute (with a burst of as
	// many): a newcomer opens a handful, a machine behind a campus NAT
	// shares the address with its lab.
	strangerConns = 120
	// strangerBlock is how long an address whose strangers went over
	// that is refused at accept, before any handshake, when no member
	// connected from it in the last memberShield.
	strangerBlock = time.Minute
	memberShield  = 10 * time.Minute
	// maxGateAddrs bounds the addresses remembered.
	maxGateAddrs = 4096
)

// strangerGate is the host's connection gater. A peer with a fresh key
// costs nothing to make, and each of its connections costs this host a
// handshake (key exchange and signature checks), then identify and the
// muxer: one address cycling fresh keys at a node's book kept 74% of a
// core busy refusing them. Each address's strangers share a budget of
// inbound connections (checked once the handshake names the peer, a
// lookup); an address over it is refused at accept, before the
// handshake, for strangerBlock, unless a member connected from it lately
// (a campus NAT shared with an attacker does not lock the lab out). A
// stranger from another address is not slowed, and members never are.
// Relayed connections carry no address of their own and pass: the relay
// serves members only.
type strangerGate struct {
	member func(peer.ID) bool

	mu    sync.Mutex
	addrs map[netip.Addr]*gateAddr
	// refused counts connections refused at accept, checked the
	// handshakes of strangers refused after it.
	refused, checked atomic.Uint64
}

type gateAddr struct {
	strangers *rate.Limiter
	blocked   time.Time // refused at accept until then
	member    time.Time // a member last connected from it
	seen      time.Time
}

func newStrangerGate(member func(peer.ID) bool) *strangerGate {
	return &strangerGate{member: member, addrs: map[netip.Addr]*gateAddr{}}
}

// remoteIP is the IP address a connection comes from (its /64 for IPv6);
// false for a relayed one, or one without an IP.
func remoteIP(c network.ConnMultiaddrs) (netip.Addr, bool) {
	remote := c.RemoteMultiaddr()
	if _, err := remote.ValueForProtocol(ma.P_CIRCUIT); err == nil {
		return netip.Addr{}, false
	}
	ip, err := manet.ToIP(remote)
	if err != nil {
		return netip.Addr{}, false
	}
	a, ok := netip.AddrFromSlice(ip)
	if a = a.Unmap(); ok && a.Is6() {
		// A host holds a whole /64: its addresses count as one.
		p, _ := a.Prefix(64)
		a = p.Addr()
	}
	return a, ok
}

// addrLocked is ip's entry, made if new; g.mu must be held.
func (g *strangerGate) addrLocked(ip netip.Addr, now time.Time) *gateAddr {
	a, ok := g.addrs[ip]
	if !ok {
		if len(g.addrs) >= maxGateAddrs {
			for k, v := range g.addrs {
				if now.Sub(v.seen) > memberShield && now.After(v.blocked) {
					delete(g.addrs, k)
				}
			}
			if len(g.addrs) >= maxGateAddrs {
				clear(g.addrs)
			}
		}
		a = &gateAddr{strangers: rate.NewLimiter(rate.Every(time.Minute/strangerConns), strangerConns)}
		g.addrs[ip] = a
	}
	a.seen = now
	return a
}

func (g *strangerGate) InterceptPeerDial(peer.ID) bool               { return true }
func (g *strangerGate) InterceptAddrDial(peer.ID, ma.Multiaddr) bool { return true }

// InterceptAccept refuses a connection from an address blocked for its
// strangers, before the handshake.
func (g *strangerGate) InterceptAccept(c network.ConnMultiaddrs) bool {
	ip, ok := remoteIP(c)
	if !ok {
		return true
	}
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	if a, ok := g.addrs[ip]; ok && now.Before(a.blocked) {
		g.refused.Add(1)
		return false
	}
	return true
}

// InterceptSecured charges an inbound stranger's connection to its
// address, and blocks the address when it goes over.
func (g *strangerGate) InterceptSecured(dir network.Direction, p peer.ID, c network.ConnMultiaddrs) bool {
	if dir != network.DirInbound {
		return true
	}
	ip, ok := remoteIP(c)
	if !ok {
		return true
	}
	member := g.member(p)
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	a := g.addrLocked(ip, now)
	if member {
		a.member = now
		return true
	}
	if a.strangers.AllowN(now, 1) {
		return true
	}
	g.checked.Add(1)
	if a.member.IsZero() || now.Sub(a.member) > memberShield {
		a.blocked = now.Add(strangerBlock)
	}
	return false
}

func (g *strangerGate) InterceptUpgraded(network.Conn) (bool, control.DisconnectReason) {
	return true, 0
}

// gater is the host's connection gater: the strangers' gate when member
// is set, else one that lets everything through.
func (h *Host) gater(member func(peer.ID) bool) connmgr.ConnectionGater {
	if member == nil {
		return openGate{}
	}
	h.gate = newStrangerGate(member)
	return h.gate
}

// StrangersRefused counts strangers' connections refused: at accept,
// before a handshake (their address was over its budget), and after the
// handshake that took it over.
func (h *Host) StrangersRefused() (atAccept, afterHandshake uint64) {
	if h.gate == nil {
		return 0, 0
	}
	return h.gate.refused.Load(), h.gate.checked.Load()
}

// openGate gates nothing.
type openGate struct{}

func (openGate) InterceptPeerDial(peer.ID) bool               { return true }
func (openGate) InterceptAddrDial(peer.ID, ma.Multiaddr) bool { return true }
func (openGate) InterceptAccept(network.ConnMultiaddrs) bool  { return true }
func (openGate) InterceptSecured(network.Direction, peer.ID, network.ConnMultiaddrs) bool {
	return true
}
func (openGate) InterceptUpgraded(network.Conn) (bool, control.DisconnectReason) {
	return true, 0
}
