package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/p2p"
)

// joined is how soon a node that joins the swarm sees its machines,
// side by side: by gossip alone (each machine's next announcement) and
// copying two peers' offer books as a starting node does (p2p.FetchBook).
type joined struct {
	Nodes     int     `json:"nodes"`
	IntervalS float64 `json:"announce_interval_s"`
	// GossipS and CopyS are seconds from joining until the newcomer held
	// 95% of the other machines' offers; -1: not within the wait.
	GossipS  float64 `json:"gossip_95_s"`
	CopyS    float64 `json:"copy_95_s"`
	Copied   int     `json:"copied_offers"`
	CopyPage float64 `json:"copy_ms_per_page"` // the copy's wall time per page fetched
}

// keeper is a swarm node's offer book as signed, for serving it.
type keeper struct {
	mu   sync.Mutex
	seen map[string][]byte
}

func (k *keeper) add(rec *p2p.Received) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.seen[rec.Signer.String()] = rec.Raw
}

func (k *keeper) entries(time.Time) []p2p.BookEntry {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]p2p.BookEntry, 0, len(k.seen))
	for m, raw := range k.seen {
		out = append(out, p2p.BookEntry{Machine: m, Raw: raw})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Machine < out[j].Machine })
	return out
}

// newcomers has two nodes join the running swarm at once, each dialing
// degree/2 random members: one waits for gossip, the other also copies
// the books of the two members that keep theirs. It waits up to wait.
func newcomers(ctx context.Context, r run, members []*member, books []*keeper, admit admission, rng *rand.Rand, wait time.Duration) (joined, error) {
	res := joined{Nodes: r.Nodes, IntervalS: r.Interval.Seconds(), GossipS: -1, CopyS: -1}
	want := int(0.95 * float64(r.Nodes))
	type side struct {
		mu   sync.Mutex
		held map[peer.ID]bool
		at   time.Duration
	}
	var sides [2]*side
	var rpcs [2]*p2p.RPC
	start := time.Now()
	for i := range sides {
		k := key(r.Nodes + 1 + i)
		admit[string(k.Public())] = k.Address()
		h, err := p2p.NewHost(p2p.HostParams{Key: k, Listen: []string{"/ip4/127.0.0.1/tcp/0"}, Version: "bench"})
		if err != nil {
			return res, err
		}
		defer h.Close()
		g, err := p2p.NewGossip(ctx, p2p.GossipParams{Host: h, Key: k, ChainID: chain, Admission: admit})
		if err != nil {
			return res, err
		}
		s := &side{held: map[peer.ID]bool{}, at: -1}
		sides[i] = s
		rpcs[i] = &p2p.RPC{Host: h, Key: k, ChainID: chain}
		go g.Offers().Run(ctx, func(rec *p2p.Received) {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.held[rec.Signer] = true
			if len(s.held) >= want && s.at < 0 {
				s.at = time.Since(start)
			}
		})
		for range r.Degree / 2 {
			to := members[rng.IntN(len(members))].host
			if err := h.Connect(ctx, peer.AddrInfo{ID: to.ID(), Addrs: to.Addrs()}); err != nil {
				return res, err
			}
		}
		if i == 1 {
			for _, b := range members[:len(books)] {
				if err := h.Connect(ctx, peer.AddrInfo{ID: b.host.ID(), Addrs: b.host.Addrs()}); err != nil {
					return res, err
				}
			}
			copier := sides[1]
			pages := 0
			began := time.Now()
			for bi, b := range members[:len(books)] {
				_, err := p2p.FetchBook(ctx, rpcs[1], b.host.ID(), 20_000, func(raw []byte) bool {
					rec, err := g.CheckOffer(raw, time.Now())
					if err != nil {
						return true
					}
					res.Copied++
					copier.mu.Lock()
					copier.held[rec.Signer] = true
					if len(copier.held) >= want && copier.at < 0 {
						copier.at = time.Since(start)
					}
					copier.mu.Unlock()
					return true
				})
				if err != nil {
					return res, fmt.Errorf("copy a book: %w", err)
				}
				pages += pagesOf(books[bi].entries(time.Now()))
			}
			res.CopyPage = float64(time.Since(began).Milliseconds()) / float64(max(pages, 1))
		}
	}
	for time.Since(start) < wait {
		done := true
		for _, s := range sides {
			s.mu.Lock()
			done = done && s.at >= 0
			s.mu.Unlock()
		}
		if done {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for i, s := range sides {
		s.mu.Lock()
		if s.at >= 0 {
			if i == 0 {
				res.GossipS = s.at.Seconds()
			} else {
				res.CopyS = s.at.Seconds()
			}
		}
		s.mu.Unlock()
	}
	return res, nil
}

// pagesOf is how many book pages entries take.
func pagesOf(entries []p2p.BookEntry) int {
	n := 1
	for p := p2p.PageAfter(entries, ""); p.Next != ""; p = p2p.PageAfter(entries, p.Next) {
		n++
	}
	return n
}
