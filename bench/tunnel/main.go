// Command tunnel measures p2p/tunnel: throughput, CPU per GB and
// round-trip latency of a TCP connection carried between two real hosts on
// loopback, side by side in one run with a direct loopback TCP connection
// (the goal's reference: tunnel >= 0.5x direct), a bare libp2p stream
// between the same hosts (libp2p's own cost), and the tunnel's two paths:
// the old one, a libp2p stream per connection (tunnel.WithDirect(false)),
// and the direct one, a TLS-authenticated TCP connection of its own with
// AES-GCM frames (the default; goal: <= 0.5x the old path's CPU per GB).
// The hosts run over TCP (Noise first, as p2p.NewHost), TCP with TLS
// preferred, and QUIC; the direct path does not use the host's transport
// for its bytes, so its rows differ by drift alone. It prints a table and
// writes JSON (-out):
//
//	go run ./bench/tunnel -out bench/results/tunnel.json
//
// Throughput: one connection sends -size bytes to a sink that reads to EOF
// and answers with the count; the clock runs from dial to that answer.
// Then -conns connections share -size. The paths take turns, -reps times,
// and each reports the median and the range of its runs, so that drift on
// a shared machine hits all of them alike; ratios between paths are the
// median of the ratios of runs taken in the same turn. CPU is this
// process's (both hosts, both ends) per GB carried. Latency: -pings round
// trips of -ping-size bytes on one open connection, after 100 unrecorded
// ones. -cpuprofile P adds one unrecorded run per path and connection
// count under the CPU profiler, written to P-<transport>-<path>-<conns>.prof.
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
	"runtime/pprof"
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
	pathDirect    = "direct TCP"
	pathRaw       = "raw libp2p stream"
	pathOldTunnel = "tunnel, streams (old)"
	pathTunnel    = "tunnel, direct (new)"
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
	OldRatio float64 `json:"ratio_to_old_tunnel,omitempty"`
	Goal     string  `json:"goal,omitempty"`
	Pass     *bool   `json:"pass,omitempty"`
	Error    string  `json:"error,omitempty"`

	// Throughput runs: the range over -reps runs around the medians above,
	// and CPU per GB as a ratio to the old tunnel path's (lower is better),
	// the median and range of the runs' ratios, turn by turn. The overhead
	// ratio leaves out what direct TCP costs in the same turn, the sending
	// and receiving applications' own share, which no path can save: it
	// compares what the two tunnels themselves take from the machine.
	MBpsRange                *[2]float64 `json:"mb_s_range,omitempty"`
	CPURange                 *[2]float64 `json:"cpu_s_per_gb_range,omitempty"`
	CPURatioOld              float64     `json:"cpu_ratio_to_old_tunnel,omitempty"`
	CPURatioOldRange         *[2]float64 `json:"cpu_ratio_to_old_tunnel_range,omitempty"`
	CPUOverheadRatioOld      float64     `json:"cpu_overhead_ratio_to_old_tunnel,omitempty"`
	CPUOverheadRatioOldRange *[2]float64 `json:"cpu_overhead_ratio_to_old_tunnel_range,omitempty"`
	CPUGoal                  string      `json:"cpu_goal,omitempty"`
	CPUPass                  *bool       `json:"cpu_pass,omitempty"`
}

type settings struct {
	size, conns, reps, pings, pingSize, buf int
	profile                                 string
}

func main() {
	out := flag.String("out", "bench/results/tunnel.json", "where to write JSON results")
	size := flag.Int("size", 1<<30, "bytes per throughput run")
	conns := flag.Int("conns", 8, "connections in the concurrent throughput run (they share -size); 0 skips it")
	reps := flag.Int("reps", 5, "throughput runs per path (the median and the range are reported)")
	pings := flag.Int("pings", 2000, "round trips in the latency run")
	pingSize := flag.Int("ping-size", 1024, "bytes each way per round trip")
	buf := flag.Int("buf", tunnel.DefaultBufferSize, "the old (stream) path's copy buffer per direction")
	transports := flag.String("transports", "tcp,tcp-tls,quic", "host transports to run: tcp (Noise), tcp-tls, quic")
	profile := flag.String("cpuprofile", "", "write a CPU profile of one extra run per path to this prefix")
	flag.Parse()
	set := settings{size: *size, conns: *conns, reps: max(*reps, 1), pings: *pings, pingSize: *pingSize, buf: *buf, profile: *profile}

	sink, echo := serveLocal(sinkConn), serveLocal(echoConn)
	defer sink.Close()
	defer echo.Close()
	var rows []row
	for _, tr := range strings.Split(*transports, ",") {
		rows = append(rows, runTransport(tr, set, sink, echo)...)
	}

	printTable(rows)

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

// runTransport measures the four paths with fresh hosts on one transport.
// The old and the new tunnel path each get their own pair of hosts, since
// both Services would answer the tunnel's protocol on one host.
func runTransport(tr string, set settings, sink, echo net.Listener) []row {
	fail := func(err error) []row {
		return []row{{Case: "setup", Path: pathTunnel, Transport: tr, Error: err.Error()}}
	}
	ctx := context.Background()
	a, b, err := hostPair(ctx, tr, 1)
	if err != nil {
		return fail(err)
	}
	defer a.Close()
	defer b.Close()
	na, nb, err := hostPair(ctx, tr, 3)
	if err != nil {
		return fail(err)
	}
	defer na.Close()
	defer nb.Close()
	old, err := forward(ctx, a, b, set, sink, echo, tunnel.WithDirect(false))
	if err != nil {
		return fail(err)
	}
	defer old.close()
	lean, err := forward(ctx, na, nb, set, sink, echo)
	if err != nil {
		return fail(err)
	}
	defer lean.close()
	b.SetStreamHandler(rawProto+"/sink", func(s network.Stream) { sinkConn(s) })
	defer b.RemoveStreamHandler(rawProto + "/sink")
	b.SetStreamHandler(rawProto+"/echo", func(s network.Stream) { echoConn(s) })
	defer b.RemoveStreamHandler(rawProto + "/echo")

	type dialer func() (conn, error)
	tcpTo := func(addr string) dialer { return func() (conn, error) { return dialTCP(addr) } }
	streamTo := func(proto string) dialer {
		return func() (conn, error) { return a.NewStream(ctx, b.ID(), protocol.ID(proto)) }
	}
	const direct, raw, oldTun, newTun = 0, 1, 2, 3
	paths := []struct {
		name       string
		sink, echo dialer
	}{
		direct: {pathDirect, tcpTo(sink.Addr().String()), tcpTo(echo.Addr().String())},
		raw:    {pathRaw, streamTo(rawProto + "/sink"), streamTo(rawProto + "/echo")},
		oldTun: {pathOldTunnel, tcpTo(old.sink), tcpTo(old.echo)},
		newTun: {pathTunnel, tcpTo(lean.sink), tcpTo(lean.echo)},
	}

	var rows []row
	counts := []int{1}
	if set.conns > 1 {
		counts = append(counts, set.conns)
	}
	for _, n := range counts {
		if set.profile != "" {
			for _, p := range paths {
				if err := profiled(fmt.Sprintf("%s-%s-%s-%d.prof", set.profile, tr, slug(p.name), n), func() {
					throughput(p.name, tr, n, set, p.sink)
				}); err != nil {
					return fail(err)
				}
			}
		}
		runs := make([][]row, len(paths))
		for range set.reps {
			for i, p := range paths {
				runs[i] = append(runs[i], throughput(p.name, tr, n, set, p.sink))
			}
		}
		rs := make([]row, len(paths))
		for i := range paths {
			rs[i] = summarize(runs[i])
		}
		mbps := func(path, ref int) func(int) float64 {
			return func(i int) float64 { return runs[path][i].MBps / runs[ref][i].MBps }
		}
		rs[raw].Ratio, _ = turnRatio(runs, mbps(raw, direct))
		rs[oldTun].Ratio, _ = turnRatio(runs, mbps(oldTun, direct))
		rs[oldTun].RawRatio, _ = turnRatio(runs, mbps(oldTun, raw))
		rs[newTun].Ratio, _ = turnRatio(runs, mbps(newTun, direct))
		rs[newTun].RawRatio, _ = turnRatio(runs, mbps(newTun, raw))
		rs[newTun].OldRatio, _ = turnRatio(runs, mbps(newTun, oldTun))
		var span, ospan [2]float64
		if rs[newTun].CPURatioOld, span = turnRatio(runs, func(i int) float64 {
			return runs[newTun][i].CPUsPerGB / runs[oldTun][i].CPUsPerGB
		}); rs[newTun].CPURatioOld > 0 {
			pass := rs[newTun].CPURatioOld <= 0.5
			rs[newTun].CPURatioOldRange, rs[newTun].CPUGoal, rs[newTun].CPUPass = &span, "<= 0.5x old tunnel", &pass
		}
		if rs[newTun].CPUOverheadRatioOld, ospan = turnRatio(runs, func(i int) float64 {
			return (runs[newTun][i].CPUsPerGB - runs[direct][i].CPUsPerGB) / (runs[oldTun][i].CPUsPerGB - runs[direct][i].CPUsPerGB)
		}); rs[newTun].CPUOverheadRatioOld > 0 {
			rs[newTun].CPUOverheadRatioOldRange = &ospan
		}
		if n == 1 && rs[newTun].Ratio > 0 {
			pass := rs[newTun].Ratio >= 0.5
			rs[newTun].Goal, rs[newTun].Pass = ">= 0.5x direct", &pass
		}
		rows = append(rows, rs...)
	}
	// Each path must have carried what it claims to.
	if st := nb.tn.Stats().Jobs[job]; st.Direct == 0 || st.Direct != st.Conns {
		return fail(fmt.Errorf("new path: %d of %d connections carried direct", st.Direct, st.Conns))
	}
	if st := b.tn.Stats().Jobs[job]; st.Direct != 0 {
		return fail(fmt.Errorf("old path: %d connections carried direct", st.Direct))
	}

	rs := make([]row, len(paths))
	for i, p := range paths {
		rs[i] = latency(p.name, tr, set, p.echo)
	}
	better := func(r, ref row) float64 {
		if r.Error != "" || ref.Error != "" {
			return 0
		}
		return ref.MedianUs / r.MedianUs
	}
	rs[raw].Ratio = better(rs[raw], rs[direct])
	rs[oldTun].Ratio, rs[oldTun].RawRatio = better(rs[oldTun], rs[direct]), better(rs[oldTun], rs[raw])
	rs[newTun].Ratio, rs[newTun].RawRatio = better(rs[newTun], rs[direct]), better(rs[newTun], rs[raw])
	rs[newTun].OldRatio = better(rs[newTun], rs[oldTun])
	return append(rows, rs...)
}

// tunnelHost is a host with its tunnel Service.
type tunnelHost struct {
	host.Host
	tn *tunnel.Service
}

// hostPair starts two connected hosts on transport tr, their keys from
// seeds seed and seed+1.
func hostPair(ctx context.Context, tr string, seed byte) (a, b *tunnelHost, err error) {
	ha, err := newHost(seed, tr)
	if err != nil {
		return nil, nil, err
	}
	hb, err := newHost(seed+1, tr)
	if err != nil {
		ha.Close()
		return nil, nil, err
	}
	if err := ha.Connect(ctx, peer.AddrInfo{ID: hb.ID(), Addrs: hb.Addrs()}); err != nil {
		ha.Close()
		hb.Close()
		return nil, nil, err
	}
	return &tunnelHost{Host: ha}, &tunnelHost{Host: hb}, nil
}

// forwarders are the loopback ends of a's tunnels to b's sink and echo.
type forwarders struct {
	sink, echo string
	close      func()
}

// forward starts a's and b's tunnel Services with opts, exposes the sink
// and the echo on b and forwards to them from a.
func forward(ctx context.Context, a, b *tunnelHost, set settings, sink, echo net.Listener, opts ...tunnel.Option) (*forwarders, error) {
	opts = append(opts, tunnel.WithBufferSize(set.buf))
	a.tn, b.tn = tunnel.New(a, chain, nil, opts...), tunnel.New(b, chain, nil, opts...)
	unexpose0 := b.tn.Expose(job, 0, port(sink), []peer.ID{a.ID()})
	unexpose1 := b.tn.Expose(job, 1, port(echo), []peer.ID{a.ID()})
	f := &forwarders{close: func() {
		unexpose0()
		unexpose1()
		a.tn.Close()
		b.tn.Close()
	}}
	var c0, c1 io.Closer
	var err error
	if f.sink, c0, err = a.tn.Forward(ctx, job, 0, b.ID()); err != nil {
		f.close()
		return nil, err
	}
	if f.echo, c1, err = a.tn.Forward(ctx, job, 1, b.ID()); err != nil {
		c0.Close()
		f.close()
		return nil, err
	}
	closeTunnels := f.close
	f.close = func() {
		c0.Close()
		c1.Close()
		closeTunnels()
	}
	return f, nil
}

// profiled runs fn under the CPU profiler, writing the profile to path.
func profiled(path string, fn func()) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := pprof.StartCPUProfile(f); err != nil {
		return err
	}
	fn()
	pprof.StopCPUProfile()
	return nil
}

// slug makes a path's name fit in a file name.
func slug(name string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, strings.ToLower(strings.NewReplacer(", ", "-", " (", "-", ")", "").Replace(name)))
}

// summarize is the median of runs' throughput and of their CPU per GB,
// each taken on its own, with their ranges; or the first failure.
func summarize(runs []row) row {
	for _, r := range runs {
		if r.Error != "" {
			return r
		}
	}
	r := runs[0]
	var mbps, cpu [2]float64
	r.MBps, mbps = medianOf(runs, func(r row) float64 { return r.MBps })
	r.CPUsPerGB, cpu = medianOf(runs, func(r row) float64 { return r.CPUsPerGB })
	r.MBpsRange, r.CPURange = &mbps, &cpu
	return r
}

// turnRatio is the median, and the range, of ratio(i) over the turns i of
// runs (runs[path][turn]): ratios of runs taken in the same turn, which
// drift on a shared machine moves least. It is 0 if a run failed.
func turnRatio(runs [][]row, ratio func(turn int) float64) (float64, [2]float64) {
	var ratios []row
	for i := range runs[0] {
		for _, path := range runs {
			if path[i].Error != "" {
				return 0, [2]float64{}
			}
		}
		ratios = append(ratios, row{MBps: ratio(i)})
	}
	return medianOf(ratios, func(r row) float64 { return r.MBps })
}

// medianOf is the median of v over runs (the upper one of an even count),
// and the range.
func medianOf(runs []row, v func(row) float64) (float64, [2]float64) {
	vs := make([]float64, len(runs))
	for i, r := range runs {
		vs[i] = v(r)
	}
	slices.Sort(vs)
	return vs[len(vs)/2], [2]float64{vs[0], vs[len(vs)-1]}
}

// printTable prints rows for a reader; the JSON has the same and more.
func printTable(rows []row) {
	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "case\tpath\ttransport\tconns\tMB/s\t(range)\tCPU s/GB\t(range)\tCPU vs old\t(range)\toverhead vs old\t(range)\tmedian µs\tp99 µs\tvs direct\tvs raw stream\tvs old\tgoal\tpass\t")
	f := func(v float64, prec int) string {
		if v == 0 {
			return "-"
		}
		return fmt.Sprintf("%.*f", prec, v)
	}
	span := func(r *[2]float64, prec int) string {
		if r == nil {
			return ""
		}
		return fmt.Sprintf("%.*f..%.*f", prec, r[0], prec, r[1])
	}
	for _, r := range rows {
		if r.Error != "" {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\terror: %s\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\n", r.Case, r.Path, r.Transport, r.Conns, r.Error)
			continue
		}
		var goals, passes []string
		for _, g := range []struct {
			goal string
			pass *bool
		}{{r.Goal, r.Pass}, {r.CPUGoal, r.CPUPass}} {
			if g.pass != nil {
				goals, passes = append(goals, g.goal), append(passes, fmt.Sprint(*g.pass))
			}
		}
		goal, pass := "-", "-"
		if len(goals) > 0 {
			goal, pass = strings.Join(goals, "; "), strings.Join(passes, "; ")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.Case, r.Path, r.Transport, f(float64(r.Conns), 0),
			f(r.MBps, 0), span(r.MBpsRange, 0), f(r.CPUsPerGB, 2), span(r.CPURange, 2), f(r.CPURatioOld, 2), span(r.CPURatioOldRange, 2),
			f(r.CPUOverheadRatioOld, 2), span(r.CPUOverheadRatioOldRange, 2),
			f(r.MedianUs, 1), f(r.P99Us, 1), f(r.Ratio, 2), f(r.RawRatio, 2), f(r.OldRatio, 2), goal, pass)
	}
	tw.Flush()
	fmt.Println("  vs direct / raw stream / old: throughput path/reference, latency reference/path (higher is better)")
	fmt.Println("  CPU vs old: CPU s/GB new/old, lower is better; overhead vs old: the same less direct TCP's CPU in that turn")
	fmt.Println("  (the applications' own send and receive), i.e. what each tunnel itself costs; ratios are medians of same-turn ratios")
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
