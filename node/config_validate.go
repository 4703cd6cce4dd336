package node

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/deepmarket/deepmarket/node/market"
	"github.com/deepmarket/deepmarket/node/sandbox"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/units"
)

// Validate checks every section; errors name the section and key.
func (c *Config) Validate() error {
	// The first error found is returned: this order (with [scheduler]'s
	// subset checked before [jobs] and [market], its nearest and machines
	// after them) decides which one a config with several gets.
	for _, check := range []func() error{
		c.Node.validate,
		c.P2P.validate,
		c.API.validate,
		c.Ledger.validate,
		c.Inventory.validate,
		c.Executor.validate,
		c.Prices.validate,
		c.Scheduler.validateSubset,
		c.Jobs.validate,
		c.Market.validate,
		c.Lend.validate,
		c.Owner.validate,
		c.Scheduler.validateNearestAndMachines,
		c.Log.validate,
	} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// configErr is the error about key of [section]: "[section] key: " and
// then format.
func configErr(section, key, format string, args ...any) error {
	return fmt.Errorf("[%s] %s: %s", section, key, fmt.Sprintf(format, args...))
}

// validate checks [node]: a chain ID (which init sets) and labels for the
// moniker and site.
func (c NodeConfig) validate() error {
	if c.ChainID == "" {
		return configErr("node", "chain_id", "is empty; run `deepmarket init` to make a home")
	}
	if err := checkConfigLabel(c.Moniker); err != nil {
		return configErr("node", "moniker", "%v", err)
	}
	if err := checkConfigLabel(c.Site); err != nil {
		return configErr("node", "site", "%v", err)
	}
	return nil
}

// validate checks [p2p]: the listen and bootstrap addresses, the DHT mode,
// the connection watermarks and the offer and discovery timing.
func (c P2PConfig) validate() error {
	if len(c.Listen) == 0 {
		return configErr("p2p", "listen", "no listen address; e.g. [\"/ip4/0.0.0.0/tcp/7701\"]")
	}
	for _, a := range c.Listen {
		if err := checkMultiaddr(a); err != nil {
			return configErr("p2p", "listen", "%v", err)
		}
	}
	if _, err := p2p.AddrInfos(c.Bootstrap); err != nil {
		return configErr("p2p", "bootstrap", "%v", err)
	}
	switch c.DHT {
	case p2p.DHTAuto, p2p.DHTServer, p2p.DHTClient, p2p.DHTOff:
	default:
		return configErr("p2p", "dht", "%q: want auto, server, client or off", c.DHT)
	}
	if c.ConnLow <= 0 || c.ConnHigh < c.ConnLow {
		return configErr("p2p", "conn_low/conn_high", "want 0 < conn_low <= conn_high, have %d and %d", c.ConnLow, c.ConnHigh)
	}
	if c.OfferTTL.Duration < 10*time.Second || c.OfferTTL.Duration > time.Hour {
		return configErr("p2p", "offer_ttl", "%s: want between 10s and 1h", c.OfferTTL)
	}
	if c.AnnounceInterval.Duration <= 0 || c.AnnounceInterval.Duration > c.OfferTTL.Duration/2 {
		return configErr("p2p", "announce_interval", "%s: want positive and at most half of offer_ttl (%s), so an offer never lapses between announcements",
			c.AnnounceInterval, c.OfferTTL)
	}
	if c.AnnounceBudget < 0 || c.AnnounceBudget > 1_000_000 {
		return configErr("p2p", "announce_budget", "%d: want 0 (never stretch announce_interval) to 1000000 offers a minute", c.AnnounceBudget)
	}
	if d := c.DiscoverInterval.Duration; d < time.Second || d > time.Hour {
		return configErr("p2p", "discover_interval", "%s: want between 1s and 1h", c.DiscoverInterval)
	}
	if d := c.ProbeInterval.Duration; d != 0 && (d < 10*time.Second || d > 24*time.Hour) {
		return configErr("p2p", "probe_interval", "%s: want 0 (off) or between 10s and 24h", c.ProbeInterval)
	}
	switch c.RelayService {
	case p2p.RelayAuto, p2p.RelayOn, p2p.RelayOff:
	default:
		return configErr("p2p", "relay_service", "%q: want auto, on or off", c.RelayService)
	}
	if _, err := p2p.AddrInfos(c.Relays); err != nil {
		return configErr("p2p", "relays", "%v", err)
	}
	if _, err := c.testnetPublic(); err != nil {
		return configErr("p2p", "testnet_public", "%v", err)
	}
	return nil
}

// validate checks [api]: the API listens on loopback only.
func (c APIConfig) validate() error {
	host, _, err := net.SplitHostPort(c.Listen)
	if err != nil {
		return configErr("api", "listen", "%q: want HOST:PORT, e.g. 127.0.0.1:7700", c.Listen)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return configErr("api", "listen", "%q: the API serves on loopback only (127.0.0.1 or [::1])", c.Listen)
	}
	return nil
}

// validate checks [ledger]: CometBFT's listen addresses, its peers and the
// block timing.
func (c LedgerConfig) validate() error {
	for key, v := range map[string]string{"p2p_listen": c.P2PListen, "rpc_listen": c.RPCListen} {
		if err := checkTCPListen(v); err != nil {
			return configErr("ledger", key, "%v", err)
		}
	}
	for _, p := range c.Peers {
		id, addr, ok := strings.Cut(p, "@")
		if !ok || len(id) != 40 {
			return configErr("ledger", "peers", "%q: want NODE_ID@HOST:PORT (the node ID is in `deepmarket status`)", p)
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return configErr("ledger", "peers", "%q: %v", p, err)
		}
	}
	if d := c.BlockTime.Duration; d < 10*time.Millisecond || d > time.Minute {
		return configErr("ledger", "block_time", "%s: want between 10ms and 1m", c.BlockTime)
	}
	if d := c.EmptyBlockInterval.Duration; d < 0 || d > time.Hour {
		return configErr("ledger", "empty_block_interval", "%s: want between 0 and 1h", c.EmptyBlockInterval)
	}
	if c.MaxInboundPeers < 1 || c.MaxInboundPeers > 10_000 {
		return configErr("ledger", "max_inbound_peers", "%d: want between 1 and 10000", c.MaxInboundPeers)
	}
	return nil
}

// validate checks that each [prices] default is an amount of credits.
func (c PricesConfig) validate() error {
	for key, v := range map[string]string{"core_hour": c.CoreHour, "mem_gib_hour": c.MemGiBHour, "gpu_hour": c.GPUHour} {
		if _, err := units.ParseCredits(v); err != nil {
			return configErr("prices", key, "%v", err)
		}
	}
	return nil
}

// validateSubset checks [scheduler] subset, and that a "list" subset names
// machines.
func (c SchedulerConfig) validateSubset() error {
	switch c.Subset {
	case market.SubsetAll, market.SubsetSite, market.SubsetNearest:
	case market.SubsetList:
		if len(c.Machines) == 0 {
			return configErr("scheduler", "machines", "is empty, but subset = \"list\" schedules only on the machines it names")
		}
	default:
		return configErr("scheduler", "subset", "%q: want all, site, nearest or list", c.Subset)
	}
	return nil
}

// validateNearestAndMachines checks [scheduler] nearest and that machines
// are peer IDs.
func (c SchedulerConfig) validateNearestAndMachines() error {
	if c.Nearest < 1 || c.Nearest > 100000 {
		return configErr("scheduler", "nearest", "%d: want 1 to 100000", c.Nearest)
	}
	for _, m := range c.Machines {
		if _, err := peer.Decode(m); err != nil {
			return configErr("scheduler", "machines", "%q is not a peer ID: %v", m, err)
		}
	}
	return nil
}

// validate checks [owner]'s policy.
func (c OwnerConfig) validate() error {
	if field, err := c.Policy(nil).Validate(); err != nil {
		return configErr("owner", field, "%v", err)
	}
	return nil
}

// validate checks [jobs] escrow_slack and starvation.
func (c JobsConfig) validate() error {
	if d := c.EscrowSlack.Duration; d < 10*time.Second || d > 7*24*time.Hour {
		return configErr("jobs", "escrow_slack", "%s: want 10s to 168h", d)
	}
	if d := c.Starvation.Duration; d < time.Minute || d > 7*24*time.Hour {
		return configErr("jobs", "starvation", "%s: want 1m to 168h", d)
	}
	return nil
}

// validate checks the [market] bounds on offers and holds.
func (m MarketConfig) validate() error {
	switch {
	case m.MaxOffers < 1 || m.MaxOffers > 1_000_000:
		return configErr("market", "max_offers", "%d: want 1 to 1000000", m.MaxOffers)
	case m.MaxOffersPerOwner < 1 || m.MaxOffersPerOwner > m.MaxOffers:
		return configErr("market", "max_offers_per_owner", "%d: want 1 to max_offers (%d)", m.MaxOffersPerOwner, m.MaxOffers)
	case m.HoldsPerBidder < 1 || m.HoldsPerBidder > 10_000:
		return configErr("market", "holds_per_bidder", "%d: want 1 to 10000", m.HoldsPerBidder)
	case m.HoldsPerScheduler < 1 || m.HoldsPerScheduler > 10_000:
		return configErr("market", "holds_per_scheduler", "%d: want 1 to 10000", m.HoldsPerScheduler)
	case m.LaunchWithin.Duration < 10*time.Second || m.LaunchWithin.Duration > time.Hour:
		return configErr("market", "launch_within", "%s: want 10s to 1h", m.LaunchWithin.Duration)
	}
	return nil
}

// validate checks the [lend] terms against the network's bounds.
func (c LendConfig) validate() error {
	switch {
	case !(c.MaxVerifyShare >= 0 && c.MaxVerifyShare <= p2p.MaxVerifyShare):
		return configErr("lend", "max_verify_share", "%g: want 0 to %g", c.MaxVerifyShare, p2p.MaxVerifyShare)
	case !(c.MinFloor >= p2p.MinFloor && c.MinFloor <= 1):
		return configErr("lend", "min_floor", "%g: want %g to 1", c.MinFloor, p2p.MinFloor)
	case !(c.MinPayerPaid >= 0 && c.MinPayerPaid <= 1):
		return configErr("lend", "min_payer_paid", "%g: want 0 (any payer) to 1", c.MinPayerPaid)
	case c.RefusedStop < 0 || c.RefusedStop > 1000:
		return configErr("lend", "refused_stop", "%d: want 0 (never) to 1000", c.RefusedStop)
	}
	return nil
}

// validate checks the [log] levels and format.
func (c LogConfig) validate() error {
	switch c.Level {
	case "debug", "info", "warn", "error":
	default:
		return configErr("log", "level", "%q: want debug, info, warn or error", c.Level)
	}
	switch c.Libp2pLevel {
	case "debug", "info", "warn", "error":
	default:
		return configErr("log", "libp2p_level", "%q: want debug, info, warn or error", c.Libp2pLevel)
	}
	switch c.Format {
	case "text", "json":
	default:
		return configErr("log", "format", "%q: want text or json", c.Format)
	}
	return nil
}

// validate checks the interpreter: jobs may read its prefix (a
// virtualenv), so that prefix must not unmask the host.
func (c InventoryConfig) validate() error {
	py := c.Python
	switch {
	case py == "":
		return errors.New(`[inventory] python is empty; e.g. "python3" or "/opt/deepmarket/venv/bin/python3"`)
	case !strings.Contains(py, "/"):
		return nil // looked up in PATH, under /usr
	case !filepath.IsAbs(py):
		return fmt.Errorf("[inventory] python = %q: want a name such as python3 or an absolute path", py)
	}
	prefix := filepath.Dir(filepath.Dir(filepath.Clean(py)))
	if err := sandbox.CheckReadOnly(prefix); err != nil {
		return fmt.Errorf("[inventory] python = %q: its prefix %w; point it at a virtualenv such as /opt/deepmarket/venv/bin/python3", py, err)
	}
	return nil
}

// validate checks the uids workers run as and how long their traces stay.
func (c ExecutorConfig) validate() error {
	r, err := sandbox.ParseIDRange(c.UIDRange)
	if err != nil {
		return fmt.Errorf("[executor] uid_range = %q: %w", c.UIDRange, err)
	}
	if err := r.Check(); err != nil {
		return fmt.Errorf("[executor] uid_range = %q: %w", c.UIDRange, err)
	}
	if d := c.KeepLogs.Duration; d < time.Minute || d > 365*24*time.Hour {
		return fmt.Errorf("[executor] keep_logs = %s: want 1m to 8760h", d)
	}
	if err := sandbox.CheckCgroupParent(c.CgroupParent); err != nil {
		return fmt.Errorf("[executor] cgroup_parent = %q: %w", c.CgroupParent, err)
	}
	if n, err := units.ParseSize(c.ImageCache); err != nil || n < 64<<20 {
		return fmt.Errorf("[executor] image_cache = %q: want a size of at least 64MiB, such as \"32GiB\" (%v)", c.ImageCache, err)
	}
	return nil
}

// checkTCPListen checks a CometBFT listen address, tcp://HOST:PORT.
func checkTCPListen(s string) error {
	rest, ok := strings.CutPrefix(s, "tcp://")
	if !ok {
		return fmt.Errorf("%q: want tcp://HOST:PORT", s)
	}
	if _, _, err := net.SplitHostPort(rest); err != nil {
		return fmt.Errorf("%q: %v", s, err)
	}
	return nil
}

// checkConfigLabel checks a moniker or site: 1 to 64 letters, digits,
// '-', '.', '_' and spaces.
func checkConfigLabel(s string) error {
	if s == "" || len(s) > 64 {
		return fmt.Errorf("%q: want 1 to 64 characters", s)
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("-._ ", c)) {
			return fmt.Errorf("%q: use letters, digits, '-', '.', '_' and spaces", s)
		}
	}
	return nil
}

// checkMultiaddr checks a libp2p listen address.
func checkMultiaddr(s string) error {
	if _, err := ma.NewMultiaddr(s); err != nil {
		return fmt.Errorf("%q is not a multiaddr: %v (e.g. /ip4/0.0.0.0/tcp/7701)", s, err)
	}
	return nil
}

// testnetPublic parses [p2p] testnet_public.
func (c P2PConfig) testnetPublic() ([]*net.IPNet, error) {
	var out []*net.IPNet
	for _, s := range c.TestnetPublic {
		_, n, err := net.ParseCIDR(s)
		if err != nil {
			return nil, fmt.Errorf("%q: want an IPv4 range such as 10.77.0.0/24", s)
		}
		if n.IP.To4() == nil || !n.IP.IsPrivate() {
			return nil, fmt.Errorf("%q: only private IPv4 ranges may be treated as public", s)
		}
		out = append(out, n)
	}
	return out, nil
}
