package p2p

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/event"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	"github.com/libp2p/go-libp2p/p2p/host/eventbus"
	relayv2 "github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/relay"
	"github.com/libp2p/go-libp2p/p2p/protocol/holepunch"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
)

// Host is the node's libp2p host with what its NAT traversal knows: the
// reachability AutoNAT found, the relay service when this node runs one,
// and the hole punches tried. NewHost returns one.
type Host struct {
	host.Host
	relayOpts []relayv2.Option
	relays    []peer.AddrInfo // the static relays
	punches   *punchCounter

	reach   atomic.Int32 // network.Reachability
	mu      sync.Mutex
	relay   *relayv2.Relay // while this node relays for others
	relayOn bool           // RelayOn: serve whatever AutoNAT says
	auto    bool           // RelayAuto: serve once found public (decideRelay)
	dialled string         // RelayAuto: an inbound connection on a public address, as evidence
	why     string         // why this node relays or not, for status
	decide  sync.Mutex     // one decideRelay at a time
	closing bool           // shutdown has begun: no relay starts
	sub     event.Subscription
	done    chan struct{} // closed when sub's reader returns

	mapped *mappingFilter // keeps unconfirmed NAT mappings out of what it advertises
	punch  *puncher       // the hole punch service and its retries; nil when NAT traversal is off
	gate   *strangerGate  // strangers' inbound connections per address; nil without HostParams.Member

	log        *slog.Logger
	closeOnce  sync.Once
	closeErr   error
	closeBound time.Duration // how long Close waits for libp2p; CloseTimeout when zero
	closeFn    func() error  // replaces shutdown in tests

	// observed are the last addresses peers saw this host's direct
	// connections come from (identify), newest last.
	omu      sync.Mutex
	observed []observation
}

// observation is one peer's view of this host's address.
type observation struct {
	addr string // the address the peer saw
	peer peer.ID
}

// maxObservations bounds what the host keeps of its peers' views.
const maxObservations = 32

// start follows AutoNAT's verdict and, for RelayOn, starts the relay
// service at once. It also tells auto-relay that reachability is unknown
// right away, so that a private node reserves a relay slot at start
// rather than after AutoNAT's first probe (15 s and more); a node found
// public drops its reservations then.
func (h *Host) start(p NATParams) error {
	h.done = make(chan struct{})
	if p.Off {
		close(h.done)
		return nil
	}
	// Its reader never blocks, and Close closes it (which drains it) before
	// libp2p's close; the buffer rides out a burst of identifications.
	sub, err := h.EventBus().Subscribe([]any{new(event.EvtLocalReachabilityChanged), new(event.EvtPeerIdentificationCompleted),
		new(event.EvtLocalAddressesUpdated)},
		eventbus.Name("deepmarket nat"), eventbus.BufSize(64))
	if err != nil {
		return err
	}
	h.sub = sub
	switch p.RelayService {
	case RelayOn:
		h.relayOn, h.why = true, "relay_service = \"on\""
		if err := h.startRelay(); err != nil {
			sub.Close()
			return err
		}
	case RelayAuto:
		h.auto, h.why = true, "not yet: relay_service = \"auto\" relays once AutoNAT finds this node public or a peer outside dials it on a public address"
		h.Network().Notify(&network.NotifyBundle{ConnectedF: func(_ network.Network, c network.Conn) { h.inbound(c) }})
	default:
		h.why = "relay_service = \"off\""
	}
	em, err := h.EventBus().Emitter(new(event.EvtLocalReachabilityChanged), eventbus.Stateful)
	if err == nil {
		em.Emit(event.EvtLocalReachabilityChanged{Reachability: network.ReachabilityUnknown})
		em.Close()
	}
	go func() {
		defer close(h.done)
		for e := range sub.Out() {
			switch e := e.(type) {
			case event.EvtLocalReachabilityChanged:
				if old := network.Reachability(h.reach.Swap(int32(e.Reachability))); old != e.Reachability {
					h.punchInputs("reachability now " + reachabilityName(e.Reachability))
				}
				h.decideRelay()
			case event.EvtPeerIdentificationCompleted:
				if h.observe(e) {
					h.punchInputs("a new public mapping observed: " + e.ObservedAddr.String())
				}
			case event.EvtLocalAddressesUpdated:
				for _, a := range e.Current {
					if a.Action == event.Added && isRelayAddr(a.Address) {
						h.punchInputs("a new relay address: " + a.Address.String())
						break
					}
				}
			}
		}
	}()
	return nil
}

// inbound takes a connection a peer dialled to this host as evidence
// that it is public (RelayAuto): not relayed, on a public address of
// this host's own, from a public address (a peer outside, not one of its
// own network).
func (h *Host) inbound(c network.Conn) {
	if c.Stat().Direction != network.DirInbound || Relayed(c) || !manet.IsPublicAddr(c.LocalMultiaddr()) ||
		!manet.IsPublicAddr(c.RemoteMultiaddr()) || manet.IsIPLoopback(c.RemoteMultiaddr()) {
		return
	}
	h.mu.Lock()
	first := h.dialled == ""
	if first {
		h.dialled = fmt.Sprintf("dialled on its public address %s by %s from %s", c.LocalMultiaddr(), c.RemotePeer(), c.RemoteMultiaddr())
	}
	h.mu.Unlock()
	if first {
		go h.decideRelay() // not on libp2p's notifier
	}
}

// decideRelay starts or stops the relay service under RelayAuto: on
// while AutoNAT finds this node public, or once a peer outside has
// dialled it on a public address of its own; off when AutoNAT finds it
// private and no peer has. libp2p's own relay manager waits for AutoNAT
// alone, whose verdict needs several servers: a network whose only
// public node is this one may never give it, and then nobody relays.
func (h *Host) decideRelay() {
	if !h.auto {
		return
	}
	h.decide.Lock()
	defer h.decide.Unlock()
	reach := network.Reachability(h.reach.Load())
	h.mu.Lock()
	dialled := h.dialled
	h.mu.Unlock()
	switch {
	case dialled != "":
		h.setWhy("auto: " + dialled)
	case reach == network.ReachabilityPublic:
		h.setWhy("auto: AutoNAT found this node public")
	case reach == network.ReachabilityPrivate:
		h.stopRelay("auto: AutoNAT found this node private, and no peer outside has dialled it on a public address")
		return
	default:
		h.stopRelay("not yet: relay_service = \"auto\" relays once AutoNAT finds this node public (it has not answered) " +
			"or a peer outside dials it on a public address")
		return
	}
	if err := h.startRelay(); err != nil {
		h.log.Warn("cannot start the relay service", "module", "p2p", "err", err)
		h.setWhy("not relaying: " + err.Error())
	}
}

func (h *Host) setWhy(why string) {
	h.mu.Lock()
	h.why = why
	h.mu.Unlock()
}

// stopRelay stops the relay service, if it runs, saying why.
func (h *Host) stopRelay(why string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.why = why
	if h.relay != nil {
		h.relay.Close()
		h.relay = nil
	}
}

func (h *Host) startRelay() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.relay != nil || h.closing {
		return nil
	}
	r, err := relayv2.New(h.Host, h.relayOpts...)
	if err != nil {
		return err
	}
	h.relay = r
	return nil
}

// punchInputs tells the hole punch retries that what a punch has to work
// with changed.
func (h *Host) punchInputs(why string) {
	if h.punch != nil {
		h.punch.inputsChanged(why)
	}
}

// observe keeps what a peer saw of a direct connection from this host's
// listening port: a public address there is the host's NAT mapping. It
// says whether no other peer had seen that address.
func (h *Host) observe(e event.EvtPeerIdentificationCompleted) (isNew bool) {
	o := e.ObservedAddr
	if o == nil || e.Conn == nil || Relayed(e.Conn) || !manet.IsPublicAddr(o) || isRelayAddr(o) {
		return false
	}
	if !slices.ContainsFunc(h.Network().ListenAddresses(), func(l ma.Multiaddr) bool { return samePort(l, e.Conn.LocalMultiaddr()) }) {
		// An ephemeral port (a dial that could not reuse the listener's,
		// say while the last connection to that peer lingers in
		// TIME_WAIT): its mapping says nothing of the listener's, unless
		// the NAT kept the port, as it keeps the listener's then.
		if o = preservedMapping(o, e.Conn.LocalMultiaddr(), h.Network().ListenAddresses()); o == nil {
			return false
		}
	}
	h.omu.Lock()
	defer h.omu.Unlock()
	isNew = !slices.ContainsFunc(h.observed, func(x observation) bool { return x.addr == o.String() })
	h.observed = slices.DeleteFunc(h.observed, func(x observation) bool { return x.peer == e.Peer })
	h.observed = append(h.observed, observation{addr: o.String(), peer: e.Peer})
	if len(h.observed) > maxObservations {
		h.observed = h.observed[1:]
	}
	return isNew
}

// preservedMapping is the listener's mapping a NAT that keeps source
// ports gives it, inferred from observed, what a peer saw of a TCP
// connection from the ephemeral local address: when the NAT kept that
// port, the public address at the port of the TCP listener (listens) of
// the same IP version. Nil when the NAT changed the port (it may map the
// listener's anyhow: only an observation of the listener's own port says).
// One peer is enough to learn the mapping (with one public node, the
// only connection out may come from an ephemeral port).
func preservedMapping(observed, local ma.Multiaddr, listens []ma.Multiaddr) ma.Multiaddr {
	op, errO := observed.ValueForProtocol(ma.P_TCP)
	lp, errL := local.ValueForProtocol(ma.P_TCP)
	if errO != nil || errL != nil || op != lp {
		return nil
	}
	ip, rest := ma.SplitFirst(observed)
	if ip == nil || rest == nil {
		return nil
	}
	for _, l := range listens {
		lip, lrest := ma.SplitFirst(l)
		if lip == nil || lrest == nil || lip.Protocol().Code != ip.Protocol().Code {
			continue
		}
		if p, err := lrest.ValueForProtocol(ma.P_TCP); err == nil && p != "0" {
			if len(lrest) != 1 { // /tcp/PORT only: not a websocket or other stack
				continue
			}
			return append(ma.Multiaddr{*ip}, lrest...)
		}
	}
	return nil
}

// samePort says whether a and b are the same transport and port.
func samePort(a, b ma.Multiaddr) bool {
	for _, code := range []int{ma.P_TCP, ma.P_UDP} {
		pa, errA := a.ValueForProtocol(code)
		pb, errB := b.ValueForProtocol(code)
		if errA == nil || errB == nil {
			return errA == nil && errB == nil && pa == pb
		}
	}
	return false
}

// NATStatus is what a node knows of how it is reached.
type NATStatus struct {
	// Reachability is AutoNAT's verdict: "public" (peers can dial this
	// node), "private" (behind a NAT or firewall: peers reach it through a
	// relay, then a hole punch) or "unknown" (not probed yet, or NAT
	// traversal is off).
	Reachability string `json:"reachability"`
	// PublicAddrs are this node's addresses the internet sees, confirmed
	// or observed by peers (a NATed node's are its NAT's mapping).
	PublicAddrs []string `json:"public_addrs"`
	// RelayAddrs are the relayed addresses this node advertises while it is
	// private: /p2p/RELAY/p2p-circuit.
	RelayAddrs []string `json:"relay_addrs"`
	// Relaying says whether this node runs the relay service for members,
	// and RelayWhy why it does or does not.
	Relaying bool   `json:"relaying"`
	RelayWhy string `json:"relay_why,omitempty"`
	// HolePunches counts the hole punches tried since start, and how many
	// turned a relayed connection direct.
	HolePunches    int64 `json:"hole_punches"`
	HolePunchesWon int64 `json:"hole_punches_won"`
	// LastHolePunch is the last hole punch's outcome, with any peer.
	LastHolePunch *Punch `json:"last_hole_punch,omitempty"`
}

// NATOf reports h's NAT status; a host NewHost did not build reports
// unknown reachability and its addresses.
func NATOf(h host.Host) NATStatus {
	st := NATStatus{Reachability: "unknown", PublicAddrs: []string{}, RelayAddrs: []string{}}
	var observed []string
	nh, ok := h.(*Host)
	if ok {
		st.Reachability = reachabilityName(network.Reachability(nh.reach.Load()))
		nh.mu.Lock()
		st.Relaying, st.RelayWhy = nh.relay != nil, nh.why
		nh.mu.Unlock()
		st.HolePunches, st.HolePunchesWon = nh.punches.tried.Load(), nh.punches.won.Load()
		nh.punches.mu.Lock()
		if l := nh.punches.latest; l != nil {
			c := *l
			st.LastHolePunch = &c
		}
		nh.punches.mu.Unlock()
		nh.omu.Lock()
		for _, o := range nh.observed {
			observed = append(observed, o.addr)
		}
		nh.omu.Unlock()
	}
	public := map[string]bool{}
	for _, a := range h.Addrs() {
		if isRelayAddr(a) {
			st.RelayAddrs = append(st.RelayAddrs, a.String())
		} else if manet.IsPublicAddr(a) {
			public[a.String()] = true
		}
	}
	for _, a := range observed {
		public[a] = true
	}
	for a := range public {
		st.PublicAddrs = append(st.PublicAddrs, a)
	}
	slices.Sort(st.PublicAddrs)
	return st
}

func reachabilityName(r network.Reachability) string {
	switch r {
	case network.ReachabilityPublic:
		return "public"
	case network.ReachabilityPrivate:
		return "private"
	}
	return "unknown"
}

func isRelayAddr(a ma.Multiaddr) bool {
	_, err := a.ValueForProtocol(ma.P_CIRCUIT)
	return err == nil
}

// Relayed says whether c goes through a relay: a limited connection, for
// the market's small control streams only.
func Relayed(c network.Conn) bool { return c.Stat().Limited || isRelayAddr(c.RemoteMultiaddr()) }

// Direct says whether h has a direct (not relayed) connection to p.
func Direct(h host.Host, p peer.ID) bool {
	for _, c := range h.Network().ConnsToPeer(p) {
		if !Relayed(c) {
			return true
		}
	}
	return false
}

// TreatAsPublic makes libp2p count the IPv4 ranges cidrs, which must lie
// in private space (10/8, 100.64/10, 172.16/12, 192.168/16), as public
// addresses, in this whole process: for a testnet whose emulated internet
// uses private addresses, so that AutoNAT, relays and hole punching act on
// it as on the real one. Call it before NewHost. Production nodes never
// call it.
func TreatAsPublic(cidrs []*net.IPNet) error {
	for _, c := range cidrs {
		if c.IP.To4() == nil {
			return fmt.Errorf("treat %s as public: IPv4 ranges only", c)
		}
		inside := false
		for _, r := range manet.Private4 {
			ro, _ := r.Mask.Size()
			co, _ := c.Mask.Size()
			if r.Contains(c.IP) && co >= ro && !r.IP.IsLoopback() && !r.IP.IsLinkLocalUnicast() {
				inside = true
			}
		}
		if !inside {
			return fmt.Errorf("treat %s as public: only a part of a private range (10/8, 100.64/10, 172.16/12, 192.168/16) may be", c)
		}
	}
	out := manet.Private4
	for _, c := range cidrs {
		var next []*net.IPNet
		for _, r := range out {
			next = append(next, subtract(r, c)...)
		}
		out = next
	}
	manet.Private4 = out
	return nil
}

// subtract is r less c, as CIDRs: r itself when they do not overlap, none
// when c covers r, else the sibling of each prefix on the way from r down
// to c.
func subtract(r, c *net.IPNet) []*net.IPNet {
	ro, _ := r.Mask.Size()
	co, _ := c.Mask.Size()
	if !r.Contains(c.IP) && !c.Contains(r.IP) {
		return []*net.IPNet{r}
	}
	if co <= ro {
		return nil
	}
	ip := binary.BigEndian.Uint32(c.IP.To4())
	var out []*net.IPNet
	for bits := ro + 1; bits <= co; bits++ {
		mask := net.CIDRMask(bits, 32)
		sib := (ip &^ (1 << (32 - bits))) | (^ip & (1 << (32 - bits)))
		b := make(net.IP, 4)
		binary.BigEndian.PutUint32(b, sib&binary.BigEndian.Uint32(mask))
		out = append(out, &net.IPNet{IP: b, Mask: mask})
	}
	return out
}

// punchCounter counts hole punches from libp2p's hole punching events.
type punchCounter struct {
	tried, won atomic.Int64
	log        *slog.Logger
	onFail     func(peer.ID) // set before the first punch (startPuncher)

	mu       sync.Mutex
	attempts map[peer.ID]int
	last     map[peer.ID]Punch // bounded by maxPunchPeers
	latest   *Punch
}

// Punch is what the last hole punch with one peer came to: whether it
// turned the relayed connection direct, after how many attempts, and the
// error it ended with.
type Punch struct {
	Peer     string    `json:"peer"`
	At       time.Time `json:"at"`
	Success  bool      `json:"success"`
	Attempts int       `json:"attempts"`
	Error    string    `json:"error,omitempty"`
}

// String says it in words.
func (p Punch) String() string {
	if p.Success {
		return fmt.Sprintf("hole punched after %d %s", p.Attempts, plural(p.Attempts, "attempt", "attempts"))
	}
	return fmt.Sprintf("hole punch failed after %d %s: %s", p.Attempts, plural(p.Attempts, "attempt", "attempts"), p.Error)
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// maxPunchPeers bounds the peers whose last hole punch is kept.
const maxPunchPeers = 256

var _ holepunch.EventTracer = (*punchCounter)(nil)

// Trace counts the hole punches and keeps each peer's last outcome; a
// failure is logged with its attempts and error.
func (c *punchCounter) Trace(e *holepunch.Event) {
	var end *Punch
	c.mu.Lock()
	if c.attempts == nil {
		c.attempts, c.last = map[peer.ID]int{}, map[peer.ID]Punch{}
	}
	switch ev := e.Evt.(type) {
	case *holepunch.HolePunchAttemptEvt:
		c.attempts[e.Remote] = ev.Attempt
	case *holepunch.EndHolePunchEvt:
		c.tried.Add(1)
		if ev.Success {
			c.won.Add(1)
		}
		end = &Punch{Peer: e.Remote.String(), At: time.Now().UTC(), Success: ev.Success, Attempts: c.attempts[e.Remote], Error: ev.Error}
	case *holepunch.ProtocolErrorEvt:
		end = &Punch{Peer: e.Remote.String(), At: time.Now().UTC(), Attempts: c.attempts[e.Remote], Error: "protocol: " + ev.Error}
	}
	if end != nil {
		delete(c.attempts, e.Remote)
		if _, ok := c.last[e.Remote]; !ok && len(c.last) >= maxPunchPeers {
			for p := range c.last { // any: a bound, not an order
				delete(c.last, p)
				break
			}
		}
		c.last[e.Remote], c.latest = *end, end
	}
	c.mu.Unlock()
	if end != nil && !end.Success {
		if c.log != nil {
			c.log.Info("hole punch failed: the connection stays relayed", "module", "p2p", "peer", end.Peer, "attempts", end.Attempts, "err", end.Error)
		}
		if c.onFail != nil {
			c.onFail(e.Remote)
		}
	}
}

// lastWith is peer p's last hole punch, if any.
func (c *punchCounter) lastWith(p peer.ID) (Punch, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	pu, ok := c.last[p]
	return pu, ok
}

// PunchWith says why h's connection to p is relayed, not direct: its last
// hole punch with p, or that there has been none (and whether h has a
// public address to punch with); "" for a host NewHost did not build.
func PunchWith(h host.Host, p peer.ID) string {
	nh, ok := h.(*Host)
	if !ok {
		return ""
	}
	if pu, ok := nh.punches.lastWith(p); ok {
		return pu.String()
	}
	if st := NATOf(h); len(st.PublicAddrs) == 0 {
		return "no hole punch yet: no peer has observed this node's public address, and a punch needs one"
	}
	return "no hole punch yet"
}

// How a machine is reached, as its offer says (Offer.Reach).
const (
	// ReachPublic: peers dial it.
	ReachPublic = "public"
	// ReachNAT: behind a NAT that keeps one public mapping for all peers
	// (endpoint-independent mapping): a hole punch turns a relayed
	// connection direct.
	ReachNAT = "nat"
	// ReachRelay: behind a NAT that maps each peer to a new port
	// (symmetric), or with no public mapping seen: only a relay, a public
	// machine it dials, or a machine of its own network reach it.
	ReachRelay = "relay"
)

// ReachOf classifies how other machines reach h, from AutoNAT's verdict
// and the public addresses its peers observe: a private host whose peers
// see one port per address is ReachNAT, one they see at several ports of
// one IP (a new mapping per peer) or at none is ReachRelay. Empty while
// AutoNAT has not answered.
func ReachOf(h host.Host) string {
	st := NATOf(h)
	switch st.Reachability {
	case "public":
		return ReachPublic
	case "private":
	default:
		return ""
	}
	ports := map[string]map[string]bool{} // IP and transport -> ports seen
	for _, s := range st.PublicAddrs {
		a, err := ma.NewMultiaddr(s)
		if err != nil {
			continue
		}
		ip, err1 := manet.ToIP(a)
		tr, port := "tcp", ""
		if p, err := a.ValueForProtocol(ma.P_TCP); err == nil {
			port = p
		} else if p, err := a.ValueForProtocol(ma.P_UDP); err == nil {
			tr, port = "udp", p
		}
		if err1 != nil || port == "" {
			continue
		}
		k := tr + " " + ip.String()
		if ports[k] == nil {
			ports[k] = map[string]bool{}
		}
		ports[k][port] = true
	}
	if len(ports) == 0 {
		return ReachRelay
	}
	for _, ps := range ports {
		if len(ps) > 1 {
			return ReachRelay
		}
	}
	return ReachNAT
}

// AddRelayAddrs gives p an address through each of h's static relays
// (the network's public nodes) when h knows no address of p: a machine
// behind a NAT that this node never met is reached through the relay it
// holds a slot on. Dials through relays where p holds none fail at once.
func AddRelayAddrs(h host.Host, p peer.ID) {
	nh, ok := h.(*Host)
	if !ok || len(nh.relays) == 0 || p == h.ID() || len(h.Peerstore().Addrs(p)) > 0 {
		return
	}
	for _, r := range nh.relays {
		if r.ID == p {
			continue
		}
		for _, a := range r.Addrs {
			c, err := ma.NewMultiaddr("/p2p/" + r.ID.String() + "/p2p-circuit")
			if err != nil {
				continue
			}
			h.Peerstore().AddAddr(p, a.Encapsulate(c), peerstore.TempAddrTTL)
		}
		h.Peerstore().AddAddrs(r.ID, r.Addrs, peerstore.TempAddrTTL)
	}
}

// mappingFilter keeps a NAT's mapping out of the addresses a host
// advertises until AutoNAT v2 has confirmed that peers can dial it. libp2p
// advertises an observed address once enough peers (4) have seen it, but a
// campus NAT drops dials that its machine did not ask for: a peer that
// finds the mapping in its peerstore dials it first, and a hole punch
// waits that dial out (make bench-nat: 5 s with libp2p's timeout, before
// punchDialTimeout). Hole punching does not need the mapping advertised:
// DCUtR sends the addresses even one peer observed. An address on one of
// the machine's own interfaces is advertised as before (a public
// machine's), and so is a mapping AutoNAT v2 found reachable (a port
// forward, a cloud machine's 1:1 NAT).
type mappingFilter struct {
	host atomic.Pointer[confirmer] // set once libp2p has made the host

	mu    sync.Mutex
	local map[netip.Addr]bool // the interfaces' addresses, as of at
	at    time.Time
}

// confirmer is libp2p's basic host: the addresses AutoNAT v2 has tried.
type confirmer interface {
	ConfirmedAddrs() (reachable, unreachable, unknown []ma.Multiaddr)
}

// localTTL is how long the interfaces' addresses are cached.
const localTTL = 10 * time.Second

func (f *mappingFilter) apply(addrs []ma.Multiaddr) []ma.Multiaddr {
	var reachable map[string]bool
	out := addrs[:0:0]
	for _, a := range addrs {
		if isRelayAddr(a) || !manet.IsPublicAddr(a) || f.isLocal(a) {
			out = append(out, a)
			continue
		}
		if reachable == nil {
			reachable = map[string]bool{}
			if c := f.host.Load(); c != nil {
				r, _, _ := (*c).ConfirmedAddrs()
				for _, x := range r {
					reachable[string(x.Bytes())] = true
				}
			}
		}
		if reachable[string(a.Bytes())] {
			out = append(out, a)
		}
	}
	return out
}

// isLocal says whether a's IP is on one of this machine's interfaces
// (true when they cannot be listed: nothing is then hidden).
func (f *mappingFilter) isLocal(a ma.Multiaddr) bool {
	ip, err := manet.ToIP(a)
	if err != nil {
		return true
	}
	addr, ok := netip.AddrFromSlice(ip)
	if !ok {
		return true
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.local == nil || time.Since(f.at) > localTTL {
		ifs, err := net.InterfaceAddrs()
		if err != nil {
			return true
		}
		f.local, f.at = map[netip.Addr]bool{}, time.Now()
		for _, x := range ifs {
			if n, ok := x.(*net.IPNet); ok {
				if ia, ok := netip.AddrFromSlice(n.IP); ok {
					f.local[ia.Unmap()] = true
				}
			}
		}
	}
	return f.local[addr.Unmap()]
}
