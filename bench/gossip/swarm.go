package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/p2p"
)

const chain = "deepmarket-bench-gossip"

// run is one measured run's settings.
type run struct {
	Nodes    int
	Degree   int           // connections each node has, on average
	Interval time.Duration // how often each node re-announces its offer
	TTL      time.Duration
	Warmup   time.Duration // after every node is connected, before measuring
	Window   time.Duration // how long to measure
	Join     bool          // then have two newcomers join (see newcomers)
}

// sample is what one run measured, per node and per minute of the window.
type sample struct {
	Nodes      int     `json:"nodes"`
	IntervalS  float64 `json:"announce_interval_s"`
	Degree     float64 `json:"mean_degree"`
	WindowS    float64 `json:"window_s"`
	Announced  float64 `json:"offers_announced_per_min"` // R: all nodes together, counted over the window
	SentBytes  float64 `json:"sent_bytes_per_node_min"`
	RecvBytes  float64 `json:"recv_bytes_per_node_min"`
	CPUSeconds float64 `json:"cpu_s_per_node_min"`
	Validated  float64 `json:"validated_per_node_min"`
	Rejected   float64 `json:"rejected_per_node_min"`
	TopicPeers float64 `json:"offers_topic_peers"` // mean, at the window's end
	// NegativeScore is the share of peers their nodes scored below zero
	// at the window's end (gossipsub penalizes broken promises under load).
	NegativeScore float64 `json:"peers_scored_negative"`
	Delivered     float64 `json:"delivered"`     // offers accepted / offers expected (each node hears every other)
	ProcessCPU    float64 `json:"process_cores"` // cores this process kept busy
	MachineBusy   float64 `json:"machine_busy"`  // share of all cores busy, all processes
	Contended     bool    `json:"cpu_contended"` // see contended
	Note          string  `json:"note,omitempty"`
}

// contended says whether a run's figures are bounded by the machine: the
// swarm kept most of the cores busy, or offers did not reach every node
// (gossipsub drops what its queues cannot hold). The machine being busy
// with other work is reported but does not bound the figures by itself:
// CPU time counts work done, not waiting.
func (s sample) contended(cpus int) bool {
	return s.ProcessCPU > 0.75*float64(cpus) || s.Delivered < 0.98
}

// admission is the ledger's answer for the swarm: every bench machine is
// registered to the account of its own key, looked up in a map as the
// node's replica does.
type admission map[string]identity.Address

func (a admission) Machine(key []byte) (identity.Address, bool) {
	owner, ok := a[string(key)]
	return owner, ok
}

func (a admission) Bidder([]byte, uint64) error { return nil }

var _ p2p.Admission = admission(nil)

type member struct {
	key       *identity.Key
	host      host.Host
	gossip    *p2p.Gossip
	accepted  atomic.Int64 // others' offers this node accepted
	published atomic.Int64 // offers this node announced
	// scored and negative count this node's peers and those it scores
	// below zero, at gossipsub's last score inspection.
	scored, negative atomic.Int64
}

func (m *member) inspect(scores map[peer.ID]float64) {
	var neg int64
	for _, v := range scores {
		if v < 0 {
			neg++
		}
	}
	m.scored.Store(int64(len(scores)))
	m.negative.Store(neg)
}

func key(i int) *identity.Key {
	seed := make([]byte, 32)
	copy(seed, fmt.Sprintf("bench-gossip-%d", i))
	k, err := identity.KeyFromSeed(seed)
	if err != nil {
		panic(err)
	}
	return k
}

// offer is the offer a lab machine announces, as large as a real one: a
// window, free disk, and the four addresses a node listening on its
// defaults advertises (TCP and QUIC over IPv4 and IPv6, each with
// /p2p/<id>, as FullAddrs writes them).
func offer(k *identity.Key, i int) *p2p.Offer {
	id := k.PeerID().String()
	return &p2p.Offer{
		Machine: id, Owner: string(k.Address()), Moniker: fmt.Sprintf("lab-pc-%d", i), Site: "univ-a",
		Lent:      p2p.Resources{Cores: 8, MemBytes: 16 << 30},
		DiskBytes: 200 << 30,
		Price:     p2p.Prices{CoreHour: 100_000, MemGiBHour: 20_000},
		Window:    "19:00-07:00",
		Addrs: []string{
			"/ip4/10.1.2.3/tcp/7701/p2p/" + id, "/ip4/10.1.2.3/udp/7701/quic-v1/p2p/" + id,
			"/ip6/2001:db8::1:2:3/tcp/7701/p2p/" + id, "/ip6/2001:db8::1:2:3/udp/7701/quic-v1/p2p/" + id,
		},
		Software: p2p.Software{OS: "linux", Arch: "amd64", Python: "3.11.2", TensorFlow: "2.17.0", Version: "bench"},
	}
}

// measure starts r.Nodes gossip nodes in this process on loopback TCP,
// connects each to r.Degree/2 random others (so about r.Degree
// connections each), has every node re-announce its offer every
// r.Interval from a random phase, and measures the process over r.Window
// after r.Warmup.
func measure(r run, rng *rand.Rand) (sample, *joined, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reg := prometheus.NewRegistry()
	metrics := p2p.NewMetrics(reg)
	members := make([]*member, r.Nodes)
	admit := admission{}
	for i := range members {
		k := key(i)
		members[i] = &member{key: k}
		admit[string(k.Public())] = k.Address()
	}
	var closers sync.WaitGroup
	defer closers.Wait()
	for i, m := range members {
		h, err := p2p.NewHost(p2p.HostParams{Key: m.key, Listen: []string{"/ip4/127.0.0.1/tcp/0"}, Version: "bench"})
		if err != nil {
			return sample{}, nil, fmt.Errorf("node %d: %w", i, err)
		}
		m.host = h
		defer closers.Go(func() { h.Close() })
		if m.gossip, err = p2p.NewGossip(ctx, p2p.GossipParams{Host: h, Key: m.key, ChainID: chain, Metrics: metrics, Admission: admit,
			ScoreInspect: m.inspect, ScoreInspectPeriod: 5 * time.Second}); err != nil {
			return sample{}, nil, fmt.Errorf("node %d: %w", i, err)
		}
	}
	links := 0
	dials := errgroup.Group{}
	dials.SetLimit(8)
	seen := map[[2]int]bool{}
	for i, m := range members {
		for range r.Degree / 2 {
			j := rng.IntN(r.Nodes - 1)
			if j >= i {
				j++
			}
			pair := [2]int{min(i, j), max(i, j)}
			if seen[pair] {
				continue
			}
			seen[pair] = true
			links++
			to := members[j].host
			dials.Go(func() error {
				return m.host.Connect(ctx, peer.AddrInfo{ID: to.ID(), Addrs: to.Addrs()})
			})
		}
	}
	if err := dials.Wait(); err != nil {
		return sample{}, nil, fmt.Errorf("connect: %w", err)
	}

	var loops sync.WaitGroup
	defer loops.Wait()
	defer cancel() // runs before loops.Wait
	// Two members keep their books as signed and serve them, for the
	// newcomers.
	books := []*keeper{{seen: map[string][]byte{}}, {seen: map[string][]byte{}}}
	for i, b := range books {
		m := members[i]
		rpc := &p2p.RPC{Host: m.host, Key: m.key, ChainID: chain}
		rpc.Handle(p2p.BookProtocol(chain), (&p2p.BookServer{Entries: b.entries, PagesPerMinute: 600}).Handle)
	}
	for i, m := range members {
		self := m.key.PeerID()
		var book *keeper
		if i < len(books) {
			book = books[i]
		}
		loops.Go(func() {
			m.gossip.Offers().Run(ctx, func(rec *p2p.Received) {
				if rec.Signer != self {
					m.accepted.Add(1)
				}
				if book != nil {
					book.add(rec)
				}
			})
		})
		phase := time.Duration(rng.Int64N(int64(r.Interval)))
		o := offer(m.key, i)
		loops.Go(func() { announce(ctx, m.gossip.Offers(), o, phase, r.Interval, r.TTL, &m.published) })
	}
	time.Sleep(r.Warmup)

	before, err := snapshot(reg, members)
	if err != nil {
		return sample{}, nil, err
	}
	time.Sleep(r.Window)
	after, err := snapshot(reg, members)
	if err != nil {
		return sample{}, nil, err
	}

	n := float64(r.Nodes)
	wall := after.at.Sub(before.at)
	perNodeMin := func(v float64) float64 { return v / n / wall.Minutes() }
	published := after.published - before.published
	s := sample{
		Nodes:       r.Nodes,
		IntervalS:   r.Interval.Seconds(),
		Degree:      2 * float64(links) / n,
		WindowS:     wall.Seconds(),
		Announced:   published / wall.Minutes(),
		SentBytes:   perNodeMin(after.wchar - before.wchar),
		RecvBytes:   perNodeMin(after.rchar - before.rchar),
		CPUSeconds:  perNodeMin(after.cpu - before.cpu),
		Validated:   perNodeMin(after.validated - before.validated),
		Rejected:    perNodeMin(after.rejected - before.rejected),
		Delivered:   (after.accepted - before.accepted) / (published * (n - 1)),
		ProcessCPU:  (after.cpu - before.cpu) / wall.Seconds(),
		MachineBusy: (after.busy - before.busy) / (after.total - before.total),
	}
	var scored, negative int64
	for _, m := range members {
		s.TopicPeers += float64(len(m.gossip.Offers().ListPeers())) / n
		scored += m.scored.Load()
		negative += m.negative.Load()
	}
	if scored > 0 {
		s.NegativeScore = float64(negative) / float64(scored)
	}
	s.Contended = s.contended(runtime.NumCPU())
	if !r.Join {
		return s, nil, nil
	}
	j, err := newcomers(ctx, r, members, books, admit, rng, r.Interval+r.Interval/5+10*time.Second)
	if err != nil {
		return s, nil, fmt.Errorf("newcomers: %w", err)
	}
	return s, &j, nil
}

// announce publishes o every interval, the first time after phase, until
// ctx ends, as the node's lender does, counting what it published.
func announce(ctx context.Context, t *p2p.Topic, o *p2p.Offer, phase, interval, ttl time.Duration, published *atomic.Int64) {
	timer := time.NewTimer(phase)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		if t.PublishOffer(ctx, o, ttl) == nil { // fails only when ctx ends
			published.Add(1)
		}
		timer.Reset(interval)
	}
}

// counters is the process and the swarm at one instant.
type counters struct {
	at                  time.Time
	cpu                 float64 // process user+system seconds
	rchar, wchar        float64 // bytes the process read and wrote: loopback TCP, Noise and yamux framing included
	busy, total         float64 // machine-wide CPU ticks (all processes)
	validated, rejected float64
	accepted, published float64
}

func snapshot(reg *prometheus.Registry, members []*member) (counters, error) {
	// The counters that move fastest first, close together: on a loaded
	// machine this goroutine may wait a while between steps.
	c := counters{at: time.Now()}
	for _, m := range members {
		c.accepted += float64(m.accepted.Load())
		c.published += float64(m.published.Load())
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return c, fmt.Errorf("getrusage: %w", err)
	}
	c.cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
	io, err := procFields("/proc/self/io", ":")
	if err != nil {
		return c, err
	}
	c.rchar, c.wchar = io["rchar"], io["wchar"]
	if c.busy, c.total, err = machineTicks(); err != nil {
		return c, err
	}
	families, err := reg.Gather()
	if err != nil {
		return c, fmt.Errorf("gather metrics: %w", err)
	}
	for _, f := range families {
		if f.GetName() != "deepmarket_p2p_messages_validated_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			v := m.GetCounter().GetValue()
			c.validated += v
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == "reject" {
					c.rejected += v
				}
			}
		}
	}
	return c, nil
}

// procFields reads "name<sep> value" lines.
func procFields(path, sep string) (map[string]float64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w (the benchmark needs Linux)", path, err)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(b), "\n") {
		name, v, ok := strings.Cut(line, sep)
		if !ok {
			continue
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err == nil {
			out[strings.TrimSpace(name)] = f
		}
	}
	return out, nil
}

// machineTicks returns the busy and total CPU ticks of all cores from
// /proc/stat (idle and iowait count as not busy).
func machineTicks() (busy, total float64, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, fmt.Errorf("read /proc/stat: %w (the benchmark needs Linux)", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	fields := strings.Fields(line)
	if len(fields) < 6 || fields[0] != "cpu" {
		return 0, 0, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	for i, f := range fields[1:] {
		v, _ := strconv.ParseFloat(f, 64)
		total += v
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	return busy, total, nil
}
