// Command storage is `make bench-storage`: dataset import and transfer
// speed of the storage package, each next to its physical reference in the
// same run, and the fetching node's peak memory.
//
//   - import: `data add` of a -size file (default 1 GiB of random bytes)
//     with 1 MiB and 256 KiB chunks, next to `sha256sum` of the same file
//     (goal: >= 0.5x sha256sum);
//   - transfer A -> B over loopback, between two node hosts (TCP, Noise,
//     yamux, as `deepmarket node run` builds them): B fetches the dataset
//     into its blockstore over bitswap (goal: >= 0.5x the raw stream), next
//     to the same number of bytes sent over one raw libp2p stream between
//     the same two hosts, and over plain TCP (the physical reference); for
//     both chunk sizes, and as `data get` (fetch, then write the file out);
//   - 3 providers -> 1 fetcher (goal: >= the single-provider rate);
//   - peak RSS of the fetching node (VmHWM of its process) over the 1 GiB
//     fetches (goal: <= 256 MiB).
//
// Each transfer is measured three times (fresh blockstores) and the
// median reported: a shared 2-core machine drifts. BENCH_CPUPROFILE=PREFIX
// writes a CPU profile of each process to PREFIX.PID.
//
// Providers live in this process; each fetcher is a child process (this
// binary with -child) so its memory is its own. Output: a table, and JSON
// with -out (bench/results/storage.json from make).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/storage"
)

const rawProto = "/deepmarket-bench/raw/1"

type result struct {
	SizeBytes int64              `json:"size_bytes"`
	Import    map[string]float64 `json:"import_mb_s"`
	Transfer  []transfer         `json:"transfer"`
	Ratios    map[string]float64 `json:"ratios"`
}

type transfer struct {
	Case      string  `json:"case"`
	Chunk     int     `json:"chunk_bytes"`
	Providers int     `json:"providers"`
	RawMBs    float64 `json:"raw_libp2p_mb_s,omitempty"`
	TCPMBs    float64 `json:"tcp_mb_s,omitempty"`
	FetchMBs  float64 `json:"fetch_mb_s"`
	GetMBs    float64 `json:"get_mb_s,omitempty"`
	PeakRSS   int64   `json:"peak_rss_bytes"`
	PeakAnon  int64   `json:"peak_rss_anon_bytes"`
	// CPU seconds per second of fetch, of the fetcher and of the
	// providers' process: where the two cores went.
	FetcherCPU  float64 `json:"fetcher_cpu"`
	ProviderCPU float64 `json:"provider_cpu"`
}

func main() {
	size := flag.Int64("size", 1<<30, "dataset size in bytes")
	out := flag.String("out", "", "write JSON results here")
	work := flag.String("dir", "", "work directory (default: a temporary one)")
	child := flag.Bool("child", false, "internal: run as the fetching node")
	flag.Parse()
	log.SetFlags(0)
	if p := os.Getenv("BENCH_CPUPROFILE"); p != "" {
		f, err := os.Create(fmt.Sprintf("%s.%d", p, os.Getpid()))
		if err != nil {
			log.Fatal(err)
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	if *child {
		if err := runChild(flag.Args()); err != nil {
			log.Fatal(err)
		}
		return
	}
	dir := *work
	if dir == "" {
		d, err := os.MkdirTemp("", "bench-storage-")
		if err != nil {
			log.Fatal(err)
		}
		defer os.RemoveAll(d)
		dir = d
	}
	res, err := run(dir, *size)
	if err != nil {
		log.Fatal(err)
	}
	print(res)
	if *out != "" {
		b, _ := json.MarshalIndent(res, "", "  ")
		if err := os.WriteFile(*out, append(b, '\n'), 0o644); err != nil {
			log.Fatal(err)
		}
	}
}

func mbs(n int64, d time.Duration) float64 { return float64(n) / 1e6 / d.Seconds() }

func run(dir string, size int64) (*result, error) {
	ctx := context.Background()
	res := &result{SizeBytes: size, Import: map[string]float64{}, Ratios: map[string]float64{}}
	data := filepath.Join(dir, "dataset.bin")
	log.Printf("writing %d MiB of random bytes to %s", size>>20, data)
	if err := randomFile(data, size); err != nil {
		return nil, err
	}

	// Import, next to sha256sum of the same (page-cached) file.
	start := time.Now()
	if outp, err := exec.Command("sha256sum", data).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("sha256sum: %v: %s", err, outp)
	}
	res.Import["sha256sum"] = mbs(size, time.Since(start))

	type provider struct {
		store *storage.Store
		host  host.Host
	}
	var providers []provider
	defer func() {
		for _, p := range providers {
			p.store.Close()
			p.host.Close()
		}
	}()
	roots := map[int]cid.Cid{}
	for i, chunk := range []int{1 << 20, 256 << 10, 1 << 20, 1 << 20} {
		s, err := storage.Open(filepath.Join(dir, fmt.Sprintf("provider%d", i)), storage.Options{ChunkSize: chunk})
		if err != nil {
			return nil, err
		}
		start := time.Now()
		p, err := s.Add(ctx, data, nil)
		if err != nil {
			return nil, err
		}
		if i < 2 {
			res.Import[chunkName(chunk)] = mbs(size, time.Since(start))
			log.Printf("import, %s chunks: %.0f MB/s", chunkName(chunk), res.Import[chunkName(chunk)])
		}
		roots[chunk] = p.CID
		h, err := newHost()
		if err != nil {
			return nil, err
		}
		h.SetStreamHandler(rawProto, serveRaw)
		s.Attach(h, nil)
		providers = append(providers, provider{s, h})
	}
	tcpAddr, stopTCP, err := serveTCP()
	if err != nil {
		return nil, err
	}
	defer stopTCP()

	addrs := func(ps ...provider) []string {
		var out []string
		for _, p := range ps {
			out = append(out, fmt.Sprintf("%s/p2p/%s", p.host.Addrs()[0], p.host.ID()))
		}
		return out
	}
	cases := []struct {
		name  string
		chunk int
		ps    []provider
		refs  bool
		get   bool
	}{
		{"1 provider", 1 << 20, providers[:1], true, true},
		{"1 provider", 256 << 10, providers[1:2], true, false},
		{"3 providers", 1 << 20, []provider{providers[0], providers[2], providers[3]}, false, false},
	}
	for _, c := range cases {
		args := []string{"-root", roots[c.chunk].String(), "-size", fmt.Sprint(size),
			"-dir", filepath.Join(dir, fmt.Sprintf("fetcher-%d-%d", c.chunk, len(c.ps)))}
		if c.refs {
			args = append(args, "-raw", "-tcp", tcpAddr)
		}
		if c.get {
			args = append(args, "-get")
		}
		args = append(args, addrs(c.ps...)...)
		t, err := runFetcher(args)
		if err != nil {
			return nil, fmt.Errorf("%s, %s chunks: %w", c.name, chunkName(c.chunk), err)
		}
		t.Case, t.Chunk, t.Providers = c.name, c.chunk, len(c.ps)
		log.Printf("%s, %s chunks: fetch %.0f MB/s (raw libp2p %.0f, tcp %.0f), peak RSS %d MiB, CPU fetcher %.2f providers %.2f",
			c.name, chunkName(c.chunk), t.FetchMBs, t.RawMBs, t.TCPMBs, t.PeakRSS>>20, t.FetcherCPU, t.ProviderCPU)
		res.Transfer = append(res.Transfer, t)
	}
	one, small, three := res.Transfer[0], res.Transfer[1], res.Transfer[2]
	res.Ratios["import_1MiB_vs_sha256sum"] = res.Import["1MiB"] / res.Import["sha256sum"]
	res.Ratios["import_256KiB_vs_sha256sum"] = res.Import["256KiB"] / res.Import["sha256sum"]
	res.Ratios["fetch_1MiB_vs_raw_libp2p"] = one.FetchMBs / one.RawMBs
	res.Ratios["fetch_256KiB_vs_raw_libp2p"] = small.FetchMBs / small.RawMBs
	res.Ratios["get_1MiB_vs_raw_libp2p"] = one.GetMBs / one.RawMBs
	res.Ratios["raw_libp2p_vs_tcp"] = one.RawMBs / one.TCPMBs
	res.Ratios["3_providers_vs_1"] = three.FetchMBs / one.FetchMBs
	return res, nil
}

func chunkName(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%dKiB", n>>10)
}

func randomFile(path string, size int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	// A fast PRNG stream: crypto/rand would dominate the set-up time, and
	// any incompressible bytes will do.
	buf := make([]byte, 1<<20)
	var x uint64 = 0x9e3779b97f4a7c15
	for written := int64(0); written < size; {
		for i := 0; i+8 <= len(buf); i += 8 {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			for j := 0; j < 8; j++ {
				buf[i+j] = byte(x >> (8 * j))
			}
		}
		n := min(int64(len(buf)), size-written)
		if _, err := f.Write(buf[:n]); err != nil {
			f.Close()
			return err
		}
		written += n
	}
	return f.Close()
}

func newHost() (host.Host, error) {
	key, err := identity.GenerateKey()
	if err != nil {
		return nil, err
	}
	return p2p.NewHost(p2p.HostParams{Key: key, Listen: []string{"/ip4/127.0.0.1/tcp/0"}, Version: "bench"})
}

// serveRaw answers a raw-stream request: an 8-byte decimal count of bytes,
// then that many bytes from memory.
func serveRaw(s network.Stream) {
	defer s.Close()
	var n int64
	if _, err := fmt.Fscanf(s, "%d\n", &n); err != nil {
		s.Reset()
		return
	}
	writeN(s, n)
}

func writeN(w io.Writer, n int64) {
	buf := make([]byte, 1<<20)
	for n > 0 {
		k := min(n, int64(len(buf)))
		if _, err := w.Write(buf[:k]); err != nil {
			return
		}
		n -= k
	}
}

func serveTCP() (string, func(), error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var n int64
				if _, err := fmt.Fscanf(c, "%d\n", &n); err == nil {
					writeN(c, n)
				}
			}()
		}
	}()
	return l.Addr().String(), func() { l.Close() }, nil
}

func runFetcher(args []string) (transfer, error) {
	cmd := exec.Command(os.Args[0], append([]string{"-child", "--"}, args...)...)
	cmd.Stderr = os.Stderr
	outp, err := cmd.Output()
	if err != nil {
		return transfer{}, err
	}
	var t transfer
	return t, json.Unmarshal(outp, &t)
}

// runChild is the fetching node: it connects to the providers, measures
// the raw stream and TCP references if asked, then fetches the root.
func runChild(args []string) error {
	fs := flag.NewFlagSet("child", flag.ContinueOnError)
	root := fs.String("root", "", "CID to fetch")
	size := fs.Int64("size", 0, "bytes for the reference transfers")
	dir := fs.String("dir", "", "blockstore directory")
	raw := fs.Bool("raw", false, "measure a raw libp2p stream first")
	tcpAddr := fs.String("tcp", "", "measure plain TCP from this address first")
	get := fs.Bool("get", false, "also time `data get` (fetch into a fresh store, write the file)")
	reps := fs.Int("reps", 3, "repetitions of each measurement (the median is reported)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	c, err := cid.Decode(*root)
	if err != nil {
		return err
	}
	ctx := context.Background()
	peak := startPeakSampler()
	h, err := newHost()
	if err != nil {
		return err
	}
	defer h.Close()
	var first peer.ID
	for _, a := range fs.Args() {
		ai, err := peer.AddrInfoFromString(a)
		if err != nil {
			return err
		}
		if err := h.Connect(ctx, *ai); err != nil {
			return err
		}
		if first == "" {
			first = ai.ID
		}
	}
	var t transfer
	var tcpRates, rawRates, fetchRates []float64
	for range *reps {
		if *tcpAddr != "" {
			conn, err := net.Dial("tcp", *tcpAddr)
			if err != nil {
				return err
			}
			start := time.Now()
			fmt.Fprintf(conn, "%d\n", *size)
			if n, err := io.Copy(io.Discard, conn); err != nil || n != *size {
				return fmt.Errorf("tcp: %d bytes: %v", n, err)
			}
			tcpRates = append(tcpRates, mbs(*size, time.Since(start)))
			conn.Close()
		}
		if *raw {
			s, err := h.NewStream(ctx, first, rawProto)
			if err != nil {
				return err
			}
			start := time.Now()
			fmt.Fprintf(s, "%d\n", *size)
			s.CloseWrite()
			if n, err := io.Copy(io.Discard, bufio.NewReaderSize(s, 1<<20)); err != nil || n != *size {
				return fmt.Errorf("raw stream: %d bytes: %v", n, err)
			}
			rawRates = append(rawRates, mbs(*size, time.Since(start)))
			s.Close()
		}
	}
	t.TCPMBs, t.RawMBs = median(tcpRates), median(rawRates)

	// Each repetition fetches into a fresh blockstore. The peak memory
	// is the first one's: one node, one store, one 1 GiB fetch.
	peak.reset()
	var fetched int64
	for rep := range *reps {
		storeDir := filepath.Join(*dir, fmt.Sprintf("fetch%d", rep))
		store, err := storage.Open(storeDir, storage.Options{})
		if err != nil {
			return err
		}
		store.Attach(h, nil)
		start := time.Now()
		self0, parent0 := cpuTicks(os.Getpid()), cpuTicks(os.Getppid())
		p, err := store.Fetch(ctx, c, nil)
		if err != nil {
			return err
		}
		wall := time.Since(start)
		fetchRates = append(fetchRates, mbs(p.Size, wall))
		t.FetcherCPU = float64(cpuTicks(os.Getpid())-self0) / 100 / wall.Seconds()
		t.ProviderCPU = float64(cpuTicks(os.Getppid())-parent0) / 100 / wall.Seconds()
		fetched = p.Size
		if rep == 0 {
			t.PeakRSS, t.PeakAnon = peak.read()
		}
		store.Close()
		os.RemoveAll(storeDir)
	}
	t.FetchMBs = median(fetchRates)

	if *get {
		store, err := storage.Open(filepath.Join(*dir, "get"), storage.Options{})
		if err != nil {
			return err
		}
		store.Attach(h, nil)
		start := time.Now()
		if _, _, err := store.Get(ctx, c, filepath.Join(*dir, "out.bin"), nil); err != nil {
			return err
		}
		t.GetMBs = mbs(fetched, time.Since(start))
		store.Close()
	}
	return json.NewEncoder(os.Stdout).Encode(t)
}

// peakSampler tracks the process's peak resident memory: VmHWM (all of it)
// and, by sampling, the peak of its anonymous part.
type peakSampler struct {
	anon chan int64
	rst  chan struct{}
}

func startPeakSampler() *peakSampler {
	p := &peakSampler{anon: make(chan int64), rst: make(chan struct{})}
	go func() {
		var peak int64
		t := time.NewTicker(20 * time.Millisecond)
		for {
			select {
			case <-t.C:
				peak = max(peak, statusKiB("RssAnon")<<10)
			case p.anon <- peak:
			case <-p.rst:
				peak = 0
			}
		}
	}()
	return p
}

// reset restarts both peaks (VmHWM through /proc/self/clear_refs).
func (p *peakSampler) reset() {
	os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
	p.rst <- struct{}{}
}

func (p *peakSampler) read() (rss, anon int64) {
	return statusKiB("VmHWM") << 10, <-p.anon
}

// cpuTicks is a process's user+system CPU time in clock ticks (1/100 s).
func cpuTicks(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command name, which is in parentheses.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	var u, s int64
	fmt.Sscan(f[11], &u)
	fmt.Sscan(f[12], &s)
	return u + s
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

func statusKiB(field string) int64 {
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			var n int64
			fmt.Sscan(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), &n)
			return n
		}
	}
	return 0
}

func print(r *result) {
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "\nimport of %d MiB\tMB/s\tvs sha256sum (goal >= 0.5x)\n", r.SizeBytes>>20)
	fmt.Fprintf(w, "sha256sum\t%.0f\t1.00x\n", r.Import["sha256sum"])
	for _, k := range []string{"1MiB", "256KiB"} {
		fmt.Fprintf(w, "data add, %s chunks\t%.0f\t%.2fx\n", k, r.Import[k], r.Import[k]/r.Import["sha256sum"])
	}
	fmt.Fprintf(w, "\ntransfer A -> B, loopback\tfetch MB/s\traw libp2p MB/s\tTCP MB/s\tfetch/raw (goal >= 0.5x)\tpeak RSS (goal <= 256 MiB)\n")
	for _, t := range r.Transfer {
		ratio := "-"
		if t.RawMBs > 0 {
			ratio = fmt.Sprintf("%.2fx", t.FetchMBs/t.RawMBs)
		}
		fmt.Fprintf(w, "%s, %s chunks\t%.0f\t%.0f\t%.0f\t%s\t%d MiB (anon %d MiB)\n", t.Case, chunkName(t.Chunk),
			t.FetchMBs, t.RawMBs, t.TCPMBs, ratio, t.PeakRSS>>20, t.PeakAnon>>20)
	}
	w.Flush()
	one := r.Transfer[0]
	fmt.Printf("\ndata get (fetch + write the file), 1 MiB chunks: %.0f MB/s (%.2fx raw libp2p)\n", one.GetMBs, one.GetMBs/one.RawMBs)
	fmt.Printf("3 providers vs 1: %.2fx (goal >= 1x)\n", r.Ratios["3_providers_vs_1"])
}
