package p2p

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/deepmarket/deepmarket/identity"
)

// LinkSample is one measured path from the offering machine to another
// machine: what a scheduler needs to predict how fast a job's workers on
// the two can exchange weights.
type LinkSample struct {
	Machine   string `cbor:"m" json:"machine"`
	RTTMicros uint32 `cbor:"rtt" json:"rtt_us"`
	// KBps is what one stream carried in the probe, in 1000 bytes/s.
	KBps uint32 `cbor:"kbps" json:"kbytes_per_s"`
}

// Bounds of the link samples an offer carries.
const (
	MaxLinks     = 32
	maxRTTMicros = 60_000_000 // a minute
	maxKBps      = 100_000_000
)

// ProbeBytes is what one throughput probe sends: large enough to leave
// the first round trips behind on a campus link, small enough that
// probing 32 machines every quarter hour costs a lab machine ~10 kB/s.
const ProbeBytes = 256 << 10

// probeTimeout bounds one probe, on either side.
const probeTimeout = 10 * time.Second

// ProbeProtocol measures a link: a one-byte echo for the round trip, then
// ProbeBytes acknowledged at their end for the throughput.
func ProbeProtocol(chainID string) protocol.ID {
	return protocol.ID("/deepmarket/" + chainID + "/probe/1")
}

func checkLinks(self string, links []LinkSample) error {
	if len(links) > MaxLinks {
		return rangeErr("%d link samples, at most %d", len(links), MaxLinks)
	}
	seen := make(map[string]bool, len(links))
	for _, l := range links {
		if _, err := peer.Decode(l.Machine); err != nil || l.Machine == self || seen[l.Machine] {
			return rangeErr("link sample for machine %q", l.Machine)
		}
		seen[l.Machine] = true
		if l.RTTMicros > maxRTTMicros || l.KBps > maxKBps {
			return rangeErr("link to %s: rtt %d us, %d kB/s", l.Machine, l.RTTMicros, l.KBps)
		}
	}
	return nil
}

// ProbeServer answers the probes of machines the ledger backs, two at a
// time and at most one per machine every period. Only lending machines
// probe (see LinkMeter), and the ledger backs every lender's machine, so
// anyone else's probe is reset before a byte of it is read, and is
// remembered nowhere: fresh keys can neither take the slots nor fill the
// table of recent probers. An admitted probe is bounded too: its echo is
// at most probePings bytes, done within probeEchoTime, and its bulk
// ProbeBytes within probeTimeout.
//
// Slots are bounded per account as well: the machines of one account
// (all linked to one member) hold at most probesPerAccount slots at once,
// so one member's idle streams never hold every slot, and are admitted at
// most probesPerAccountPeriod times a period between them, so a member
// with many machines cannot take turns holding slots all period long.
type ProbeServer struct {
	adm      Admission
	slots    chan struct{}
	every    time.Duration
	mu       sync.Mutex
	last     map[peer.ID]time.Time // admitted peers only
	held     map[string]int        // slots held, by account
	accounts map[string]*accountProbes
}

// accountProbes counts one account's admitted probes in the current
// period.
type accountProbes struct {
	since time.Time
	n     int
}

// Bounds of what one probe may take of the machine that answers it.
const (
	// probePings is how many one-byte round trips a probe makes: the
	// most the server echoes.
	probePings = 3
	// probeEchoTime bounds the round trips, from the stream's opening: a
	// stream that holds a slot without probing frees it this soon. It
	// allows round trips of most of a second, a satellite link's.
	probeEchoTime = 3 * time.Second
	// probeSlots is how many probes are answered at once.
	probeSlots = 2
	// maxProbers bounds the table of recent probers (admitted machines).
	maxProbers = 4096
	// probesPerAccount is how many slots one account's machines hold at
	// once; probesPerAccountPeriod how many of their probes are admitted
	// in a period (a lender probes at most 32 machines a period, so an
	// account lending from two machines that both probe this one uses 2).
	probesPerAccount       = 1
	probesPerAccountPeriod = 64
)

// ServeProbes registers the probe protocol on h, answering at most one
// probe every period from each machine admit backs (a nil admit backs
// everyone: tests of this package); stop removes it.
func ServeProbes(h host.Host, chainID string, every time.Duration, admit Admission) (s *ProbeServer, stop func()) {
	s = &ProbeServer{adm: admit, slots: make(chan struct{}, probeSlots), every: every, last: map[peer.ID]time.Time{},
		held: map[string]int{}, accounts: map[string]*accountProbes{}}
	pid := ProbeProtocol(chainID)
	h.SetStreamHandler(pid, s.handle)
	return s, func() { h.RemoveStreamHandler(pid) }
}

// admit takes a slot for p's probe at now, if p is a machine the ledger
// backs (asked first: a stranger is remembered nowhere and takes no
// slot), a slot is free, and p has not probed within the period: the
// probe spends it. release frees the slot.
func (s *ProbeServer) admit(p peer.ID, now time.Time) (release func(), ok bool) {
	account, ok := backer(s.adm, p)
	if !ok {
		return nil, false
	}
	s.mu.Lock()
	busy := s.held[account] >= probesPerAccount
	if !busy {
		s.held[account]++
	}
	s.mu.Unlock()
	if busy {
		return nil, false
	}
	unhold := func() {
		s.mu.Lock()
		if s.held[account]--; s.held[account] <= 0 {
			delete(s.held, account)
		}
		s.mu.Unlock()
	}
	select {
	case s.slots <- struct{}{}:
	default:
		unhold()
		return nil, false
	}
	release = func() { <-s.slots; unhold() }
	if !s.spend(p, account, now) {
		release()
		return nil, false
	}
	return release, true
}

// spend records a probe from p (backed by account) at now, unless p
// probed within the period, its account's machines were admitted
// probesPerAccountPeriod times in it, or the tables are full of machines
// and accounts that did.
func (s *ProbeServer) spend(p peer.ID, account string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.last[p]; ok && now.Sub(t) < s.every {
		return false
	}
	a := s.accounts[account]
	if a == nil || now.Sub(a.since) >= s.every {
		if a == nil && len(s.accounts) >= maxProbers {
			for q, b := range s.accounts {
				if now.Sub(b.since) >= s.every {
					delete(s.accounts, q)
				}
			}
			if len(s.accounts) >= maxProbers {
				return false
			}
		}
		a = &accountProbes{since: now}
		s.accounts[account] = a
	}
	if a.n >= probesPerAccountPeriod {
		return false
	}
	if len(s.last) >= maxProbers {
		for q, t := range s.last {
			if now.Sub(t) >= s.every {
				delete(s.last, q)
			}
		}
	}
	if len(s.last) >= maxProbers {
		return false
	}
	s.last[p] = now
	a.n++
	return true
}

func (s *ProbeServer) handle(st network.Stream) {
	defer st.Close()
	start := time.Now()
	release, ok := s.admit(st.Conn().RemotePeer(), start)
	if !ok {
		st.Reset()
		return
	}
	defer release()
	st.SetDeadline(start.Add(probeEchoTime))
	var b [1]byte
	// Echo the round-trip bytes, at most probePings, until the bulk
	// starts (a zero byte).
	for echoed := 0; ; echoed++ {
		if _, err := io.ReadFull(st, b[:]); err != nil {
			st.Reset()
			return
		}
		if b[0] == 0 {
			break
		}
		if echoed == probePings {
			st.Reset()
			return
		}
		if _, err := st.Write(b[:]); err != nil {
			st.Reset()
			return
		}
	}
	st.SetDeadline(start.Add(probeTimeout))
	n, err := io.Copy(io.Discard, io.LimitReader(st, ProbeBytes))
	if err != nil || n != ProbeBytes-1 {
		st.Reset()
		return
	}
	st.Write([]byte{'k'})
}

// backer is the account that answers on the ledger for peer p: the member
// its machine earns into (a member's own key answers for itself), or
// false for a stranger. It is a lookup, no signature: callers ask it
// before they read what p sent. A nil a backs every peer, by itself.
func backer(a Admission, p peer.ID) (string, bool) {
	if a == nil {
		return string(p), true
	}
	raw, err := identity.PublicKeyOf(p)
	if err != nil {
		return "", false
	}
	owner, ok := a.Machine(raw)
	return string(owner), ok
}

// Probe measures the link from h to p: the least of three one-byte round
// trips, and ProbeBytes' throughput (their time to be acknowledged, less
// one round trip).
func Probe(ctx context.Context, h host.Host, chainID string, p peer.ID) (Link, error) {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	// Direct connections only: a probe's bulk must not cross a relay, and
	// a link measured through one would be the relay's. Over a relayed
	// connection NewStream waits for the hole punch; a machine it cannot
	// reach directly gets no link, and placement sees that.
	st, err := h.NewStream(ctx, p, ProbeProtocol(chainID))
	if err != nil {
		return Link{}, err
	}
	defer st.Close()
	if d, ok := ctx.Deadline(); ok {
		st.SetDeadline(d)
	}
	rtt := time.Duration(1<<63 - 1)
	var b [1]byte
	for range probePings {
		t0 := time.Now()
		if _, err := st.Write([]byte{'p'}); err != nil {
			return Link{}, err
		}
		if _, err := io.ReadFull(st, b[:]); err != nil {
			return Link{}, fmt.Errorf("probe echo: %w", err)
		}
		rtt = min(rtt, time.Since(t0))
	}
	buf := make([]byte, 32<<10) // zeros: the first is the bulk's start
	t0 := time.Now()
	for sent := 0; sent < ProbeBytes; sent += len(buf) {
		if _, err := st.Write(buf[:min(len(buf), ProbeBytes-sent)]); err != nil {
			return Link{}, err
		}
	}
	if err := st.CloseWrite(); err != nil {
		return Link{}, err
	}
	if _, err := io.ReadFull(st, b[:]); err != nil || b[0] != 'k' {
		return Link{}, errors.Join(errors.New("probe: no acknowledgement"), err)
	}
	took := time.Since(t0) - rtt
	if took <= 0 {
		took = time.Microsecond
	}
	return Link{RTT: rtt, BytesPerSec: float64(ProbeBytes) / took.Seconds()}, nil
}

// Link is a measured path: round trip and one stream's throughput.
type Link struct {
	RTT         time.Duration
	BytesPerSec float64
}

// Sample is l as an offer carries it.
func (l Link) Sample(machine string) LinkSample {
	return LinkSample{
		Machine:   machine,
		RTTMicros: uint32(min(l.RTT.Microseconds(), maxRTTMicros)),
		KBps:      uint32(min(l.BytesPerSec/1000, maxKBps)),
	}
}

// LinkMeter probes the machines it is pointed at, one at a time, and
// keeps the latest sample of each (at most MaxLinks, the most recent).
type LinkMeter struct {
	h       host.Host
	chainID string
	mu      sync.Mutex
	samples map[string]meterEntry
}

type meterEntry struct {
	s  LinkSample
	at time.Time
}

// NewLinkMeter measures links from h.
func NewLinkMeter(h host.Host, chainID string) *LinkMeter {
	return &LinkMeter{h: h, chainID: chainID, samples: map[string]meterEntry{}}
}

// Measure probes each target in turn (itself left out), keeping what it
// measured; it returns how many probes answered.
func (m *LinkMeter) Measure(ctx context.Context, targets []peer.ID) int {
	ok := 0
	for _, p := range targets[:min(len(targets), MaxLinks)] {
		if p == m.h.ID() || ctx.Err() != nil {
			continue
		}
		l, err := Probe(ctx, m.h, m.chainID, p)
		if err != nil {
			continue
		}
		ok++
		m.mu.Lock()
		m.samples[p.String()] = meterEntry{s: l.Sample(p.String()), at: time.Now()}
		m.mu.Unlock()
	}
	return ok
}

// Samples lists the freshest samples, at most MaxLinks, newest first.
func (m *LinkMeter) Samples() []LinkSample {
	m.mu.Lock()
	es := make([]meterEntry, 0, len(m.samples))
	for _, e := range m.samples {
		es = append(es, e)
	}
	m.mu.Unlock()
	slices.SortFunc(es, func(a, b meterEntry) int { return b.at.Compare(a.at) })
	out := make([]LinkSample, 0, min(len(es), MaxLinks))
	for _, e := range es[:min(len(es), MaxLinks)] {
		out = append(out, e.s)
	}
	return out
}
