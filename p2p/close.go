package p2p

import (
	"fmt"
	"runtime"
	"strings"
	"time"
)

// CloseTimeout bounds how long Host.Close waits for libp2p's own close.
const CloseTimeout = 10 * time.Second

// Close stops the host within CloseTimeout: first what this package runs
// on it (the relay service of RelayOn, and the reader of its event-bus
// subscription, closed and drained so that it never holds up the bus),
// then libp2p's network (listeners and connections: no identify, push or
// AutoNAT exchange reaches the host after that), then libp2p's host
// itself, whose services (identify, AutoNAT v1 and v2, auto-relay, hole
// punching, the peerstore, the resource manager) stop in libp2p's order.
//
// The network goes first because libp2p stops its observed-address manager
// before AutoNAT v2 and leaves that manager's event-bus subscription open
// and unread (go-libp2p v0.51): an identify message that completes in
// between fills it and blocks identify's emitter, which holds the event
// bus lock AutoNAT v2's Close then waits for, forever.
//
// Should libp2p's close still not return within CloseTimeout, Close logs a
// warning with a trimmed dump of the goroutines that hold it up (those in
// libp2p's event bus or in this close, then other blocked libp2p ones)
// and returns an error, so that the node's shutdown completes. What libp2p
// had not closed yet stays: the goroutine running its close and whatever
// it waits for, possibly the listeners (their ports stay bound), the
// connections, the peerstore and the resource manager, until that close
// returns (it is logged if it does) or the process exits. Calling Close
// again returns the first call's result at once.
func (h *Host) Close() error {
	h.closeOnce.Do(func() { h.closeErr = h.closeBounded() })
	return h.closeErr
}

// closeBounded runs the host's shutdown (h.closeFn, in tests) and waits
// for it at most h.closeBound (CloseTimeout when zero).
func (h *Host) closeBounded() error {
	shutdown, bound := h.shutdown, CloseTimeout
	if h.closeFn != nil {
		shutdown = h.closeFn
	}
	if h.closeBound > 0 {
		bound = h.closeBound
	}
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		err := shutdown()
		done <- err
		if took := time.Since(start); took > bound {
			h.log.Warn("libp2p host close returned late", "took", took.Round(time.Millisecond), "err", err)
		}
	}()
	timer := time.NewTimer(bound)
	defer timer.Stop()
	select {
	case err := <-done:
		return err
	case <-timer.C:
	}
	h.log.Warn("libp2p host close is stuck; shutting down without it (its listeners, connections and goroutines stay until it returns)",
		"after", bound, "goroutines", stuckGoroutines())
	return fmt.Errorf("libp2p host close did not return within %s (left running; the log shows what holds it)", bound)
}

// shutdown stops what this package runs on the host, then libp2p's
// network, then libp2p's host: see Close.
func (h *Host) shutdown() error {
	h.mu.Lock()
	h.closing = true // no relay starts from here on (decideRelay)
	if h.relay != nil {
		h.relay.Close()
		h.relay = nil
	}
	h.mu.Unlock()
	if h.sub != nil {
		h.sub.Close() // drains the subscription until it is closed
	}
	<-h.done
	if h.punch != nil {
		h.punch.close()
	}
	h.Network().Close()
	return h.Host.Close()
}

// Limits of the dump stuckGoroutines logs.
const (
	stuckMaxGoroutines = 24
	stuckMaxFrames     = 14
	stuckMaxBytes      = 16 << 10
)

// stuckGoroutines is a trimmed dump of the goroutines that may hold up a
// host's close, whichever host of the process they serve: first those in
// libp2p's event bus or in Host's close, then libp2p goroutines blocked on
// a lock, a channel send or a wait group; each cut to its top
// stuckMaxFrames frames, and the whole to stuckMaxGoroutines goroutines
// and about stuckMaxBytes. Idle goroutines (reading, selecting) are only
// counted.
func stuckGoroutines() string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) || len(buf) >= 64<<20 {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var first, blocked []string
	other := 0
	for _, g := range strings.Split(strings.TrimSpace(string(buf)), "\n\n") {
		header, _, _ := strings.Cut(g, "\n")
		switch {
		case strings.Contains(g, "p2p.stuckGoroutines"): // this one
		case strings.Contains(g, "/eventbus.") || strings.Contains(g, "p2p.(*Host).close") || strings.Contains(g, "p2p.(*Host).shutdown"):
			first = append(first, trimStack(g))
		case strings.Contains(g, "libp2p") && isBlocked(header):
			blocked = append(blocked, trimStack(g))
		case strings.Contains(g, "libp2p"):
			other++
		}
	}
	var out strings.Builder
	kept, left := 0, 0
	for _, g := range append(first, blocked...) {
		if left > 0 || kept == stuckMaxGoroutines || out.Len() >= stuckMaxBytes {
			left++
			continue
		}
		out.WriteString(g)
		out.WriteString("\n\n")
		kept++
	}
	if left > 0 {
		fmt.Fprintf(&out, "(%d more blocked libp2p goroutines left out)\n", left)
	}
	fmt.Fprintf(&out, "(%d other libp2p goroutines, idle, left out)", other)
	return out.String()
}

// isBlocked says whether a goroutine's header ("goroutine 7 [chan send,
// 3 minutes]:") shows it waiting on a lock, a send or a wait group.
func isBlocked(header string) bool {
	for _, s := range []string{"chan send", "Mutex", "semacquire", "WaitGroup", "sync.Cond"} {
		if strings.Contains(header, s) {
			return true
		}
	}
	return false
}

// trimStack keeps a goroutine's header and its top stuckMaxFrames frames
// (two lines each).
func trimStack(g string) string {
	lines := strings.Split(g, "\n")
	if keep := 1 + 2*stuckMaxFrames; len(lines) > keep {
		lines = append(lines[:keep], fmt.Sprintf("\t... %d more frames", (len(lines)-keep)/2))
	}
	return strings.Join(lines, "\n")
}
