package p2p

import (
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/host/peerstore/pstoremem"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"
	"github.com/libp2p/go-libp2p/p2p/net/connmgr"
	noise "github.com/libp2p/go-libp2p/p2p/security/noise"
	libp2ptls "github.com/libp2p/go-libp2p/p2p/security/tls"
	quic "github.com/libp2p/go-libp2p/p2p/transport/quic"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
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
}

// NewHost builds the node's libp2p host: TCP and QUIC, Noise and TLS, the
// resource manager with libp2p's auto-scaled default limits, and a
// connection manager that trims idle connections.
func NewHost(p HostParams) (host.Host, error) {
	if p.ConnLow == 0 {
		p.ConnLow = 64
	}
	if p.ConnHigh == 0 {
		p.ConnHigh = 192
	}
	limits := rcmgr.DefaultLimits
	libp2p.SetDefaultServiceLimits(&limits)
	rm, err := rcmgr.NewResourceManager(rcmgr.NewFixedLimiter(limits.AutoScale()))
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
	opts := []libp2p.Option{
		libp2p.Identity(p.Key.PrivKey()),
		libp2p.ListenAddrStrings(p.Listen...),
		// Without SO_REUSEPORT a second node on the same port fails at once
		// instead of silently sharing the port with the first.
		libp2p.Transport(tcp.NewTCPTransport, tcp.DisableReuseport()),
		libp2p.Transport(quic.NewTransport),
		libp2p.Security(noise.ID, noise.New),
		libp2p.Security(libp2ptls.ID, libp2ptls.New),
		libp2p.ResourceManager(rm),
		libp2p.ConnectionManager(cm),
		libp2p.Peerstore(ps),
		libp2p.UserAgent(UserAgent(p.Version, p.Site, p.Moniker)),
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
	return h, nil
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
