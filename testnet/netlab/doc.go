// Package netlab puts each node of a testnet in a Linux network namespace of
// its own, on an emulated network: a wired lab, a campus WiFi, or data
// centres in several regions, with sites that can be cut off and healed.
//
// It owns the namespaces, interfaces, routes and shaping it makes, every one
// named after the lab's tag, and nothing else: it starts no node (callers run
// programs with Lab.Cmd or `ip netns exec`, or open sockets in a namespace
// with Lab.Do) and changes none of the host's settings but one interface and
// one route. It imports the standard library and golang.org/x/sys only, and
// must not import other DeepMarket packages.
//
// # Topology
//
// With tag T and octet B (Config.Octet; by default the first of 77 to 99 that
// no route of the host overlaps):
//
//	root namespace (the host)    Th 10.B.255.1/30, route 10.B.0.0/16 via 10.B.255.2
//	      | veth, not shaped
//	T-core   host 10.B.255.2/30          routes between sites; ip_forward=1 here only
//	         gw0 10.B.0.1/24   gw1 10.B.1.1/24   ...   a site's gateway
//	          | uplink: WAN[0]  | uplink: WAN[1]
//	         up0               up1
//	         [br0]             [br1]             ...   one bridge per site
//	         s0n0  s0n1        s1n0  s1n1              the nodes' ports
//	          |     |           |     |                node links: Intra
//	T-s0n0 eth0 10.B.0.10/24, default via 10.B.0.1;  T-s0n1 eth0 10.B.0.11/24 ...
//
// Node i of site k lives in namespace T-sKnI with address 10.B.k.(i+10) on
// eth0. Th is the lab's only interface in the root namespace; the host
// reaches every node through it, and nodes reach the host at 10.B.255.1
// (Lab.HostIP).
//
// # Sites behind a NAT
//
// Config.NAT puts sites behind campus NATs (site k, for k up to
// MaxNATSite). The nodes of such a site keep their private addresses,
// their default route via 10.B.k.1 and their bridge, but that gateway is
// in a router namespace of the site's own, T-rK, at the far end of the
// uplink, and the router reaches the core through a link that is not
// shaped:
//
//	T-core   rK 10.B.254.(4k+1)/30                  no gwK, no route to 10.B.k.0/24
//	          | veth, not shaped
//	T-rK     wan 10.B.254.(4k+2)/30, default via 10.B.254.(4k+1); ip_forward=1
//	         gwK 10.B.k.1/24
//	          | uplink: WAN[k]
//	         upK [brK] sKn0 sKn1 ...               in the core, as for a public site
//
// nftables in the router masquerades what leaves through wan to the wan
// address (Lab.PublicIP), keeping the source port when it is free:
// endpoint-independent mapping with address-and-port-dependent filtering,
// a port-restricted cone NAT (NATCone). NATSymmetric adds fully-random, a
// random external port for each new flow. The router forwards what comes
// from the site and, from wan, only what conntrack takes for replies
// (established or related); anything else that arrives on wan, for the
// router or through it, is dropped without an RST or ICMP error, as real
// NATs do, so TCP simultaneous open and UDP hole punching work through
// cone NATs. The core has no route to a NATed site's /24: outside the
// site, nothing reaches its nodes but replies, and the rest of the lab
// sees them at their router's address. Lab.PublicCIDRs lists the ranges
// a node can reach unasked, the lab's "internet": each public site's /24,
// 10.B.254.0/24 and the host's /30. Round trips are as for a public site
// (the router and its veth add no delay); the router's conntrack and
// forwarding add some microseconds.
//
// # Shaping: a star
//
// Every link is shaped at both of its egresses, so both directions are.
// A node's link delays by Intra.Delay/2 each way (jitter and loss split so
// that two hops add up to the profile's): two nodes of one site, which talk
// through their bridge only, see a round trip of 2·Intra.Delay. A site's
// uplink, between its gateway and its bridge, delays by WAN[k].Delay each
// way: the sites form a star around the core, and a packet between sites i
// and j crosses both uplinks, so
//
//	RTT(i, j) = 2·(Intra.Delay + WAN[i].Delay + WAN[j].Delay)
//
// and the host, at the core, sees Intra.Delay + 2·WAN[k].Delay to site k
// (Profile.RTT, Profile.HostRTT). A star gives each pair of sites the sum
// of two per-site delays; for the four regions of the multi-dc profile
// that fits the measured inter-region round trips within 1.5%.
//
// The uplink is a link of its own rather than a qdisc on the egress of
// the site's bridge. On Linux 6.18 a qdisc on a bridge's egress does shape
// routed packets leaving through it and not packets bridged between its
// ports (checked with tbf: a routed flow held to 2 Mbit/s, a bridged one
// not), so that would work for netem too; but it shapes only the way into
// the site, and the userspace shaper needs a link there anyway.
//
// # Jitter without reordering
//
// netem reorders packets whose jittered delays cross, and TCP takes
// reordering for loss. With a rate set, though, netem sends no packet
// before the one queued ahead of it (sch_netem.c, netem_enqueue), so an
// egress with jitter always gets a rate: the profile's, or 10 Gbit/s when it
// has none.
// Jitter is normal with the profile's standard deviation, truncated at zero
// delay.
//
// # Shapers
//
// ShaperNetem makes every link a veth pair with a netem qdisc at each end
// (limit 10000 packets; gso_max_segs 1, so that loss and rate apply to
// packets, not to 64 kB TSO bursts):
// the kernel shapes, and the lab outlives its process until Close or
// Cleanup. Some kernels are built without sch_netem (the one this package
// was written on is), so ShaperUserspace makes every link two TAP devices
// and moves the frames between them in this process, with netem's rules
// (delay, normal jitter, rate, random loss, a 10000-frame queue, no
// reordering) and timerfd wake-ups accurate to some tens of microseconds.
// One TCP flow got 650 to 900 Mbit/s through it on a 2-core VM, and it
// adds about 0.15 ms to a round trip inside a site; its links go dead when
// the process exits.
// ShaperNone makes bare veth pairs and shapes nothing, for a lab of many
// nodes (bench-scale's 100) where one process moving every frame would
// be the bottleneck. ShaperAuto, the default, picks netem when the kernel
// has it, else the userspace shaper.
//
// # Partition
//
// Lab.Partition(k) adds policy-routing rules in the core: packets routed
// from or to site k's /24 (for a site behind a NAT, its router's wan /30)
// are blackholed, unless they come from or go to the host. Packets between nodes of site k are bridged, never routed, so
// no rule sees them. Packets across the cut vanish, as on a cut cable (no
// ICMP error: TCP times out rather than failing fast). Lab.Heal(k) deletes
// the rules. No iptables is needed.
//
// # Requirements and cleanup
//
// Root, iproute2 (ip, and tc for netem), and a kernel with network
// namespaces, veth, bridges and either sch_netem or TAP devices; Available
// says which is missing. Sites behind a NAT also need nftables' nft and a
// kernel with nf_tables, conntrack and masquerade; AvailableNAT checks
// those too, and scripts/netlab-env.sh installs nftables. IPv4 only: nodes have IPv6 link-local addresses
// but no IPv6 routes. Create serializes on /run/netlab.lock while it picks
// the octet. Close removes everything; after a crash, Cleanup(tag) does,
// by name.
//
// docs/network-profiles.md lists the profiles' numbers and their sources.
package netlab
