package node

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/p2p"
)

// attacker is a real libp2p peer running plain gossipsub with no
// validators: it publishes whatever bytes it is told to.
type attacker struct {
	key   *identity.Key
	topic *pubsub.Topic
}

func attackerKey(t *testing.T, seed byte) *identity.Key {
	t.Helper()
	k, err := identity.KeyFromSeed(bytes.Repeat([]byte{seed}, 32))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func newAttacker(t *testing.T, ctx context.Context, chain string, victim *testNode, seed byte) *attacker {
	t.Helper()
	k := attackerKey(t, seed)
	h, err := p2p.NewHost(p2p.HostParams{Key: k, Listen: []string{"/ip4/127.0.0.1/tcp/0"}, Version: "evil"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	ps, err := pubsub.NewGossipSub(ctx, h, pubsub.WithFloodPublish(true))
	if err != nil {
		t.Fatal(err)
	}
	topic, err := ps.Join(p2p.OffersTopic(chain))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := topic.Subscribe(); err != nil {
		t.Fatal(err)
	}
	if err := h.Connect(ctx, peer.AddrInfo{ID: victim.Host().ID(), Addrs: victim.Host().Addrs()}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "attacker sees the victim on the topic", func() bool { return len(topic.ListPeers()) > 0 })
	return &attacker{key: k, topic: topic}
}

func (a *attacker) send(t *testing.T, data []byte) {
	t.Helper()
	if err := a.topic.Publish(context.Background(), data); err != nil {
		t.Fatal(err)
	}
}

func (a *attacker) offer(cores uint32, moniker string) *p2p.Offer {
	return &p2p.Offer{
		Machine: a.key.PeerID().String(), Owner: string(a.key.Address()), Moniker: moniker, Site: "evil",
		Lent: p2p.Resources{Cores: cores, MemBytes: 1 << 30}, Addrs: []string{}, Software: p2p.Software{OS: "linux"},
	}
}

func (a *attacker) seal(t *testing.T, chain, typ string, payload any, seq uint64, exp time.Time) []byte {
	t.Helper()
	b, err := p2p.Seal(a.key, chain, typ, payload, seq, exp)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// rejected reads V's metric of offers-topic messages rejected for reason.
func rejected(n *testNode, reason string) float64 {
	mfs, err := n.reg.Gather()
	if err != nil {
		return 0
	}
	for _, mf := range mfs {
		if mf.GetName() != "deepmarket_p2p_messages_validated_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["topic"] == p2p.OffersTopic(n.cfg.Node.ChainID) && labels["result"] == "reject" && labels["reason"] == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestMisbehavingPeersAreDroppedAndScored: real libp2p peers send every
// kind of bad message to V. None is ever listed by V (or relayed to A
// behind it), each counts against its sender's gossipsub score, and the
// honest offer from A still arrives. The attackers' keys are members of
// the network here (the ledger backs them), so each message meets the
// check it is about; TestFakeMachineFlood covers keys the ledger does not
// know.
func TestMisbehavingPeersAreDroppedAndScored(t *testing.T) {
	t.Parallel()
	chain := testNet(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var members []identity.Address
	for seed := byte(101); seed <= 112; seed++ {
		members = append(members, attackerKey(t, seed).Address())
	}
	homes := initNetwork(t, t.TempDir(), chain, []string{"v", "a"}, members...)
	v := startNode(t, homes[0])
	a := startNode(t, homes[1], withBootstrap(v.addr()))
	eventually(t, 10*time.Second, "A connected to V", func() bool { return v.Status().Peers == 1 })

	now := time.Now()
	exp := now.Add(time.Minute)
	victimID := a.Host().ID().String()
	var attackers []*attacker
	next := byte(100)
	mk := func() *attacker {
		next++
		at := newAttacker(t, ctx, chain, v, next)
		attackers = append(attackers, at)
		return at
	}

	// Bad signature: a valid envelope with one signature byte flipped.
	m := mk()
	good := m.seal(t, chain, p2p.TypeOffer, m.offer(3, "forged"), 1, exp)
	var env p2p.Envelope
	if err := p2p.Unmarshal(good, &env); err != nil {
		t.Fatal(err)
	}
	env.Sig[10] ^= 1
	forged, _ := p2p.Marshal(&env)
	m.send(t, forged)

	// Signed by someone else's key, published by the attacker.
	m = mk()
	other, _ := identity.KeyFromSeed(bytes.Repeat([]byte{99}, 32))
	otherOffer := m.offer(3, "not-mine")
	otherOffer.Machine, otherOffer.Owner = other.PeerID().String(), string(other.Address())
	stolen, _ := p2p.Seal(other, chain, p2p.TypeOffer, otherOffer, 1, exp)
	m.send(t, stolen)

	// Impersonation: an offer for A's machine, signed by the attacker.
	m = mk()
	imp := m.offer(3, "impersonated")
	imp.Machine = victimID
	m.send(t, m.seal(t, chain, p2p.TypeOffer, imp, 1, exp))

	m = mk() // unknown type
	m.send(t, m.seal(t, chain, "offer/9", m.offer(3, "unknown"), 1, exp))

	m = mk() // oversize
	big := m.offer(3, "big")
	for i := 0; i < 30; i++ {
		big.Addrs = append(big.Addrs, "/dns4/"+string(bytes.Repeat([]byte("a"), 200))+".example/tcp/1")
	}
	body, _ := p2p.Marshal(big)
	env = p2p.Envelope{Signer: m.key.Public(), Type: p2p.TypeOffer, Payload: append(body, make([]byte, 70<<10)...), Seq: 1, Expiry: exp.UnixMilli(), Sig: make([]byte, 64)}
	oversize, _ := p2p.Marshal(&env)
	m.send(t, oversize)

	m = mk() // expired
	m.send(t, m.seal(t, chain, p2p.TypeOffer, m.offer(3, "expired"), 1, now.Add(-time.Hour)))

	m = mk() // absurd values
	m.send(t, m.seal(t, chain, p2p.TypeOffer, m.offer(1_000_000_000, "absurd"), 1, exp))

	m = mk() // an offer claiming images: too many, and a name that is no CID
	claims := m.offer(1, "claims")
	for i := range p2p.MaxOfferImages {
		claims.Images = append(claims.Images, fmt.Sprintf("bafyclaimed%d", i))
	}
	claims.Images = append(claims.Images, "../../etc/shadow")
	m.send(t, m.seal(t, chain, p2p.TypeOffer, claims, 1, exp))

	m = mk() // not even CBOR
	m.send(t, []byte("\xff\xfe garbage"))

	m = mk() // another network's message
	m.send(t, m.seal(t, "deepmarket-elsewhere", p2p.TypeOffer, m.offer(3, "elsewhere"), 1, exp))

	// Replays: a valid offer (listed: this is honest), then the very same
	// bytes again, twice (rejected), and an older sequence with different
	// content (a signer's messages may arrive slightly out of order, so
	// it passes validation, but it must not displace the newer offer).
	replayer := mk()
	first := replayer.seal(t, chain, p2p.TypeOffer, replayer.offer(1, "replayer"), 100, exp)
	replayer.send(t, first)
	eventually(t, 10*time.Second, "the replayer's first, valid offer on V", func() bool { return hasOffer(v, replayer.key.PeerID().String()) })
	replayer.send(t, first)
	replayer.send(t, first)
	replayer.send(t, replayer.seal(t, chain, p2p.TypeOffer, replayer.offer(2, "replayed-old"), 50, exp))

	// The honest lender.
	if _, err := a.client.SetLend(ctx, api.LendRequest{Cores: 1, MemBytes: 1 << 30}); err != nil {
		t.Fatal(err)
	}

	want := map[string]float64{
		"bad_signature": 2, "signer_mismatch": 2, "unknown_type": 1, "oversize": 1,
		"expired": 1, "out_of_range": 2, "malformed": 1, "replay": 2,
	}
	eventually(t, 15*time.Second, "V to reject every bad message", func() bool {
		for reason, n := range want {
			if rejected(v, reason) < n {
				return false
			}
		}
		return true
	})
	eventually(t, 15*time.Second, "A's honest offer on V", func() bool { return hasOffer(v, victimID) })

	for _, o := range v.Offers() {
		switch {
		case o.Machine == victimID && (o.Cores != 1 || o.Moniker != "a"):
			t.Errorf("A's offer on V was replaced by the impersonation: %+v", o)
		case o.Machine == replayer.key.PeerID().String() && (o.Cores != 1 || o.Moniker != "replayer"):
			t.Errorf("a replayed old offer replaced the current one: %+v", o)
		case o.Machine != victimID && o.Machine != replayer.key.PeerID().String() && !o.Self:
			t.Errorf("V lists an offer it should have rejected: %+v", o)
		}
	}
	// Nothing invalid was relayed onwards to A.
	for reason := range want {
		if n := rejected(a, reason); n != 0 {
			t.Errorf("A saw %v %s messages relayed by V", n, reason)
		}
	}
	// Each rejection lowered its sender's score on V.
	eventually(t, 15*time.Second, "negative scores for every attacker", func() bool {
		scores := map[string]float64{}
		for _, p := range v.Peers() {
			scores[p.PeerID] = p.Score
		}
		for _, at := range attackers {
			if scores[at.key.PeerID().String()] >= 0 {
				return false
			}
		}
		return true
	})
}
