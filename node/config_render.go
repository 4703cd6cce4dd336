package node

import (
	"fmt"
	"strings"
)

// Writing config.toml: the commented template every setting appears in,
// which init writes and `deepmarket config` shows.

// configTemplate is config.toml as `init` writes it: every setting with a
// comment saying what it does.
const configTemplate = `# DeepMarket node configuration.
# Precedence: built-in defaults < this file < DEEPMARKET_<SECTION>_<KEY>
# environment variables (e.g. DEEPMARKET_API_LISTEN) < command-line flags.

[node]
# Name shown to other members for this machine.
moniker = {{lit .Node.Moniker}}
# Site label: your lab or university. Schedulers prefer placing one job's
# workers within a site.
site = {{lit .Node.Site}}
# The network this node belongs to. Set by init (from --genesis when joining
# an existing network); nodes only talk to nodes of the same chain ID.
chain_id = {{lit .Node.ChainID}}

[p2p]
# Addresses libp2p listens on (TCP and QUIC, IPv4 and IPv6).
listen = {{lit .P2P.Listen}}
# Peers to connect to at start, as /ip4/HOST/tcp/PORT/p2p/PEER_ID. Needed
# to join peers outside this LAN; with any set, the DHT runs (see dht).
bootstrap = {{lit .P2P.Bootstrap}}
# Find peers of the same network on the local network by mDNS.
mdns = {{lit .P2P.MDNS}}
# Kademlia DHT for finding peers across sites: "auto" (on when bootstrap
# peers are set), "server", "client" or "off".
dht = {{lit .P2P.DHT}}
# Connection manager watermarks: above conn_high, idle connections are
# trimmed down to conn_low.
conn_low = {{lit .P2P.ConnLow}}
conn_high = {{lit .P2P.ConnHigh}}
# How long peers keep this machine's offer without hearing it again.
offer_ttl = {{lit .P2P.OfferTTL}}
# How often the offer is re-announced (at most half of offer_ttl); it is
# also announced at once whenever it changes.
announce_interval = {{lit .P2P.AnnounceInterval}}
# Every node hears every offer, so its gossip grows with the announcements
# the whole market makes. Once the machines in this node's offer book,
# each re-announcing every announce_interval, would make more than this
# many a minute, it stretches announce_interval and offer_ttl alike to
# stay within it (the default costs a node about 1% of a core; see
# "make bench-gossip"), up to an offer_ttl of 1h. 0 never stretches.
announce_budget = {{lit .P2P.AnnounceBudget}}
# How often to look for more peers in the DHT, and to re-dial bootstrap
# peers when the node has none.
discover_interval = {{lit .P2P.DiscoverInterval}}
# How often a lending machine measures round trip and throughput to the
# machines it sees (up to 32, 256 KiB each) and publishes them in its
# offer, so quotes can predict a training job's time; "0s" turns it off.
probe_interval = {{lit .P2P.ProbeInterval}}
# Behind a NAT (a campus network), libp2p's own traversal lets peers reach
# this machine: AutoNAT tells whether it is reachable, a private node
# reserves a slot on a public node's relay and advertises it, and a hole
# punch turns a relayed connection direct. Only small control messages
# cross a relay; datasets and training traffic wait for a direct path.
nat_traversal = {{lit .P2P.NATTraversal}}
# Relay for the network's members (machines the ledger backs), within
# limits: "auto" once AutoNAT finds this node public or a peer outside
# dials it on a public address of its own, "on", or "off".
relay_service = {{lit .P2P.RelayService}}
# Relays a private node reserves a slot on (multiaddrs with /p2p/ID);
# empty uses the bootstrap peers, the network's public nodes.
relays = {{lit .P2P.Relays}}
# Testnets only: private IPv4 ranges to treat as public addresses, for an
# emulated internet (testnet run --profile nat). Leave empty.
testnet_public = {{lit .P2P.TestnetPublic}}

[ledger]
# This node's replica of the credit ledger, a CometBFT node in the same
# process. Its peer-to-peer address (other ledger nodes connect here):
p2p_listen = {{lit .Ledger.P2PListen}}
# CometBFT's RPC: what "deepmarket ledger audit --rpc" reads. Loopback by
# default; open it to let auditors elsewhere replay the chain from this node.
rpc_listen = {{lit .Ledger.RPCListen}}
# Other ledger nodes to keep connected to, as NODE_ID@HOST:PORT (a node's ID
# is in "deepmarket status"). Validators of a network list each other.
peers = {{lit .Ledger.Peers}}
# Time between blocks while there are transactions (CometBFT timeout_commit).
block_time = {{lit .Ledger.BlockTime}}
# With no transactions, a block at least this often, so time-based rules
# (escrow expiry) advance; 0 makes blocks continuously.
empty_block_interval = {{lit .Ledger.EmptyBlockInterval}}
# Ledger nodes that may connect here at most: every machine of the network
# that lists this node in its peers (a validator's members) must fit.
max_inbound_peers = {{lit .Ledger.MaxInboundPeers}}

[api]
# The local HTTP API, /metrics and the dashboard. Loopback only; the CLI
# authenticates with the token in api.token beside this file.
listen = {{lit .API.Listen}}

[inventory]
# The Python interpreter probed for TensorFlow and run for a job's python3:
# a name found in PATH, or the python3 of a virtualenv, whose prefix jobs
# may read (never /, /usr/local/..., a home or anything of the host's).
python = {{lit .Inventory.Python}}

[prices]
# Default reserve prices, in credits per unit-hour, when ` + "`lend`" + ` names none.
core_hour = {{lit .Prices.CoreHour}}
mem_gib_hour = {{lit .Prices.MemGiBHour}}
gpu_hour = {{lit .Prices.GPUHour}}

[scheduler]
# Answer the market's job bids with quotes (holding the placement on the
# machines for a minute).
quote = {{.Scheduler.Quote}}
# Which machines this node's scheduler prices and places jobs on, of those
# whose offers it holds: "all", "site" (this node's site only), "nearest"
# (the ` + "`nearest`" + ` machines with the lowest measured round-trip time), or
# "list" (the peer IDs in ` + "`machines`" + `).
subset = {{lit .Scheduler.Subset}}
nearest = {{.Scheduler.Nearest}}
machines = {{lit .Scheduler.Machines}}

[executor]
# Where workers of lent jobs run (their inputs, output and scratch space).
# Empty: /var/tmp/deepmarket-jobs. Jobs run as unprivileged uids of their own,
# so this must not be under a private directory, and only root may change it
# or the dirs above it.
work_dir = {{lit .Executor.WorkDir}}
# CPU ids lent workers may be pinned to; empty: the highest-numbered free ones.
cpus = {{lit .Executor.CPUs}}
# true: pin no worker to CPUs; each is held to its lent cores by its CPU quota
# alone (for a machine whose CPUs others share, such as a VM's vCPUs).
share_cpus = {{lit .Executor.ShareCPUs}}
# The uids workers run as, one of its own for each worker, as FIRST-LAST.
# No account may use them (checked against /etc/passwd and /etc/group).
uid_range = {{lit .Executor.UIDRange}}
# How long the logs and work dirs of ended workers stay on this machine.
keep_logs = {{lit .Executor.KeepLogs}}
# The cgroup, relative to the cgroup root, that holds the workers' cgroups.
# A node that runs in a cgroup of its own (a container, or a slice with a CPU
# quota) names one under it, so that its workers count against its limits.
cgroup_parent = {{lit .Executor.CgroupParent}}
# The most that the jobs' images (OCI, unpacked once each under work_dir) may
# take; the least recently used image no worker is using goes first.
image_cache = {{lit .Executor.ImageCache}}

[jobs]
# How long a submitted job's escrow outlives its max_duration: the time this
# node has to settle it (after a crash, say) before its lenders may claim
# what its receipts owe them.
escrow_slack = {{lit .Jobs.EscrowSlack}}
# A job that finds no machines (or only prices above its max price) waits in
# this node's queue, up to its spec's max_wait (24h unless it says), and bids
# again as machines free up. Waiting jobs bid in order of benefit per cost;
# one that has waited this long goes before every job that has waited less.
starvation = {{lit .Jobs.Starvation}}

[owner]
# Put the machine's owner first while it lends, as HTCondor does on lab
# desktops: while the owner's own CPU load (not the jobs', not the node's) is
# above suspend_above cores, or someone types at one of its terminals, the
# jobs here are suspended (frozen; that time is
# not paid) and the machine offers nothing; once the owner's load has stayed
# at or below it for resume_idle they resume, and after start_idle the machine
# offers itself again. A suspension that lasts vacate_after vacates the jobs:
# stopped with a checkpoint, their submitters re-place them elsewhere.
# 0 turns it off (the default); "deepmarket lend --suspend-above" sets it too.
suspend_above = {{.Owner.SuspendAbove}}
start_idle = {{lit .Owner.StartIdle}}
resume_idle = {{lit .Owner.ResumeIdle}}
vacate_after = {{lit .Owner.VacateAfter}}

[market]
# The most offers this node keeps of the market, and of one owner's machines
# (offers of machines the ledger does not back are never kept).
max_offers = {{.Market.MaxOffers}}
max_offers_per_owner = {{.Market.MaxOffersPerOwner}}
# What others may hold on this machine: reservations per bidder account and
# per scheduler at once, and how long a committed reservation waits for its
# job's launch (backed by an escrow on the ledger) before it lapses.
holds_per_bidder = {{.Market.HoldsPerBidder}}
holds_per_scheduler = {{.Market.HoldsPerScheduler}}
launch_within = {{lit .Market.LaunchWithin}}

[lend]
# The payment terms this machine lends on. Every job pays a floor: a share of
# the machine's price for the time its worker runs, whatever the submitter's
# checks say (only a spot check the worker failed forfeits it). A bid paying a
# lower floor than min_floor (0.25 to 1) is refused a hold here, and so is a
# job whose submitter holds the model when held_jobs is false, or one that
# holds back more of the pay until a spot check passes than max_verify_share
# (0 to 0.2). The node also stops a worker whose receipts fall behind the
# floor for two receipt intervals ("stopped: unpaid"). min_payer_paid (0 to 1;
# 0 takes any payer) refuses a bidder whose own settlements, by its record on
# the ledger, paid less than that share of what it owed (its lenders had to
# lodge their receipts for the rest). refused_stop (0 to 1000; 0: never)
# stops a worker of a held job whose last refused_stop updates the job's holder
# all refused ("stopped: unpaid"): only the floor pays such a worker.
held_jobs = {{.Lend.HeldJobs}}
max_verify_share = {{.Lend.MaxVerifyShare}}
min_floor = {{.Lend.MinFloor}}
min_payer_paid = {{.Lend.MinPayerPaid}}
refused_stop = {{.Lend.RefusedStop}}

[log]
# debug, info, warn or error.
level = {{lit .Log.Level}}
# text or json.
format = {{lit .Log.Format}}
# Level for messages from libp2p's own subsystems.
libp2p_level = {{lit .Log.Libp2pLevel}}
`

// SaveConfig checks cfg and writes it to path, atomically.
func SaveConfig(path string, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	text, err := cfg.Render()
	if err != nil {
		return fmt.Errorf("render config: %w", err)
	}
	return writeFileAtomic(path, []byte(text), 0o644)
}

// Render writes the config as commented TOML.
func (c *Config) Render() (string, error) {
	var b strings.Builder
	err := renderTemplate(&b, configTemplate, c)
	return b.String(), err
}
