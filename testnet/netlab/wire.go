package netlab

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// A wire is the userspace shaper's link: two TAP devices, one at each end,
// and this process moving the Ethernet frames between them, each direction
// through a pipe that delays, paces and drops them the way netem does with a
// rate set. It is for kernels without sch_netem.
type wire struct {
	a, b   *os.File
	ab, ba *pipe
	done   chan struct{}
	wg     sync.WaitGroup
}

// openTAP creates the TAP device dev in namespace ns and returns its file;
// the device lives until the file is closed.
func openTAP(ns, dev string) (*os.File, error) {
	var f *os.File
	err := inNetNS(ns, func() error {
		// /dev/net/tun puts the device in the namespace of whoever
		// opens it, so it is opened in there.
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open /dev/net/tun: %w", err)
		}
		ifr, err := unix.NewIfreq(dev)
		if err != nil {
			unix.Close(fd)
			return err
		}
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			unix.Close(fd)
			return fmt.Errorf("create TAP device %s: %w", dev, err)
		}
		// Non-blocking, so reads wait in the runtime's poller and Close
		// ends them.
		f = os.NewFile(uintptr(fd), dev)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("TAP %s in %s: %w", dev, ns, err)
	}
	return f, nil
}

// newWire starts moving frames between the files a and b (TAP devices, or
// any descriptors that keep message boundaries), shaping a→b like ab and
// b→a like ba. Once it returns without error it owns both files.
func newWire(a, b *os.File, ab, ba Link) (*wire, error) {
	w := &wire{a: a, b: b, done: make(chan struct{})}
	var err error
	if w.ab, err = newPipe(a, b, ab); err != nil {
		return nil, err
	}
	if w.ba, err = newPipe(b, a, ba); err != nil {
		w.ab.timer.Close()
		return nil, err
	}
	for _, p := range []*pipe{w.ab, w.ba} {
		w.wg.Add(2)
		go func() {
			defer w.wg.Done()
			p.readLoop()
		}()
		go func() {
			defer w.wg.Done()
			p.writeLoop(w.done)
		}()
	}
	return w, nil
}

// set changes the shaping; frames already queued keep their times.
func (w *wire) set(ab, ba Link) {
	w.ab.shape.Store(&ab)
	w.ba.shape.Store(&ba)
}

// close stops the wire, drops the frames in flight and closes both ends.
func (w *wire) close() {
	close(w.done)
	w.a.Close()
	w.b.Close()
	w.ab.timer.Close()
	w.ba.timer.Close()
	w.wg.Wait()
}

// A pipe carries one direction of a wire.
type pipe struct {
	in, out *os.File
	shape   atomic.Pointer[Link]

	// Owned by readLoop.
	rng  *rand.Rand
	last time.Time // when the frame queued last leaves

	mu     sync.Mutex
	frames []frame // frames[head:] wait, in order of departure
	head   int
	wake   chan struct{}

	// timer is a timerfd: Go's timers wake up to a millisecond late, a
	// timerfd read through the poller some tens of microseconds.
	timer *os.File
}

type frame struct {
	at   time.Time
	data []byte
}

func newPipe(in, out *os.File, l Link) (*pipe, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("timerfd: %w", err)
	}
	p := &pipe{
		in:    in,
		out:   out,
		rng:   rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())),
		wake:  make(chan struct{}, 1),
		timer: os.NewFile(uintptr(fd), "timerfd"),
	}
	p.shape.Store(&l)
	return p, nil
}

// departure is when a frame of size bytes that arrives at now leaves a hop
// shaped like h, when the frame ahead of it leaves at last; z is a draw
// from the standard normal distribution. It is netem's rule with a rate
// set: the delay, at least the departure of the frame ahead, plus the time
// to send the frame at the rate. Frames thus leave in the order they came.
func departure(h Link, now, last time.Time, size int, z float64) time.Time {
	d := h.Delay + time.Duration(z*float64(h.Jitter))
	t := now
	if d > 0 {
		t = now.Add(d)
	}
	if t.Before(last) {
		t = last
	}
	if h.RateBits > 0 {
		t = t.Add(time.Duration(uint64(size) * 8 * uint64(time.Second) / h.RateBits))
	}
	return t
}

func (p *pipe) readLoop() {
	buf := make([]byte, 1<<16)
	for {
		n, err := p.in.Read(buf)
		if err != nil {
			if errors.Is(err, os.ErrClosed) {
				return
			}
			// A TAP whose device is going away; close follows. Don't
			// spin meanwhile.
			time.Sleep(10 * time.Millisecond)
			continue
		}
		h := p.shape.Load()
		if h.Loss > 0 && p.rng.Float64()*100 < h.Loss {
			continue
		}
		var z float64
		if h.Jitter > 0 {
			z = p.rng.NormFloat64()
		}
		at := departure(*h, time.Now(), p.last, n, z)
		if p.push(frame{at: at, data: append([]byte(nil), buf[:n]...)}) {
			p.last = at
		}
	}
}

// push queues f, or drops it when the queue is full, like netem's limit.
func (p *pipe) push(f frame) bool {
	p.mu.Lock()
	if len(p.frames)-p.head >= queueLimit {
		p.mu.Unlock()
		return false
	}
	if p.head > 1024 && p.head > len(p.frames)/2 {
		n := copy(p.frames, p.frames[p.head:])
		clear(p.frames[n:])
		p.frames = p.frames[:n]
		p.head = 0
	}
	p.frames = append(p.frames, f)
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
	return true
}

// pop takes the next frame, waiting for one until done.
func (p *pipe) pop(done <-chan struct{}) (frame, bool) {
	for {
		p.mu.Lock()
		if p.head < len(p.frames) {
			f := p.frames[p.head]
			p.frames[p.head] = frame{}
			p.head++
			if p.head == len(p.frames) {
				p.frames = p.frames[:0]
				p.head = 0
			}
			p.mu.Unlock()
			return f, true
		}
		p.mu.Unlock()
		select {
		case <-p.wake:
		case <-done:
			return frame{}, false
		}
	}
}

func (p *pipe) writeLoop(done <-chan struct{}) {
	tick := make([]byte, 8)
	for {
		f, ok := p.pop(done)
		if !ok {
			return
		}
		if wait := time.Until(f.at); wait > 0 {
			if err := p.sleep(wait, tick); err != nil {
				return // closed
			}
		}
		if _, err := p.out.Write(f.data); errors.Is(err, os.ErrClosed) {
			return
		}
	}
}

// sleep waits d on the timerfd; it fails once the wire is closed.
func (p *pipe) sleep(d time.Duration, tick []byte) error {
	rc, err := p.timer.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	// Control holds the descriptor open, so a concurrent close can't
	// hand its number to another file under us.
	err = rc.Control(func(fd uintptr) {
		spec := unix.ItimerSpec{Value: unix.NsecToTimespec(int64(d))}
		serr = unix.TimerfdSettime(int(fd), 0, &spec, nil)
	})
	if err != nil {
		return err
	}
	if serr != nil {
		return serr
	}
	_, err = p.timer.Read(tick)
	return err
}
