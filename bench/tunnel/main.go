// Command tunnel measures p2p/tunnel: throughput and round-trip latency of
// a TCP connection carried between two real hosts on loopback, side by
// side in one run with a direct loopback TCP connection (the goal's
// reference: tunnel >= 0.5x direct) and with a bare libp2p stream between
// the same hosts (libp2p's own cost, which the tunnel cannot beat). Each
// runs over TCP (Noise first, as p2p.NewHost), TCP with TLS preferred, and
// QUIC. It prints a table and writes JSON (-out):
//
//	go run ./bench/tunnel -out bench/results/tunnel.json
//
// Throughput: one connection sends -size bytes to a sink that reads to EOF
// and answers with the count; the clock runs from dial to that answer.
// Then -conns connections share -size. The three paths take turns, -reps
// times, and each reports its median, so that drift on a shared machine
// hits all three alike. CPU is this process's (both hosts, both ends) per
// GB carried. Latency: -pings round trips of -ping-size bytes on one open
// connection, after 100 unrecorded ones.
package main

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	noise "github.com/libp2p/go-libp2p/p2p/security/noise"
	libp2ptls "github.com/libp2p/go-libp2p/p2p/security/tls"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/p2p/tunnel"
)

const (
	chain = "deepmarket-bench"
	job   = "bench"
	// rawProto is a bare libp2p stream, served by the sink or echo itself.
	rawProto = "/deepmarket-bench/raw/1"
)

// The paths a connection can take.
const (
	pathDirect = "direct TCP"
	pathRaw    = "raw libp2p stream"
	pathTunnel = "tunnel"
)

type row struct {
	Case      string  `json:"case"` // throughput or round trip
	Path      string  `json:"path"`
	Transport string  `json:"transport"`
	Conns     int     `json:"conns,omitempty"`
	MBps      float64 `json:"mb_s,omitempty"`
	CPUsPerGB float64 `json:"cpu_s_per_gb,omitempty"`
	MedianUs  float64 `json:"median_us,omitempty"`
	P99Us     float64 `json:"p99_us,omitempty"`
	// Ratios are throughput path/reference and latency reference/path, so
	// that higher is better in both.
	Ratio    float64 `json:"ratio_to_direct,omitempty"`
	RawRatio float64 `json:"ratio_to_raw_stream,omitempty"`
	Goal     string  `json:"goal,omitempty"`
	Pass     *bool   `json:"pass,omitempty"`
	Error    string  `json:"error,omitempty"`
}

type settings struct {
	size, conns, reps, pings, pingSize, buf int
}

func main() {
	out := flag.String("out", "bench/results/tunnel.json", "where to write JSON results")
	size := flag.Int("size", 1<<30, "bytes per throughput run")
	conns := flag.Int("conns", 8, "connections in the concurrent throughput run (they share -size); 0 skips it")
	reps := flag.Int("reps", 3, "throughput runs per path (the median is reported)")
	pings := flag.Int("pings", 2000, "round trips in the latency run")
	pingSize := flag.Int("ping-size", 1024, "bytes each way per round trip")
	buf := flag.Int("buf", tunnel.DefaultBufferSize, "tunnel copy buffer per direction")
	transports := flag.String("transports", "tcp,tcp-tls,quic", "host transports to run: tcp (Noise), tcp-tls, quic")
	flag.Parse()
	set := settings{size: *size, conns: *conns, reps: max(*reps, 1), pings: *pings, pingSize: *pingSize, buf: *buf}

	sink, echo := serveLocal(sinkConn), serveLocal(echoConn)
	defer sink.Close()
	defer echo.Close()
	var rows []row
	for _, tr := range strings.Split(*transports, ",") {
		rows = append(rows, runTransport(tr, set, sink, echo)...)
	}

	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "case\tpath\ttransport\tconns\tMB/s\tCPU s/GB\tmedian µs\tp99 µs\tvs direct\tvs raw stream\tgoal\tpass\t")
	f := func(v float64, prec int) string {
		if v == 0 {
			return "-"
		}
		return fmt.Sprintf("%.*f", prec, v)
	}
	for _, r := range rows {
		if r.Error != "" {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\terror: %s\t\t\t\t\t\t\t\t\n", r.Case, r.Path, r.Transport, r.Conns, r.Error)
			continue
		}
		pass := "-"
		if r.Pass != nil {
			pass = fmt.Sprint(*r.Pass)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.Case, r.Path, r.Transport, f(float64(r.Conns), 0),
			f(r.MBps, 0), f(r.CPUsPerGB, 2), f(r.MedianUs, 1), f(r.P99Us, 1), f(r.Ratio, 2), f(r.RawRatio, 2), r.Goal, pass)
	}
	tw.Flush()
	fmt.Println("  vs direct / vs raw stream: throughput path/reference, latency reference/path (higher is better)")

	res := map[string]any{
		"when": time.Now().UTC().Format(time.RFC3339), "go": runtime.Version(), "cpus": runtime.NumCPU(),
		"size_bytes": set.size, "conns": set.conns, "reps": set.reps, "pings": set.pings, "ping_bytes": set.pingSize,
		"buffer_bytes": set.buf, "rows": rows,
	}
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		log.Fatal(err)
	}
	b, _ := json.MarshalIndent(res, "", "  ")
	if err := os.WriteFile(*out, b, 0o644); err != nil {
		log.Fatal(err)
	}
	fmt.Println("results:", *out)
}

// runTransport measures the three paths with two fresh hosts on one
// transport.
func runTransport(tr string, set settings, sink, echo net.Listener) []row {
	fail := func(err error) []row {
		return []row{{Case: "setup", Path: pathTunnel, Transport: tr, Error: err.Error()}}
	}
	a, err := newHost(1, tr)
	if err != nil {
		return fail(err)
	}
	defer a.Close()
	b, err := newHost(2, tr)
	if err != nil {
		return fail(err)
	}
	defer b.Close()
	ctx := context.Background()
	if err := a.Connect(ctx, peer.AddrInfo{ID: b.ID(), Addrs: b.Addrs()}); err != nil {
		return fail(err)
	}
	ta := tunnel.New(a, chain, nil, tunnel.WithBufferSize(set.buf))
	defer ta.Close()
	tb := tunnel.New(b, chain, nil, tunnel.WithBufferSize(set.buf))
	defer tb.Close()
	defer tb.Expose(job, 0, port(sink), []peer.ID{a.ID()})()
	defer tb.Expose(job, 1, port(echo), []peer.ID{a.ID()})()
	sinkAddr, c1, err := ta.Forward(ctx, job, 0, b.ID())
	if err != nil {
		return fail(err)
	}
	defer c1.Close()
	echoAddr, c2, err := ta.Forward(ctx, job, 1, b.ID())
	if err != nil {
		return fail(err)
	}
	defer c2.Close()
	b.SetStreamHandler(rawProto+"/sink", func(s network.Stream) { sinkConn(s) })
	defer b.RemoveStreamHandler(rawProto + "/sink")
	b.SetStreamHandler(rawProto+"/echo", func(s network.Stream) { echoConn(s) })
	defer b.RemoveStreamHandler(rawProto + "/echo")

	type dialer func() (conn, error)
	tcpTo := func(addr string) dialer { return func() (conn, error) { return dialTCP(addr) } }
	streamTo := func(proto string) dialer {
		return func() (conn, error) { return a.NewStream(ctx, b.ID(), protocol.ID(proto)) }
	}
	paths := []struct {
		name       string
		sink, echo dialer
	}{
		{pathDirect, tcpTo(sink.Addr().String()), tcpTo(echo.Addr().String())},
		{pathRaw, streamTo(rawProto + "/sink"), streamTo(rawProto + "/echo")},
		{pathTunnel, tcpTo(sinkAddr), tcpTo(echoAddr)},
	}
	ratios := func(rs []row, better func(r, ref row) float64) {
		direct, raw, tun := &rs[0], &rs[1], &rs[2]
		if direct.Error == "" && raw.Error == "" {
			raw.Ratio = better(*raw, *direct)
		}
		if direct.Error == "" && tun.Error == "" {
			tun.Ratio = better(*tun, *direct)
		}
		if raw.Error == "" && tun.Error == "" {
			tun.RawRatio = better(*tun, *raw)
		}
	}

	var rows []row
	counts := []int{1}
	if set.conns > 1 {
		counts = append(counts, set.conns)
	}
	for _, n := range counts {
		runs := make([][]row, len(paths))
		for range set.reps {
			for i, p := range paths {
				runs[i] = append(runs[i], throughput(p.name, tr, n, set, p.sink))
			}
		}
		rs := make([]row, len(paths))
		for i := range paths {
			rs[i] = median(runs[i])
		}
		ratios(rs, func(r, ref row) float64 { return r.MBps / ref.MBps })
		if n == 1 && rs[2].Error == "" {
			pass := rs[2].Ratio >= 0.5
			rs[2].Goal, rs[2].Pass = ">= 0.5x direct", &pass
		}
		rows = append(rows, rs...)
	}
	rs := make([]row, len(paths))
	for i, p := range paths {
		rs[i] = latency(p.name, tr, set, p.echo)
	}
	ratios(rs, func(r, ref row) float64 { return ref.MedianUs / r.MedianUs })
	return append(rows, rs...)
}

// median is the run with the median throughput, or the first failure.
func median(runs []row) row {
	for _, r := range runs {
		if r.Error != "" {
			return r
		}
	}
	slices.SortFunc(runs, func(x, y row) int {
		switch {
		case x.MBps < y.MBps:
			return -1
		case x.MBps > y.MBps:
			return 1
		}
		return 0
	})
	return runs[len(runs)/2]
}

func newHost(seed byte, tr string) (host.Host, error) {
	k, err := identity.KeyFromSeed(bytes.Repeat([]byte{seed}, 32))
	if err != nil {
		return nil, err
	}
	switch tr {
	case "tcp":
		return p2p.NewHost(p2p.HostParams{Key: k, Listen: []string{"/ip4/127.0.0.1/tcp/0"}, Version: "bench"})
	case "quic":
		return p2p.NewHost(p2p.HostParams{Key: k, Listen: []string{"/ip4/127.0.0.1/udp/0/quic-v1"}, Version: "bench"})
	case "tcp-tls":
		// As p2p.NewHost, but TLS (AES-GCM) preferred to Noise
		// (ChaCha20-Poly1305), for comparison.
		return libp2p.New(
			libp2p.Identity(k.PrivKey()),
			libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"),
			libp2p.Transport(tcp.NewTCPTransport, tcp.DisableReuseport()),
			libp2p.Security(libp2ptls.ID, libp2ptls.New),
			libp2p.Security(noise.ID, noise.New),
			libp2p.DisableMetrics(),
		)
	}
	return nil, fmt.Errorf("unknown transport %q (want tcp, tcp-tls or quic)", tr)
}

// payload is what the writers send, over and over.
var payload = func() []byte {
	b := make([]byte, 1<<20)
	crand.Read(b)
	return b
}()

// throughput sends set.size bytes over n connections made by dial and
// times it from the first dial to the last sink's answer.
func throughput(path, tr string, n int, set settings, dial func() (conn, error)) row {
	r := row{Case: "throughput", Path: path, Transport: tr, Conns: n}
	per := set.size / n
	cpu0 := cpuTime()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := dial()
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			for left := per; left > 0; {
				k := min(left, len(payload))
				if _, err := c.Write(payload[:k]); err != nil {
					errs <- fmt.Errorf("write: %w", err)
					return
				}
				left -= k
			}
			if err := c.CloseWrite(); err != nil {
				errs <- err
				return
			}
			var ack [8]byte
			if _, err := io.ReadFull(c, ack[:]); err != nil {
				errs <- fmt.Errorf("sink's answer: %w", err)
				return
			}
			if got := int(binary.LittleEndian.Uint64(ack[:])); got != per {
				errs <- fmt.Errorf("sink read %d bytes, want %d", got, per)
			}
		}()
	}
	wg.Wait()
	d := time.Since(start)
	cpu := cpuTime() - cpu0
	close(errs)
	if err := <-errs; err != nil {
		r.Error = err.Error()
		return r
	}
	total := float64(per * n)
	r.MBps = total / d.Seconds() / 1e6
	r.CPUsPerGB = cpu.Seconds() / (total / 1e9)
	return r
}

// latency times set.pings round trips of set.pingSize bytes on one
// connection.
func latency(path, tr string, set settings, dial func() (conn, error)) row {
	r := row{Case: fmt.Sprintf("%d B round trip", set.pingSize), Path: path, Transport: tr}
	c, err := dial()
	if err != nil {
		r.Error = err.Error()
		return r
	}
	defer c.Close()
	msg, back := payload[:set.pingSize], make([]byte, set.pingSize)
	times := make([]time.Duration, 0, set.pings)
	for i := range set.pings + 100 {
		start := time.Now()
		if _, err := c.Write(msg); err != nil {
			r.Error = err.Error()
			return r
		}
		if _, err := io.ReadFull(c, back); err != nil {
			r.Error = err.Error()
			return r
		}
		if i >= 100 {
			times = append(times, time.Since(start))
		}
	}
	slices.Sort(times)
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	r.MedianUs, r.P99Us = us(times[len(times)/2]), us(times[len(times)*99/100])
	return r
}

// serveLocal runs fn on each connection to a new listener on 127.0.0.1.
func serveLocal(fn func(conn)) net.Listener {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				fn(c.(*net.TCPConn))
			}()
		}
	}()
	return ln
}

// sinkConn reads to EOF and answers with the count, little-endian.
func sinkConn(c conn) {
	buf := make([]byte, 256<<10)
	var n uint64
	for {
		k, err := c.Read(buf)
		n += uint64(k)
		if err != nil {
			break
		}
	}
	c.Write(binary.LittleEndian.AppendUint64(nil, n))
	c.CloseWrite()
}

func echoConn(c conn) {
	buf := make([]byte, 64<<10)
	for {
		k, err := c.Read(buf)
		if k > 0 {
			if _, werr := c.Write(buf[:k]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// conn is what both a TCP connection and a libp2p stream are.
type conn interface {
	io.ReadWriteCloser
	CloseWrite() error
}

func port(ln net.Listener) int { return ln.Addr().(*net.TCPAddr).Port }

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func dialTCP(addr string) (conn, error) {
	c, err := net.Dial("tcp4", addr)
	if err != nil {
		return nil, err
	}
	return c.(*net.TCPConn), nil
}
