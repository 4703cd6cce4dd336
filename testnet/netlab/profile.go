package netlab

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// Link describes one direction of a network path: what a packet that takes
// it meets. The zero Link is a perfect wire.
type Link struct {
	// Delay is the one-way delay.
	Delay time.Duration
	// Jitter is the standard deviation of the one-way delay, drawn from a
	// normal distribution. Packets are never reordered by it (see the
	// package documentation).
	Jitter time.Duration
	// RateBits is the bandwidth in bits per second, 0 for unlimited.
	RateBits uint64
	// Loss is the share of packets dropped at random, in percent.
	Loss float64
}

func (l Link) validate() error {
	switch {
	case l.Delay < 0:
		return fmt.Errorf("delay %v is negative", l.Delay)
	case l.Jitter < 0:
		return fmt.Errorf("jitter %v is negative", l.Jitter)
	case l.Delay > time.Minute || l.Jitter > time.Minute:
		return fmt.Errorf("delay %v or jitter %v is over a minute", l.Delay, l.Jitter)
	case math.IsNaN(l.Loss) || l.Loss < 0 || l.Loss >= 100:
		return fmt.Errorf("loss %g%% is not in [0, 100)", l.Loss)
	case l.RateBits != 0 && l.RateBits < 8000:
		return fmt.Errorf("rate %d bit/s is under 8 kbit/s", l.RateBits)
	}
	return nil
}

// Profile is a network to emulate: the links inside every site, and each
// site's link to the others.
type Profile struct {
	Name string
	// Doc says what the profile stands for and where its numbers come from.
	Doc string
	// Intra is the path between two nodes of one site, node to node: its
	// Delay is half the intra-site round trip.
	Intra Link
	// WAN holds each site's uplink to the core that joins the sites, in
	// each direction; site k uses WAN[k % len(WAN)]. A packet from site i
	// to site j crosses both uplinks, so the round trip between them is
	// 2·(Intra.Delay + WAN[i].Delay + WAN[j].Delay). Empty: the sites
	// are joined with no delay, as on one campus.
	WAN []Link
}

func (p Profile) validate() error {
	if p.Name == "" {
		return fmt.Errorf("profile has no name: start from ProfileByName(%q)", "lan")
	}
	if err := p.Intra.validate(); err != nil {
		return fmt.Errorf("profile %s: intra: %w", p.Name, err)
	}
	for k, l := range p.WAN {
		if err := l.validate(); err != nil {
			return fmt.Errorf("profile %s: WAN[%d]: %w", p.Name, k, err)
		}
	}
	return nil
}

// wan is site k's uplink.
func (p Profile) wan(site int) Link {
	if len(p.WAN) == 0 {
		return Link{}
	}
	return p.WAN[site%len(p.WAN)]
}

// RTT is the nominal round-trip time between a node of site a and a node of
// site b (a == b: two nodes of one site), without jitter or queueing.
func (p Profile) RTT(a, b int) time.Duration {
	if a == b {
		return 2 * p.Intra.Delay
	}
	return 2 * (p.Intra.Delay + p.wan(a).Delay + p.wan(b).Delay)
}

// HostRTT is the nominal round-trip time between the host (the root
// namespace) and a node of site k: the host sits at the core.
func (p Profile) HostRTT(site int) time.Duration {
	return p.Intra.Delay + 2*p.wan(site).Delay
}

// The profiles' numbers; docs/network-profiles.md says where each comes
// from.
var (
	lanIntra = Link{Delay: 100 * time.Microsecond, RateBits: 1_000_000_000}

	wifiIntra = Link{
		Delay:    3 * time.Millisecond,
		Jitter:   1500 * time.Microsecond,
		RateBits: 60_000_000,
		Loss:     0.2,
	}

	// One-way delays from each region to a virtual core, fitted to AWS
	// inter-region round trips (least squares on relative error; every
	// pair within 1.5% of the table).
	multiDCWAN = []Link{
		{Delay: 2500 * time.Microsecond, Jitter: 500 * time.Microsecond, RateBits: 100_000_000, Loss: 0.005},  // us-east-1, N. Virginia
		{Delay: 37500 * time.Microsecond, Jitter: 500 * time.Microsecond, RateBits: 100_000_000, Loss: 0.005}, // eu-west-1, Ireland
		{Delay: 57500 * time.Microsecond, Jitter: 500 * time.Microsecond, RateBits: 100_000_000, Loss: 0.005}, // sa-east-1, São Paulo
		{Delay: 70 * time.Millisecond, Jitter: 500 * time.Microsecond, RateBits: 100_000_000, Loss: 0.005},    // ap-northeast-1, Tokyo
	}
)

// Profiles returns the built-in profiles: lan, wifi and multi-dc.
func Profiles() []Profile {
	return []Profile{
		{
			Name: "lan",
			Doc: "A wired university lab: hosts on one switched 1 GbE network. " +
				"RTT 0.2 ms, 1 Gbit/s, no loss; all sites on one campus.",
			Intra: lanIntra,
		},
		{
			Name: "wifi",
			Doc: "Lab machines on the WiFi (802.11n/ac) of a busy campus building, " +
				"as DeepMarket's 2019 Portland State prototype ran: node to node " +
				"through the access point, RTT 6 ms (two WiFi hops of about 3 ms, " +
				"the median WiFi hop latency measured on a campus by Sui et al., " +
				"MobiSys 2016) with 1.5 ms jitter, 60 Mbit/s, 0.2% loss; " +
				"all sites on one campus.",
			Intra: wifiIntra,
		},
		{
			Name: "multi-dc",
			Doc: "Sites in four cloud regions (us-east-1, eu-west-1, sa-east-1, " +
				"ap-northeast-1, cycled), each a lan behind a 100 Mbit/s uplink; " +
				"inter-site RTTs of 80 to 255 ms fitted to published AWS " +
				"inter-region round trips; 0.01% loss site to site.",
			Intra: lanIntra,
			WAN:   append([]Link(nil), multiDCWAN...),
		},
	}
}

// ProfileByName returns the built-in profile with that name.
func ProfileByName(name string) (Profile, error) {
	var names []string
	for _, p := range Profiles() {
		if p.Name == name {
			return p, nil
		}
		names = append(names, p.Name)
	}
	return Profile{}, fmt.Errorf("unknown network profile %q: choose one of %s", name, strings.Join(names, ", "))
}

// intraHop is the shaping on each egress of a node's link, which a packet between
// two nodes of a site crosses twice: half the delay, and jitter and loss
// split so that the two hops add up to the profile's.
func intraHop(l Link) Link {
	return Link{
		Delay:    l.Delay / 2,
		Jitter:   time.Duration(float64(l.Jitter) / math.Sqrt2),
		RateBits: l.RateBits,
		Loss:     100 * (1 - math.Sqrt(1-l.Loss/100)),
	}
}
