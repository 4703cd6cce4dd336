package wire

import (
	"errors"
	"testing"
)

type msg struct {
	A uint64 `cbor:"a"`
	B string `cbor:"b,omitempty"`
	C []byte `cbor:"c"`
}

func TestUnmarshalAcceptsOnlyTheCanonicalEncoding(t *testing.T) {
	good, err := Marshal(msg{A: 7, B: "x", C: []byte{1}})
	if err != nil {
		t.Fatal(err)
	}
	var m msg
	if err := Unmarshal(good, &m); err != nil || m.A != 7 || m.B != "x" {
		t.Fatalf("canonical bytes refused: %v %+v", err, m)
	}
	cases := map[string][]byte{
		// {"a": 7, "b": "x", "c": h'01', "d": 1}: an unknown key.
		"unknown key": {0xa4, 0x61, 'a', 0x07, 0x61, 'b', 0x61, 'x', 0x61, 'c', 0x41, 0x01, 0x61, 'd', 0x01},
		// {"b": "x", "a": 7, "c": h'01'}: keys out of order.
		"unsorted keys": {0xa3, 0x61, 'b', 0x61, 'x', 0x61, 'a', 0x07, 0x61, 'c', 0x41, 0x01},
		// "a": 7 as a two-byte integer.
		"non-minimal integer": {0xa3, 0x61, 'a', 0x18, 0x07, 0x61, 'b', 0x61, 'x', 0x61, 'c', 0x41, 0x01},
		"trailing byte":       append(append([]byte(nil), good...), 0x00),
		// {"a": 7, "b": "", "c": h'01'}: an omitted zero field present.
		"zero field present": {0xa3, 0x61, 'a', 0x07, 0x61, 'b', 0x60, 0x61, 'c', 0x41, 0x01},
		"duplicate key":      {0xa3, 0x61, 'a', 0x07, 0x61, 'a', 0x07, 0x61, 'c', 0x41, 0x01},
	}
	for name, b := range cases {
		var m msg
		err := Unmarshal(b, &m)
		if err == nil {
			t.Errorf("%s: accepted %x", name, b)
			continue
		}
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v does not wrap ErrMalformed", name, err)
		}
	}
}

// FuzzRoundTrip: whatever Unmarshal accepts encodes back to the same
// bytes.
func FuzzRoundTrip(f *testing.F) {
	good, _ := Marshal(msg{A: 7, B: "x", C: []byte{1}})
	f.Add(good)
	f.Add([]byte{0xa0})
	f.Fuzz(func(t *testing.T, b []byte) {
		var m msg
		if Unmarshal(b, &m) != nil {
			return
		}
		again, err := Marshal(m)
		if err != nil || string(again) != string(b) {
			t.Fatalf("accepted %x, encodes to %x (%v)", b, again, err)
		}
	})
}
