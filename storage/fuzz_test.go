package storage

import (
	"bytes"
	"testing"
)

// FuzzDecodeEntry: no entry bytes (a corrupt badger value) make the
// decoder panic or point outside sane bounds, and pointers round-trip.
func FuzzDecodeEntry(f *testing.F) {
	f.Add(encodePointer(pointer{pack: 3, offset: 4096, length: 1 << 20, crc: 0xdeadbeef}))
	f.Add(append([]byte{entryInline}, "hello"...))
	f.Add([]byte{})
	f.Add([]byte{entryPacked, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, e []byte) {
		inline, ptr, packed, err := decodeEntry(e)
		if err != nil {
			return
		}
		if !packed {
			if !bytes.Equal(inline, e[1:]) {
				t.Fatal("inline bytes altered")
			}
			return
		}
		if ptr.length < 0 || ptr.length > 1<<30 || ptr.offset < 0 {
			t.Fatalf("pointer out of bounds: %+v", ptr)
		}
		_, again, _, err := decodeEntry(encodePointer(ptr))
		if err != nil || again != ptr {
			t.Fatalf("round trip %+v -> %+v (%v)", ptr, again, err)
		}
	})
}
