package tunnel

import (
	"bytes"
	"crypto/rand"
	"errors"
	"testing"
)

// keyPair is both directions' keys as the dialer and the listener derive
// them from one handshake's keying material.
func keyPair(t testing.TB, km []byte) (dialerSend, dialerRecv, listenerSend, listenerRecv *frameKey) {
	t.Helper()
	ds, dr, err := newFrameKeys(km, true)
	if err != nil {
		t.Fatal(err)
	}
	ls, lr, err := newFrameKeys(km, false)
	if err != nil {
		t.Fatal(err)
	}
	return ds, dr, ls, lr
}

func testKeyMaterial() []byte {
	km := make([]byte, keysSize)
	for i := range km {
		km[i] = byte(i * 7)
	}
	return km
}

// sealStream seals each of payloads as a data frame, then an end frame.
func sealStream(k *frameKey, payloads ...[]byte) []byte {
	var out []byte
	for _, p := range append(payloads, nil) {
		frame := make([]byte, frameHeaderLen+len(p)+frameTagLen)
		copy(frame[frameHeaderLen:], p)
		typ := frameData
		if p == nil {
			typ = frameEnd
		}
		out = append(out, k.seal(frame, typ, len(p))...)
	}
	return out
}

func joined(bufs [][]byte) []byte { return bytes.Join(bufs, nil) }

func TestFramesRoundTrip(t *testing.T) {
	ds, dr, ls, lr := keyPair(t, testKeyMaterial())
	a, b := make([]byte, maxFramePayload), []byte("the last few bytes")
	rand.Read(a)
	// Each direction has its own key: what the dialer seals, the listener
	// opens, and the other way.
	for _, dir := range []struct {
		name       string
		send, recv *frameKey
	}{{"dialer to listener", ds, lr}, {"listener to dialer", ls, dr}} {
		stream := sealStream(dir.send, a, b)
		got, used, n, fin, err := dir.recv.openFrames(stream, nil)
		if err != nil || !fin || used != len(stream) || n != len(a)+len(b) {
			t.Fatalf("%s: used %d of %d, %d bytes, fin %v, %v", dir.name, used, len(stream), n, fin, err)
		}
		if !bytes.Equal(joined(got), append(append([]byte(nil), a...), b...)) {
			t.Fatalf("%s: payloads differ", dir.name)
		}
	}
}

// TestFramesPartial: a frame is opened only once all of it is there.
func TestFramesPartial(t *testing.T) {
	ds, _, _, lr := keyPair(t, testKeyMaterial())
	stream := sealStream(ds, []byte("one"), []byte("two"))
	first := frameHeaderLen + 3 + frameTagLen
	for cut := range first {
		got, used, _, fin, err := lr.openFrames(append([]byte(nil), stream[:cut]...), nil)
		if err != nil || used != 0 || fin || len(got) != 0 {
			t.Fatalf("%d bytes of the first frame: used %d, %d payloads, fin %v, %v", cut, used, len(got), fin, err)
		}
	}
	got, used, _, _, err := lr.openFrames(stream[:first+5], nil)
	if err != nil || used != first || string(joined(got)) != "one" {
		t.Fatalf("first frame and a bit: used %d, %q, %v", used, joined(got), err)
	}
	got, _, _, fin, err := lr.openFrames(stream[first:], nil)
	if err != nil || !fin || string(joined(got)) != "two" {
		t.Fatalf("the rest: %q, fin %v, %v", joined(got), fin, err)
	}
}

// TestFramesTampered changes each byte of a sealed stream in turn: no
// change may yield a payload that was not sent, or a clean end.
func TestFramesTampered(t *testing.T) {
	payloads := [][]byte{[]byte("first frame"), []byte("second frame")}
	km := testKeyMaterial()
	ds, _, _, _ := keyPair(t, km)
	stream := sealStream(ds, payloads...)
	sent := joined(payloads)
	for i := range stream {
		for _, flip := range []byte{0x01, 0x80} {
			_, _, _, lr := keyPair(t, km)
			b := append([]byte(nil), stream...)
			b[i] ^= flip
			got, _, _, fin, err := lr.openFrames(b, nil)
			if fin {
				t.Fatalf("byte %d ^ %#x: the stream still ended cleanly", i, flip)
			}
			if !bytes.HasPrefix(sent, joined(got)) {
				t.Fatalf("byte %d ^ %#x: opened %q, not a prefix of what was sent", i, flip, joined(got))
			}
			if err != nil && !errors.Is(err, errFrame) {
				t.Fatalf("byte %d ^ %#x: %v", i, flip, err)
			}
		}
	}
}

// TestFramesOutOfOrder: frames replayed, reordered or reflected do not open.
func TestFramesOutOfOrder(t *testing.T) {
	km := testKeyMaterial()
	ds, _, _, _ := keyPair(t, km)
	one, two := sealStream(ds, []byte("one")), sealStream(ds, []byte("two"))
	frame := func(s []byte) []byte { return s[:frameHeaderLen+3+frameTagLen] }
	for _, c := range []struct {
		name   string
		stream []byte
		recv   func() *frameKey
	}{
		{"replayed", append(append([]byte(nil), frame(one)...), frame(one)...), func() *frameKey { _, _, _, lr := keyPair(t, km); return lr }},
		{"reordered", append(append([]byte(nil), frame(two)...), frame(one)...), func() *frameKey { _, _, _, lr := keyPair(t, km); return lr }},
		{"reflected", frame(one), func() *frameKey { _, dr, _, _ := keyPair(t, km); return dr }},
	} {
		got, _, _, _, err := c.recv().openFrames(append([]byte(nil), c.stream...), nil)
		if !errors.Is(err, errFrame) {
			t.Errorf("%s: %q, %v; want a bad frame", c.name, joined(got), err)
		}
		if c.name != "reflected" && string(joined(got)) != "one" && string(joined(got)) != "" {
			t.Errorf("%s: opened %q", c.name, joined(got))
		}
	}
}

func TestFrameHeaderBounds(t *testing.T) {
	for _, c := range []struct {
		hdr []byte
		ok  bool
	}{
		{[]byte{frameData, 0, 0, 1}, true},
		{[]byte{frameData, 0x01, 0x00, 0x00}, true}, // maxFramePayload
		{[]byte{frameData, 0x01, 0x00, 0x01}, false},
		{[]byte{frameData, 0, 0, 0}, false},
		{[]byte{frameEnd, 0, 0, 0}, true},
		{[]byte{frameEnd, 0, 0, 1}, false},
		{[]byte{2, 0, 0, 1}, false},
	} {
		if _, _, err := frameHeader(c.hdr); (err == nil) != c.ok {
			t.Errorf("header %x: %v", c.hdr, err)
		}
	}
}

// FuzzOpenFrames cuts a sealed stream into reads of the fuzzer's sizes and
// may flip one bit of it: what comes out is always a prefix of what went
// in, all of it if nothing was flipped, and never a clean end after a flip.
func FuzzOpenFrames(f *testing.F) {
	f.Add([]byte("hello, frames"), uint16(5), uint16(3), uint32(0), false)
	f.Add(bytes.Repeat([]byte{7}, 3*maxFramePayload/2), uint16(65535), uint16(100), uint32(70000), true)
	f.Fuzz(func(t *testing.T, data []byte, frame, read uint16, at uint32, flip bool) {
		km := testKeyMaterial()
		ds, _, _, lr := keyPair(t, km)
		// At most 64 frames and 4096 reads, so that each input runs fast.
		size := max(1, int(frame)%(maxFramePayload+1), (len(data)+63)/64)
		var payloads [][]byte
		for rest := data; len(rest) > 0; {
			k := min(size, len(rest))
			payloads, rest = append(payloads, rest[:k]), rest[k:]
		}
		stream := sealStream(ds, payloads...)
		if flip {
			stream[int(at)%len(stream)] ^= 1 << (at % 8)
		}
		// As receive does: read into a buffer, open whole frames, keep the rest.
		step := max(1, int(read), len(stream)/4096)
		var got []byte
		fin, start, avail := false, 0, 0
		for !fin && avail < len(stream) {
			avail = min(avail+step, len(stream))
			opened, used, n, end, err := lr.openFrames(stream[start:avail], nil)
			if n != len(joined(opened)) {
				t.Fatalf("%d payload bytes counted, %d opened", n, len(joined(opened)))
			}
			got, start, fin = append(got, joined(opened)...), start+used, end
			if err != nil {
				break
			}
		}
		if !bytes.HasPrefix(data, got) {
			t.Fatalf("opened %d bytes that were not sent", len(got))
		}
		if flip && fin {
			t.Fatal("a flipped bit still ended cleanly")
		}
		if !flip && (!fin || len(got) != len(data)) {
			t.Fatalf("got %d of %d bytes, fin %v", len(got), len(data), fin)
		}
	})
}
