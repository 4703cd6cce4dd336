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

	"github.com/deepmarket/deepmarket/node/sandbox"
	"github.com/deepmarket/deepmarket/p2p"
	"github.com/deepmarket/deepmarket/units"
)

// Validate checks every section; errors name the section and key.
func (c *Config) Validate() error {
	bad := func(key, format string, args ...any) error {
		return fmt.Errorf("[%s]: %s", key, fmt.Sprintf(format, args...))
	}
	if c.Node.ChainID == "" {
		return bad("node] chain_id", "is empty; run `deepmarket init` to make a home")
	}
	if err := checkConfigLabel(c.Node.Moniker); err != nil {
		return bad("node] moniker", "%v", err)
	}
	if err := checkConfigLabel(c.Node.Site); err != nil {
		return bad("node] site", "%v", err)
	}
	if len(c.P2P.Listen) == 0 {
		return bad("p2p] listen", "no listen address; e.g. [\"/ip4/0.0.0.0/tcp/7701\"]")
	}
	for _, a := range c.P2P.Listen {
		if err := checkMultiaddr(a); err != nil {
			return bad("p2p] listen", "%v", err)
		}
	}
	if _, err := p2p.AddrInfos(c.P2P.Bootstrap); err != nil {
		return bad("p2p] bootstrap", "%v", err)
	}
	switch c.P2P.DHT {
	case p2p.DHTAuto, p2p.DHTServer, p2p.DHTClient, p2p.DHTOff:
	default:
		return bad("p2p] dht", "%q: want auto, server, client or off", c.P2P.DHT)
	}
	if c.P2P.ConnLow <= 0 || c.P2P.ConnHigh < c.P2P.ConnLow {
		return bad("p2p] conn_low/conn_high", "want 0 < conn_low <= conn_high, have %d and %d", c.P2P.ConnLow, c.P2P.ConnHigh)
	}
	if c.P2P.OfferTTL.Duration < 10*time.Second || c.P2P.OfferTTL.Duration > time.Hour {
		return bad("p2p] offer_ttl", "%s: want between 10s and 1h", c.P2P.OfferTTL)
	}
	if c.P2P.AnnounceInterval.Duration <= 0 || c.P2P.AnnounceInterval.Duration > c.P2P.OfferTTL.Duration/2 {
		return bad("p2p] announce_interval", "%s: want positive and at most half of offer_ttl (%s), so an offer never lapses between announcements",
			c.P2P.AnnounceInterval, c.P2P.OfferTTL)
	}
	if d := c.P2P.DiscoverInterval.Duration; d < time.Second || d > time.Hour {
		return bad("p2p] discover_interval", "%s: want between 1s and 1h", c.P2P.DiscoverInterval)
	}
	host, _, err := net.SplitHostPort(c.API.Listen)
	if err != nil {
		return bad("api] listen", "%q: want HOST:PORT, e.g. 127.0.0.1:7700", c.API.Listen)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return bad("api] listen", "%q: the API serves on loopback only (127.0.0.1 or [::1])", c.API.Listen)
	}
	for key, v := range map[string]string{"p2p_listen": c.Ledger.P2PListen, "rpc_listen": c.Ledger.RPCListen} {
		if err := checkTCPListen(v); err != nil {
			return bad("ledger] "+key, "%v", err)
		}
	}
	for _, p := range c.Ledger.Peers {
		id, addr, ok := strings.Cut(p, "@")
		if !ok || len(id) != 40 {
			return bad("ledger] peers", "%q: want NODE_ID@HOST:PORT (the node ID is in `deepmarket status`)", p)
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return bad("ledger] peers", "%q: %v", p, err)
		}
	}
	if d := c.Ledger.BlockTime.Duration; d < 10*time.Millisecond || d > time.Minute {
		return bad("ledger] block_time", "%s: want between 10ms and 1m", c.Ledger.BlockTime)
	}
	if d := c.Ledger.EmptyBlockInterval.Duration; d < 0 || d > time.Hour {
		return bad("ledger] empty_block_interval", "%s: want between 0 and 1h", c.Ledger.EmptyBlockInterval)
	}
	if err := c.Inventory.validate(); err != nil {
		return err
	}
	if err := c.Executor.validate(); err != nil {
		return err
	}
	for key, v := range map[string]string{"core_hour": c.Prices.CoreHour, "mem_gib_hour": c.Prices.MemGiBHour, "gpu_hour": c.Prices.GPUHour} {
		if _, err := units.ParseCredits(v); err != nil {
			return bad("prices] "+key, "%v", err)
		}
	}
	switch c.Scheduler.Subset {
	case SubsetAll, SubsetSite, SubsetNearest:
	case SubsetList:
		if len(c.Scheduler.Machines) == 0 {
			return bad("scheduler] machines", "is empty, but subset = \"list\" schedules only on the machines it names")
		}
	default:
		return bad("scheduler] subset", "%q: want all, site, nearest or list", c.Scheduler.Subset)
	}
	if d := c.Jobs.EscrowSlack.Duration; d < 10*time.Second || d > 7*24*time.Hour {
		return bad("jobs] escrow_slack", "%s: want 10s to 168h", d)
	}
	m := c.Market
	switch {
	case m.MaxOffers < 1 || m.MaxOffers > 1_000_000:
		return bad("market] max_offers", "%d: want 1 to 1000000", m.MaxOffers)
	case m.MaxOffersPerOwner < 1 || m.MaxOffersPerOwner > m.MaxOffers:
		return bad("market] max_offers_per_owner", "%d: want 1 to max_offers (%d)", m.MaxOffersPerOwner, m.MaxOffers)
	case m.HoldsPerBidder < 1 || m.HoldsPerBidder > 10_000:
		return bad("market] holds_per_bidder", "%d: want 1 to 10000", m.HoldsPerBidder)
	case m.HoldsPerScheduler < 1 || m.HoldsPerScheduler > 10_000:
		return bad("market] holds_per_scheduler", "%d: want 1 to 10000", m.HoldsPerScheduler)
	case m.LaunchWithin.Duration < 10*time.Second || m.LaunchWithin.Duration > time.Hour:
		return bad("market] launch_within", "%s: want 10s to 1h", m.LaunchWithin.Duration)
	}
	if c.Scheduler.Nearest < 1 || c.Scheduler.Nearest > 100000 {
		return bad("scheduler] nearest", "%d: want 1 to 100000", c.Scheduler.Nearest)
	}
	for _, m := range c.Scheduler.Machines {
		if _, err := peer.Decode(m); err != nil {
			return bad("scheduler] machines", "%q is not a peer ID: %v", m, err)
		}
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		return bad("log] level", "%q: want debug, info, warn or error", c.Log.Level)
	}
	switch c.Log.Libp2pLevel {
	case "debug", "info", "warn", "error":
	default:
		return bad("log] libp2p_level", "%q: want debug, info, warn or error", c.Log.Libp2pLevel)
	}
	switch c.Log.Format {
	case "text", "json":
	default:
		return bad("log] format", "%q: want text or json", c.Log.Format)
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

func checkMultiaddr(s string) error {
	if _, err := ma.NewMultiaddr(s); err != nil {
		return fmt.Errorf("%q is not a multiaddr: %v (e.g. /ip4/0.0.0.0/tcp/7701)", s, err)
	}
	return nil
}
