package p2p

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
)

// TestHostsCloseTogether stops five connected hosts, configured as a node
// configures them (identify, AutoNAT v1 and v2, a relay service, a static
// relay, hole punching), all at once, 20 times: each Close returns
// within CloseTimeout without an error, that is without the bound firing.
// While they stop, each host keeps changing its protocols, so that its
// peers receive identify pushes as they close: nodes stopping together
// once hung 16 minutes in libp2p's close that way.
func TestHostsCloseTogether(t *testing.T) {
	rounds := 20
	if testing.Short() {
		rounds = 3
	}
	for round := range rounds {
		closeHostsTogether(t, round)
		if t.Failed() {
			return
		}
	}
}

func closeHostsTogether(t *testing.T, round int) {
	const n = 5
	listen := []string{"/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.1/udp/0/quic-v1"}
	member := func(peer.ID) bool { return true }
	hosts := make([]*Host, 0, n)
	for i := range n {
		nat := NATParams{Member: member}
		if i == 0 {
			nat.RelayService = RelayOn
		} else {
			nat.Relays = []peer.AddrInfo{{ID: hosts[0].ID(), Addrs: hosts[0].Addrs()}}
		}
		h, err := NewHost(HostParams{Key: testKey(t, byte(100+i)), Listen: listen, Version: "test", NAT: nat})
		if err != nil {
			for _, h := range hosts {
				h.Close()
			}
			t.Fatal(err)
		}
		hosts = append(hosts, h.(*Host))
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	for i, a := range hosts {
		for _, b := range hosts[i+1:] {
			if err := a.Connect(ctx, peer.AddrInfo{ID: b.ID(), Addrs: b.Addrs()}); err != nil {
				t.Errorf("round %d: connect: %v", round, err)
			}
		}
	}

	// Each host changes its protocols until all have closed: every change
	// is an identify push to its peers.
	stop := make(chan struct{})
	var churn sync.WaitGroup
	for _, h := range hosts {
		churn.Go(func() {
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				case <-time.After(time.Millisecond):
				}
				h.RemoveStreamHandler(protocol.ID(fmt.Sprintf("/deepmarket-test/churn/%d", k%4)))
				h.SetStreamHandler(protocol.ID(fmt.Sprintf("/deepmarket-test/churn/%d", (k+2)%4)), func(s network.Stream) { s.Reset() })
			}
		})
	}
	time.Sleep(20 * time.Millisecond)

	type result struct {
		took time.Duration
		err  error
	}
	results := make([]result, n)
	var closing sync.WaitGroup
	for i, h := range hosts {
		closing.Go(func() {
			start := time.Now()
			err := h.Close()
			results[i] = result{time.Since(start), err}
		})
	}
	all := make(chan struct{})
	go func() { closing.Wait(); close(all) }()
	select {
	case <-all:
	case <-time.After(2 * CloseTimeout):
		t.Fatalf("round %d: the hosts' Close calls did not all return within %s", round, 2*CloseTimeout)
	}
	close(stop)
	churn.Wait()
	for i, r := range results {
		if r.err != nil || r.took > CloseTimeout {
			t.Errorf("round %d: host %d closed in %s: %v", round, i, r.took.Round(time.Millisecond), r.err)
		}
	}
}

// blockInLibp2pClose stands for a libp2p close that never returns.
func blockInLibp2pClose(release <-chan struct{}) error {
	<-release
	return nil
}

// TestCloseIsBounded: a host whose libp2p close hangs still closes, after
// the bound, with an error, and logs what hangs; a second Close answers
// the same at once.
func TestCloseIsBounded(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	var logged syncBuffer
	h := &Host{
		log:        slog.New(slog.NewTextHandler(&logged, nil)),
		closeBound: 200 * time.Millisecond,
		closeFn:    func() error { return blockInLibp2pClose(release) },
	}
	errc := make(chan error, 1)
	start := time.Now()
	go func() { errc <- h.Close() }()
	var err error
	select {
	case err = <-errc:
	case <-time.After(10 * time.Second):
		t.Fatal("Close waited for a hung libp2p close")
	}
	if took := time.Since(start); took < h.closeBound {
		t.Errorf("Close returned after %s, before its bound %s", took, h.closeBound)
	}
	if err == nil || !strings.Contains(err.Error(), "did not return within 200ms") {
		t.Errorf("Close's error: %v", err)
	}
	out := logged.String()
	if !strings.Contains(out, "level=WARN") || !strings.Contains(out, "blockInLibp2pClose") {
		t.Errorf("the warning does not show the hung close:\n%s", out)
	}
	again := make(chan error, 1)
	go func() { again <- h.Close() }()
	select {
	case err2 := <-again:
		if err2 != err {
			t.Errorf("a second Close said %v, the first %v", err2, err)
		}
	case <-time.After(time.Second):
		t.Fatal("a second Close blocked")
	}
}

// TestCloseReturnsLibp2psResult: within the bound, Close returns what
// libp2p's close returned, and logs nothing.
func TestCloseReturnsLibp2psResult(t *testing.T) {
	var logged syncBuffer
	want := fmt.Errorf("libp2p says no")
	h := &Host{log: slog.New(slog.NewTextHandler(&logged, nil)), closeFn: func() error { return want }}
	if err := h.Close(); err != want {
		t.Errorf("Close: %v, want %v", err, want)
	}
	if logged.String() != "" {
		t.Errorf("Close logged: %s", logged.String())
	}
}

// syncBuffer is a bytes.Buffer safe for a logger and a reader at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
