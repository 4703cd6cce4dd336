// Command nat measures NAT traversal between two machines behind campus
// NATs, on an emulated network (testnet/netlab): how often, and how fast,
// libp2p's hole punch (DCUtR, coordinated through a circuit relay v2)
// turns a relayed connection direct; what the relay carries for it; and
// what a job's tunnel then gets through the hole-punched connection,
// against the same machines without NAT. It prints tables and writes a
// report and JSON (root only: it builds network namespaces):
//
//	go run ./bench/nat -out bench/results/nat
//
// The lab (profile lan, tag -tag) has five sites: 0 on the emulated
// internet, holding the relay; 1 and 2 behind a NAT each, holding A (and
// A-tcp) and B; 3 and 4 public, holding A' and B', the same machines
// without NAT. It runs twice: with cone NATs (profile nat: Linux
// masquerade, endpoint-independent mapping) and with symmetric ones
// (nat-symmetric: a random port per flow). Every libp2p host lives in its
// node's network namespace for its whole life: each is a child process,
// this binary run again with the hidden flag -role, forked from a thread
// inside the namespace (Lab.Do around cmd.Start), which the parent drives
// with JSON lines on its stdin and stdout. Children count the lab's
// internet as public (p2p.TreatAsPublic with Lab.PublicCIDRs).
//
//   - The relay: p2p.NewHost with the relay service on for everyone
//     (RelayOn, Member always true) and a Prometheus registry, whose
//     libp2p_relaysvc_data_transferred_bytes_total counts what it relays.
//     It listens on TCP and QUIC, as a node does by default.
//   - A (and A', and A-tcp): p2p.NewHost with the relay as its static
//     relay, and a tunnel Service exposing a local TCP sink (job "bench",
//     worker 0). The attempts start once A advertises a relay address (it
//     reserves a slot at start: p2p.NewHost reports reachability unknown
//     at once).
//   - Attempts: for each, B makes a fresh key and host, connects to the
//     relay, waits until its hole punch service is up (libp2p starts it
//     once the host has a public address, the one the relay observed;
//     A's DCUtR stream would otherwise find no handler, and libp2p does
//     not retry), dials A at /p2p/RELAY/p2p-circuit/p2p/A, and waits, up
//     to -wait from its start, for a direct connection to A (p2p.Direct).
//     A, which receives the relayed connection, starts DCUtR. Time to
//     direct runs from just before B's key and host are made. The main
//     set listens on TCP and QUIC, as nodes do (-attempts); a second set
//     (-tcp-attempts) on TCP only, to A-tcp, a second node of A's site
//     that does the same, through the relay's TCP address. Under cone
//     NATs attempts run one at a time (-parallel-nat), the relay's counter
//     read around each; under symmetric NATs, where every attempt runs to
//     -wait, -parallel-symmetric at a time (the relay allows 8 relayed
//     connections per peer), so the relayed bytes there are a mean over
//     all of them. One relay and one A serve all of a set's attempts, so
//     that the relay takes every fresh B from one NAT address, as a
//     campus's public node does (p2p.NewHost sizes the resource manager's
//     per-address limits for that; libp2p's defaults refused the 16th
//     attempt); -per-relay N starts a fresh relay and A every N attempts
//     instead.
//   - Throughput (profile nat only): B forwards a loopback port to A's
//     sink through the tunnel and sends -size bytes. A is private, so each
//     tunnelled connection is punched through both NATs (the tunnel's
//     PunchProtocol: a TCP simultaneous open from fresh ports, over the
//     public addresses of the hole-punched libp2p connection), and the
//     tunnel carries it on its own direct TCP path; where the punch fails,
//     over streams of the libp2p connection. The reference is B' to A'
//     without NAT, where the tunnel takes its own direct TCP path (goal:
//     NAT >= 0.9x that). Two more paths: B to A-tcp (a TCP-only pair), and
//     B' to A' over streams of their direct libp2p connection (what the
//     NAT path cost before the punch). The clock runs from the dial to the sink's answer
//     of the count. The paths take turns -reps times, after an untimed
//     warm-up of each; each reports the median and the range, and ratios
//     are the medians of same-turn ratios. The relay's counter is read
//     around the runs (the bulk must not cross it), and /proc around each
//     run says how busy the machine was, and how much of that was not
//     this benchmark.
//
// Public nodes (-public, default 1,2,4): the relay and more public hosts
// beside it in site 0, which A and each B connect to, as a lab's bootstrap
// list has them; every cone set runs with each count. With four, libp2p
// activates an observed address, and "B settled" attempts (B stays
// settleFor among them before it dials) compare libp2p's stock hole punch
// (p2p.NATParams.Stock: the unconfirmed mapping advertised, and dialled
// first) with the node's.
//
// Every figure is from network namespaces on one machine, with netlab's
// shaper (the userspace one on a kernel without sch_netem, which runs in
// this process) and the lan profile; the report says which.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/testnet"
	"github.com/deepmarket/deepmarket/testnet/netlab"
)

// settings are the parent's flags.
type settings struct {
	out, tag                 string
	attempts, tcpAttempts    int
	reps                     int
	size                     int64
	wait                     time.Duration
	parallelNAT, parallelSym int
	epoch                    int
	profiles                 []string
	publics                  []int // public nodes in the network, one run of the cone sets each
	// machineCores, when above 0, runs every host child in a machine of
	// known size of its own (testnet.ByHand: a cgroup with that CPU
	// quota), the NAT routers, the core and the link shaper outside them.
	machineCores float64
}

// machineSize is the size of each host child's machine (settings'
// machineCores; zero: none), read by spawn.
var machineSize testnet.Machine

// maxPublic bounds -public: site 0's nodes.
const maxPublic = 6

// The goals.
const (
	goalRate  = 0.95
	goalP50Ms = 5000
	goalRatio = 0.9
)

func main() {
	var cf childFlags
	flag.StringVar(&cf.role, "role", "", "internal: run as a child (relay, serve or dial)")
	flag.StringVar(&cf.ip, "ip", "", "internal: the child's lab address")
	flag.StringVar(&cf.cidrs, "cidrs", "", "internal: the lab's public ranges")
	flag.StringVar(&cf.relay, "relay", "", "internal: the relay's multiaddrs")
	flag.StringVar(&cf.peers, "peers", "", "internal: the other public nodes' multiaddrs")
	flag.BoolVar(&cf.tcpOnly, "tcp-only", false, "internal: listen on TCP only")
	flag.BoolVar(&cf.stock, "stock", false, "internal: libp2p's stock hole punch (p2p.NATParams.Stock)")
	out := flag.String("out", "bench/results/nat", "directory for report.md and nat.json")
	tag := flag.String("tag", "bnat", "the lab's tag (namespace prefix)")
	attempts := flag.Int("attempts", 50, "hole punch attempts per profile, hosts on TCP and QUIC (a node's default)")
	tcpAttempts := flag.Int("tcp-attempts", 20, "more attempts per profile with hosts on TCP only; 0 skips them and the TCP throughput path")
	size := flag.Int64("size", 256<<20, "bytes per throughput run; 0 skips throughput")
	reps := flag.Int("reps", 3, "throughput runs per path (median and range reported)")
	wait := flag.Duration("wait", 15*time.Second, "bound on one attempt, from B's start to a direct connection")
	parNAT := flag.Int("parallel-nat", 1, "attempts at once under cone NATs")
	parSym := flag.Int("parallel-symmetric", 6, "attempts at once under symmetric NATs (each runs to -wait; at most 7)")
	epoch := flag.Int("per-relay", 0, "attempts per relay and A, started fresh for each such batch; 0: one relay and one A for all of a set's attempts")
	profiles := flag.String("profiles", "nat,nat-symmetric", "NAT profiles to run: nat, nat-symmetric")
	machineCores := flag.Float64("machine-cores", 0, "run each host in a machine of known size of its own (a cgroup with this CPU quota, 2 GiB), the NAT routers outside them, as on a campus whose NAT is a box of its own; 0: no machines (root)")
	publics := flag.String("public", "1,2,4", "public nodes in the network (the relay and more public peers, each lab's bootstrap), comma-separated: the cone NAT's sets run once for each; the symmetric NAT's with the first")
	flag.Parse()
	if cf.role != "" {
		if err := childMain(cf); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		return
	}
	var pubs []int
	for _, f := range strings.Split(*publics, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > maxPublic {
			log.Fatalf("-public: %q: want numbers of public nodes from 1 to %d", f, maxPublic)
		}
		pubs = append(pubs, n)
	}
	set := settings{publics: pubs, out: *out, tag: *tag, attempts: max(*attempts, 1), tcpAttempts: max(*tcpAttempts, 0), reps: max(*reps, 1),
		size: *size, wait: *wait, parallelNAT: min(max(*parNAT, 1), 7), parallelSym: min(max(*parSym, 1), 7),
		epoch: max(*epoch, 0), profiles: strings.Split(*profiles, ","), machineCores: *machineCores}
	if set.machineCores > 0 {
		machineSize = testnet.Machine{Cores: set.machineCores, MemBytes: 2 << 30}
	}
	code := 0
	if err := run(set); err != nil {
		log.Print(err)
		code = 1
	}
	cleanup()
	os.Exit(code)
}

// cleanups run at exit, normal or by signal, last added first.
var (
	cleanMu  sync.Mutex
	cleanups []func()
)

func atExit(f func()) func() {
	once := sync.OnceFunc(f)
	cleanMu.Lock()
	cleanups = append(cleanups, once)
	cleanMu.Unlock()
	return once
}

func cleanup() {
	cleanMu.Lock()
	fs := cleanups
	cleanups = nil
	cleanMu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}

// natProfiles are the profiles this benchmark runs, as testnet names them.
var natProfiles = map[string]netlab.NAT{"nat": netlab.NATCone, "nat-symmetric": netlab.NATSymmetric}

func run(set settings) error {
	if err := netlab.AvailableNAT(); err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	logDir, err := os.MkdirTemp("", "bench-nat-")
	if err != nil {
		return err
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-sigs
		log.Printf("%s: stopping the children and removing the lab", s)
		cleanup()
		os.Exit(1)
	}()
	began := time.Now()
	res := results{When: began.UTC().Format(time.RFC3339), Go: runtime.Version(), CPUs: runtime.NumCPU(),
		Attempts: set.attempts, TCPAttempts: set.tcpAttempts, WaitS: set.wait.Seconds(), SizeBytes: set.size, Reps: set.reps, Logs: logDir,
		HostCores: set.machineCores}
	for _, name := range set.profiles {
		nat, ok := natProfiles[name]
		if !ok {
			return fmt.Errorf("unknown profile %q: want nat or nat-symmetric", name)
		}
		log.Printf("profile %s: building the lab", name)
		pr := runProfile(exe, logDir, name, nat, set)
		if pr.Error != "" {
			log.Printf("profile %s: %s", name, pr.Error)
		}
		res.Profiles = append(res.Profiles, pr)
		if res.Machine == "" {
			res.Machine = pr.Machine
		}
	}
	res.DurationS = time.Since(began).Seconds()
	printTables(res)
	if err := write(set.out, res); err != nil {
		return err
	}
	fmt.Printf("run time %.0f s; report %s, JSON %s; child logs in %s\n", res.DurationS,
		filepath.Join(set.out, "report.md"), filepath.Join(set.out, "nat.json"), logDir)
	return nil
}

// results is nat.json.
type results struct {
	When        string  `json:"when"`
	Go          string  `json:"go"`
	CPUs        int     `json:"cpus"`
	Machine     string  `json:"machine"`
	Attempts    int     `json:"attempts_per_profile"`
	TCPAttempts int     `json:"tcp_only_attempts_per_profile"`
	WaitS       float64 `json:"attempt_bound_s"`
	SizeBytes   int64   `json:"throughput_bytes"`
	Reps        int     `json:"throughput_reps"`
	// HostCores is each host's machine of known size (-machine-cores);
	// 0: the hosts shared the whole machine with the NAT routers.
	HostCores float64         `json:"host_machine_cores,omitempty"`
	DurationS float64         `json:"run_time_s"`
	Logs      string          `json:"child_logs"`
	Profiles  []profileResult `json:"profiles"`
}

// profileResult is one NAT profile's figures.
type profileResult struct {
	Profile string `json:"profile"`
	NAT     string `json:"nat"`
	Machine string `json:"machine"`
	APublic string `json:"a_nat_address"`
	BPublic string `json:"b_nat_address"`

	Sets       []attemptSet `json:"attempt_sets"`
	Throughput *throughput  `json:"throughput,omitempty"`
	DurationS  float64      `json:"run_time_s"`
	Error      string       `json:"error,omitempty"`
}

// attemptSet is a set of hole punch attempts, hosts listening alike.
type attemptSet struct {
	Listen string `json:"listen"` // what A and B listen on
	Target string `json:"target"`
	// Public is how many public nodes the network has: the relay, and
	// more public peers that A and every B are connected to (each an
	// observer of their NATs' mappings).
	Public   int     `json:"public_nodes"`
	Parallel int     `json:"parallel"`
	PerRelay int     `json:"attempts_per_relay"` // attempts per relay and A
	Attempts int     `json:"attempts"`
	Direct   int     `json:"direct"`
	Rate     float64 `json:"success_rate"`
	// Time to direct over the successful attempts, ms.
	P50Ms  float64 `json:"p50_ms,omitempty"`
	P90Ms  float64 `json:"p90_ms,omitempty"`
	MeanMs float64 `json:"mean_ms,omitempty"`
	MaxMs  float64 `json:"max_ms,omitempty"`
	// Medians of the steps before it, ms from B's start, over all
	// attempts that reached them.
	RelayMs   float64 `json:"relay_p50_ms,omitempty"`
	ReadyMs   float64 `json:"ready_p50_ms,omitempty"`
	RelayedMs float64 `json:"relayed_p50_ms,omitempty"`
	// PunchMs is the median time from the relayed connection to the
	// direct one, over the successful attempts: DCUtR and the punch.
	PunchMs float64 `json:"punch_p50_ms,omitempty"`
	// Transports of the direct connections, and why attempts failed.
	Transports   map[string]int `json:"transports,omitempty"`
	Failures     map[string]int `json:"failures,omitempty"`
	FirstFailure int            `json:"first_failure,omitempty"` // the first attempt that failed
	FirstError   string         `json:"first_error,omitempty"`   // and its error
	// Bytes the relay carried per attempt, both ways.
	RelayedMean   float64   `json:"relayed_bytes_mean"`
	RelayedMedian float64   `json:"relayed_bytes_median,omitempty"`
	RelayedMax    float64   `json:"relayed_bytes_max,omitempty"`
	RelayedEach   []float64 `json:"relayed_bytes_each,omitempty"`
	// A: the median time from its start to its relay address, its status
	// then (first batch) and after the attempts (last batch), and the
	// hole punches it counted over all batches.
	ASlotS      float64        `json:"a_relay_addr_after_s"`
	ABefore     *p2p.NATStatus `json:"a_before,omitempty"`
	AAfter      *p2p.NATStatus `json:"a_after,omitempty"`
	APunches    int64          `json:"a_hole_punches"`
	APunchesWon int64          `json:"a_hole_punches_won"`
	// AAdvertised is the public addresses A's host advertised after the
	// attempts (libp2p activates an observed address once enough
	// distinct peers observed it).
	AAdvertised []string `json:"a_advertised_public,omitempty"`
	// BAdvertised counts the settled attempts whose B advertised its NAT's
	// mapping when it dialled A.
	BAdvertised int `json:"b_advertised_mapping,omitempty"`

	Goal    string          `json:"goal"`
	Pass    *bool           `json:"pass,omitempty"`
	Results []attemptResult `json:"results"`

	relayedSum float64 // parallel attempts: the relay's counter's growth over all
}

// throughput compares the tunnel over hole-punched connections with the
// same machines without NAT.
type throughput struct {
	SizeBytes int64        `json:"size_bytes"`
	Reps      int          `json:"reps"`
	Paths     []pathResult `json:"paths"` // the first is the goal's, the last the reference
	Goal      string       `json:"goal"`
	Pass      *bool        `json:"pass,omitempty"`
	// NATShare is B to A over B' to A' with streams only, the median of
	// same-turn ratios and their range: the same kind of path with and
	// without the NATs.
	NATShare      float64    `json:"ratio_nat_to_no_nat_streams,omitempty"`
	NATShareRange [2]float64 `json:"ratio_nat_to_no_nat_streams_range,omitempty"`
	// APrivateS is how long after its start A was found private.
	APrivateS float64 `json:"a_private_after_s"`
	// RelayedDuring is what the relay carried while the runs went on.
	RelayedDuring float64 `json:"relayed_bytes_during"`
	Error         string  `json:"error,omitempty"`
}

type pathResult struct {
	Name  string     `json:"name"`
	Pair  string     `json:"pair"`
	Path  string     `json:"path"`       // what carried the bytes
	Conn  string     `json:"connection"` // the sender's libp2p connections to the receiver
	Tries int        `json:"hole_punch_tries,omitempty"`
	MBps  float64    `json:"mb_s"`
	Range [2]float64 `json:"mb_s_range"`
	Runs  []float64  `json:"mb_s_runs"`
	// Ratio is the median of same-turn ratios to the reference path.
	Ratio      float64    `json:"ratio_to_no_nat,omitempty"`
	RatioRange [2]float64 `json:"ratio_to_no_nat_range,omitempty"`
	// The forwarder's connections, and how many took the direct path.
	TunnelConns  uint64 `json:"tunnel_conns"`
	TunnelDirect uint64 `json:"tunnel_direct_conns"`
	// Medians over the runs, as fractions of all the machine's cores:
	// this benchmark's processes (shaper and hosts), and everything else.
	CPUOurs   float64      `json:"cpu_ours"`
	CPUOthers float64      `json:"cpu_others"`
	cpu       [][2]float64 // per run: ours, others
	c         *child
	a         *child
}

// child is one child process and its control pipe.
type child struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan []byte // closed when its stdout ends
	done  chan struct{}
	log   string
	mu    sync.Mutex
}

// spawn starts this binary as a child with role in node (site, idx) of
// lab and returns it with its ready message.
func spawn(lab *netlab.Lab, exe, logDir, name string, site, idx int, role string, args ...string) (*child, reply, error) {
	logPath := filepath.Join(logDir, name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, reply{}, err
	}
	args = append([]string{"-role", role, "-ip", lab.IP(site, idx).String()}, args...)
	cmd := exec.Command(exe, args...)
	var machine *testnet.ByHand
	if machineSize.Cores > 0 {
		if machine, err = testnet.NewByHand(machineSize, "bench-nat", name); err != nil {
			logf.Close()
			return nil, reply{}, fmt.Errorf("%s's machine: %w", name, err)
		}
		cmd = machine.Command(exe, args...)
	}
	cmd.Stderr = logf
	// Its own process group, killed with this process.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		logf.Close()
		machine.Close()
		return nil, reply{}, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		machine.Close()
		return nil, reply{}, err
	}
	// Forked from a thread inside the node's namespace: the child and
	// every socket it opens live there.
	if err := lab.Do(site, idx, cmd.Start); err != nil {
		logf.Close()
		machine.Close()
		return nil, reply{}, fmt.Errorf("start %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, stdin: stdin, lines: make(chan []byte, 4), done: make(chan struct{}), log: logPath}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			c.lines <- slices.Clone(sc.Bytes())
		}
		close(c.lines)
	}()
	go func() {
		cmd.Wait()
		logf.Close()
		if machine != nil {
			machine.Close()
		}
		close(c.done)
	}()
	atExit(c.stop)
	r, err := c.read(60 * time.Second)
	if err != nil {
		c.stop()
		return nil, reply{}, fmt.Errorf("%s did not start: %w", name, err)
	}
	return c, r, nil
}

// read waits up to timeout for the child's next line.
func (c *child) read(timeout time.Duration) (reply, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case line, ok := <-c.lines:
		if !ok {
			return reply{}, fmt.Errorf("%s exited: %s", c.name, tail(c.log))
		}
		var r reply
		if err := json.Unmarshal(line, &r); err != nil {
			return reply{}, fmt.Errorf("%s: %q: %w", c.name, line, err)
		}
		if r.Err != "" {
			return r, fmt.Errorf("%s: %s", c.name, r.Err)
		}
		return r, nil
	case <-t.C:
		return reply{}, fmt.Errorf("%s: no answer within %s", c.name, timeout)
	}
}

// call sends req and waits up to timeout for the answer.
func (c *child) call(req request, timeout time.Duration) (reply, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b, _ := json.Marshal(req)
	if _, err := c.stdin.Write(append(b, '\n')); err != nil {
		return reply{}, fmt.Errorf("%s: %w", c.name, err)
	}
	return c.read(timeout)
}

// stop asks the child to quit, and kills its process group after 5 s.
func (c *child) stop() {
	c.stdin.Write([]byte(`{"cmd":"quit"}` + "\n"))
	c.stdin.Close()
	select {
	case <-c.done:
	case <-time.After(5 * time.Second):
		syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
		<-c.done
	}
}

// tail is the end of a child's log.
func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return strings.TrimSpace(string(b))
}

// tcpAddrs keeps the TCP ones of comma-separated multiaddrs.
func tcpAddrs(addrs []string) string {
	var out []string
	for _, a := range addrs {
		if strings.Contains(a, "/tcp/") {
			out = append(out, a)
		}
	}
	return strings.Join(out, ",")
}

// runProfile builds the lab under nat, runs the attempts (and, under cone
// NATs, the throughput runs) and tears it down.
func runProfile(exe, logDir, name string, nat netlab.NAT, set settings) (pr profileResult) {
	began := time.Now()
	pr = profileResult{Profile: name, NAT: nat.String()}
	defer func() { pr.DurationS = time.Since(began).Seconds() }()
	fail := func(err error) profileResult {
		pr.Error = err.Error()
		return pr
	}
	_ = netlab.Cleanup(set.tag) // what a crashed run left
	lan, err := netlab.ProfileByName("lan")
	if err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	lab, err := netlab.Create(ctx, netlab.Config{Tag: set.tag, Sites: []int{slices.Max(set.publics), 2, 1, 1, 1}, Profile: lan,
		NAT: []netlab.NAT{netlab.NATNone, nat, nat, netlab.NATNone, netlab.NATNone}})
	cancel()
	if err != nil {
		return fail(err)
	}
	closeLab := atExit(func() {
		if err := lab.Close(); err != nil {
			log.Print(err)
		}
	})
	l := &labRun{lab: lab, exe: exe, logDir: logDir, prefix: set.tag + "-" + name + "-"}
	defer func() {
		// Children first: a namespace outlives its mount while a process
		// runs in it.
		l.stopAll()
		closeLab()
	}()
	pr.Machine = fmt.Sprintf("emulated with network namespaces on one %d-core VM, %s link shaper, lan profile",
		runtime.NumCPU(), lab.Shaper())
	pr.APublic, pr.BPublic = lab.PublicIP(1).String(), lab.PublicIP(2).String()
	var cidrs []string
	for _, c := range lab.PublicCIDRs() {
		cidrs = append(cidrs, c.String())
	}
	l.pub = "-cidrs=" + strings.Join(cidrs, ",")
	b, _, err := l.start("B", 2, 0, "dial")
	if err != nil {
		return fail(err)
	}

	par := set.parallelNAT
	goal := fmt.Sprintf(">= %.0f%% direct, p50 <= %.0f s", goalRate*100, goalP50Ms/1000.)
	if nat == netlab.NATSymmetric {
		par, goal = set.parallelSym, "none: ~0% expected"
	}
	type setSpec struct {
		listen, target string
		n              int
		tcpOnly        bool
		public         int
		settled        bool // B settles among the public nodes before it dials
		stock          bool // A and B with libp2p's stock hole punch
	}
	publics := set.publics
	if nat != netlab.NATCone {
		publics = publics[:1] // more public nodes cannot help a symmetric NAT: a mapping per flow
	}
	var sets []setSpec
	for _, np := range publics {
		sets = append(sets, setSpec{"TCP and QUIC (a node's default)", "A", set.attempts, false, np, false, false},
			setSpec{"TCP only", "A-tcp", set.tcpAttempts, true, np, false, false})
		if np >= 4 && nat == netlab.NATCone {
			// Four observers activate B's public address in libp2p: a node
			// that has run a while advertises it, and A's hole puncher then
			// dials it directly before it punches. Side by side: libp2p's
			// stock hole punch, and the node's (p2p.NATParams.Stock).
			sets = append(sets,
				setSpec{"TCP and QUIC, B settled, libp2p's stock hole punch", "A", set.tcpAttempts, false, np, true, true},
				setSpec{"TCP and QUIC, B settled", "A", set.tcpAttempts, false, np, true, false})
		}
	}
	for i, s := range sets {
		if s.n == 0 {
			continue
		}
		epoch := set.epoch
		if epoch == 0 {
			epoch = s.n
		}
		as := attemptSet{Listen: s.listen, Target: s.target, Parallel: par, PerRelay: epoch, Public: s.public}
		if !s.tcpOnly && s.public == 1 {
			as.Goal = goal
		}
		_ = i
		log.Printf("profile %s: %d public %s, %d attempts, hosts on %s, %d at once, %d per relay and %s", name, s.public,
			plural(s.public, "node", "nodes"), s.n, s.listen, par, epoch, s.target)
		var slots []float64
		for done := 0; done < s.n; done += epoch {
			ep, err := l.startPair(s.target, s.tcpOnly, s.public, s.stock)
			if err != nil {
				return fail(err)
			}
			slots = append(slots, ep.slotS)
			if as.ABefore == nil {
				as.ABefore = &ep.slotStatus
			}
			req := request{Peer: ep.aID, Relay: ep.relayAddrs(s.tcpOnly), Peers: ep.peerAddrs(s.tcpOnly), TCPOnly: s.tcpOnly, Settled: s.settled, Stock: s.stock}
			err = attempts(ep.relay, b, req, min(epoch, s.n-done), set.wait, &as)
			if st, serr := ep.a.call(request{Cmd: "status"}, 10*time.Second); serr == nil {
				as.AAfter = st.NAT
				as.APunches += st.NAT.HolePunches
				as.APunchesWon += st.NAT.HolePunchesWon
				as.AAdvertised = st.Public
			}
			l.stop(append([]*child{ep.a, ep.relay}, ep.others...)...)
			if err != nil {
				return fail(err)
			}
		}
		as.ASlotS = percentile(slots, 0.5)
		summarize(&as)
		pr.Sets = append(pr.Sets, as)
		log.Printf("profile %s: %d/%d direct, p50 %.0f ms, p90 %.0f ms, %.0f B relayed per attempt", name, as.Direct, as.Attempts,
			as.P50Ms, as.P90Ms, as.RelayedMean)
	}
	if nat != netlab.NATCone {
		return pr
	}
	if set.size > 0 {
		pr.Throughput = l.throughput(b, set)
		if pr.Throughput.Error != "" {
			log.Printf("profile %s: throughput: %s", name, pr.Throughput.Error)
		}
	}
	return pr
}

// labRun is the children of one profile's lab.
type labRun struct {
	lab                 *netlab.Lab
	exe, logDir, prefix string
	pub                 string // the -cidrs flag
	mu                  sync.Mutex
	children            []*child
	seq                 int
}

// start starts a child in node (site, idx).
func (l *labRun) start(cname string, site, idx int, role string, args ...string) (*child, reply, error) {
	l.mu.Lock()
	l.seq++
	name := fmt.Sprintf("%s%s-%d", l.prefix, cname, l.seq)
	l.mu.Unlock()
	c, r, err := spawn(l.lab, l.exe, l.logDir, name, site, idx, role, append([]string{l.pub}, args...)...)
	if err == nil {
		l.mu.Lock()
		l.children = append(l.children, c)
		l.mu.Unlock()
	}
	return c, r, err
}

// stop stops cs (nil ones skipped) and forgets them.
func (l *labRun) stop(cs ...*child) {
	for _, c := range cs {
		if c == nil {
			continue
		}
		c.stop()
		l.mu.Lock()
		l.children = slices.DeleteFunc(l.children, func(x *child) bool { return x == c })
		l.mu.Unlock()
	}
}

func (l *labRun) stopAll() {
	l.mu.Lock()
	cs := slices.Clone(l.children)
	l.mu.Unlock()
	l.stop(cs...)
}

func (l *labRun) pids() []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	pids := []int{os.Getpid()}
	for _, c := range l.children {
		pids = append(pids, c.cmd.Process.Pid)
	}
	return pids
}

// pair is a fresh relay and a fresh A holding a slot on it, with the
// network's other public nodes (others), which A is connected to.
type pair struct {
	relay, a   *child
	others     []*child
	relayAll   []string
	peersAll   [][]string // the others' full multiaddrs
	aID        string
	aAddrs     []string
	aStart     time.Time
	slotS      float64 // from A's start to its relay address
	slotStatus p2p.NATStatus
}

func (p *pair) relayAddrs(tcpOnly bool) string {
	if tcpOnly {
		return tcpAddrs(p.relayAll)
	}
	return strings.Join(p.relayAll, ",")
}

// peerAddrs is the other public nodes' full multiaddrs, ";" between
// nodes.
func (p *pair) peerAddrs(tcpOnly bool) string {
	var nodes []string
	for _, as := range p.peersAll {
		if tcpOnly {
			nodes = append(nodes, tcpAddrs(as))
		} else {
			nodes = append(nodes, strings.Join(as, ","))
		}
	}
	return strings.Join(nodes, ";")
}

// startPair starts a relay in site 0 (its node 0) and public-1 more
// public nodes beside it, then A (target "A", node 0 of site 1) or A-tcp
// (node 1, TCP only, reaching the relay over TCP), connected to every
// public node, and waits until A holds a slot on the relay.
func (l *labRun) startPair(target string, tcpOnly bool, public int, stock bool) (*pair, error) {
	relay, rr, err := l.start("relay", 0, 0, "relay")
	if err != nil {
		return nil, err
	}
	p := &pair{relay: relay, relayAll: rr.Addrs}
	for i := 1; i < public; i++ {
		o, or, err := l.start(fmt.Sprintf("public%d", i), 0, i, "relay")
		if err != nil {
			l.stop(append([]*child{relay}, p.others...)...)
			return nil, err
		}
		p.others, p.peersAll = append(p.others, o), append(p.peersAll, or.Addrs)
	}
	idx, args := 0, []string{"-relay=" + p.relayAddrs(tcpOnly), "-peers=" + p.peerAddrs(tcpOnly)}
	if stock {
		args = append(args, "-stock")
	}
	if tcpOnly {
		idx, args = 1, append(args, "-tcp-only")
	}
	began := time.Now()
	a, ar, err := l.start(target, 1, idx, "serve", args...)
	if err != nil {
		l.stop(append([]*child{relay}, p.others...)...)
		return nil, err
	}
	p.a, p.aID, p.aAddrs, p.aStart = a, ar.ID, ar.Addrs, began
	// A must hold a relay slot before anyone can reach it.
	st, err := waitStatus(a, 60*time.Second, func(s p2p.NATStatus) bool { return len(s.RelayAddrs) > 0 })
	if err != nil {
		l.stop(append([]*child{a, relay}, p.others...)...)
		return nil, fmt.Errorf("%s has no relay address: %w", target, err)
	}
	p.slotS, p.slotStatus = time.Since(began).Seconds(), st
	return p, nil
}

// waitStatus polls c's NAT status until ok, up to timeout.
func waitStatus(c *child, timeout time.Duration, ok func(p2p.NATStatus) bool) (p2p.NATStatus, error) {
	deadline := time.Now().Add(timeout)
	var last p2p.NATStatus
	for {
		r, err := c.call(request{Cmd: "status"}, 10*time.Second)
		if err != nil {
			return last, err
		}
		last = *r.NAT
		if ok(last) {
			return last, nil
		}
		if time.Now().After(deadline) {
			return last, fmt.Errorf("not within %s: %+v", timeout, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// relayed reads the relay's counter.
func relayed(relay *child) (float64, error) {
	r, err := relay.call(request{Cmd: "metrics"}, 10*time.Second)
	return r.Relayed, err
}

// attempts runs n attempts of req, adding them to as: one by one, with
// the relay's counter around each, or as.Parallel at a time with the
// counter around them all.
func attempts(relay, b *child, req request, n int, wait time.Duration, as *attemptSet) error {
	req.Cmd, req.WaitMs, req.Parallel = "attempts", int(wait.Milliseconds()), as.Parallel
	if as.Parallel == 1 {
		req.N = 1
		for i := range n {
			before, err := relayed(relay)
			if err != nil {
				return err
			}
			r, err := b.call(req, wait+30*time.Second)
			if err != nil {
				return err
			}
			// The circuit ends when B's host closes; let the relay see it.
			time.Sleep(100 * time.Millisecond)
			after, err := relayed(relay)
			if err != nil {
				return err
			}
			as.Results = append(as.Results, r.Attempts...)
			as.RelayedEach = append(as.RelayedEach, after-before)
			if (i+1)%10 == 0 {
				log.Printf("  %d attempts", i+1)
			}
		}
		return nil
	}
	req.N = n
	before, err := relayed(relay)
	if err != nil {
		return err
	}
	rounds := (n + as.Parallel - 1) / as.Parallel
	r, err := b.call(req, time.Duration(rounds)*(wait+10*time.Second)+30*time.Second)
	if err != nil {
		return err
	}
	time.Sleep(500 * time.Millisecond)
	after, err := relayed(relay)
	if err != nil {
		return err
	}
	as.Results = append(as.Results, r.Attempts...)
	as.relayedSum += after - before
	return nil
}

// summarize fills as's figures from its attempts.
func summarize(as *attemptSet) {
	var times, relayT, readyT, relayedT, punchT []float64
	as.Transports, as.Failures = map[string]int{}, map[string]int{}
	for i, r := range as.Results {
		if r.RelayMs > 0 {
			relayT = append(relayT, r.RelayMs)
		}
		if r.ReadyMs > 0 {
			readyT = append(readyT, r.ReadyMs)
		}
		if r.RelayedMs > 0 {
			relayedT = append(relayedT, r.RelayedMs)
		}
		if r.Advertised {
			as.BAdvertised++
		}
		if !r.OK {
			as.Failures[failureKind(r.Err)]++
			if as.FirstFailure == 0 {
				as.FirstFailure, as.FirstError = i+1, r.Err
			}
			continue
		}
		as.Direct++
		times = append(times, r.ToDirectMs)
		punchT = append(punchT, r.ToDirectMs-r.RelayedMs)
		as.Transports[transport(r.Conn)]++
	}
	as.Attempts = len(as.Results)
	if as.Attempts > 0 {
		as.Rate = float64(as.Direct) / float64(as.Attempts)
	}
	as.P50Ms, as.P90Ms = percentile(times, 0.5), percentile(times, 0.9)
	as.MaxMs = percentile(times, 1)
	as.MeanMs = mean(times)
	as.RelayMs, as.ReadyMs, as.RelayedMs = percentile(relayT, 0.5), percentile(readyT, 0.5), percentile(relayedT, 0.5)
	as.PunchMs = percentile(punchT, 0.5)
	if len(as.RelayedEach) > 0 {
		as.RelayedMean, as.RelayedMedian, as.RelayedMax = mean(as.RelayedEach), percentile(as.RelayedEach, 0.5), percentile(as.RelayedEach, 1)
	} else if as.Attempts > 0 {
		as.RelayedMean = as.relayedSum / float64(as.Attempts)
	}
	if strings.HasPrefix(as.Goal, ">=") {
		pass := as.Rate >= goalRate && as.P50Ms > 0 && as.P50Ms <= goalP50Ms
		as.Pass = &pass
	}
}

// failureKind is an attempt's error without its details.
func failureKind(err string) string {
	if i := strings.Index(err, ": "); i > 0 && !strings.HasPrefix(err, "no ") {
		return err[:i]
	}
	return err
}

// transport names a connection's transport from its remote address.
func transport(addr string) string {
	switch {
	case strings.Contains(addr, "/quic-v1"):
		return "quic"
	case strings.Contains(addr, "/tcp/"):
		return "tcp"
	}
	return "other"
}

// percentile is the nearest-rank percentile p (0 < p <= 1) of xs, the
// least for p = 0; 0 if there are none.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	var sum float64
	for _, x := range xs {
		sum += x
	}
	return sum / float64(len(xs))
}

// cpuSample is the machine's CPU time so far, and this benchmark's.
type cpuSample struct {
	at          time.Time
	busy, total uint64 // /proc/stat, all CPUs, in ticks
	ours        uint64 // utime+stime of pids, in ticks
}

func sampleCPU(pids []int) cpuSample {
	s := cpuSample{at: time.Now()}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		f := strings.Fields(line)
		for i, v := range f[1:] {
			n, _ := strconv.ParseUint(v, 10, 64)
			if i >= 8 { // guest time is in user already
				break
			}
			s.total += n
			if i != 3 && i != 4 { // idle, iowait
				s.busy += n
			}
		}
	}
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		_, rest, _ := strings.Cut(string(b), ") ")
		f := strings.Fields(rest)
		if len(f) > 12 {
			u, _ := strconv.ParseUint(f[11], 10, 64)
			k, _ := strconv.ParseUint(f[12], 10, 64)
			s.ours += u + k
		}
	}
	return s
}

// usage is the fractions of the machine's cores that pids, and the
// rest, used between a and b.
func usage(a, b cpuSample) (ours, others float64) {
	if b.total <= a.total {
		return 0, 0
	}
	busy := float64(b.busy-a.busy) / float64(b.total-a.total)
	// Ticks are 1/100 s (USER_HZ) on Linux.
	ours = float64(b.ours-a.ours) / 100 / b.at.Sub(a.at).Seconds() / float64(runtime.NumCPU())
	return ours, max(busy-ours, 0)
}

// throughput starts a fresh relay, A (and A-tcp), A' and B', opens the
// paths (each a fresh host and forwarder in its sender, allowed by its
// receiver), and times the runs, the paths taking turns. The last path
// is the reference.
func (l *labRun) throughput(b *child, set settings) *throughput {
	t := &throughput{SizeBytes: set.size, Reps: set.reps, Goal: fmt.Sprintf(">= %.1fx no NAT", goalRatio)}
	fail := func(err error) *throughput {
		t.Error = err.Error()
		return t
	}
	ep, err := l.startPair("A", false, 1, false)
	if err != nil {
		return fail(err)
	}
	defer l.stop(ep.a, ep.relay)
	var atcp *child
	var atcpr reply
	if set.tcpAttempts > 0 {
		if atcp, atcpr, err = l.start("A-tcp", 1, 1, "serve", "-relay="+ep.relayAddrs(true), "-tcp-only"); err != nil {
			return fail(err)
		}
		defer l.stop(atcp)
	}
	a2, a2r, err := l.start("A2", 3, 0, "serve", "-relay="+ep.relayAddrs(false))
	if err != nil {
		return fail(err)
	}
	defer l.stop(a2)
	b2, _, err := l.start("B2", 4, 0, "dial")
	if err != nil {
		return fail(err)
	}
	defer l.stop(b2)
	paths := []*pathResult{
		{Name: "nat", Pair: "A-B, behind NATs", c: b, a: ep.a},
		{Name: "nat-tcp", Pair: "A-tcp-B, behind NATs, TCP only", c: b, a: atcp},
		{Name: "no-nat-streams", Pair: "A'-B', no NAT, tunnel streams only", c: b2, a: a2},
		{Name: "no-nat", Pair: "A'-B', no NAT", c: b2, a: a2},
	}
	if atcp == nil {
		paths = slices.Delete(paths, 1, 2)
	}
	opens := map[string]request{
		"nat":            {Peer: ep.aID, Relay: ep.relayAddrs(false)},
		"nat-tcp":        {Peer: atcpr.ID, Relay: ep.relayAddrs(true), TCPOnly: true},
		"no-nat-streams": {Peer: a2r.ID, Addrs: a2r.Addrs, Streams: true},
		"no-nat":         {Peer: a2r.ID, Addrs: a2r.Addrs},
	}
	// Over a hole-punched connection the tunnel uses streams only once A
	// knows it is private (AutoNAT); before, its first connection would
	// try A's NAT address for 3 s.
	for _, a := range []*child{ep.a, atcp} {
		if a == nil {
			continue
		}
		if _, err := waitStatus(a, 90*time.Second, func(s p2p.NATStatus) bool { return s.Reachability == "private" }); err != nil {
			return fail(fmt.Errorf("%s not found private: %w", a.name, err))
		}
		if a == ep.a {
			t.APrivateS = time.Since(ep.aStart).Seconds()
		}
	}
	relay, pids := ep.relay, l.pids()
	waitMs := int(set.wait.Milliseconds())
	for _, p := range paths {
		req := opens[p.Name]
		req.Cmd, req.Name, req.WaitMs = "tput-open", p.Name, waitMs
		r, err := p.c.call(req, 3*(set.wait+10*time.Second))
		if err != nil {
			return fail(fmt.Errorf("%s: %w", p.Pair, err))
		}
		if _, err := p.a.call(request{Cmd: "allow", Peer: r.ID}, 10*time.Second); err != nil {
			return fail(err)
		}
		p.Tries = r.Tries
	}
	// A send's bound: 10 MB/s at the least.
	bound := time.Duration(set.size/10e6+30) * time.Second
	send := func(p *pathResult, size int64) (float64, error) {
		r, err := p.c.call(request{Cmd: "tput-send", Name: p.Name, Size: size, WaitMs: int(bound.Milliseconds())}, bound+10*time.Second)
		if err != nil {
			return 0, err
		}
		return float64(size) / r.Seconds / 1e6, nil
	}
	for _, p := range paths {
		if _, err := send(p, min(set.size, 16<<20)); err != nil {
			return fail(fmt.Errorf("%s warm-up: %w", p.Pair, err))
		}
	}
	before, err := relayed(relay)
	if err != nil {
		return fail(err)
	}
	ref := len(paths) - 1
	ratios := make([][]float64, len(paths))
	for rep := range set.reps {
		got := make([]float64, len(paths))
		for k := range paths {
			i := (k + rep) % len(paths) // each turn starts with another path
			p := paths[i]
			c0 := sampleCPU(pids)
			v, err := send(p, set.size)
			if err != nil {
				return fail(fmt.Errorf("%s, run %d: %w", p.Pair, rep+1, err))
			}
			ours, others := usage(c0, sampleCPU(pids))
			got[i] = v
			p.Runs = append(p.Runs, v)
			p.cpu = append(p.cpu, [2]float64{ours, others})
		}
		var line []string
		for i, p := range paths {
			ratios[i] = append(ratios[i], got[i]/got[ref])
			line = append(line, fmt.Sprintf("%s %.1f", p.Name, got[i]))
		}
		log.Printf("  throughput turn %d (MB/s): %s", rep+1, strings.Join(line, ", "))
	}
	after, err := relayed(relay)
	if err != nil {
		return fail(err)
	}
	t.RelayedDuring = after - before
	for i, p := range paths {
		p.MBps = percentile(p.Runs, 0.5)
		p.Range = [2]float64{percentile(p.Runs, 0), percentile(p.Runs, 1)}
		if i != ref {
			p.Ratio = percentile(ratios[i], 0.5)
			p.RatioRange = [2]float64{percentile(ratios[i], 0), percentile(ratios[i], 1)}
		}
		var ours, others []float64
		for _, c := range p.cpu {
			ours, others = append(ours, c[0]), append(others, c[1])
		}
		p.CPUOurs, p.CPUOthers = percentile(ours, 0.5), percentile(others, 0.5)
		r, err := p.c.call(request{Cmd: "tput-stats", Name: p.Name}, 10*time.Second)
		if err != nil {
			return fail(err)
		}
		p.Conn = strings.Join(r.Conns, ", ")
		p.TunnelConns, p.TunnelDirect = r.Stats.Conns, r.Stats.Direct
		switch {
		case r.Stats.Direct == 0 && strings.HasPrefix(p.Name, "nat"):
			p.Path = "tunnel streams over the hole-punched " + transport(directOf(p.Conn)) + " connection"
		case r.Stats.Direct == 0:
			p.Path = "tunnel streams over the direct " + transport(directOf(p.Conn)) + " connection"
		case r.Stats.Direct == r.Stats.Conns && strings.HasPrefix(p.Name, "nat"):
			p.Path = "the tunnel's own direct TCP path, punched through both NATs"
		case r.Stats.Direct == r.Stats.Conns:
			p.Path = "the tunnel's own direct TCP path"
		default:
			p.Path = fmt.Sprintf("tunnel: %d of %d connections on its direct path", r.Stats.Direct, r.Stats.Conns)
		}
		t.Paths = append(t.Paths, *p)
	}
	if i := slices.IndexFunc(paths, func(p *pathResult) bool { return p.Name == "no-nat-streams" }); i > 0 {
		var rs []float64
		for turn := range paths[0].Runs {
			rs = append(rs, paths[0].Runs[turn]/paths[i].Runs[turn])
		}
		t.NATShare, t.NATShareRange = percentile(rs, 0.5), [2]float64{percentile(rs, 0), percentile(rs, 1)}
	}
	pass := t.Paths[0].Ratio >= goalRatio && t.RelayedDuring < 1<<20
	t.Pass = &pass
	return t
}

// directOf is the first direct connection in a list tput-stats gave.
func directOf(conns string) string {
	for _, c := range strings.Split(conns, ", ") {
		if a, ok := strings.CutPrefix(c, "direct "); ok {
			return a
		}
	}
	return ""
}

// setRow is one attempt set's figures, for both tables.
func setRow(p profileResult, s attemptSet, ms func(float64) string) []string {
	rel := fmt.Sprintf("%.0f", s.RelayedMean)
	if s.RelayedMedian > 0 {
		rel += fmt.Sprintf(" (median %.0f, max %.0f)", s.RelayedMedian, s.RelayedMax)
	}
	return []string{p.Profile, p.NAT, strconv.Itoa(s.Public), s.Listen, strconv.Itoa(s.Parallel), strconv.Itoa(s.PerRelay), strconv.Itoa(s.Attempts), strconv.Itoa(s.Direct),
		fmt.Sprintf("%.0f%%", s.Rate*100), ms(s.P50Ms), ms(s.P90Ms), ms(s.MaxMs), ms(s.RelayMs), ms(s.ReadyMs), ms(s.RelayedMs), ms(s.PunchMs), rel,
		counts(s.Transports), orDash(s.Goal), passText(s.Pass)}
}

var setHeader = []string{"profile", "NAT", "public nodes", "hosts listen on", "at once", "per relay", "attempts", "direct", "success", "p50 to direct",
	"p90", "max", "relay", "ready", "relayed", "punch", "relayed bytes/attempt", "direct over", "goal", "pass"}

// printTables prints the results for a reader; the JSON has more.
func printTables(res results) {
	fmt.Printf("\nNAT traversal, %s\n\n", res.Machine)
	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, strings.Join(setHeader, "\t")+"\t")
	ms := func(v float64) string { return num(v, 0) }
	for _, p := range res.Profiles {
		if p.Error != "" && len(p.Sets) == 0 {
			fmt.Fprintf(tw, "%s\t%s\terror: %s\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\n", p.Profile, p.NAT, p.Error)
			continue
		}
		for _, s := range p.Sets {
			fmt.Fprintln(tw, strings.Join(setRow(p, s, ms), "\t")+"\t")
		}
	}
	tw.Flush()
	fmt.Println("  times in ms from B's start; relay, ready, relayed: medians of the steps before the direct connection;")
	fmt.Println("  punch: median from the relayed connection to the direct one")
	for _, p := range res.Profiles {
		for _, s := range p.Sets {
			if strings.Contains(s.Listen, "settled") {
				fmt.Printf("  %s, %d public nodes, %s: B advertised its mapping in %d of %d attempts; A advertised %v\n", p.Profile, s.Public,
					s.Listen, s.BAdvertised, s.Attempts, s.AAdvertised)
			}
			if len(s.Failures) > 0 {
				fmt.Printf("  %s, %s: failures: %s\n", p.Profile, s.Listen, counts(s.Failures))
				if s.FirstError != failureKind(s.FirstError) {
					fmt.Printf("    the first (attempt %d): %s\n", s.FirstFailure, clip(strings.ReplaceAll(s.FirstError, "\n", " "), 300))
				}
			}
		}
		if p.Error != "" {
			fmt.Printf("  %s error: %s\n", p.Profile, p.Error)
		}
	}
	for _, p := range res.Profiles {
		t := p.Throughput
		if t == nil {
			continue
		}
		fmt.Printf("\nThroughput through the tunnel, %d MiB a run, %d turns (profile %s)\n\n", t.SizeBytes>>20, t.Reps, p.Profile)
		if t.Error != "" {
			fmt.Printf("  error: %s\n", t.Error)
		}
		tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "pair\tpath\tMB/s\t(range)\tvs no NAT\t(range)\tCPU ours\tCPU others\tgoal\tpass\t")
		for i, pa := range t.Paths {
			goal, pass := "", ""
			if i == 0 {
				goal, pass = t.Goal, passText(t.Pass)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%.0f%%\t%.0f%%\t%s\t%s\t\n", pa.Pair, pa.Path, num(pa.MBps, 1), span(pa.Range, 1),
				num(pa.Ratio, 2), span(pa.RatioRange, 2), pa.CPUOurs*100, pa.CPUOthers*100, goal, pass)
		}
		tw.Flush()
		if t.NATShare > 0 {
			fmt.Printf("  A-B over A'-B' with streams only (what the NAT path gains over the streams it used before the punch): %.2f (%s)\n", t.NATShare, span(t.NATShareRange, 2))
		}
		fmt.Printf("  the relay carried %.0f bytes during the runs; A was found private %.0f s after its start;\n", t.RelayedDuring, t.APrivateS)
		fmt.Printf("  CPU: medians over the runs, shares of all %d cores\n", res.CPUs)
	}
	fmt.Println()
}

// clip shortens s to n bytes.
func clip(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func num(v float64, prec int) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.*f", prec, v)
}

func span(r [2]float64, prec int) string {
	if r[1] == 0 {
		return ""
	}
	return fmt.Sprintf("%.*f..%.*f", prec, r[0], prec, r[1])
}

func passText(p *bool) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprint(*p)
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func counts(m map[string]int) string {
	if len(m) == 0 {
		return "-"
	}
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s %d", k, v))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

// write writes nat.json and report.md in dir.
func write(dir string, res results) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "nat.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "report.md"), []byte(report(res)), 0o644)
}

// report is report.md.
func report(res results) string {
	var w strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&w, format, args...) }
	p("# NAT traversal: hole punching through campus NATs, and the tunnel over it\n\n")
	p("Written by `make bench-nat` (`go run ./bench/nat`) on %s, %s, %d CPUs, in %.0f s.\n\n", res.When, res.Go, res.CPUs, res.DurationS)
	p("Every figure here is **%s**: real libp2p hosts (p2p.NewHost) in network namespaces of their own, ", res.Machine)
	p("real nftables NATs in router namespaces, but one machine's cores shared by every host and by the link shaper, ")
	p("and no real WAN. Times and rates are this machine's, not a campus's.\n\n")
	p("## How it was measured\n\n")
	p("A netlab lab: site 0 on the emulated internet holds the relay (relay service on, libp2p's metrics in a Prometheus ")
	p("registry); sites 1 and 2 sit behind a NAT each and hold A (and A-tcp) and B; sites 3 and 4 are public and hold A' ")
	p("and B', the same kind of machine without NAT. Profile `nat` puts sites 1 and 2 behind cone NATs (Linux masquerade: ")
	p("endpoint-independent mapping, address-and-port-dependent filtering), `nat-symmetric` behind symmetric ones (a random ")
	p("external port per flow). Each host is a child process started inside its node's namespace and counts the lab's ")
	p("internet as public (p2p.TreatAsPublic). The relay and A listen on TCP and QUIC, as nodes do by default.\n\n")
	p("- A has the relay as its static relay and a tunnel Service exposing a TCP sink. Attempts start once A advertises ")
	p("a relay address.\n")
	p("- Each attempt: B makes a fresh key and host, connects to the relay, waits for its own hole punch service (libp2p ")
	p("starts it once the relay has told B its public address; without it A's DCUtR stream finds no handler and libp2p ")
	p("does not retry), dials A through `/p2p/RELAY/p2p-circuit/p2p/A`, and waits up to %.0f s from its start for a direct ", res.WaitS)
	p("connection to A (p2p.Direct). A, which receives the relayed connection, runs DCUtR. *Time to direct* runs from just ")
	p("before B's key and host are made; *relay*, *ready* and *relayed* are the medians of the steps before it (B connected ")
	p("to the relay, B's hole punch service up, B's relayed connection to A up), *punch* the median from the relayed ")
	p("connection to the direct one (DCUtR's exchange and the punch itself). *Ready* is libp2p's own pace: its hole punch ")
	p("service first looks for a public address 250 ms after the host starts (then at 0.75 s, 1.75 s, ...), so a fresh ")
	p("host's time to direct starts at about 250 ms; a node that has run a while has it already. ")
	p("The main set (%d attempts) has B listen on ", res.Attempts)
	p("TCP and QUIC like A; a second set (%d attempts) has B and A-tcp, a second node beside A, listen on TCP only and ", res.TCPAttempts)
	p("reach the relay over TCP.\n")
	p("- *Public nodes*: how many public nodes the network has, as a lab's bootstrap list gives them: the relay, and ")
	p("more public hosts beside it in site 0 (relay service on too). A connects to all of them at its start, and each B ")
	p("at its start, before it dials A through the relay; each observes the NATs' mappings. Under the cone NAT every set ")
	p("runs with each count of public nodes; under the symmetric one with the first (more observers cannot help a NAT ")
	p("that maps every flow anew). With four, libp2p activates an observed address (4 observers) and a host would ")
	p("advertise its NAT's mapping, which the NAT does not let peers dial: *B settled* attempts have B stay %.0f s among ", settleFor.Seconds())
	p("the public nodes before it dials, as a node that has run a while, once with libp2p's stock hole punch on A and B ")
	p("(p2p.NATParams.Stock: the mapping advertised, 10 s for each hole punch dial) and once as a node runs (an ")
	p("unconfirmed mapping not advertised, 2 s for each dial). *Ready* there includes the %.0f s.\n", settleFor.Seconds())
	p("- *Per relay*: one relay and one A serve a whole set of attempts, so the relay takes every fresh B from B's one NAT ")
	p("address, as a campus's public node takes its lab machines. (With libp2p's default per-address limits, 8 connections ")
	p("at once and 16 new ones in a burst, then one per 5 s, the relay refused the 16th attempt; p2p.NewHost now sizes them ")
	p("for a campus.)\n")
	p("- *Relayed bytes*: the relay's `libp2p_relaysvc_data_transferred_bytes_total` (both directions), read before and ")
	p("after each attempt: DCUtR's coordination, identify and whatever else crossed the relayed connection before B closed. ")
	p("Under symmetric NATs the attempts run several at once, each to its bound (the relay allows 8 relayed connections per ")
	p("peer), and the figure is the counter's growth over all of them divided ")
	p("by their number.\n")
	p("- Throughput (profile `nat`): a sender forwards a loopback port to its receiver's sink through the tunnel and sends ")
	p("%d MiB; the clock runs from the dial to the sink's answer. The goal compares B to A (behind the NATs, over the ", res.SizeBytes>>20)
	p("hole-punched connection) with B' to A' (no NAT). A NATed receiver answers the tunnel's direct-path query with no ")
	p("port (its NAT forwards nothing to it), so B punches each tunnelled connection through both NATs (the tunnel's ")
	p("PunchProtocol: both machines connect from fresh ports to each other's public address at once, a TCP simultaneous ")
	p("open) and carries it on the tunnel's own direct TCP path, as B' does without NAT; a failed punch falls back to ")
	p("streams of the hole-punched libp2p connection. Two more paths: B to A-tcp (a TCP-only pair) and B' to A' with ")
	p("the tunnel's direct path off (streams of a direct libp2p connection: what the NAT path cost before the punch). The paths take turns %d times after an untimed warm-up each; medians, ranges, and the ", res.Reps)
	p("median of same-turn ratios to B' to A'. *CPU ours* is this benchmark's processes (the link shaper in the parent, ")
	p("the hosts in the children) and *CPU others* the rest of the machine, both as shares of all its cores, medians ")
	p("over the runs (/proc).\n\n")
	p("## Hole punching\n\n")
	p("| %s |\n|%s\n", strings.Join(setHeader, " | "), strings.Repeat("---|", len(setHeader)))
	ms := func(v float64) string {
		if v == 0 {
			return "-"
		}
		return fmt.Sprintf("%.0f ms", v)
	}
	for _, pr := range res.Profiles {
		if pr.Error != "" && len(pr.Sets) == 0 {
			p("| %s | %s | error: %s |%s\n", pr.Profile, pr.NAT, pr.Error, strings.Repeat(" |", len(setHeader)-3))
			continue
		}
		for _, s := range pr.Sets {
			p("| %s |\n", strings.Join(setRow(pr, s, ms), " | "))
		}
	}
	p("\n")
	for _, pr := range res.Profiles {
		p("- `%s`:", pr.Profile)
		for _, s := range pr.Sets {
			p(" %s: %s held a relay slot %.1f s after its start", s.Listen, s.Target, s.ASlotS)
			if s.PerRelay < s.Attempts {
				p(" (median over the batches)")
			}
			p(" (")
			if s.ABefore != nil {
				p("reachability %s then", s.ABefore.Reachability)
			}
			if s.AAfter != nil {
				p(", %s after the attempts", s.AAfter.Reachability)
				if s.AAfter.Reachability == "unknown" {
					p(": AutoNAT's first probe comes 15 s after a host starts, and DCUtR does not wait for it")
				}
			}
			p("); %s counted %d hole punches, %d won.", s.Target, s.APunches, s.APunchesWon)
			if s.Public > 1 || strings.Contains(s.Listen, "settled") {
				p(" With %d public nodes, A advertised %s", s.Public, orDash(strings.Join(s.AAdvertised, ", ")))
				if strings.Contains(s.Listen, "settled") {
					p(", and B its mapping in %d of %d attempts", s.BAdvertised, s.Attempts)
				}
				p(".")
			}
			if len(s.Failures) > 0 {
				p(" Failures: %s", counts(s.Failures))
				if s.FirstError != failureKind(s.FirstError) {
					p("; the first (attempt %d): `%s`", s.FirstFailure, clip(strings.ReplaceAll(s.FirstError, "\n", " "), 300))
				}
				p(".")
			}
		}
		if pr.Error != "" {
			p(" Error: %s.", pr.Error)
		}
		p(" Profile run time %.0f s.\n", pr.DurationS)
	}
	for _, pr := range res.Profiles {
		t := pr.Throughput
		if t == nil {
			continue
		}
		p("\n## Throughput through the tunnel (profile %s, %d MiB a run, %d turns)\n\n", pr.Profile, t.SizeBytes>>20, t.Reps)
		if t.Error != "" {
			p("Error: %s\n\n", t.Error)
		}
		p("| pair | path | MB/s (median) | range | vs no NAT | range | CPU ours | CPU others | goal | pass |\n")
		p("|---|---|---:|---:|---:|---:|---:|---:|---|---|\n")
		for i, pa := range t.Paths {
			goal, pass := "", ""
			if i == 0 {
				goal, pass = t.Goal, passText(t.Pass)
			}
			p("| %s | %s | %s | %s | %s | %s | %.0f%% | %.0f%% | %s | %s |\n", pa.Pair, pa.Path, num(pa.MBps, 1), span(pa.Range, 1),
				num(pa.Ratio, 2), span(pa.RatioRange, 2), pa.CPUOurs*100, pa.CPUOthers*100, goal, pass)
		}
		if t.NATShare > 0 {
			p("\nB to A over B' to A' with streams only (tunnel streams over a direct libp2p connection, what the NAT path used before the punch) ")
			p("without NATs: %.2f (same-turn ratios %s).\n", t.NATShare, span(t.NATShareRange, 2))
		}
		bound := len(t.Paths) > 0
		for _, pa := range t.Paths {
			bound = bound && pa.CPUOurs+pa.CPUOthers > 0.9
		}
		if res.HostCores > 0 {
			p("\nEvery host ran in an emulated machine of %g cores of its own (a cgroup CPU quota, testnet.ByHand), ", res.HostCores)
			p("the NAT routers, the core and the link shaper outside them, as on a campus where the NAT is a box of its own: ")
			p("the ratios compare the tunnel's paths on machines of that size, without the emulated routers' forwarding ")
			p("charged to them (the kernel may still charge part of it to the sender's machine).\n")
		} else if bound {
			p("\nEvery path ran with the machine's cores busy (CPU ours + others above 90%%): the paths are CPU-bound, ")
			p("so their ratios compare what each costs per byte here (the link shaper's share included), not link speeds. ")
			p("*CPU others* includes kernel threads (ksoftirqd) that partly carry this benchmark's own packets.\n")
		}
		p("\nThe relay carried %.0f bytes while the runs went on (the pass also needs under 1 MiB: the bulk must not cross it). ", t.RelayedDuring)
		p("A was found private (AutoNAT) %.0f s after its start; the runs waited for it. ", t.APrivateS)
		p("Senders' libp2p connections to their receivers:\n\n")
		for _, pa := range t.Paths {
			p("- %s: %s\n", pa.Pair, pa.Conn)
		}
	}
	return w.String()
}
