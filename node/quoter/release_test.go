package quoter

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/lender"
	"github.com/deepmarket/deepmarket/node/market"
	"github.com/deepmarket/deepmarket/node/submitter"
	"github.com/deepmarket/deepmarket/p2p"
)

// A quote that does not reach its bidder, between real libp2p hosts on
// loopback: a scheduling node that lends its own machine, a lab machine
// it reaches at the address its offer gives, and a bidder. Both machines
// check and hold as a node's do (lender.Desk over lender.Holds), the lab
// machine over the reserve protocol.

const testChain = "deepmarket-test"

// ledgerView is the ledger as the machines' admission reads it: its
// members and their balances; a member's own key is its machine.
type ledgerView map[identity.Address]uint64

func (v ledgerView) MachineOwner(a identity.Address) (identity.Address, bool) {
	_, ok := v[a]
	return a, ok
}
func (v ledgerView) IsMember(a identity.Address) bool                  { _, ok := v[a]; return ok }
func (v ledgerView) BalanceOf(a identity.Address) uint64               { return v[a] }
func (v ledgerView) PayerRecordOf(identity.Address) ledger.PayerRecord { return ledger.PayerRecord{} }

func testKey(t *testing.T, b byte) *identity.Key {
	t.Helper()
	k, err := identity.KeyFromSeed(bytes.Repeat([]byte{b}, 32))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// lab is the scheduling node (sched, lending its own machine with
// selfHolds), the lab machine (labHolds) and a bid the node answers.
type lab struct {
	q                   *Quoter
	sched               *p2p.RPC
	labID               peer.ID
	selfHolds, labHolds *lender.Holds
	bid                 bidWork
	bidder              *identity.Key
	// beforeSend runs as the quote is about to be sent.
	beforeSend func()
	// sent is the quote sent, and what each machine held then.
	sent              p2p.Quote
	selfHeld, labHeld p2p.Resources
}

// newLab builds a lab where each machine lends 2 cores and the bid asks
// for 2 workers of 2 cores: its quote holds both machines.
func newLab(t *testing.T) *lab {
	bidder, schedKey, labKey := testKey(t, 9), testKey(t, 1), testKey(t, 2)
	// The scheduling node is a member's machine: only those schedule holds.
	reads := ledgerView{bidder.Address(): 1 << 40, schedKey.Address(): 0, labKey.Address(): 0}
	lent := p2p.Resources{Cores: 2, MemBytes: 2 << 30}
	newHolds := func() (*lender.Holds, *lender.Desk) {
		h := lender.NewHolds(func() p2p.Resources { return lent }, lender.HoldLimits{}, nil)
		return h, lender.NewDesk(lender.NewAdmission(reads, testChain, lender.DefaultTerms()), h)
	}
	l := &lab{bidder: bidder, beforeSend: func() {}}

	sh, err := p2p.NewHost(p2p.HostParams{Key: schedKey, Listen: []string{"/ip4/127.0.0.1/tcp/0"}, Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sh.Close() })
	l.sched = &p2p.RPC{Host: sh, Key: schedKey, ChainID: testChain}
	var selfDesk *lender.Desk
	l.selfHolds, selfDesk = newHolds()

	// The lab machine sits behind a NAT: it advertises no address of its
	// own (there is none a peer could dial), so the only address the node
	// has for it is its offer's.
	lh, err := libp2p.New(libp2p.Identity(labKey.PrivKey()), libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"),
		libp2p.AddrsFactory(func([]ma.Multiaddr) []ma.Multiaddr { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lh.Close() })
	l.labID = lh.ID()
	var labDesk *lender.Desk
	l.labHolds, labDesk = newHolds()
	(&p2p.RPC{Host: lh, Key: labKey, ChainID: testChain}).Handle(p2p.ReserveProtocol(testChain), labDesk.Handle)

	now := time.Now()
	book := market.NewOfferBook(10, 10)
	for _, m := range []struct {
		id    peer.ID
		addrs []string
	}{{sh.ID(), p2p.FullAddrs(sh)}, {lh.ID(), fullAddrs(t, lh.ID(), lh.Network().ListenAddresses())}} {
		book.Apply(&p2p.Received{Signer: m.id, Seq: 1, Expiry: now.Add(time.Hour), Offer: &p2p.Offer{
			Machine: m.id.String(), Owner: "owner", Moniker: m.id.String()[len(m.id.String())-4:], Lent: lent, Addrs: m.addrs,
			Price: p2p.Prices{CoreHour: 100_000, MemGiBHour: 20_000}}}, now)
	}

	// Holds and quotes go as the node sends them (node.reserve,
	// node.sendQuote): this machine's desk directly, other machines over
	// the reserve protocol at the addresses given, learnt for a while.
	reserve := ReserveFunc(func(ctx context.Context, machine peer.ID, addrs []string, r p2p.Reserve) (p2p.ReserveReply, error) {
		if machine == sh.ID() {
			return selfDesk.Apply(ctx, machine, &r, time.Now()), nil
		}
		for _, a := range addrs {
			if tr, id := peer.SplitAddr(ma.StringCast(a)); tr != nil && id == machine {
				sh.Peerstore().AddAddr(machine, tr, peerstore.TempAddrTTL)
			}
		}
		var reply p2p.ReserveReply
		err := l.sched.Call(ctx, machine, p2p.ReserveProtocol(testChain), p2p.TypeReserve, &r, p2p.TypeReserveReply, &reply)
		return reply, err
	})
	send := SendFunc(func(ctx context.Context, bidder peer.ID, q p2p.Quote) error {
		l.sent, l.selfHeld, l.labHeld = q, l.selfHolds.Allocated(time.Now()), l.labHolds.Allocated(time.Now())
		l.beforeSend()
		var ack p2p.QuoteAck
		if err := l.sched.Call(ctx, bidder, p2p.QuoteProtocol(testChain), p2p.TypeQuote, &q, p2p.TypeQuoteAck, &ack); err != nil {
			return err
		}
		if !ack.OK {
			return errors.New("the bidder refused the quote")
		}
		return nil
	})
	l.q = New(Params{Self: sh.ID(), Market: market.New(market.Params{Book: book, Subset: market.SubsetAll}),
		Holds: reserve, Quotes: send, Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))})

	b := p2p.Bid{JobID: "ab" + string(bytes.Repeat([]byte("0"), 62)), Submitter: string(bidder.Address()), Workers: 2,
		PerWorker: lent, MaxPrice: 50_000_000, Duration: 600, Framework: "generic", Floor: p2p.DefaultFloor}
	raw, err := p2p.Seal(bidder, testChain, p2p.TypeBid, &b, 1, now.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	l.bid = bidWork{bid: b, bidder: bidder.PeerID(), raw: raw}
	return l
}

func fullAddrs(t *testing.T, id peer.ID, addrs []ma.Multiaddr) []string {
	t.Helper()
	full, err := peer.AddrInfoToP2pAddrs(&peer.AddrInfo{ID: id, Addrs: addrs})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, len(full))
	for i, a := range full {
		out[i] = a.String()
	}
	return out
}

// TestUndeliveredQuoteReleasesItsHolds: whatever keeps a quote from its
// bidder, both machines' holds are gone once the node is done with the
// bid, where they used to keep the machines' cores for a minute.
func TestUndeliveredQuoteReleasesItsHolds(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, l *lab, stop context.CancelFunc)
	}{
		// The bidder sits behind a NAT: the node has no address for it.
		// By the time the quote fails (against an address that drops
		// packets it takes the RPC's whole timeout), the connection that
		// carried the lab machine's hold has closed: a relay's limit, the
		// connection manager, a hole punch replacing it. Identify dropped
		// the address learnt from its offer, so a release sent without it
		// had nowhere to go.
		{"bidder unreachable", func(t *testing.T, l *lab, _ context.CancelFunc) {
			l.beforeSend = func() {
				if err := l.sched.Host.Network().ClosePeer(l.labID); err != nil {
					t.Error(err)
				}
			}
		}},
		// The node stops while the quote is on its way.
		{"node stopping", func(t *testing.T, l *lab, stop context.CancelFunc) {
			l.beforeSend = stop
		}},
		// The bidder answers, but takes no quote for the bid (it has
		// chosen already, or never bid it).
		{"bidder refuses", func(t *testing.T, l *lab, _ context.CancelFunc) {
			bh, err := p2p.NewHost(p2p.HostParams{Key: l.bidder, Listen: []string{"/ip4/127.0.0.1/tcp/0"}, Version: "test"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { bh.Close() })
			(&p2p.RPC{Host: bh, Key: l.bidder, ChainID: testChain}).Handle(p2p.QuoteProtocol(testChain), submitter.NewQuoteBook().Handle)
			l.sched.Host.Peerstore().AddAddrs(bh.ID(), bh.Addrs(), time.Minute)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, stop := context.WithCancel(t.Context())
			defer stop()
			l := newLab(t)
			tc.setup(t, l, stop)
			l.q.answer(ctx, l.bid)
			if len(l.sent.Workers) != 2 || l.selfHeld.Cores != 2 || l.labHeld.Cores != 2 {
				t.Fatalf("quoted %+v, with %d cores held here and %d on the lab machine; want both machines held", l.sent, l.selfHeld.Cores, l.labHeld.Cores)
			}
			now := time.Now()
			if self, other := l.selfHolds.Allocated(now), l.labHolds.Allocated(now); self != (p2p.Resources{}) || other != (p2p.Resources{}) {
				t.Errorf("after the quote failed, %+v still held on the node's own machine and %+v on the lab machine", self, other)
			}
		})
	}
}
