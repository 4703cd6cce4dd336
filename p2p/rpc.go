package p2p

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/bits"
	"regexp"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/deepmarket/deepmarket/identity"
)

// Request/response payload types, carried in envelopes over streams.
const (
	TypeReserve      = "reserve/1"
	TypeReserveReply = "reserve-reply/1"
	TypeQuote        = "quote/1"
	TypeQuoteAck     = "quote-ack/1"
)

// QuoteAck is a bidder's receipt for a quote.
type QuoteAck struct {
	OK bool `cbor:"ok" json:"ok"`
}

// Stream protocols, one per network.
func ReserveProtocol(chainID string) protocol.ID {
	return protocol.ID("/deepmarket/" + chainID + "/reserve/1")
}

// QuoteProtocol carries a scheduler's quote to a bidder.
func QuoteProtocol(chainID string) protocol.ID {
	return protocol.ID("/deepmarket/" + chainID + "/quote/1")
}

// rpcTimeout bounds one request and its reply.
const rpcTimeout = 10 * time.Second

// rpcTTL is how long a request or reply envelope is valid: it is answered
// at once, so a short life keeps replays out.
const rpcTTL = time.Minute

// Reservation operations. A machine is the only authority over its
// capacity: a scheduler holds capacity with OpReserve (the hold lapses
// after TTL unless committed), then the bidder commits it (OpCommit) or
// either releases it (OpRelease).
const (
	OpReserve = "reserve"
	OpCommit  = "commit"
	OpRelease = "release"
)

// MaxHoldTTL bounds an uncommitted hold: the quote window. Only the
// bidder's commit (its acceptance of the quote) keeps a machine longer.
const MaxHoldTTL = time.Minute

var reservationIDRE = regexp.MustCompile(`^[0-9a-f]{16,64}$`)

// Reserve asks a machine to hold, commit or release capacity.
type Reserve struct {
	Op    string    `cbor:"op" json:"op"`
	ID    string    `cbor:"id" json:"id"` // chosen by the scheduler, hex
	JobID string    `cbor:"job" json:"job_id"`
	Res   Resources `cbor:"res,omitempty" json:"resources"`
	TTL   int64     `cbor:"ttl,omitempty" json:"ttl_s"` // seconds, OpReserve only
	// Bidder is the peer that bid for the job (OpReserve): it may commit
	// or release the hold too, and launch the job on it.
	Bidder string `cbor:"bidder,omitempty" json:"bidder,omitempty"`
	// Bid is the bidder's signed bid envelope, as gossip carried it
	// (OpReserve): a machine holds capacity only for a bid it has checked
	// itself, from a member whose balance covers the bid.
	Bid []byte `cbor:"bid,omitempty" json:"-"`
	// Receipt is the bidder's signed receipt for the hold's launch window
	// (OpCommit): its hourly price for HoldChargeWindow, which the machine
	// lodges against the run's escrow if the hold lapses, or the bidder
	// releases it, unlaunched once that escrow is open (HoldCharge).
	Receipt *Receipt `cbor:"receipt,omitempty" json:"receipt,omitempty"`
}

// HoldChargeWindow is the most of a committed hold's wait for its launch
// that the hold's receipt covers.
const HoldChargeWindow = 2 * time.Minute

// HoldCharge is what a committed hold that is never launched costs its
// bidder at perHour (micro-credits an hour) for window (at most
// HoldChargeWindow): rounded up, at least 1 when perHour is not 0.
func HoldCharge(perHour uint64, window time.Duration) uint64 {
	window = min(window, HoldChargeWindow)
	if perHour == 0 || window <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(perHour, uint64(window))
	if hi >= uint64(time.Hour) {
		return math.MaxUint64
	}
	q, rem := bits.Div64(hi, lo, uint64(time.Hour))
	if rem > 0 {
		q++
	}
	return max(q, 1)
}

// Validate checks a reservation request.
func (r *Reserve) Validate() error {
	switch r.Op {
	case OpReserve:
		if err := r.Res.check("resources", false); err != nil {
			return err
		}
		if r.Res == (Resources{}) {
			return rangeErr("reserve: nothing asked for")
		}
		if r.TTL <= 0 || r.TTL > int64(MaxHoldTTL/time.Second) {
			return rangeErr("ttl %ds not in 1..%d", r.TTL, int64(MaxHoldTTL/time.Second))
		}
		if _, err := peer.Decode(r.Bidder); err != nil {
			return rangeErr("bidder %q: %v", r.Bidder, err)
		}
		if len(r.Bid) == 0 || len(r.Bid) > MaxEnvelopeSize {
			return rangeErr("reserve: the bid's signed envelope is missing or oversize")
		}
	case OpCommit, OpRelease:
	default:
		return rangeErr("op %q (want reserve, commit or release)", r.Op)
	}
	if r.Receipt != nil {
		switch {
		case r.Op != OpCommit:
			return rangeErr("%s: only a commit carries a receipt", r.Op)
		case len(r.Receipt.Payee) == 0 || len(r.Receipt.Payee) > 128 || len(r.Receipt.Sig) != 64 || r.Receipt.Answer != nil:
			return rangeErr("commit: malformed receipt")
		}
	}
	if !reservationIDRE.MatchString(r.ID) {
		return rangeErr("reservation ID %q is not 16-64 hex digits", r.ID)
	}
	if !jobIDRE.MatchString(r.JobID) {
		return rangeErr("job ID %q is not a hex SHA-256", r.JobID)
	}
	return nil
}

// ReserveReply is a machine's answer.
type ReserveReply struct {
	OK      bool      `cbor:"ok" json:"ok"`
	Reason  string    `cbor:"reason,omitempty" json:"reason,omitempty"`
	Expires int64     `cbor:"exp,omitempty" json:"expires_ms,omitempty"` // unix ms; uncommitted holds
	Free    Resources `cbor:"free" json:"free"`                          // after this operation
}

// QuotedWorker is one worker's machine and hourly price in a quote.
type QuotedWorker struct {
	Machine string `cbor:"machine" json:"machine"`
	PerHour uint64 `cbor:"per_hour" json:"per_hour"`
	// Hold is the reservation on that machine that holds the worker.
	Hold string `cbor:"hold" json:"hold"`
}

// Quote is a scheduler's answer to a bid: a placement held on the
// machines and its price, or why there is none.
type Quote struct {
	JobID   string         `cbor:"job" json:"job_id"`
	Workers []QuotedWorker `cbor:"workers,omitempty" json:"workers,omitempty"`
	PerHour uint64         `cbor:"per_hour,omitempty" json:"per_hour,omitempty"`
	// Total is the most the placement costs; on a refusal for price
	// (Resource "price") it is what the job would cost now.
	Total     uint64 `cbor:"total,omitempty" json:"total,omitempty"`
	DoneAt    int64  `cbor:"done,omitempty" json:"done_at,omitempty"`       // unix seconds
	HeldUntil int64  `cbor:"held,omitempty" json:"held_until_ms,omitempty"` // unix ms
	// Resource and Reason say why there is no quote (Workers empty).
	Resource string `cbor:"resource,omitempty" json:"resource,omitempty"`
	Reason   string `cbor:"reason,omitempty" json:"reason,omitempty"`
	// Predicted is the job's expected time on the quoted machines, when
	// the bid described its work ([training] steps and params).
	Predicted *Predicted `cbor:"predicted,omitempty" json:"predicted,omitempty"`
}

// Predicted is a quote's prediction of a training job's time: one step,
// the whole job (and what of it is spent exchanging weights), and the
// speed-up over one worker; Fewest is the worker count predicted to
// finish soonest on these machines.
type Predicted struct {
	StepMillis   float64 `cbor:"step_ms" json:"step_ms"`
	TotalSeconds float64 `cbor:"total_s" json:"total_s"`
	CommSeconds  float64 `cbor:"comm_s" json:"comm_s"`
	SpeedUp      float64 `cbor:"speed_up" json:"speed_up"`
	Fewest       int     `cbor:"fewest" json:"fewest"`
}

// Validate checks a quote's shape.
func (q *Quote) Validate() error {
	if !jobIDRE.MatchString(q.JobID) {
		return rangeErr("job ID %q is not a hex SHA-256", q.JobID)
	}
	if len(q.Workers) > MaxWorkers {
		return rangeErr("%d workers exceeds %d", len(q.Workers), MaxWorkers)
	}
	if len(q.Workers) == 0 && q.Reason == "" {
		return rangeErr("a quote without workers must say why")
	}
	for _, w := range q.Workers {
		if _, err := peer.Decode(w.Machine); err != nil {
			return rangeErr("worker machine %q: %v", w.Machine, err)
		}
		if !reservationIDRE.MatchString(w.Hold) {
			return rangeErr("worker hold %q", w.Hold)
		}
	}
	if len(q.Reason) > maxTextLen || len(q.Resource) > maxLabelLen {
		return rangeErr("reason too long")
	}
	if p := q.Predicted; p != nil {
		ok := func(x float64) bool { return x >= 0 && x < 1e12 } // NaN fails too
		if !ok(p.StepMillis) || !ok(p.TotalSeconds) || !ok(p.CommSeconds) || !ok(p.SpeedUp) || p.Fewest < 0 || p.Fewest > MaxWorkers {
			return rangeErr("prediction %+v", *p)
		}
	}
	return nil
}

// RPC sends signed requests over streams and answers them.
type RPC struct {
	Host    host.Host
	Key     *identity.Key
	ChainID string
	Logger  *slog.Logger
	seq     Sequencer
}

// Call opens a stream to p on proto, sends req as a signed envelope of
// type typ, and decodes the reply, which must be signed by p and of type
// replyType, into reply.
func (r *RPC) Call(ctx context.Context, p peer.ID, proto protocol.ID, typ string, req any, replyType string, reply any) error {
	ctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	defer cancel()
	// Requests and replies are small and bounded (maxFrame): they may
	// cross a relay while the two machines have no direct connection, as
	// between labs behind NATs before (or without) a hole punch.
	AddRelayAddrs(r.Host, p)
	s, err := r.Host.NewStream(network.WithAllowLimitedConn(ctx, "deepmarket rpc"), p, proto)
	if err != nil {
		return fmt.Errorf("%s to %s: %w", typ, p, err)
	}
	defer s.Close()
	if dl, ok := ctx.Deadline(); ok {
		s.SetDeadline(dl)
	}
	data, err := Seal(r.Key, r.ChainID, typ, req, r.seq.Next(), time.Now().Add(rpcTTL))
	if err != nil {
		return err
	}
	if err := writeFrame(s, data); err != nil {
		s.Reset()
		return fmt.Errorf("%s to %s: %w", typ, p, err)
	}
	s.CloseWrite()
	env, err := r.readEnvelope(s)
	if err != nil {
		return fmt.Errorf("%s reply from %s: %w", typ, p, err)
	}
	if env.SignerID() != p {
		return fmt.Errorf("%s reply from %s: %w (signed by %s)", typ, p, ErrSignerMismatch, env.SignerID())
	}
	if env.Type != replyType {
		return fmt.Errorf("%s reply from %s: %w %q", typ, p, ErrUnknownType, env.Type)
	}
	return Unmarshal(env.Payload, reply)
}

// Handle answers requests on proto: each is opened (size, signature under
// this network, expiry), its signer checked against the stream's remote
// peer, and passed to fn with its payload; fn's reply is sealed and sent.
// A request fn refuses (an error) gets the stream reset.
func (r *RPC) Handle(proto protocol.ID, fn func(ctx context.Context, from peer.ID, env *Envelope) (replyType string, reply any, err error)) {
	r.HandleGated(proto, nil, fn)
}

// HandleGated is Handle with a gate asked about the remote peer before a
// byte of its request is read: a peer the gate refuses gets the stream
// reset at once, so that a refusal costs a lookup, not a signature check.
// A nil gate lets everyone through.
func (r *RPC) HandleGated(proto protocol.ID, gate func(peer.ID) bool, fn func(ctx context.Context, from peer.ID, env *Envelope) (replyType string, reply any, err error)) {
	if r.Logger == nil {
		r.Logger = slog.New(slog.DiscardHandler)
	}
	r.Host.SetStreamHandler(proto, func(s network.Stream) {
		defer s.Close()
		from := s.Conn().RemotePeer()
		if gate != nil && !gate(from) {
			s.Reset()
			return
		}
		s.SetDeadline(time.Now().Add(rpcTimeout))
		env, err := r.readEnvelope(s)
		if err == nil && env.SignerID() != from {
			err = fmt.Errorf("%w: stream from %s, signed by %s", ErrSignerMismatch, from, env.SignerID())
		}
		if err != nil {
			r.Logger.Debug("refused request", "protocol", proto, "from", from, "err", err)
			s.Reset()
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
		defer cancel()
		typ, reply, err := fn(ctx, from, env)
		if err != nil {
			r.Logger.Debug("refused request", "protocol", proto, "from", from, "err", err)
			s.Reset()
			return
		}
		data, err := Seal(r.Key, r.ChainID, typ, reply, r.seq.Next(), time.Now().Add(rpcTTL))
		if err == nil {
			err = writeFrame(s, data)
		}
		if err != nil {
			s.Reset()
		}
	})
}

func (r *RPC) readEnvelope(s io.Reader) (*Envelope, error) {
	data, err := readFrame(s)
	if err != nil {
		return nil, err
	}
	return Open(data, r.ChainID, time.Now())
}

// Frames are a uvarint length then that many bytes, at most one envelope.
func writeFrame(w io.Writer, b []byte) error {
	buf := binary.AppendUvarint(make([]byte, 0, len(b)+binary.MaxVarintLen32), uint64(len(b)))
	_, err := w.Write(append(buf, b...))
	return err
}

func readFrame(r io.Reader) ([]byte, error) {
	br := byteReader{r}
	n, err := binary.ReadUvarint(br)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if n > MaxEnvelopeSize {
		return nil, fmt.Errorf("%w: %d bytes", ErrOversize, n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return b, nil
}

type byteReader struct{ r io.Reader }

func (b byteReader) ReadByte() (byte, error) {
	var one [1]byte
	_, err := io.ReadFull(b.r, one[:])
	if errors.Is(err, io.ErrUnexpectedEOF) {
		err = io.EOF
	}
	return one[0], err
}

// OpenBid opens a bid's signed envelope (a Reserve's Bid) as a machine
// must before holding capacity for it: signature under chainID, expiry,
// type, the bid's values, and the submitter being the signer. The bid
// comes back as a received one: its signer, sequence and expiry with it.
func OpenBid(data []byte, chainID string, now time.Time) (*Received, error) {
	env, err := Open(data, chainID, now)
	if err != nil {
		return nil, err
	}
	if env.Type != TypeBid {
		return nil, fmt.Errorf("%w: %q where a bid belongs", ErrUnknownType, env.Type)
	}
	rec := &Received{Signer: env.SignerID(), Type: env.Type, Seq: env.Seq, Expiry: env.ExpiresAt(), Raw: data}
	if err := decodeBid(env, rec); err != nil {
		return nil, err
	}
	return rec, nil
}
