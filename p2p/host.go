package p2p

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/host/autorelay"
	"github.com/libp2p/go-libp2p/p2p/host/peerstore/pstoremem"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"
	"github.com/libp2p/go-libp2p/p2p/net/connmgr"
	relayv2 "github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/relay"
	"github.com/libp2p/go-libp2p/p2p/protocol/holepunch"
	noise "github.com/libp2p/go-libp2p/p2p/security/noise"
	libp2ptls "github.com/libp2p/go-libp2p/p2p/security/tls"
	quic "github.com/libp2p/go-libp2p/p2p/transport/quic"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
	"github.com/libp2p/go-libp2p/x/rate"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/deepmarket/deepmarket/identity"
)

// HostParams configures NewHost.
type HostParams struct {
	Key    *identity.Key
	Listen []string // multiaddrs
	// Version, Site and Moniker are advertised to peers through identify's
	// agent string, so `peers` can show where each peer sits.
	Version, Site, Moniker string
	// ConnLow and ConnHigh are the connection manager's watermarks; zero
	// means 64 and 192, plenty for a lab and light on a lab machine.
	ConnLow, ConnHigh int
	// Registerer receives libp2p's metrics; nil disables them.
	Registerer prometheus.Registerer
	// NAT says how the host crosses NATs; the zero value is on, with the
	// relay service where AutoNAT finds the node public.
	NAT NATParams
	// Logger receives what Host.Close says when libp2p's close is stuck;
	// nil means slog.Default().
	Logger *slog.Logger
	// Member says whether a peer is a machine the ledger backs: the
	// inbound connections of everyone else are limited per IP address
	// (strangerGate). Nil limits nobody.
	Member func(peer.ID) bool
}

// NATParams configures libp2p's own NAT traversal (see NewHost).
type NATParams struct {
	// Off turns all of it off: no AutoNAT service, no relays (client or
	// service), no hole punching. For tests of what it brings.
	Off bool
	// Relays are the static relays a private node reserves a slot on: the
	// network's public nodes (its seeds).
	Relays []peer.AddrInfo
	// RelayService is RelayAuto (serve once AutoNAT finds this node
	// public), RelayOn (serve at once, e.g. a validator known to be
	// public) or RelayOff.
	RelayService string
	// Member says whether a peer is a machine the ledger backs. The relay
	// service reserves slots for members only, and relays only to them:
	// a stranger with a fresh key cannot use it. Nil refuses everyone.
	Member func(peer.ID) bool
	// Resources overrides the relay's limits (DefaultRelayResources).
	Resources *relayv2.Resources
	// Stock gives the hole punch libp2p's own behaviour, for benchmarks
	// that compare: a NAT mapping advertised once 4 peers observed it,
	// confirmed or not, and 10 s for each of its dials (see
	// mappingFilter and punchDialTimeout).
	Stock bool
}

// Relay service modes of NATParams.RelayService and [p2p] relay_service.
const (
	RelayAuto = "auto"
	RelayOn   = "on"
	RelayOff  = "off"
)

// DefaultRelayResources are the relay service's limits. A relayed
// connection carries the market's small control streams (quote, reserve,
// launch, status, receipts) and the hole punch that replaces it; bulk
// traffic never crosses a relay. So each relayed connection is cut after
// 10 min or 1 MiB each way (libp2p's defaults, 2 min and 128 KiB, are made
// for the hole punch alone), a member may hold 8 relayed connections at
// once, and the relay holds 128 reservations, from one IP address as from
// many: a university's lab machines all come from its NAT's address
// (libp2p's default, 8 per address, would serve 8 of them).
func DefaultRelayResources() relayv2.Resources {
	r := relayv2.DefaultResources()
	r.Limit = &relayv2.RelayLimit{Duration: 10 * time.Minute, Data: 1 << 20}
	r.MaxCircuits = 8
	r.ReservationTTL = 30 * time.Minute
	r.MaxReservationsPerIP = r.MaxReservations
	r.MaxReservationsPerASN = r.MaxReservations
	return r
}

// NewHost builds the node's libp2p host: TCP (with port reuse, which TCP
// hole punching needs) and QUIC, Noise and TLS, the resource manager with
// libp2p's auto-scaled default limits, a connection manager that trims
// idle connections, and libp2p's NAT traversal unless p.NAT.Off:
//   - AutoNAT v1 and v2, client and service: the node learns whether it is
//     reachable and at which public addresses, and tells its peers;
//   - circuit relay v2: the relay service on public nodes (members only,
//     DefaultRelayResources), auto-relay with p.NAT.Relays as static relays
//     on private ones, which then advertise their relay addresses;
//   - DCUtR hole punching, which turns a relayed connection direct.
//
// Loopback addresses are advertised only by a host that has no other.
// punchDialTimeout bounds each dial of a hole punch: the direct dial
// libp2p tries first, to any public address the other peer advertises,
// and each punch. libp2p's default is 10 s. A lab machine behind a NAT
// advertises its mapping once enough peers observed it (4 in libp2p), but
// its NAT drops unsolicited dials to it, so the direct dial to it waits
// out its bound before the punch begins: in make bench-nat, with four
// public nodes, a machine that advertised its mapping went direct 5 s
// after its relayed connection instead of 10 ms. A dial that will succeed
// on a campus link does so in a few round trips.
const punchDialTimeout = 2 * time.Second

func NewHost(p HostParams) (host.Host, error) {
	if p.ConnLow == 0 {
		p.ConnLow = 64
	}
	if p.ConnHigh == 0 {
		p.ConnHigh = 192
	}
	switch p.NAT.RelayService {
	case "":
		p.NAT.RelayService = RelayAuto
	case RelayAuto, RelayOn, RelayOff:
	default:
		return nil, fmt.Errorf("relay service %q: want auto, on or off", p.NAT.RelayService)
	}
	// With SO_REUSEPORT a second node on the same port would silently share
	// it with the first: check it is free first, without the option.
	if err := checkPortsFree(p.Listen); err != nil {
		return nil, err
	}
	rm, err := newResourceManager()
	if err != nil {
		return nil, fmt.Errorf("resource manager: %w", err)
	}
	cm, err := connmgr.NewConnManager(p.ConnLow, p.ConnHigh, connmgr.WithGracePeriod(time.Minute))
	if err != nil {
		return nil, fmt.Errorf("connection manager: %w", err)
	}
	ps, err := pstoremem.NewPeerstore()
	if err != nil {
		return nil, fmt.Errorf("peerstore: %w", err)
	}
	nh := &Host{punches: &punchCounter{}, mapped: &mappingFilter{}, log: p.Logger}
	if nh.log == nil {
		nh.log = slog.Default()
	}
	nh.punches.log = nh.log
	opts := []libp2p.Option{
		libp2p.Identity(p.Key.PrivKey()),
		libp2p.ListenAddrStrings(p.Listen...),
		libp2p.Transport(tcp.NewTCPTransport),
		libp2p.Transport(quic.NewTransport),
		libp2p.Security(noise.ID, noise.New),
		libp2p.Security(libp2ptls.ID, libp2ptls.New),
		libp2p.ResourceManager(rm),
		libp2p.ConnectionManager(cm),
		libp2p.ConnectionGater(nh.gater(p.Member)),
		libp2p.Peerstore(ps),
		libp2p.UserAgent(UserAgent(p.Version, p.Site, p.Moniker)),
		libp2p.AddrsFactory(func(addrs []ma.Multiaddr) []ma.Multiaddr {
			if p.NAT.Stock {
				return advertised(addrs)
			}
			return nh.mapped.apply(advertised(addrs))
		}),
	}
	var punchOpts []holepunch.Option
	if p.NAT.Off {
		opts = append(opts, libp2p.DisableRelay())
	} else {
		acl := memberACL{member: p.NAT.Member}
		res := DefaultRelayResources()
		if p.NAT.Resources != nil {
			res = *p.NAT.Resources
		}
		nh.relayOpts = []relayv2.Option{relayv2.WithResources(res), relayv2.WithACL(acl)}
		if p.Registerer != nil {
			nh.relayOpts = append(nh.relayOpts, relayv2.WithMetricsTracer(relayv2.NewMetricsTracer(relayv2.WithRegisterer(p.Registerer))))
		}
		nh.relays = p.NAT.Relays
		punchOpts = []holepunch.Option{holepunch.WithTracer(nh.punches)}
		if p.Registerer != nil { // one tracer option only: each replaces the last
			punchOpts[0] = holepunch.WithMetricsAndEventTracer(holepunch.NewMetricsTracer(holepunch.WithRegisterer(p.Registerer)), nh.punches)
		}
		if !p.NAT.Stock {
			punchOpts = append(punchOpts, holepunch.DirectDialTimeout(punchDialTimeout))
		}
		// The hole punch service is started below (startPuncher), not by
		// libp2p.EnableHolePunching: see punch.go.
		opts = append(opts,
			libp2p.EnableNATService(),
			libp2p.EnableAutoNATv2(),
			libp2p.EnableAutoRelayWithStaticRelays(p.NAT.Relays, autorelay.WithNumRelays(min(2, max(1, len(p.NAT.Relays)))),
				autorelay.WithBootDelay(0), autorelay.WithBackoff(30*time.Second)),
		)
		// Under RelayAuto the host itself starts the relay service
		// (Host.decideRelay): libp2p's relay manager waits for AutoNAT,
		// which in a network of few public nodes may never answer.
	}
	if p.Registerer != nil {
		opts = append(opts, libp2p.PrometheusRegisterer(p.Registerer))
	} else {
		opts = append(opts, libp2p.DisableMetrics())
	}
	h, err := libp2p.New(opts...)
	if err != nil {
		rm.Close()
		return nil, fmt.Errorf("start libp2p host: %w", err)
	}
	nh.Host = h
	if c, ok := h.(confirmer); ok {
		nh.mapped.host.Store(&c)
	}
	if !p.NAT.Off {
		if nh.punch, err = startPuncher(nh, punchOpts); err != nil {
			h.Close()
			return nil, fmt.Errorf("hole punch service: %w", err)
		}
	}
	if err := nh.start(p.NAT); err != nil {
		if nh.punch != nil {
			nh.punch.close()
		}
		h.Close()
		return nil, err
	}
	return nh, nil
}

// newResourceManager is libp2p's resource manager with its auto-scaled
// default limits, and per-address limits sized for campus NATs.
func newResourceManager() (network.ResourceManager, error) {
	limits := rcmgr.DefaultLimits
	libp2p.SetDefaultServiceLimits(&limits)
	return rcmgr.NewResourceManager(rcmgr.NewFixedLimiter(limits.AutoScale()), campusLimits()...)
}

// campusConns is how many connections a node takes from one IP address.
// A campus NAT puts a whole university's lab machines behind one public
// address, and its public node (a validator, their relay) hears all of
// them from it: libp2p's defaults (8 connections, and 0.2 new ones a
// second after a burst of 16, per IPv4 address) would admit 8 machines and
// then one every 5 s. The resource manager's system and transient limits
// still bound the total.
const campusConns = 512

// campusLimits are the resource manager's per-address limits, sized for a
// campus behind one NAT: campusConns connections per IPv4 address (and
// IPv6 /56; four times that per /48), and new ones at 4 a second after a
// burst of a quarter of that; loopback is not limited.
func campusLimits() []rcmgr.Option {
	burst := campusConns / 4
	return []rcmgr.Option{
		rcmgr.WithLimitPerSubnet(
			[]rcmgr.ConnLimitPerSubnet{{PrefixLength: 32, ConnCount: campusConns}},
			[]rcmgr.ConnLimitPerSubnet{{PrefixLength: 56, ConnCount: campusConns}, {PrefixLength: 48, ConnCount: 4 * campusConns}}),
		rcmgr.WithConnRateLimiters(&rate.Limiter{
			NetworkPrefixLimits: []rate.PrefixLimit{
				{Prefix: netip.MustParsePrefix("127.0.0.0/8")},
				{Prefix: netip.MustParsePrefix("::1/128")},
			},
			SubnetRateLimiter: rate.SubnetLimiter{
				IPv4SubnetLimits: []rate.SubnetLimit{{PrefixLength: 32, Limit: rate.Limit{RPS: 4, Burst: burst}}},
				IPv6SubnetLimits: []rate.SubnetLimit{
					{PrefixLength: 56, Limit: rate.Limit{RPS: 4, Burst: burst}},
					{PrefixLength: 48, Limit: rate.Limit{RPS: 10, Burst: 4 * burst}},
				},
				GracePeriod: time.Minute,
			},
		}),
	}
}

// checkPortsFree binds each fixed TCP port of listen without SO_REUSEPORT
// and lets it go: it fails, with the port named, when another process
// holds it.
func checkPortsFree(listen []string) error {
	for _, s := range listen {
		a, err := ma.NewMultiaddr(s)
		if err != nil {
			return fmt.Errorf("listen address %q: %w", s, err)
		}
		network, addr, err := manet.DialArgs(a)
		if err != nil || !strings.HasPrefix(network, "tcp") || strings.HasSuffix(addr, ":0") {
			continue
		}
		ln, err := net.Listen(network, addr)
		if err != nil {
			return fmt.Errorf("listen %s: %w", s, err)
		}
		ln.Close()
	}
	return nil
}

// advertised is what the host tells peers it listens on: loopback
// addresses only when it has nothing else (a node alone, or a testnet on
// one machine), since a remote peer that dials one reaches itself.
func advertised(addrs []ma.Multiaddr) []ma.Multiaddr {
	out := make([]ma.Multiaddr, 0, len(addrs))
	for _, a := range addrs {
		if !manet.IsIPLoopback(a) {
			out = append(out, a)
		}
	}
	if len(out) == 0 {
		return addrs
	}
	return out
}

// memberACL lets only machines the ledger backs reserve a relay slot, and
// relays only between members.
type memberACL struct{ member func(peer.ID) bool }

func (a memberACL) ok(p peer.ID) bool { return a.member != nil && a.member(p) }

func (a memberACL) AllowReserve(p peer.ID, _ ma.Multiaddr) bool { return a.ok(p) }

func (a memberACL) AllowConnect(src peer.ID, _ ma.Multiaddr, dst peer.ID) bool {
	return a.ok(src) && a.ok(dst)
}

const agentPrefix = "deepmarket/"

// UserAgent builds the identify agent string carrying version, site and
// moniker.
func UserAgent(version, site, moniker string) string {
	v := url.Values{}
	v.Set("site", site)
	v.Set("moniker", moniker)
	return agentPrefix + version + " " + v.Encode()
}

// ParseUserAgent reads what UserAgent wrote; ok is false for agents that
// are not DeepMarket nodes.
func ParseUserAgent(agent string) (version, site, moniker string, ok bool) {
	rest, found := strings.CutPrefix(agent, agentPrefix)
	if !found {
		return "", "", "", false
	}
	version, query, _ := strings.Cut(rest, " ")
	v, err := url.ParseQuery(query)
	if err != nil {
		return version, "", "", true
	}
	clip := func(s string) string {
		if len(s) > maxLabelLen {
			s = s[:maxLabelLen]
		}
		return s
	}
	return version, clip(v.Get("site")), clip(v.Get("moniker")), true
}

// AddrInfos parses a list of "/.../p2p/<id>" multiaddrs, merging addresses
// of the same peer.
func AddrInfos(addrs []string) ([]peer.AddrInfo, error) {
	byID := map[peer.ID]*peer.AddrInfo{}
	var order []peer.ID
	for _, s := range addrs {
		ai, err := peer.AddrInfoFromString(s)
		if err != nil {
			return nil, fmt.Errorf("bootstrap address %q: %w (want /ip4/HOST/tcp/PORT/p2p/PEER_ID)", s, err)
		}
		if prev, ok := byID[ai.ID]; ok {
			prev.Addrs = append(prev.Addrs, ai.Addrs...)
			continue
		}
		byID[ai.ID] = ai
		order = append(order, ai.ID)
	}
	out := make([]peer.AddrInfo, 0, len(order))
	for _, id := range order {
		out = append(out, *byID[id])
	}
	return out, nil
}

// FullAddrs returns the host's listen addresses with /p2p/<id> appended.
func FullAddrs(h host.Host) []string {
	addrs, err := peer.AddrInfoToP2pAddrs(&peer.AddrInfo{ID: h.ID(), Addrs: h.Addrs()})
	if err != nil {
		return nil
	}
	out := make([]string, len(addrs))
	for i, a := range addrs {
		out[i] = a.String()
	}
	return out
}
