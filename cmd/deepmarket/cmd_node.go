package main

import (
	"encoding/base64"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/node"
)

func newInitCmd(c *cli) *cobra.Command {
	var opts node.InitOptions
	var bootstrap, ledgerPeers string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "init",
		Short: "Create this machine's node: key, config.toml and API token",
		Long: `Create the node's home directory: an ed25519 node key (its libp2p identity and,
by default, its account), config.toml with every setting commented, and the
token that guards the local API.

Without --genesis, the node starts its own local network (chain ID
deepmarket-local-<random>). With --genesis FILE it joins an existing network.
An existing home is never overwritten unless --force, which moves it aside.

Lent jobs run with the Python of --python (written to [inventory] python);
without it, the virtualenv that make deps makes (/opt/deepmarket/venv, or
.venv here) if there is one, else python3 from the PATH. TensorFlow jobs are
placed only on machines whose Python imports TensorFlow.`,
		Example: `  deepmarket init --moniker lab-pc-12 --site psu-fab-lab
  deepmarket init --genesis genesis.json --bootstrap /ip4/10.0.0.5/tcp/7701/p2p/12D3KooW... \
                  --ledger-peers 3f2a...c9@10.0.0.5:7702`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if bootstrap != "" {
				for _, b := range strings.Split(bootstrap, ",") {
					if b = strings.TrimSpace(b); b != "" {
						opts.Bootstrap = append(opts.Bootstrap, b)
					}
				}
			}
			for _, p := range strings.Split(ledgerPeers, ",") {
				if p = strings.TrimSpace(p); p != "" {
					opts.LedgerPeers = append(opts.LedgerPeers, p)
				}
			}
			res, err := node.Init(c.home(), opts)
			if err != nil {
				return err
			}
			if asJSON {
				return c.printJSON(map[string]string{"home": res.Home, "peer_id": res.PeerID, "address": string(res.Address), "chain_id": res.ChainID,
					"python": res.Python, "backup": res.Backup})
			}
			if res.Backup != "" {
				fmt.Fprintf(c.out, "Moved the old home to %s\n", res.Backup)
			}
			fmt.Fprintf(c.out, "Initialised %s\n  peer ID:  %s\n  account:  %s\n  chain ID: %s\n  python:   %s\nNext: deepmarket node run --home %s\n",
				res.Home, res.PeerID, res.Address, res.ChainID, res.Python, res.Home)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Moniker, "moniker", "", "name of this machine as peers see it (default: hostname)")
	f.StringVar(&opts.Site, "site", "", "site label: your lab or university (default \"default\")")
	f.StringSliceVar(&opts.Listen, "listen", nil, "libp2p listen multiaddrs (default TCP and QUIC on port 7701)")
	f.StringVar(&opts.API, "api", "", "local API address HOST:PORT (default 127.0.0.1:7700)")
	f.StringVar(&bootstrap, "bootstrap", "", "comma-separated peers to join: /ip4/HOST/tcp/PORT/p2p/PEER_ID,...")
	f.StringVar(&opts.Genesis, "genesis", "", "genesis.json of an existing network to join")
	f.StringVar(&opts.ChainID, "chain-id", "", "network ID to use instead of a new local one")
	f.StringVar(&opts.LedgerP2P, "ledger-p2p", "", "ledger (CometBFT) peer address, tcp://HOST:PORT (default tcp://0.0.0.0:7702)")
	f.StringVar(&ledgerPeers, "ledger-peers", "", "comma-separated ledger nodes to sync with: NODE_ID@HOST:PORT (the ID is in 'deepmarket status' there)")
	f.StringVar(&opts.LedgerRPC, "ledger-rpc", "", "ledger RPC address, tcp://HOST:PORT (default tcp://127.0.0.1:7703)")
	f.StringVar(&opts.Python, "python", "", "Python interpreter lent jobs run with (default: the make deps virtualenv if present, else python3)")
	f.BoolVar(&opts.Force, "force", false, "move an existing home aside and start over")
	f.BoolVar(&asJSON, "json", false, "print the result as JSON")
	return cmd
}

func newNodeCmd(c *cli) *cobra.Command {
	cmd := &cobra.Command{Use: "node", Short: "Run the node daemon"}
	var apiAddr, logLevel string
	var listen []string
	run := &cobra.Command{
		Use:   "run",
		Short: "Run this machine's node until interrupted",
		Long: `Run the node in the foreground: the libp2p host, peer discovery, gossip of
offers and bids, the lender announcing this machine's offer, and the local API
(with /metrics and /healthz) on 127.0.0.1. SIGINT or SIGTERM stops it cleanly,
withdrawing this machine's offer first.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			h := c.home()
			if err := h.Check(); err != nil {
				return err
			}
			cfg, err := node.LoadConfig(h.ConfigPath())
			if err != nil {
				return err
			}
			if apiAddr != "" {
				cfg.API.Listen = apiAddr
			}
			if len(listen) > 0 {
				cfg.P2P.Listen = listen
			}
			if logLevel != "" {
				cfg.Log.Level = logLevel
			}
			if err := cfg.Validate(); err != nil {
				return usageError{err}
			}
			log := node.NewLogger(os.Stderr, cfg.Log.Level, cfg.Log.Format)
			node.RouteLibp2pLogs(log, cfg.Log.Libp2pLevel)
			n, err := node.New(h, cfg, log)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			go func() {
				select {
				case <-n.Ready():
					homeFlag := ""
					if h.Dir != node.DefaultHomeDir() {
						homeFlag = " --home " + h.Dir
					}
					fmt.Fprintf(os.Stderr, `DeepMarket node %s is running (account %s).
  dashboard: %s/  sign in with a one-time link: deepmarket ui%s
  local API: %s/api/v1/openapi.json   metrics: %s/metrics
  Next, from another terminal:
    deepmarket lend%s --cores 2 --mem 4GiB          # lend this machine
    deepmarket submit%s examples/fashion-mnist/job.toml   # train the example on it
    deepmarket jobs%s                                # follow it (or in the dashboard)
  Stop with Ctrl-C.
`, n.Key().PeerID(), n.Key().Address(), n.APIURL(), homeFlag, n.APIURL(), n.APIURL(), homeFlag, homeFlag, homeFlag)
				case <-ctx.Done():
				}
			}()
			go func() { // a stuck shutdown must not hang the machine's service manager
				<-ctx.Done()
				time.Sleep(10 * time.Second)
				fmt.Fprintln(os.Stderr, "error: shutdown took longer than 10s; exiting")
				os.Exit(1)
			}()
			return n.Run(ctx)
		},
	}
	run.Flags().StringVar(&apiAddr, "api", "", "override [api] listen")
	run.Flags().StringSliceVar(&listen, "listen", nil, "override [p2p] listen")
	run.Flags().StringVar(&logLevel, "log-level", "", "override [log] level: debug, info, warn, error")
	cmd.AddCommand(run)
	return cmd
}

func newKeysCmd(c *cli) *cobra.Command {
	cmd := &cobra.Command{Use: "keys", Short: "Show this node's keys"}
	var asJSON bool
	show := &cobra.Command{
		Use:   "show",
		Short: "Print the node's account address, peer ID and validator key (no running node needed)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			k, err := c.home().LoadKey()
			if err != nil {
				return err
			}
			out := struct {
				Address identity.Address `json:"address"`
				PeerID  string           `json:"peer_id"`
				// ValidatorPubKey is what validators vote in with
				// `deepmarket ledger validator vote`.
				ValidatorPubKey string `json:"validator_pubkey"`
			}{k.Address(), k.PeerID().String(), base64.StdEncoding.EncodeToString(k.Public())}
			if asJSON {
				return c.printJSON(out)
			}
			fmt.Fprintf(c.out, "account:          %s\npeer ID:          %s\nvalidator pubkey: %s\n", out.Address, out.PeerID, out.ValidatorPubKey)
			return nil
		},
	}
	show.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	cmd.AddCommand(show)
	return cmd
}
