package p2p

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"sync"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/identity"
)

// OffersTopic names the topic of offers and withdrawals on a network.
func OffersTopic(chainID string) string { return "/deepmarket/" + chainID + "/offers/1" }

// BidsTopic names the topic of job bids on a network.
func BidsTopic(chainID string) string { return "/deepmarket/" + chainID + "/bids/1" }

// Score thresholds. A peer whose invalid messages drive its score below
// GraylistThreshold is ignored entirely; one rejected message costs
// invalidWeight (squared count, per gossipsub v1.1), so a handful of forged
// messages graylists a peer while honest peers stay near zero.
const (
	invalidWeight      = -100
	gossipThreshold    = -500
	publishThreshold   = -1000
	graylistThreshold  = -2500
	acceptPXThreshold  = 10
	opportunisticGraft = 3
)

// ScoreParams returns DeepMarket's gossipsub peer-scoring parameters for
// the topics of chainID. Loopback and private addresses are exempt from the
// IP-colocation penalty, since a lab (and every test) runs many nodes behind
// one address.
//
// appScore, when not nil, is the application's own score of a peer (see
// deliveries); nil scores every peer 0.
func ScoreParams(chainID string, appScore func(peer.ID) float64) (*pubsub.PeerScoreParams, *pubsub.PeerScoreThresholds) {
	if appScore == nil {
		appScore = func(peer.ID) float64 { return 0 }
	}
	topic := func(weight float64) *pubsub.TopicScoreParams {
		return &pubsub.TopicScoreParams{
			TopicWeight:                    weight,
			TimeInMeshWeight:               0.01,
			TimeInMeshQuantum:              time.Second,
			TimeInMeshCap:                  300,
			FirstMessageDeliveriesWeight:   1,
			FirstMessageDeliveriesDecay:    pubsub.ScoreParameterDecay(10 * time.Minute),
			FirstMessageDeliveriesCap:      50,
			InvalidMessageDeliveriesWeight: invalidWeight,
			InvalidMessageDeliveriesDecay:  pubsub.ScoreParameterDecay(time.Hour),
		}
	}
	var whitelist []*net.IPNet
	for _, c := range []string{"127.0.0.0/8", "::1/128", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7"} {
		_, n, _ := net.ParseCIDR(c)
		whitelist = append(whitelist, n)
	}
	params := &pubsub.PeerScoreParams{
		Topics: map[string]*pubsub.TopicScoreParams{
			OffersTopic(chainID): topic(1),
			BidsTopic(chainID):   topic(0.5),
		},
		TopicScoreCap:               100,
		AppSpecificScore:            appScore,
		AppSpecificWeight:           1,
		IPColocationFactorWeight:    -10,
		IPColocationFactorThreshold: 8,
		IPColocationFactorWhitelist: whitelist,
		BehaviourPenaltyWeight:      -10,
		BehaviourPenaltyThreshold:   6,
		BehaviourPenaltyDecay:       pubsub.ScoreParameterDecay(10 * time.Minute),
		DecayInterval:               time.Second,
		DecayToZero:                 0.01,
		RetainScore:                 time.Hour,
	}
	thresholds := &pubsub.PeerScoreThresholds{
		GossipThreshold:             gossipThreshold,
		PublishThreshold:            publishThreshold,
		GraylistThreshold:           graylistThreshold,
		AcceptPXThreshold:           acceptPXThreshold,
		OpportunisticGraftThreshold: opportunisticGraft,
	}
	return params, thresholds
}

// GossipParams configures NewGossip.
type GossipParams struct {
	Host    host.Host
	Key     *identity.Key
	ChainID string
	Logger  *slog.Logger
	Metrics *Metrics // may be nil
	// Admission is the ledger's say on who may publish offers and bids;
	// nil admits everyone.
	Admission Admission
	// ScoreInspect, when set, receives every peer's score every
	// ScoreInspectPeriod (for `peers` and metrics).
	ScoreInspect       func(map[peer.ID]float64)
	ScoreInspectPeriod time.Duration
}

// Gossip is the node's gossipsub router with DeepMarket's topics joined.
type Gossip struct {
	ps        *pubsub.PubSub
	validator *Validator
	// unbacked counts, per peer that delivered them, the messages the
	// ledger does not back: they are ignored (a replica a few blocks
	// behind may not know a machine yet), but a peer that keeps relaying
	// them loses score until it is graylisted.
	unbacked *deliveries
	offers   *Topic
	bids     *Topic
	// rejoined has a value once the watch reconnected a peer the router
	// had given up on (Rejoined).
	rejoined chan struct{}
}

// NewGossip starts gossipsub on the host with peer scoring and validators,
// and joins the offers and bids topics. The router stops when ctx ends.
func NewGossip(ctx context.Context, p GossipParams) (*Gossip, error) {
	if p.Logger == nil {
		p.Logger = slog.New(slog.DiscardHandler)
	}
	unbacked := newDeliveries(unbackedHalfLife)
	params, thresholds := ScoreParams(p.ChainID, unbacked.score)
	opts := []pubsub.Option{
		pubsub.WithPeerScore(params, thresholds),
		pubsub.WithMessageSignaturePolicy(pubsub.StrictSign),
		pubsub.WithPeerExchange(true),
		pubsub.WithFloodPublish(true),
		pubsub.WithMaxMessageSize(4 * MaxEnvelopeSize), // larger ones reach our validator and are scored
		// A researcher submitting a sweep publishes hundreds of bids at
		// once: the default queues (32) drop most of such a burst.
		pubsub.WithPeerOutboundQueueSize(512),
		pubsub.WithValidateQueueSize(512),
		pubsub.WithLogger(p.Logger.With("module", "pubsub")),
	}
	if p.ScoreInspect != nil {
		period := p.ScoreInspectPeriod
		if period <= 0 {
			period = 10 * time.Second
		}
		opts = append(opts, pubsub.WithPeerScoreInspect(pubsub.PeerScoreInspectFn(p.ScoreInspect), period))
	}
	ps, err := pubsub.NewGossipSub(ctx, p.Host, opts...)
	if err != nil {
		return nil, fmt.Errorf("start gossipsub: %w", err)
	}
	g := &Gossip{ps: ps, validator: NewValidator(p.ChainID, p.Admission), unbacked: unbacked, rejoined: make(chan struct{}, 1)}
	if g.offers, err = g.join(OffersTopic(p.ChainID), p); err != nil {
		return nil, err
	}
	if g.bids, err = g.join(BidsTopic(p.ChainID), p); err != nil {
		return nil, err
	}
	go g.watchDeaf(ctx, p.Host, p.Logger.With("module", "p2p"))
	return g, nil
}

func (g *Gossip) join(name string, p GossipParams) (*Topic, error) {
	log := p.Logger.With("module", "p2p", "topic", name)
	validate := func(ctx context.Context, from peer.ID, msg *pubsub.Message) pubsub.ValidationResult {
		now := time.Now()
		rec, err := g.validator.Validate(name, msg.Data, msg.GetFrom(), now)
		if errors.Is(err, ErrNotAdmitted) {
			g.unbacked.add(from, now)
			p.Metrics.incRejected(name, Reason(err))
			log.Debug("ignored message", "from", from, "author", msg.GetFrom(), "err", err)
			return pubsub.ValidationIgnore
		}
		if err != nil {
			reason := Reason(err)
			p.Metrics.incRejected(name, reason)
			log.Debug("rejected message", "from", from, "author", msg.GetFrom(), "reason", reason, "err", err)
			return pubsub.ValidationReject
		}
		p.Metrics.incAccepted(name, rec.Type)
		msg.ValidatorData = rec
		return pubsub.ValidationAccept
	}
	// Inline: validated by pubsub's workers in arrival order, so a burst
	// from one signer stays (nearly) in sequence order; the check is cheap.
	if err := g.ps.RegisterTopicValidator(name, validate, pubsub.WithValidatorInline(true)); err != nil {
		return nil, fmt.Errorf("register validator for %s: %w", name, err)
	}
	t, err := g.ps.Join(name)
	if err != nil {
		return nil, fmt.Errorf("join %s: %w", name, err)
	}
	sub, err := t.Subscribe(pubsub.WithBufferSize(256))
	if err != nil {
		return nil, fmt.Errorf("subscribe %s: %w", name, err)
	}
	return &Topic{name: name, topic: t, sub: sub, key: p.Key, chainID: p.ChainID, metrics: p.Metrics, log: log}, nil
}

// Offers returns the topic of offers and withdrawals.
func (g *Gossip) Offers() *Topic { return g.offers }

// Rejoined has a value each time (coalesced) the gossip watch reconnected
// a peer the router had given up on: what this node heard meanwhile may
// lack offers, and a copy of a peer's book fills it (market.BookSync).
func (g *Gossip) Rejoined() <-chan struct{} { return g.rejoined }

// Bids returns the topic of job bids.
func (g *Gossip) Bids() *Topic { return g.bids }

// PubSub exposes the router, for tests and diagnostics.
func (g *Gossip) PubSub() *pubsub.PubSub { return g.ps }

// Topic owns one gossip topic: it publishes this node's signed messages and
// reads validated ones.
type Topic struct {
	name    string
	topic   *pubsub.Topic
	sub     *pubsub.Subscription
	key     *identity.Key
	chainID string
	seq     Sequencer
	metrics *Metrics
	log     *slog.Logger
	// pubMu keeps publishing in sequence order: peers (and our own
	// validator) drop a sequence lower than one already seen.
	pubMu sync.Mutex
}

// Name returns the topic's name.
func (t *Topic) Name() string { return t.name }

// PublishOffer signs o, valid for ttl, and publishes it (on the offers
// topic: the bids topic's validators refuse it).
func (t *Topic) PublishOffer(ctx context.Context, o *Offer, ttl time.Duration) error {
	return t.publish(ctx, TypeOffer, o, ttl)
}

// PublishWithdrawal signs w, valid for ttl, and publishes it (on the
// offers topic).
func (t *Topic) PublishWithdrawal(ctx context.Context, w *Withdrawal, ttl time.Duration) error {
	return t.publish(ctx, TypeWithdrawal, w, ttl)
}

// PublishBid signs b, valid for ttl, and publishes it (on the bids topic).
func (t *Topic) PublishBid(ctx context.Context, b *Bid, ttl time.Duration) error {
	return t.publish(ctx, TypeBid, b, ttl)
}

// publish signs payload as typ, valid for ttl, and publishes it.
func (t *Topic) publish(ctx context.Context, typ string, payload any, ttl time.Duration) error {
	t.pubMu.Lock()
	defer t.pubMu.Unlock()
	data, err := Seal(t.key, t.chainID, typ, payload, t.seq.Next(), time.Now().Add(ttl))
	if err != nil {
		return err
	}
	if err := t.topic.Publish(ctx, data); err != nil {
		return fmt.Errorf("publish %s: %w", typ, err)
	}
	t.metrics.incPublished(t.name, typ)
	return nil
}

// Run reads validated messages and passes each to handle until ctx ends.
func (t *Topic) Run(ctx context.Context, handle func(*Received)) error {
	defer t.sub.Cancel()
	for {
		msg, err := t.sub.Next(ctx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, pubsub.ErrSubscriptionCancelled) {
				return nil
			}
			return fmt.Errorf("read %s: %w", t.name, err)
		}
		if rec, ok := msg.ValidatorData.(*Received); ok {
			handle(rec)
		}
	}
}

// ListPeers returns the peers this node exchanges the topic with.
func (t *Topic) ListPeers() []peer.ID { return t.topic.ListPeers() }

// Signer returns the peer ID that signs this node's messages.
func (t *Topic) Signer() peer.ID { return t.key.PeerID() }

// unbackedHalfLife is how fast a peer's count of unbacked deliveries
// decays; unbackedAllowance how many it may have before losing score (an
// honest relay passes a few while its replica lags a block or two), and
// unbackedWeight what each one past the allowance costs.
const (
	unbackedHalfLife  = 10 * time.Minute
	unbackedAllowance = 50
	unbackedWeight    = -10
	maxScoredPeers    = 10_000
)

// deliveries is a decaying count of messages per delivering peer.
type deliveries struct {
	halfLife time.Duration
	mu       sync.Mutex
	count    map[peer.ID]*decaying
}

type decaying struct {
	v  float64
	at time.Time
}

func newDeliveries(halfLife time.Duration) *deliveries {
	return &deliveries{halfLife: halfLife, count: map[peer.ID]*decaying{}}
}

func (d *deliveries) decayed(c *decaying, now time.Time) float64 {
	return c.v * math.Exp2(-float64(now.Sub(c.at))/float64(d.halfLife))
}

func (d *deliveries) add(p peer.ID, now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	c, ok := d.count[p]
	if !ok {
		if len(d.count) >= maxScoredPeers {
			for q, old := range d.count { // forget the ones that have decayed away
				if d.decayed(old, now) < 1 {
					delete(d.count, q)
				}
			}
		}
		if len(d.count) >= maxScoredPeers {
			return
		}
		c = &decaying{at: now}
		d.count[p] = c
	}
	c.v = d.decayed(c, now) + 1
	c.at = now
}

// score is the application-specific gossip score of peer p.
func (d *deliveries) score(p peer.ID) float64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	c, ok := d.count[p]
	if !ok {
		return 0
	}
	over := d.decayed(c, time.Now()) - unbackedAllowance
	if over <= 0 {
		return 0
	}
	return unbackedWeight * over
}

// Tracked is how many signers' sequences the validators remember (tests
// and diagnostics: keys the ledger does not back must add none).
func (g *Gossip) Tracked() int { return g.validator.Tracked() }

// CheckOffer checks an offer from a peer's offer book as the offers
// topic's validator would (Validator.CheckOffer).
func (g *Gossip) CheckOffer(data []byte, now time.Time) (*Received, error) {
	return g.validator.CheckOffer(data, now)
}
