package node

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/deepmarket/deepmarket/node/lender"
	"github.com/deepmarket/deepmarket/node/market"
	"github.com/deepmarket/deepmarket/node/sandbox"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/units"
)

// Config is the node's configuration: defaults, then config.toml, then
// DEEPMARKET_<SECTION>_<KEY> environment variables, then flags.
type Config struct {
	Node      NodeConfig      `toml:"node"`
	P2P       P2PConfig       `toml:"p2p"`
	API       APIConfig       `toml:"api"`
	Ledger    LedgerConfig    `toml:"ledger"`
	Inventory InventoryConfig `toml:"inventory"`
	Prices    PricesConfig    `toml:"prices"`
	Scheduler SchedulerConfig `toml:"scheduler"`
	Executor  ExecutorConfig  `toml:"executor"`
	Jobs      JobsConfig      `toml:"jobs"`
	Market    MarketConfig    `toml:"market"`
	Owner     OwnerConfig     `toml:"owner"`
	Lend      LendConfig      `toml:"lend"`
	Log       LogConfig       `toml:"log"`
}

// LendConfig is the payment terms this machine lends on (lender.Terms).
type LendConfig struct {
	HeldJobs       bool    `toml:"held_jobs"`
	MaxVerifyShare float64 `toml:"max_verify_share"`
	MinFloor       float64 `toml:"min_floor"`
	MinPayerPaid   float64 `toml:"min_payer_paid"`
	RefusedStop    int     `toml:"refused_stop"`
}

// Terms are the lender's terms as configured.
func (c LendConfig) Terms() lender.Terms {
	return lender.Terms{HeldJobs: c.HeldJobs, MaxVerifyShare: c.MaxVerifyShare, MinFloor: c.MinFloor, MinPayerPaid: c.MinPayerPaid}
}

// MarketConfig bounds what this node keeps of the market and what others
// may hold on this machine.
type MarketConfig struct {
	// MaxOffers bounds the offers held in all; MaxOffersPerOwner those of
	// the machines of one owner account.
	MaxOffers         int `toml:"max_offers"`
	MaxOffersPerOwner int `toml:"max_offers_per_owner"`
	// HoldsPerBidder and HoldsPerScheduler bound the holds one bidder
	// account, and one scheduler, may have on this machine at once.
	HoldsPerBidder    int `toml:"holds_per_bidder"`
	HoldsPerScheduler int `toml:"holds_per_scheduler"`
	// LaunchWithin is how long a committed hold waits for its job's launch
	// before it lapses.
	LaunchWithin Duration `toml:"launch_within"`
}

// OwnerConfig puts the machine's owner first while it lends (see
// lender.OwnerPolicy): off unless suspend_above is set, here or by
// `lend --suspend-above`.
type OwnerConfig struct {
	SuspendAbove float64  `toml:"suspend_above"`
	StartIdle    Duration `toml:"start_idle"`
	ResumeIdle   Duration `toml:"resume_idle"`
	VacateAfter  Duration `toml:"vacate_after"`
}

// Policy is the owner policy, with suspendAbove (lend's setting, when
// given) over the configured threshold.
func (c OwnerConfig) Policy(suspendAbove *float64) lender.OwnerPolicy {
	p := lender.OwnerPolicy{SuspendAbove: c.SuspendAbove, StartIdle: c.StartIdle.Duration, ResumeIdle: c.ResumeIdle.Duration,
		VacateAfter: c.VacateAfter.Duration}
	if suspendAbove != nil {
		p.SuspendAbove = *suspendAbove
	}
	return p
}

// Pace is the offer's announce pace settings.
func (c P2PConfig) Pace() lender.PaceParams {
	return lender.PaceParams{Interval: c.AnnounceInterval.Duration, TTL: c.OfferTTL.Duration, Budget: float64(c.AnnounceBudget),
		MaxTTL: lender.MaxOfferTTL}
}

// JobsConfig is about the jobs this node submits.
type JobsConfig struct {
	// EscrowSlack is how long a job's escrow outlives its max duration:
	// the time the submitter has to settle before its lenders may claim.
	EscrowSlack Duration `toml:"escrow_slack"`
	// Starvation bounds how long a job waits in this node's queue behind
	// jobs of more benefit per cost: once it has waited this long it bids
	// before every job that has waited less.
	Starvation Duration `toml:"starvation"`
}

// ExecutorConfig says where lent workers run.
type ExecutorConfig struct {
	// WorkDir holds each worker's work dir (inputs, output, scratch);
	// empty means /var/tmp/deepmarket-jobs. Jobs run as uids of their own,
	// so it must not sit under a private directory such as the node's
	// home; and only root may change it or the dirs above it.
	WorkDir string `toml:"work_dir"`
	// CPUs, when set, are the CPU ids lent workers are pinned to (else the
	// highest-numbered free ones).
	CPUs []int `toml:"cpus"`
	// ShareCPUs leaves workers unpinned: each is held to the cores it
	// was lent by its CPU quota alone. For machines whose CPUs others
	// share too (a VM's vCPUs, the testnet's machines of known size).
	ShareCPUs bool `toml:"share_cpus"`
	// UIDRange ("FIRST-LAST") holds the uids workers run as, one of its
	// own for each; no account may use them.
	UIDRange string `toml:"uid_range"`
	// KeepLogs is how long the logs and dirs of ended workers stay.
	KeepLogs Duration `toml:"keep_logs"`
	// CgroupParent holds the workers' cgroups, relative to the cgroup
	// root: a node confined to a cgroup of its own (a container, a
	// machine of known size on a shared host) names one under it.
	CgroupParent string `toml:"cgroup_parent"`
	// ImageCache bounds the jobs' images unpacked under the work dir
	// (a size: "32GiB"); the least recently used go first.
	ImageCache string `toml:"image_cache"`
}

// NodeConfig names the node and its network.
type NodeConfig struct {
	Moniker string `toml:"moniker"`
	Site    string `toml:"site"`
	ChainID string `toml:"chain_id"`
}

// P2PConfig configures the libp2p host, discovery and gossip.
type P2PConfig struct {
	Listen           []string `toml:"listen"`
	Bootstrap        []string `toml:"bootstrap"`
	MDNS             bool     `toml:"mdns"`
	DHT              string   `toml:"dht"`
	ConnLow          int      `toml:"conn_low"`
	ConnHigh         int      `toml:"conn_high"`
	OfferTTL         Duration `toml:"offer_ttl"`
	AnnounceInterval Duration `toml:"announce_interval"`
	// AnnounceBudget is how many offer announcements a minute the whole
	// market may make before machines stretch their announce_interval
	// and offer_ttl to stay within it (lender.PaceFor); 0 never stretches.
	AnnounceBudget   int      `toml:"announce_budget"`
	DiscoverInterval Duration `toml:"discover_interval"`
	// ProbeInterval is how often a lending machine measures its links to
	// the machines whose offers it holds (see p2p.LinkMeter); 0 turns it off.
	ProbeInterval Duration `toml:"probe_interval"`
	// NATTraversal turns libp2p's NAT traversal on (AutoNAT, relays, hole
	// punching: p2p.NewHost).
	NATTraversal bool `toml:"nat_traversal"`
	// RelayService is auto (relay for members once AutoNAT finds this node
	// public), on or off.
	RelayService string `toml:"relay_service"`
	// Relays are the static relays a private node reserves a slot on;
	// empty means the bootstrap peers (the network's seeds).
	Relays []string `toml:"relays"`
	// TestnetPublic lists private IPv4 ranges that this node's libp2p
	// treats as public: for a testnet whose emulated internet uses private
	// addresses (testnet run --profile nat). Leave it empty elsewhere.
	TestnetPublic []string `toml:"testnet_public"`
}

// LedgerConfig configures this node's replica of the credit ledger (an
// in-process CometBFT node).
type LedgerConfig struct {
	P2PListen          string   `toml:"p2p_listen"`
	RPCListen          string   `toml:"rpc_listen"`
	Peers              []string `toml:"peers"`
	BlockTime          Duration `toml:"block_time"`
	EmptyBlockInterval Duration `toml:"empty_block_interval"`
	// MaxInboundPeers bounds the ledger nodes that may connect here.
	// CometBFT's own default, 40, leaves the 41st lab machine of a
	// validator's network with no peer to copy the chain from.
	MaxInboundPeers int `toml:"max_inbound_peers"`
}

// APIConfig configures the local HTTP API.
type APIConfig struct {
	Listen string `toml:"listen"`
}

// InventoryConfig says how the machine's software is probed.
type InventoryConfig struct {
	// Python is the interpreter probed for TensorFlow and run for jobs'
	// python3: a name looked up in PATH, or an absolute path whose prefix
	// (a virtualenv) jobs may read.
	Python string `toml:"python"`
}

// PricesConfig holds default reserve prices in credits per unit-hour, used
// when `lend` names none.
type PricesConfig struct {
	CoreHour   string `toml:"core_hour"`
	MemGiBHour string `toml:"mem_gib_hour"`
	GPUHour    string `toml:"gpu_hour"`
}

// SchedulerConfig says which machines this node's scheduler prices and
// places on, of those whose offers it holds.
type SchedulerConfig struct {
	Quote    bool     `toml:"quote"`
	Subset   string   `toml:"subset"`
	Nearest  int      `toml:"nearest"`
	Machines []string `toml:"machines"`
}

// LogConfig configures logging.
type LogConfig struct {
	Level       string `toml:"level"`
	Format      string `toml:"format"`
	Libp2pLevel string `toml:"libp2p_level"`
}

// Duration is a time.Duration written as "30s" in TOML.
type Duration struct{ time.Duration }

// UnmarshalText parses a Go duration string.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("duration %q: want e.g. 30s, 5m", b)
	}
	d.Duration = v
	return nil
}

// MarshalText prints the duration.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// Default ports: the API on 7700, libp2p on 7701 (TCP and QUIC).
const (
	DefaultAPIListen       = "127.0.0.1:7700"
	DefaultP2PPort         = 7701
	DefaultLedgerP2PListen = "tcp://0.0.0.0:7702"
	DefaultLedgerRPCListen = "tcp://127.0.0.1:7703"
	// DefaultLedgerInboundPeers is [ledger] max_inbound_peers: a
	// validator serves a university's lab machines, hundreds of them.
	DefaultLedgerInboundPeers = 400
)

// DefaultAnnounceBudget is [p2p] announce_budget's default: 600 offers a
// minute cost a node about 0.9 % of a core and 0.7 Mbit/s each way by
// the gossip benchmark's model (bench/results/gossip), within the 1 % an
// idle lending node may spend; the market reaches it at 300 machines.
const DefaultAnnounceBudget = 600

// DefaultConfig returns the built-in defaults.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	return Config{
		Node: NodeConfig{Moniker: sanitizeLabel(host), Site: "default"},
		P2P: P2PConfig{
			Listen: []string{
				fmt.Sprintf("/ip4/0.0.0.0/tcp/%d", DefaultP2PPort),
				fmt.Sprintf("/ip4/0.0.0.0/udp/%d/quic-v1", DefaultP2PPort),
				fmt.Sprintf("/ip6/::/tcp/%d", DefaultP2PPort),
				fmt.Sprintf("/ip6/::/udp/%d/quic-v1", DefaultP2PPort),
			},
			MDNS:             true,
			DHT:              p2p.DHTAuto,
			ConnLow:          64,
			ConnHigh:         192,
			OfferTTL:         Duration{90 * time.Second},
			AnnounceInterval: Duration{30 * time.Second},
			AnnounceBudget:   DefaultAnnounceBudget,
			DiscoverInterval: Duration{30 * time.Second},
			ProbeInterval:    Duration{15 * time.Minute},
			NATTraversal:     true,
			RelayService:     p2p.RelayAuto,
		},
		API: APIConfig{Listen: DefaultAPIListen},
		Ledger: LedgerConfig{
			P2PListen: DefaultLedgerP2PListen, RPCListen: DefaultLedgerRPCListen,
			BlockTime: Duration{time.Second}, EmptyBlockInterval: Duration{30 * time.Second},
			MaxInboundPeers: DefaultLedgerInboundPeers,
		},
		Inventory: InventoryConfig{Python: "python3"},
		Executor: ExecutorConfig{UIDRange: sandbox.DefaultIDRange, KeepLogs: Duration{7 * 24 * time.Hour},
			CgroupParent: sandbox.DefaultCgroupParent, ImageCache: "32GiB"},
		Prices:    PricesConfig{CoreHour: "0.1", MemGiBHour: "0.02", GPUHour: "1"},
		Scheduler: SchedulerConfig{Quote: true, Subset: market.SubsetAll, Nearest: 16},
		Log:       LogConfig{Level: "info", Format: "text", Libp2pLevel: "warn"},
		Jobs:      JobsConfig{EscrowSlack: Duration{15 * time.Minute}, Starvation: Duration{30 * time.Minute}},
		Owner:     OwnerConfig{StartIdle: Duration{5 * time.Minute}, ResumeIdle: Duration{time.Minute}, VacateAfter: Duration{10 * time.Minute}},
		Market: MarketConfig{MaxOffers: 20_000, MaxOffersPerOwner: 256, HoldsPerBidder: 8, HoldsPerScheduler: 32,
			LaunchWithin: Duration{2 * time.Minute}},
		Lend: LendConfig{HeldJobs: true, MaxVerifyShare: p2p.MaxVerifyShare, MinFloor: p2p.MinFloor, RefusedStop: 3},
	}
}

func sanitizeLabel(s string) string {
	var b strings.Builder
	for _, c := range s {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_' {
			b.WriteRune(c)
		}
	}
	if b.Len() == 0 {
		return "node"
	}
	out := b.String()
	if len(out) > 64 {
		out = out[:64]
	}
	return out
}

// LoadConfig reads path over the defaults, then applies DEEPMARKET_*
// environment overrides. Errors name the file, the line where known, and
// the key.
func LoadConfig(path string) (Config, error) {
	cfg := DefaultConfig()
	md, err := toml.DecodeFile(path, &cfg)
	if err != nil {
		var perr toml.ParseError
		if errors.As(err, &perr) {
			if perr.LastKey != "" {
				return Config{}, fmt.Errorf("%s:%d: key %q: %s", path, perr.Position.Line, perr.LastKey, perr.Message)
			}
			return Config{}, fmt.Errorf("%s:%d: %s", path, perr.Position.Line, perr.Message)
		}
		if errors.Is(err, os.ErrNotExist) {
			return Config{}, fmt.Errorf("%w: no config at %s", ErrNoHome, path)
		}
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	if undec := md.Undecoded(); len(undec) > 0 {
		return Config{}, fmt.Errorf("%s: unknown key %q (check the spelling against the comments in the file)", path, undec[0].String())
	}
	if err := applyEnv(&cfg, os.Environ()); err != nil {
		return Config{}, err
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

// applyEnv sets every config key that has a DEEPMARKET_<SECTION>_<KEY>
// variable, e.g. DEEPMARKET_API_LISTEN=127.0.0.1:7800. Lists are
// comma-separated.
func applyEnv(cfg *Config, environ []string) error {
	env := map[string]string{}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, "DEEPMARKET_") {
			env[k] = v
		}
	}
	root := reflect.ValueOf(cfg).Elem()
	for i := 0; i < root.NumField(); i++ {
		section := root.Type().Field(i).Tag.Get("toml")
		sv := root.Field(i)
		for j := 0; j < sv.NumField(); j++ {
			key := sv.Type().Field(j).Tag.Get("toml")
			name := "DEEPMARKET_" + strings.ToUpper(section+"_"+key)
			val, ok := env[name]
			if !ok {
				continue
			}
			f := sv.Field(j)
			var err error
			switch f.Interface().(type) {
			case string:
				f.SetString(val)
			case bool:
				switch strings.ToLower(val) {
				case "1", "true", "yes", "on":
					f.SetBool(true)
				case "0", "false", "no", "off":
					f.SetBool(false)
				default:
					err = fmt.Errorf("want true or false")
				}
			case int:
				var n int
				if _, err = fmt.Sscan(val, &n); err == nil {
					f.SetInt(int64(n))
				}
			case []string:
				var list []string
				for _, s := range strings.Split(val, ",") {
					if s = strings.TrimSpace(s); s != "" {
						list = append(list, s)
					}
				}
				f.Set(reflect.ValueOf(list))
			case Duration:
				var d Duration
				if err = d.UnmarshalText([]byte(val)); err == nil {
					f.Set(reflect.ValueOf(d))
				}
			}
			if err != nil {
				return fmt.Errorf("environment %s=%q: %v", name, val, err)
			}
		}
	}
	return nil
}

// DefaultPrices returns the configured default reserve prices.
func (c *Config) DefaultPrices() p2p.Prices {
	core, _ := units.ParseCredits(c.Prices.CoreHour)
	mem, _ := units.ParseCredits(c.Prices.MemGiBHour)
	gpu, _ := units.ParseCredits(c.Prices.GPUHour)
	return p2p.Prices{CoreHour: core, MemGiBHour: mem, GPUHour: gpu}
}
