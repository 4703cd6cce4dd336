package tunnel

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/deepmarket/deepmarket/wire"
)

func TestHeaderRoundTrip(t *testing.T) {
	job := strings.Repeat("ab", 32)
	b, err := header{Job: job, Index: 7}.marshal()
	if err != nil {
		t.Fatal(err)
	}
	r := bytes.NewReader(append(b, "payload"...))
	h, err := readHeader(r)
	if err != nil {
		t.Fatal(err)
	}
	if h.Job != job || h.Index != 7 {
		t.Fatalf("read %+v", h)
	}
	// The header is read exactly: the connection's bytes follow untouched.
	if r.Len() != len("payload") {
		t.Fatalf("header read consumed %d bytes of payload", len("payload")-r.Len())
	}
}

func TestHeaderRefused(t *testing.T) {
	cbor := func(v any) []byte {
		b, err := wire.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	framed := func(b []byte) []byte { return append(binary.AppendUvarint(nil, uint64(len(b))), b...) }
	for _, c := range []struct {
		name string
		in   []byte
	}{
		{"empty stream", nil},
		{"zero length", []byte{0}},
		{"over the bound", binary.AppendUvarint(nil, maxHeaderLen+1)},
		{"huge length", binary.AppendUvarint(nil, 1<<40)},
		{"truncated", framed(cbor(header{Job: "j", Index: 1}))[:4]},
		{"not cbor", framed([]byte{0xff, 0xff})},
		{"empty job", framed(cbor(header{Job: "", Index: 1}))},
		{"job too long", framed(cbor(header{Job: strings.Repeat("a", MaxJobLen+1), Index: 1}))},
		{"negative index", framed(cbor(map[string]any{"job": "j", "i": -1}))},
		{"index too big", framed(cbor(header{Job: "j", Index: MaxIndex}))},
		{"wrong types", framed(cbor(map[string]any{"job": 5, "i": "x"}))},
	} {
		if _, err := readHeader(bytes.NewReader(c.in)); !errors.Is(err, ErrBadHeader) {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	if _, err := (header{Job: "", Index: 0}).marshal(); !errors.Is(err, ErrBadHeader) {
		t.Errorf("marshal of an empty job: %v", err)
	}
}

func FuzzReadHeader(f *testing.F) {
	good, _ := header{Job: "job", Index: 3}.marshal()
	f.Add(good)
	f.Add([]byte{0x80, 0x80, 0x80, 0x01})
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bytes.NewReader(in)
		h, err := readHeader(r)
		if err != nil {
			return
		}
		if h.validate() != nil {
			t.Fatalf("accepted an invalid header %+v", h)
		}
		if read := len(in) - r.Len(); read > maxHeaderLen+binary.MaxVarintLen16 {
			t.Fatalf("read %d bytes for one header", read)
		}
	})
}
