package p2p

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/protocol/holepunch"
	"github.com/libp2p/go-libp2p/p2p/protocol/identify"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
)

// The node runs libp2p's hole punch service (DCUtR) itself rather than
// through libp2p.EnableHolePunching, whose service the host keeps to
// itself, so that a failed punch can be tried again:
//
//   - after a failure, up to punchRetries times, after a growing delay with
//     jitter: two labs that dial each other through the relay at once each
//     start a punch, and the two punches can spoil each other (seen in
//     TestOnePublicValidatorIsEnough: "noise: message is too short" on both
//     sides, and the connection stayed relayed);
//   - then every punchSlow, as long as the connection stays relayed: what
//     stood in the way (a firewall between the campuses) may lift unseen;
//   - when its inputs change: a new public mapping observed, a new relay
//     address, a new reachability verdict. The retries' count starts anew.
//
// Only the side that received the relayed connection can start DCUtR (the
// other answers it). Where each side received one (the race above), the
// one with the smaller peer ID tries again, so that the two do not race
// anew.

// punchRetries bounds the retries after failures; punchBackoff is the
// delay before the first, doubled before each next (plus up to a second
// of jitter).
const (
	punchRetries = 3
	punchBackoff = 2 * time.Second
	// punchSlow spaces the tries after those, as long as the connection
	// stays relayed: a DCUtR exchange over the relay (about 3 KB) and up
	// to three punch dials each.
	punchSlow = 2 * time.Minute
)

// inputsEvery bounds how often a change of inputs tries again: an observed
// address is what a peer says it saw, and a stranger who connects with a
// new one each time must not make this host punch with every relayed peer
// each time.
const inputsEvery = 10 * time.Second

// puncher is the host's hole punch service and its retries.
type puncher struct {
	h   *Host
	svc *holepunch.Service

	mu      sync.Mutex
	retries map[peer.ID]int         // retries since the last input change, bounded by maxPunchPeers
	pending map[peer.ID]chan string // a retry loop's wake-up, with why
	inputs  time.Time               // the last change of inputs acted on
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// startPuncher starts the hole punch service on h, with opts; nil when h
// has no identify service (not libp2p's basic host).
func startPuncher(h *Host, opts []holepunch.Option) (*puncher, error) {
	ids, ok := h.Host.(interface{ IDService() identify.IDService })
	if !ok {
		return nil, nil
	}
	p := &puncher{h: h, retries: map[peer.ID]int{}, pending: map[peer.ID]chan string{}}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	h.punches.onFail = p.failed // before the service's first punch
	svc, err := holepunch.NewService(h.Host, ids.IDService(), h.punchAddrs, opts...)
	if err != nil {
		p.cancel()
		return nil, err
	}
	p.svc = svc
	return p, nil
}

// punchAddrs is what this host offers a hole punch: its public addresses
// (advertised or on its interfaces) and the NAT mappings its peers
// observed, one observer being enough (libp2p's own service, which this
// replaces, counts the same).
func (h *Host) punchAddrs() []ma.Multiaddr {
	var out []ma.Multiaddr
	add := func(a ma.Multiaddr) {
		if manet.IsPublicAddr(a) && !isRelayAddr(a) && !slices.ContainsFunc(out, a.Equal) {
			out = append(out, a)
		}
	}
	for _, a := range h.Addrs() {
		add(a)
	}
	h.omu.Lock()
	obs := slices.Clone(h.observed)
	h.omu.Unlock()
	for _, o := range obs {
		if a, err := ma.NewMultiaddr(o.addr); err == nil {
			add(a)
		}
	}
	return out
}

// failed is told of every failed punch with p (punchCounter.Trace).
func (p *puncher) failed(rp peer.ID) {
	p.retry(rp, punchBackoff+rand.N(time.Second), "after a failed punch")
}

// inputsChanged tries again, soon, every peer this host reaches only
// through a relay whose last punch failed: what it had to punch with
// changed (why).
func (p *puncher) inputsChanged(why string) {
	p.mu.Lock()
	if time.Since(p.inputs) < inputsEvery {
		p.mu.Unlock()
		return
	}
	p.inputs = time.Now()
	clear(p.retries)
	p.mu.Unlock()
	for _, rp := range p.h.Network().Peers() {
		if last, ok := p.h.punches.lastWith(rp); ok && !last.Success && !p.wake(rp, why) {
			p.retry(rp, rand.N(time.Second), why)
		}
	}
}

// wake makes rp's retry loop try now, for why; false when none runs.
func (p *puncher) wake(rp peer.ID, why string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	ch, ok := p.pending[rp]
	if ok {
		select {
		case ch <- why:
		default: // woken already
		}
	}
	return ok
}

// retry punches with rp again after delay, and after each failure again
// after twice the last delay, up to punchRetries times since the last
// change of inputs, then every punchSlow, while this host reaches rp only
// through a relay and is the side that starts DCUtR. One such loop runs
// per peer: the failures it causes itself do not start another, and a
// change of inputs wakes it (wake).
func (p *puncher) retry(rp peer.ID, delay time.Duration, why string) {
	p.mu.Lock()
	if p.pending[rp] != nil || p.ctx.Err() != nil {
		p.mu.Unlock()
		return
	}
	if _, ok := p.retries[rp]; !ok && len(p.retries) >= maxPunchPeers {
		p.mu.Unlock()
		return
	}
	woken := make(chan string, 1)
	p.pending[rp] = woken
	p.wg.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.wg.Done()
		defer func() {
			p.mu.Lock()
			delete(p.pending, rp)
			p.mu.Unlock()
		}()
		for {
			select {
			case <-p.ctx.Done():
				return
			case <-time.After(delay):
			case why = <-woken:
			}
			if !p.starts(rp) || !slices.Contains(p.h.Mux().Protocols(), holepunch.Protocol) {
				return // direct already, gone, the other side's to start, or nothing to punch with yet
			}
			p.mu.Lock()
			n := p.retries[rp]
			p.retries[rp] = min(n+1, punchRetries)
			p.mu.Unlock()
			p.h.log.Info("trying the hole punch again", "module", "p2p", "peer", rp, "why", why, "retry", n+1)
			p.forgetMappings(rp)
			p.oneWay(rp)
			err := p.svc.DirectConnect(rp)
			if err == nil && Direct(p.h, rp) {
				return
			}
			if errors.Is(err, holepunch.ErrHolePunchActive) { // libp2p's own tries go on: not a retry
				p.mu.Lock()
				p.retries[rp] = n
				p.mu.Unlock()
				delay = time.Second
				continue
			}
			p.h.log.Debug("hole punch retry", "module", "p2p", "peer", rp, "err", err)
			delay, why = punchBackoff<<(n+1)+rand.N(time.Second), "after a failed punch"
			if n+1 >= punchRetries {
				// What stood in the way may lift unseen (a firewall between
				// the campuses): slowly from now on, while relayed.
				delay, why = punchSlow+rand.N(punchSlow/4), "still relayed"
			}
		}
	}()
}

// forgetMappings drops from the peerstore the public addresses of rp that
// are not relayed: NAT mappings learnt from an earlier punch, which only a
// punch opens. Left there, libp2p's DirectConnect first dials them alone
// (its "direct dial" before DCUtR). Where a firewall dropped the earlier
// punches, that lone SYN reaches rp's listener through the hole rp's own
// blocked SYNs left in its NAT; rp answers from its listener with a new
// sequence number, which rp's NAT, still tracking the old one, finds out
// of window and lets out untranslated (Linux conntrack's INVALID): the
// answer is lost, and the half-open connection holds rp's listening port
// toward this host for a minute, so rp's punch dials leave from other
// ports that this side's NAT does not expect (seen in
// TestAFailedHolePunchIsTriedAgain with tcpdump in both NATs). DCUtR
// exchanges the addresses anew.
func (p *puncher) forgetMappings(rp peer.ID) {
	ps := p.h.Peerstore()
	for _, a := range ps.Addrs(rp) {
		if !isRelayAddr(a) && manet.IsPublicAddr(a) {
			ps.SetAddr(rp, a, 0)
		}
	}
}

// oneWay closes the relayed connections this host dialled to rp when rp
// dialled one too (the two labs dialled each other at once), before this
// host punches: DCUtR opens its stream on whichever connection libp2p
// picks (the one with most streams), and where that is one this host
// dialled, rp, which received it, resets the stream ("failed to read
// CONNECT message: stream reset"), retry after retry (seen in
// TestAFailedHolePunchIsTriedAgain). Streams open on the closed
// connections are reset; their protocols open them again on the other.
func (p *puncher) oneWay(rp peer.ID) {
	var mine []network.Conn
	theirs := false
	for _, c := range p.h.Network().ConnsToPeer(rp) {
		switch {
		case !Relayed(c):
		case c.Stat().Direction == network.DirOutbound:
			mine = append(mine, c)
		default:
			theirs = true
		}
	}
	if !theirs {
		return
	}
	for _, c := range mine {
		p.h.log.Debug("closing this host's relayed connection to punch on the one the peer dialled", "module", "p2p", "peer", rp)
		_ = c.Close()
	}
}

// starts says whether this host is the one to start a punch with rp: it
// reaches rp only through a relay, on a connection rp dialled, and rp did
// not also receive one from this host, or this host's ID is the smaller.
func (p *puncher) starts(rp peer.ID) bool {
	var in, out bool
	for _, c := range p.h.Network().ConnsToPeer(rp) {
		if !Relayed(c) {
			return false
		}
		if c.Stat().Direction == network.DirInbound {
			in = true
		} else {
			out = true
		}
	}
	return in && (!out || p.h.ID() < rp)
}

// close stops the retries and the service.
func (p *puncher) close() {
	p.mu.Lock()
	p.cancel() // under mu: retry adds to wg only before it
	p.mu.Unlock()
	p.wg.Wait()
	p.svc.Close()
}
