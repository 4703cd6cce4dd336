package tunnel

import (
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
)

// A direct connection carries the tunnelled bytes in frames, each sealed
// with AES-128-GCM under keys exported from the connection's TLS 1.3
// handshake, one key and IV per direction:
//
//	type (1 byte) | payload length (3 bytes, big-endian) | ciphertext | tag (16 bytes)
//
// The 4-byte header is the AEAD's additional data and the nonce is the
// direction's IV XOR the frame's sequence number, as in TLS 1.3's record
// layer, so that a changed, dropped, repeated or reordered frame fails to
// open. A data frame carries 1..maxFramePayload bytes; an end frame, with
// no payload, is a clean half-close. A connection that ends without one
// was cut, and the tunnelled connection is aborted rather than ended.
//
// Frames are TLS records with a larger payload (64 KiB rather than 16):
// the sender reads up to 4 frames' worth with one readv straight into the
// gaps between their headers and tags, seals them in place and writes
// them with one write; the receiver opens what one read brought in place
// and writes the payloads with one writev. Nothing is copied in user space.
const (
	frameHeaderLen  = 4
	frameTagLen     = 16
	maxFramePayload = 64 << 10
	frameStride     = frameHeaderLen + maxFramePayload + frameTagLen

	frameData byte = 0
	frameEnd  byte = 1

	keyLen   = 16 // AES-128
	ivLen    = 12
	keysSize = 2 * (keyLen + ivLen) // both directions
)

// errFrame wraps every frame that cannot be accepted: tampered, forged,
// out of order, or malformed.
var errFrame = errors.New("bad tunnel frame")

// frameKey seals or opens one direction's frames. It is not safe for
// concurrent use; each direction has its own.
type frameKey struct {
	aead cipher.AEAD
	iv   [ivLen]byte
	seq  uint64
}

// newFrameKeys makes the two directions' keys from keysSize bytes of
// exported keying material: the dialer sends with the first half.
func newFrameKeys(km []byte, dialer bool) (send, recv *frameKey, err error) {
	if len(km) != keysSize {
		return nil, nil, fmt.Errorf("frame keys: %d bytes of keying material, want %d", len(km), keysSize)
	}
	mk := func(b []byte) (*frameKey, error) {
		blk, err := aes.NewCipher(b[:keyLen])
		if err != nil {
			return nil, err
		}
		g, err := cipher.NewGCM(blk)
		if err != nil {
			return nil, err
		}
		k := &frameKey{aead: g}
		copy(k.iv[:], b[keyLen:keyLen+ivLen])
		return k, nil
	}
	first, err := mk(km[:keyLen+ivLen])
	if err != nil {
		return nil, nil, fmt.Errorf("frame keys: %w", err)
	}
	second, err := mk(km[keyLen+ivLen:])
	if err != nil {
		return nil, nil, fmt.Errorf("frame keys: %w", err)
	}
	if dialer {
		return first, second, nil
	}
	return second, first, nil
}

func (k *frameKey) nonce() (n [ivLen]byte) {
	n = k.iv
	var seq [8]byte
	binary.BigEndian.PutUint64(seq[:], k.seq)
	for i, b := range seq {
		n[ivLen-8+i] ^= b
	}
	k.seq++
	return n
}

// seal turns frame[frameHeaderLen:frameHeaderLen+n], the payload, into a
// sealed frame of type typ in place, and returns the whole frame; frame
// must have room for the tag after the payload.
func (k *frameKey) seal(frame []byte, typ byte, n int) []byte {
	frame[0] = typ
	frame[1], frame[2], frame[3] = byte(n>>16), byte(n>>8), byte(n)
	nonce := k.nonce()
	k.aead.Seal(frame[frameHeaderLen:frameHeaderLen], nonce[:], frame[frameHeaderLen:frameHeaderLen+n], frame[:frameHeaderLen])
	return frame[:frameHeaderLen+n+frameTagLen]
}

// frameHeader reads the type and payload length at the start of b, which
// holds at least frameHeaderLen bytes, and checks them: what a header says
// is only trusted once its frame opens.
func frameHeader(b []byte) (typ byte, n int, err error) {
	typ, n = b[0], int(b[1])<<16|int(b[2])<<8|int(b[3])
	switch {
	case typ == frameData && n >= 1 && n <= maxFramePayload:
	case typ == frameEnd && n == 0:
	default:
		return typ, n, fmt.Errorf("%w: type %d with %d bytes", errFrame, typ, n)
	}
	return typ, n, nil
}

// open checks and decrypts frame, one whole frame as frameHeader sized it,
// in place and returns its payload.
func (k *frameKey) open(frame []byte) ([]byte, error) {
	nonce := k.nonce()
	p, err := k.aead.Open(frame[frameHeaderLen:frameHeaderLen], nonce[:], frame[frameHeaderLen:], frame[:frameHeaderLen])
	if err != nil {
		return nil, fmt.Errorf("%w: frame %d does not open", errFrame, k.seq-1)
	}
	return p, nil
}

// openFrames opens, in place, the whole frames at the start of b, up to and
// including an end frame, and appends their payloads to into. It returns
// how many bytes of b those frames took, how many payload bytes they
// carried, and whether the last was the end frame. An error means that b
// holds a frame that must not be believed: the connection is done for.
func (k *frameKey) openFrames(b []byte, into net.Buffers) (_ net.Buffers, used, n int, fin bool, err error) {
	for len(b)-used >= frameHeaderLen {
		typ, m, err := frameHeader(b[used:])
		if err != nil {
			return into, used, n, false, err
		}
		size := frameHeaderLen + m + frameTagLen
		if len(b)-used < size {
			break
		}
		p, err := k.open(b[used : used+size])
		if err != nil {
			return into, used, n, false, err
		}
		used += size
		if typ == frameEnd {
			return into, used, n, true, nil
		}
		into = append(into, p)
		n += len(p)
	}
	return into, used, n, false, nil
}
