package tunnel

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/deepmarket/deepmarket/wire"
)

// Bounds on what a header may name. Job IDs are hex SHA-256 (64 bytes);
// the slack leaves room without letting a peer make us buffer much.
const (
	MaxJobLen    = 128
	MaxIndex     = 1 << 16
	maxHeaderLen = 256
)

// ErrBadHeader wraps every header a stream cannot be accepted on.
var ErrBadHeader = errors.New("bad tunnel header")

// header opens every tunnel stream: which worker of which job the
// connection is for. On the wire it is a uvarint length, then that many
// bytes of CBOR (package wire), at most maxHeaderLen.
type header struct {
	Job   string `cbor:"job"`
	Index int    `cbor:"i"`
}

func (h header) validate() error {
	if h.Job == "" || len(h.Job) > MaxJobLen {
		return fmt.Errorf("%w: job ID of %d bytes (want 1..%d)", ErrBadHeader, len(h.Job), MaxJobLen)
	}
	if h.Index < 0 || h.Index >= MaxIndex {
		return fmt.Errorf("%w: worker index %d (want 0..%d)", ErrBadHeader, h.Index, MaxIndex-1)
	}
	return nil
}

func (h header) marshal() ([]byte, error) {
	if err := h.validate(); err != nil {
		return nil, err
	}
	b, err := wire.Marshal(h)
	if err != nil {
		return nil, err
	}
	return append(binary.AppendUvarint(nil, uint64(len(b))), b...), nil
}

// readHeader reads exactly one header and nothing past it: what follows is
// the tunnelled connection's first bytes.
func readHeader(r io.Reader) (header, error) {
	var h header
	var lenBuf [binary.MaxVarintLen16]byte
	n := uint64(0)
	for i := 0; ; i++ {
		if i == len(lenBuf) {
			return h, fmt.Errorf("%w: length prefix too long", ErrBadHeader)
		}
		if _, err := io.ReadFull(r, lenBuf[i:i+1]); err != nil {
			return h, fmt.Errorf("%w: %v", ErrBadHeader, err)
		}
		if lenBuf[i] < 0x80 {
			var k int
			n, k = binary.Uvarint(lenBuf[:i+1])
			if k <= 0 {
				return h, fmt.Errorf("%w: bad length prefix", ErrBadHeader)
			}
			break
		}
	}
	if n == 0 || n > maxHeaderLen {
		return h, fmt.Errorf("%w: %d bytes (want 1..%d)", ErrBadHeader, n, maxHeaderLen)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return h, fmt.Errorf("%w: %v", ErrBadHeader, err)
	}
	if err := wire.Unmarshal(b, &h); err != nil {
		return h, fmt.Errorf("%w: %v", ErrBadHeader, err)
	}
	return h, h.validate()
}
