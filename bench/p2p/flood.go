package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/node"
	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/testnet"
)

// flood runs three node processes of one network (a victim that bids and
// schedules, a relay, a lender) and a stranger's libp2p host that floods
// the victim and the relay with offers of fakes fake machines, each
// signed by a fresh key of its own. It reports what the victim and the
// relay kept, how their memory grew, and how long an honest bid took to
// be quoted and held before and during the flood.
func flood(bin string, fakes int) []row {
	if _, err := os.Stat(bin); err != nil {
		log.Fatalf("flood benchmark needs the binary: %v (run `make build`)", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir, err := os.MkdirTemp("", "dm-bench-flood")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	// Only the victim schedules: racing schedulers would hold the one core
	// for each other and blur what the flood does.
	m, err := testnet.Init(testnet.Params{Validators: 1, Nodes: 2, Out: dir, BasePort: 29100,
		Configure: func(n *testnet.Node, cfg *node.Config) { cfg.Scheduler.Quote = n.Name == "val0" }})
	if err != nil {
		log.Fatal(err)
	}
	netw, err := testnet.Start(ctx, dir, testnet.RunOptions{Binary: bin})
	if err != nil {
		log.Fatal(err)
	}
	defer netw.Close()
	const victim, relay, lender = 0, 1, 2
	client := func(i int) *api.Client {
		c, err := netw.Client(i)
		if err != nil {
			log.Fatal(err)
		}
		return c
	}
	vc, rc, lc := client(victim), client(relay), client(lender)
	if _, err := lc.SetLend(ctx, api.LendRequest{Cores: 1, MemBytes: 1 << 30}); err != nil {
		log.Fatalf("lend: %v", err)
	}
	lenderID := m.Nodes[lender].PeerID
	waitFor(60*time.Second, "the victim to hold the lender's offer", func() bool {
		offers, _ := vc.Offers(ctx)
		return slices.ContainsFunc(offers, func(o api.Offer) bool { return o.Machine == lenderID })
	})

	// placed is how long an honest bid takes to come back quoted and held
	// on the lender.
	n := 0
	placed := func() time.Duration {
		n++
		sum := sha256.Sum256([]byte(fmt.Sprintf("%s honest %d", m.ChainID, n)))
		job := hex.EncodeToString(sum[:])
		start := time.Now()
		bid := api.PublishBidRequest{Bid: p2p.Bid{JobID: job, Workers: 1, PerWorker: p2p.Resources{Cores: 1, MemBytes: 128 << 20},
			MaxPrice: 10_000_000, Duration: 60, Framework: "generic"}}
		for next := time.Now(); time.Since(start) < time.Minute; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(next) {
				if _, err := vc.PublishBid(ctx, bid); err != nil {
					log.Fatalf("bid: %v", err)
				}
				next = time.Now().Add(2 * time.Second)
			}
			qs, _ := vc.Quotes(ctx, job)
			for _, q := range qs {
				if len(q.Workers) == 1 && q.Workers[0].Machine == lenderID {
					took := time.Since(start)
					release(ctx, lc)
					return took
				}
			}
		}
		st, _ := lc.Lend(ctx)
		offers, _ := vc.Offers(ctx)
		log.Fatalf("an honest bid (%d) was not quoted within a minute; lender's holds %+v; victim's offers %+v", n, st.Holds, offers)
		return 0
	}
	median := func(k int) time.Duration {
		var ds []time.Duration
		for range k {
			ds = append(ds, placed())
		}
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	rssNow := func() map[int]uint64 {
		return map[int]uint64{victim: rssBytes(netw.PID(victim)), relay: rssBytes(netw.PID(relay))}
	}
	heap := func(c *api.Client) float64 {
		text, err := c.Metrics(ctx)
		if err != nil {
			log.Fatal(err)
		}
		for _, line := range strings.Split(text, "\n") {
			if v, ok := strings.CutPrefix(line, "go_memstats_heap_inuse_bytes "); ok {
				f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
				return f / (1 << 20)
			}
		}
		return 0
	}
	start := rssNow()
	before := median(5)
	time.Sleep(3 * time.Second)
	rss0 := rssNow() // the control: the same bids and wait, no flood
	heap0 := map[int]float64{victim: heap(vc), relay: heap(rc)}

	// The stranger.
	k, err := identity.GenerateKey()
	if err != nil {
		log.Fatal(err)
	}
	h, err := p2p.NewHost(p2p.HostParams{Key: k, Listen: []string{"/ip4/127.0.0.1/tcp/0"}, Version: "evil"})
	if err != nil {
		log.Fatal(err)
	}
	defer h.Close()
	ps, err := pubsub.NewGossipSub(ctx, h, pubsub.WithFloodPublish(true), pubsub.WithPeerOutboundQueueSize(1<<15))
	if err != nil {
		log.Fatal(err)
	}
	for _, i := range []int{victim, relay} {
		connect(ctx, h, vcStatus(ctx, client(i)))
	}
	topic, err := ps.Join(p2p.OffersTopic(m.ChainID))
	if err != nil {
		log.Fatal(err)
	}
	if _, err := topic.Subscribe(); err != nil {
		log.Fatal(err)
	}
	waitFor(20*time.Second, "the stranger on the offers topic", func() bool { return len(topic.ListPeers()) >= 2 })
	msgs := make([][]byte, fakes)
	keys := make([]*identity.Key, fakes)
	exp := time.Now().Add(time.Hour)
	for i := range msgs {
		fk, _ := identity.GenerateKey()
		o := &p2p.Offer{Machine: fk.PeerID().String(), Owner: string(fk.Address()), Moniker: fmt.Sprint("fake", i), Site: "univ-a",
			Lent: p2p.Resources{Cores: 64, MemBytes: 256 << 30}, Addrs: []string{"/ip4/10.255.255.1/tcp/7701/p2p/" + fk.PeerID().String()},
			Software: p2p.Software{OS: "linux"}}
		if msgs[i], err = p2p.Seal(fk, m.ChainID, p2p.TypeOffer, o, 1, exp); err != nil {
			log.Fatal(err)
		}
		keys[i] = fk
	}
	floodStart := time.Now()
	done := make(chan time.Duration, 1)
	go func() {
		for i, b := range msgs {
			topic.Publish(ctx, b, pubsub.WithSecretKeyAndPeerId(keys[i].PrivKey(), keys[i].PeerID()))
		}
		done <- time.Since(floodStart)
	}()
	during := median(5)
	sent := <-done
	time.Sleep(3 * time.Second) // let queued messages arrive
	fmt.Printf("flood: Go heap in use: victim %.1f -> %.1f MiB, relay %.1f -> %.1f MiB\n", heap0[victim], heap(vc), heap0[relay], heap(rc))
	var peak = map[int]uint64{}
	for _, i := range []int{victim, relay} {
		peak[i] = rssBytes(netw.PID(i))
	}
	book := func(c *api.Client) int { o, _ := c.Offers(ctx); return len(o) }
	mib := func(b uint64, a uint64) float64 { return (float64(b) - float64(a)) / (1 << 20) }
	gv, gr := mib(peak[victim], rss0[victim]), mib(peak[relay], rss0[relay])
	fmt.Printf("flood: RSS growth without a flood (5 bids, 3 s): victim %.1f MiB, relay %.1f MiB\n", mib(rss0[victim], start[victim]), mib(rss0[relay], start[relay]))
	ratio := float64(during) / float64(before)
	fmt.Printf("flood: %d fake offers sent in %s; honest placement %s before, %s during\n", fakes, sent.Round(time.Millisecond), before.Round(time.Millisecond), during.Round(time.Millisecond))
	return []row{
		{Name: fmt.Sprintf("flood of %d fake machines: victim's offer book", fakes), Value: float64(book(vc)), Unit: "offers", Goal: "1 (the lender)", Pass: book(vc) == 1},
		{Name: "flood: relay's offer book", Value: float64(book(rc)), Unit: "offers", Goal: "1 (the lender)", Pass: book(rc) == 1},
		{Name: "flood: victim RSS growth", Value: gv, Unit: "MiB", Goal: "<= 20 MiB", Ratio: gv / 20, RefDoc: "growth / 20 MiB goal", Pass: gv <= 20},
		{Name: "flood: relay RSS growth", Value: gr, Unit: "MiB", Goal: "<= 20 MiB", Ratio: gr / 20, RefDoc: "growth / 20 MiB goal", Pass: gr <= 20},
		{Name: "flood: honest placement during / before", Value: during.Seconds(), Unit: "s", Goal: "unaffected (<= 1.5x)",
			Ratio: ratio, RefDoc: fmt.Sprintf("during %s / before %s (median of 5 bids, quote held on the lender)", during.Round(time.Millisecond), before.Round(time.Millisecond)), Pass: ratio <= 1.5},
	}
}

func release(ctx context.Context, lc *api.Client) {
	st, err := lc.Lend(ctx)
	if err != nil {
		return
	}
	for _, h := range st.Holds {
		lc.ReleaseHold(ctx, h.ID)
	}
}

func vcStatus(ctx context.Context, c *api.Client) api.Status {
	st, err := c.Status(ctx)
	if err != nil {
		log.Fatal(err)
	}
	return st
}

func connect(ctx context.Context, h host.Host, st api.Status) {
	for _, a := range st.Addrs {
		ai, err := peer.AddrInfoFromP2pAddr(ma.StringCast(a))
		if err == nil && h.Connect(ctx, *ai) == nil {
			return
		}
	}
	log.Fatalf("cannot connect to %s", st.PeerID)
}

func waitFor(within time.Duration, what string, cond func() bool) {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			log.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
