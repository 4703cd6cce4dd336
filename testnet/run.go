package testnet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	rpchttp "github.com/cometbft/cometbft/rpc/client/http"

	"github.com/deepmarket/deepmarket/node"
	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/testnet/netlab"
)

// RunOptions says how to run a testnet.
type RunOptions struct {
	// Binary is the deepmarket executable (default: this one).
	Binary string
	// Profile is a network profile (lan, wifi, multi-dc): each node in its
	// own network namespace behind tc netem. Empty runs on loopback. The
	// NAT profiles nat and nat-symmetric are lan with every university's
	// machines behind a NAT of its own (NATProfiles), its validators
	// outside, on the emulated internet.
	Profile string
	// Shaper says how the lab shapes its links (netlab.ShaperAuto when
	// zero: netem, else the userspace shaper); netlab.ShaperNone leaves
	// them bare, for networks of many nodes.
	Shaper netlab.Shaper
	// RelayAuto, under a NAT profile, leaves the validators' relay_service
	// at "auto", as a new university's would be, rather than "on".
	RelayAuto bool
	// Tag names the namespaces (default from the chain ID); at most 6
	// characters.
	Tag string
	// Progress gets a line per step; nil is quiet.
	Progress io.Writer
	// Env is added to every node's environment.
	Env []string
	// StartTimeout bounds how long a node may take to answer (default 60 s).
	StartTimeout time.Duration
	// Lazy starts no node: the caller starts them one by one.
	Lazy bool
	// Machine, when set, confines every node but the validators, with all
	// it runs, to a machine of this size: a cgroup of its own with a CPU
	// quota and a memory limit (needs root).
	Machine *Machine
}

// Network is a running testnet.
type Network struct {
	Dir      string
	Manifest *Manifest
	Addrs    Addrs
	Lab      *netlab.Lab // nil on loopback

	opts    RunOptions
	pos     []labPos // each node's place in the lab
	mu      sync.Mutex
	procs   []*exec.Cmd
	exited  []chan struct{}
	proxies []*proxy
	// machines are the nodes' cgroups when RunOptions.Machine is set.
	machines *machines
}

// Start configures every node for the chosen network and starts them,
// waiting until each answers on its API. On error it stops what it
// started.
func Start(ctx context.Context, dir string, opts RunOptions) (*Network, error) {
	m, err := Load(dir)
	if err != nil {
		return nil, err
	}
	if opts.Binary == "" {
		if opts.Binary, err = os.Executable(); err != nil {
			return nil, err
		}
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 60 * time.Second
	}
	n := &Network{Dir: dir, Manifest: m, opts: opts,
		procs: make([]*exec.Cmd, len(m.Nodes)), exited: make([]chan struct{}, len(m.Nodes))}
	n.Addrs = Loopback(m)
	if opts.Profile != "" {
		if err := n.makeLab(ctx); err != nil {
			return nil, err
		}
	}
	if opts.Machine != nil {
		tag := opts.Tag
		if tag == "" {
			tag = "dm" + m.ChainID[max(0, len(m.ChainID)-4):]
		}
		if n.machines, err = newMachines(*opts.Machine, tag); err != nil {
			n.Close()
			return nil, err
		}
	}
	extra := func(i int, cfg *node.Config) {
		n.natConfig(i, cfg)
		n.machineConfig(i, cfg)
	}
	if err := configure(dir, m, n.Addrs, extra); err != nil {
		n.Close()
		return nil, err
	}
	if opts.Lazy {
		return n, nil
	}
	for i := range m.Nodes {
		if err := n.launch(i); err != nil {
			n.Close()
			return nil, err
		}
	}
	for i := range m.Nodes {
		if err := n.WaitUp(ctx, i); err != nil {
			n.Close()
			return nil, err
		}
	}
	return n, nil
}

func (n *Network) makeLab(ctx context.Context) error {
	name, nat := n.opts.Profile, netlab.NATNone
	if k, ok := NATProfiles[name]; ok {
		name, nat = "lan", k
	}
	p, err := netlab.ProfileByName(name)
	if err != nil {
		return fmt.Errorf("%w (or a NAT profile: nat, nat-symmetric)", err)
	}
	if err := netlab.Available(); err != nil {
		return fmt.Errorf("--profile %s: %w", n.opts.Profile, err)
	}
	tag := n.opts.Tag
	if tag == "" {
		tag = "dm" + n.Manifest.ChainID[max(0, len(n.Manifest.ChainID)-4):]
	}
	_ = netlab.Cleanup(tag) // what a crashed run left
	var sites []int
	var nats []netlab.NAT
	sites, nats, n.pos = layout(n.Manifest, nat)
	lab, err := netlab.Create(ctx, netlab.Config{Tag: tag, Sites: sites, Profile: p, NAT: nats, Shaper: n.opts.Shaper})
	if err != nil {
		return err
	}
	n.Lab = lab
	for i, nd := range n.Manifest.Nodes {
		at := n.pos[i]
		n.Addrs[i] = lab.IP(at.site, at.index).String()
		// The API and the ledger RPC listen on the node's own loopback;
		// the host reaches them through these proxies on its loopback.
		for _, port := range []int{nd.Ports.API, nd.Ports.LedgerRPC} {
			px, err := newProxy(lab, at.site, at.index, port)
			if err != nil {
				n.Close()
				return fmt.Errorf("%s: %w", nd.Name, err)
			}
			n.proxies = append(n.proxies, px)
		}
	}
	return nil
}

// NATProfiles are the profiles that put every university's machines
// behind a NAT of its own: lan links, and a NAT that keeps one mapping per
// machine (nat: as Linux masquerade, which hole punches cross) or maps
// every destination anew (nat-symmetric: which they do not).
var NATProfiles = map[string]netlab.NAT{"nat": netlab.NATCone, "nat-symmetric": netlab.NATSymmetric}

// labPos is a node's place in the lab: its lab site and index there.
type labPos struct{ site, index int }

// layout places the nodes in the lab. Without NAT a lab site is a
// university. With it, lab site 0 is the emulated internet, where every
// validator sits (a university's public servers), and lab site k+1 holds
// university k's other machines behind its NAT; a university with no
// other machines gets no lab site.
func layout(m *Manifest, nat netlab.NAT) (sites []int, nats []netlab.NAT, pos []labPos) {
	pos = make([]labPos, len(m.Nodes))
	if nat == netlab.NATNone {
		sites = make([]int, len(m.Sites))
		for i := range m.Nodes {
			s := m.SiteIndex(i)
			pos[i] = labPos{s, sites[s]}
			sites[s]++
		}
		return sites, nil, pos
	}
	sites, nats = []int{0}, []netlab.NAT{netlab.NATNone}
	labOf := map[int]int{}
	for i, nd := range m.Nodes {
		s := 0
		if !nd.Validator {
			u := m.SiteIndex(i)
			if _, ok := labOf[u]; !ok {
				labOf[u] = len(sites)
				sites, nats = append(sites, 0), append(nats, nat)
			}
			s = labOf[u]
		}
		pos[i] = labPos{s, sites[s]}
		sites[s]++
	}
	return sites, nats, pos
}

// natConfig sets what a node behind the lab's NATs needs: libp2p counts
// the lab's internet as public, and the validators, public servers, relay
// for members from the start.
func (n *Network) natConfig(i int, cfg *node.Config) {
	cfg.P2P.TestnetPublic, cfg.P2P.RelayService = nil, node.DefaultConfig().P2P.RelayService
	if _, ok := NATProfiles[n.opts.Profile]; !ok || n.Lab == nil {
		return
	}
	for _, c := range n.Lab.PublicCIDRs() {
		cfg.P2P.TestnetPublic = append(cfg.P2P.TestnetPublic, c.String())
	}
	if n.Manifest.Nodes[i].Validator && !n.opts.RelayAuto {
		cfg.P2P.RelayService = p2p.RelayOn
	}
}

func (n *Network) progress(format string, args ...any) {
	if n.opts.Progress != nil {
		fmt.Fprintf(n.opts.Progress, format+"\n", args...)
	}
}

// Home is node i's home.
func (n *Network) Home(i int) node.Home {
	return node.Home{Dir: filepath.Join(n.Dir, n.Manifest.Nodes[i].Home)}
}

// launch starts node i's process; its output goes to node.log in its home.
func (n *Network) launch(i int) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.procs[i] != nil {
		return fmt.Errorf("%s is already running", n.Manifest.Nodes[i].Name)
	}
	nd := n.Manifest.Nodes[i]
	h := n.Home(i)
	_ = os.Remove(h.APIAddrPath()) // a killed node leaves it behind
	logf, err := os.OpenFile(filepath.Join(h.Dir, LogFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(n.opts.Binary, "node", "run", "--home", h.Dir)
	cmd.Env = append(os.Environ(), n.opts.Env...)
	if n.machines != nil && !nd.Validator {
		procs, err := n.machines.create(nd.Name)
		if err != nil {
			logf.Close()
			return fmt.Errorf("%s: %w", nd.Name, err)
		}
		// The node joins its machine before it runs anything: a shell
		// writes itself into the machine's cgroups and execs the node.
		cmd = exec.Command("/bin/sh", "-c", joinScript, n.opts.Binary, "node", "run", "--home", h.Dir)
		cmd.Env = append(append(os.Environ(), n.opts.Env...), "DM_MACHINE_PROCS="+strings.Join(procs, " "))
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group: Ctrl-C reaches the runner, which stops the
	// nodes in order; the nodes die with the runner.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	start := cmd.Start
	if n.Lab != nil {
		// Forked from a thread inside the node's network namespace. Not
		// `ip netns exec`: it remounts /sys, which hides the cgroup
		// hierarchies the node's sandbox needs.
		start = func() error { return n.Lab.Do(n.pos[i].site, n.pos[i].index, cmd.Start) }
	}
	if err := start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", nd.Name, err)
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		logf.Close()
		close(done)
	}()
	n.procs[i], n.exited[i] = cmd, done
	n.progress("started %s (%s%s) pid %d, log %s", nd.Name, nd.Site, map[bool]string{true: ", validator"}[nd.Validator],
		cmd.Process.Pid, filepath.Join(h.Dir, LogFile))
	return nil
}

// Running says whether node i's process is alive.
func (n *Network) Running(i int) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.procs[i] == nil {
		return false
	}
	select {
	case <-n.exited[i]:
		return false
	default:
		return true
	}
}

// WaitUp waits until node i answers on its API.
func (n *Network) WaitUp(ctx context.Context, i int) error {
	nd := n.Manifest.Nodes[i]
	ctx, cancel := context.WithTimeout(ctx, n.opts.StartTimeout)
	defer cancel()
	for {
		if !n.Running(i) {
			return fmt.Errorf("%s exited while starting: %s", nd.Name, n.LogTail(i, 15))
		}
		if c, err := n.Client(i); err == nil {
			sctx, scancel := context.WithTimeout(ctx, 2*time.Second)
			st, err := c.Status(sctx)
			scancel()
			if err == nil {
				n.progress("%s up: peer %s, height %d, API %s", nd.Name, st.PeerID, st.Height, st.API)
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s did not answer within %s: %s", nd.Name, n.opts.StartTimeout, n.LogTail(i, 15))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Client is a client of node i's local API.
func (n *Network) Client(i int) (*api.Client, error) {
	return ClientOf(n.Home(i))
}

// ClientOf reads a home's API address and token.
func ClientOf(h node.Home) (*api.Client, error) {
	addr, err := os.ReadFile(h.APIAddrPath())
	if err != nil {
		return nil, fmt.Errorf("not running (no %s)", filepath.Base(h.APIAddrPath()))
	}
	tok, err := h.LoadToken()
	if err != nil {
		return nil, err
	}
	return api.NewClient(strings.TrimSpace(string(addr)), tok), nil
}

// RPC is an HTTP client of node i's ledger RPC (reachable from the host
// in both modes).
func (n *Network) RPC(i int) (*rpchttp.HTTP, error) {
	return rpchttp.New(fmt.Sprintf("http://127.0.0.1:%d", n.Manifest.Nodes[i].Ports.LedgerRPC), "/websocket")
}

// Launch starts node i again (after Stop or Kill) and waits for it.
func (n *Network) Launch(ctx context.Context, i int) error {
	n.mu.Lock()
	if n.procs[i] != nil {
		select {
		case <-n.exited[i]:
			n.procs[i] = nil
		default:
		}
	}
	n.mu.Unlock()
	if err := n.launch(i); err != nil {
		return err
	}
	return n.WaitUp(ctx, i)
}

// Kill kills node i with SIGKILL, as a power cut would, and waits for it.
func (n *Network) Kill(i int) error { return n.signal(i, syscall.SIGKILL, 0) }

// Stop stops node i with SIGTERM, waiting up to 20 s before killing it.
func (n *Network) Stop(i int) error { return n.signal(i, syscall.SIGTERM, 20*time.Second) }

func (n *Network) signal(i int, sig syscall.Signal, grace time.Duration) error {
	n.mu.Lock()
	cmd, done := n.procs[i], n.exited[i]
	n.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(sig)
	if grace > 0 {
		select {
		case <-done:
		case <-time.After(grace):
			n.progress("%s did not stop within %s: killing it", n.Manifest.Nodes[i].Name, grace)
			_ = cmd.Process.Kill()
		}
	}
	<-done
	n.mu.Lock()
	n.procs[i] = nil
	n.mu.Unlock()
	n.progress("%s stopped (%s)", n.Manifest.Nodes[i].Name, sig)
	return nil
}

// Exited is closed when node i's current process exits (nil if none).
func (n *Network) Exited(i int) <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.exited[i]
}

// Partition cuts a site off from the others (network profiles only).
func (n *Network) Partition(site int) error {
	if n.Lab == nil {
		return errors.New("partitions need a network profile (testnet run --profile)")
	}
	n.progress("partitioning %s from the other sites", n.Manifest.Sites[site])
	return n.Lab.Partition(n.labSite(site))
}

// Heal ends a partition.
func (n *Network) Heal(site int) error {
	if n.Lab == nil {
		return errors.New("partitions need a network profile (testnet run --profile)")
	}
	n.progress("healing %s", n.Manifest.Sites[site])
	return n.Lab.Heal(n.labSite(site))
}

// labSite is the lab site of university site's machines: under a NAT
// profile its NATed lab (its validators stay on the internet).
func (n *Network) labSite(site int) int {
	for i := range n.Manifest.Nodes {
		if n.Manifest.SiteIndex(i) == site && !n.Manifest.Nodes[i].Validator {
			return n.pos[i].site
		}
	}
	return site
}

// Close stops every node (in parallel, each with SIGTERM then SIGKILL)
// and removes the network namespaces.
func (n *Network) Close() error {
	var wg sync.WaitGroup
	for i := range n.Manifest.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.Stop(i)
		}()
	}
	wg.Wait()
	for _, p := range n.proxies {
		p.Close()
	}
	if n.machines != nil {
		n.machines.remove()
	}
	if n.Lab != nil {
		return n.Lab.Close()
	}
	return nil
}

// LogTail is the last lines of node i's log.
func (n *Network) LogTail(i, lines int) string {
	b, err := os.ReadFile(filepath.Join(n.Home(i).Dir, LogFile))
	if err != nil {
		return err.Error()
	}
	all := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return "\n  " + strings.Join(all, "\n  ")
}

// PID is the process ID of node i, or 0 when it is not running.
func (n *Network) PID(i int) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if p := n.procs[i]; p != nil && p.Process != nil {
		return p.Process.Pid
	}
	return 0
}
