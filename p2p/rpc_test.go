package p2p

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

func rpcHost(t *testing.T, b byte) *RPC {
	t.Helper()
	k := testKey(t, b)
	h, err := NewHost(HostParams{Key: k, Listen: []string{"/ip4/127.0.0.1/tcp/0"}, Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return &RPC{Host: h, Key: k, ChainID: testChain}
}

func TestRPCReserve(t *testing.T) {
	machine, sched := rpcHost(t, 1), rpcHost(t, 2)
	var seenFrom peer.ID
	machine.Handle(ReserveProtocol(testChain), func(_ context.Context, from peer.ID, env *Envelope) (string, any, error) {
		var r Reserve
		if err := Unmarshal(env.Payload, &r); err != nil {
			return "", nil, err
		}
		if err := r.Validate(); err != nil {
			return "", nil, err
		}
		seenFrom = from
		return TypeReserveReply, ReserveReply{OK: true, Free: Resources{Cores: 3}}, nil
	})
	if err := sched.Host.Connect(t.Context(), peer.AddrInfo{ID: machine.Host.ID(), Addrs: machine.Host.Addrs()}); err != nil {
		t.Fatal(err)
	}
	bidder := testKey(t, 3)
	req := Reserve{Op: OpReserve, ID: "00112233445566778899aabbccddeeff", JobID: testBid(bidder).JobID,
		Res: Resources{Cores: 1, MemBytes: 1 << 20}, TTL: 60, Bidder: bidder.PeerID().String(),
		Bid: seal(t, bidder, testChain, TypeBid, testBid(bidder), 1, time.Now().Add(time.Minute))}
	var reply ReserveReply
	if err := sched.Call(t.Context(), machine.Host.ID(), ReserveProtocol(testChain), TypeReserve, &req, TypeReserveReply, &reply); err != nil {
		t.Fatal(err)
	}
	if !reply.OK || reply.Free.Cores != 3 || seenFrom != sched.Host.ID() {
		t.Fatalf("reply %+v from %s", reply, seenFrom)
	}
	// A request the machine refuses (invalid) resets the stream: an error.
	bad := req
	bad.TTL = 0
	if err := sched.Call(t.Context(), machine.Host.ID(), ReserveProtocol(testChain), TypeReserve, &bad, TypeReserveReply, &reply); err == nil {
		t.Fatal("an invalid hold request got a reply")
	}
	// A reply of the wrong type is refused by the caller.
	if err := sched.Call(t.Context(), machine.Host.ID(), ReserveProtocol(testChain), TypeReserve, &req, TypeQuoteAck, &reply); !errors.Is(err, ErrUnknownType) {
		t.Fatalf("wrong reply type: %v", err)
	}
}

func TestReserveAndQuoteValidate(t *testing.T) {
	bidder := testKey(t, 3)
	job := testBid(bidder).JobID
	by, bid := bidder.PeerID().String(), []byte{1}
	for _, c := range []struct {
		name string
		r    Reserve
		ok   bool
	}{
		{"reserve", Reserve{Op: OpReserve, ID: "0011223344556677", JobID: job, Res: Resources{Cores: 1}, TTL: 60, Bidder: by, Bid: bid}, true},
		{"no bid", Reserve{Op: OpReserve, ID: "0011223344556677", JobID: job, Res: Resources{Cores: 1}, TTL: 60, Bidder: by}, false},
		{"no bidder", Reserve{Op: OpReserve, ID: "0011223344556677", JobID: job, Res: Resources{Cores: 1}, TTL: 60, Bid: bid}, false},
		{"commit", Reserve{Op: OpCommit, ID: "0011223344556677", JobID: job}, true},
		{"nothing asked", Reserve{Op: OpReserve, ID: "0011223344556677", JobID: job, TTL: 60, Bidder: by, Bid: bid}, false},
		{"ttl too long", Reserve{Op: OpReserve, ID: "0011223344556677", JobID: job, Res: Resources{Cores: 1}, TTL: 3600, Bidder: by, Bid: bid}, false},
		{"bad id", Reserve{Op: OpCommit, ID: "xyz", JobID: job}, false},
		{"bad op", Reserve{Op: "steal", ID: "0011223344556677", JobID: job}, false},
		{"absurd cores", Reserve{Op: OpReserve, ID: "0011223344556677", JobID: job, Res: Resources{Cores: MaxCores + 1}, TTL: 60}, false},
	} {
		if err := c.r.Validate(); (err == nil) != c.ok {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	m := testKey(t, 1).PeerID().String()
	good := Quote{JobID: job, Workers: []QuotedWorker{{Machine: m, PerHour: 5, Hold: "0011223344556677"}}, Total: 5}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, q := range []Quote{
		{JobID: job},                  // neither placement nor reason
		{JobID: "nope", Reason: "no"}, // bad job
		{JobID: job, Workers: []QuotedWorker{{Machine: "not-a-peer", Hold: "0011223344556677"}}},
		{JobID: job, Workers: []QuotedWorker{{Machine: m, Hold: "short"}}},
	} {
		if err := q.Validate(); err == nil {
			t.Errorf("quote %+v passed", q)
		}
	}
}

// TestQuoteRefusesBadPredictions: a scheduler's prediction must be finite,
// non-negative and bounded, or the bidder refuses the quote.
func TestQuoteRefusesBadPredictions(t *testing.T) {
	job := strings.Repeat("ab", 32)
	good := Quote{JobID: job, Reason: "none fits", Predicted: &Predicted{StepMillis: 50, TotalSeconds: 60, SpeedUp: 1.8, Fewest: 2}}
	if err := good.Validate(); err != nil {
		t.Fatalf("a good prediction: %v", err)
	}
	for name, p := range map[string]Predicted{
		"NaN total":       {TotalSeconds: math.NaN()},
		"infinite step":   {StepMillis: math.Inf(1)},
		"negative comm":   {CommSeconds: -1},
		"absurd speed-up": {SpeedUp: 1e13},
		"fewest too many": {Fewest: MaxWorkers + 1},
	} {
		q := good
		q.Predicted = &p
		if err := q.Validate(); !errors.Is(err, ErrOutOfRange) {
			t.Errorf("%s: %v, want out of range", name, err)
		}
	}
}
