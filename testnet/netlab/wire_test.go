package netlab

import (
	"encoding/binary"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// packetPair is two connected descriptors that keep message boundaries, as
// a TAP device does: a wire can run between them without root.
func packetPair(t *testing.T) (*os.File, *os.File) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	return os.NewFile(uintptr(fds[0]), "a"), os.NewFile(uintptr(fds[1]), "b")
}

// testWire runs a wire shaped like h both ways and returns the outer ends:
// what is written to in comes out of out.
func testWire(t *testing.T, h Link) (in, out *os.File, w *wire) {
	t.Helper()
	in, wa := packetPair(t)
	wb, out := packetPair(t)
	w, err := newWire(wa, wb, h, h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		w.close()
		in.Close()
		out.Close()
	})
	return in, out, w
}

func send(t *testing.T, f *os.File, n, size int) {
	t.Helper()
	b := make([]byte, size)
	for i := range n {
		binary.BigEndian.PutUint32(b, uint32(i))
		if _, err := f.Write(b); err != nil {
			t.Fatal(err)
		}
	}
}

// receive reads n frames, failing the test if they don't come within
// timeout or come out of order.
func receive(t *testing.T, f *os.File, n int, timeout time.Duration) {
	t.Helper()
	f.SetReadDeadline(time.Now().Add(timeout))
	b := make([]byte, 2048)
	for i := range n {
		m, err := f.Read(b)
		if err != nil {
			t.Fatalf("frame %d of %d: %v", i, n, err)
		}
		if m < 4 || binary.BigEndian.Uint32(b) != uint32(i) {
			t.Fatalf("frame %d came out as %d", i, binary.BigEndian.Uint32(b))
		}
	}
}

func TestWireDelays(t *testing.T) {
	in, out, _ := testWire(t, Link{Delay: 30 * time.Millisecond})
	start := time.Now()
	send(t, in, 1, 100)
	receive(t, out, 1, 5*time.Second)
	if d := time.Since(start); d < 30*time.Millisecond {
		t.Errorf("frame came through in %v, before its 30ms delay", d)
	}
}

func TestWireJitterKeepsOrder(t *testing.T) {
	in, out, _ := testWire(t, Link{Delay: 3 * time.Millisecond, Jitter: 3 * time.Millisecond})
	send(t, in, 200, 100)
	receive(t, out, 200, 5*time.Second)
}

func TestWirePaces(t *testing.T) {
	in, out, _ := testWire(t, Link{RateBits: 8_000_000}) // 1 MB/s
	start := time.Now()
	send(t, in, 100, 1000)
	receive(t, out, 100, 5*time.Second)
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Errorf("100 kB went through 8 Mbit/s in %v, under 100ms", d)
	}
}

func TestWireDropsAndReshapes(t *testing.T) {
	in, out, w := testWire(t, Link{Loss: 100})
	send(t, in, 10, 100)
	out.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if n, err := out.Read(make([]byte, 2048)); err == nil {
		t.Fatalf("a %d-byte frame came through 100%% loss", n)
	}
	w.set(Link{}, Link{})
	send(t, in, 10, 100)
	receive(t, out, 10, 5*time.Second)
	// And back, b to a.
	send(t, out, 10, 100)
	receive(t, in, 10, 5*time.Second)
}
