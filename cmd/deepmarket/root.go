package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/deepmarket/deepmarket/node"
	"github.com/deepmarket/deepmarket/node/api"
)

// cli holds what every command shares.
type cli struct {
	homeDir string
	out     io.Writer
}

func (c *cli) home() node.Home { return node.Home{Dir: c.homeDir} }

// client returns an API client for the home's running node: the address
// it recorded at start (api.addr), else the configured one.
func (c *cli) client() (*api.Client, error) {
	h := c.home()
	if err := h.Check(); err != nil {
		return nil, err
	}
	token, err := h.LoadToken()
	if err != nil {
		return nil, err
	}
	base := ""
	if b, err := os.ReadFile(h.APIAddrPath()); err == nil {
		base = strings.TrimSpace(string(b))
	}
	if base == "" {
		cfg, err := node.LoadConfig(h.ConfigPath())
		if err != nil {
			return nil, err
		}
		base = "http://" + cfg.API.Listen
	}
	return api.NewClient(base, token), nil
}

func newRoot() *cobra.Command {
	c := &cli{out: os.Stdout}
	root := &cobra.Command{
		Use:   "deepmarket",
		Short: "A peer-to-peer marketplace of lab machines for machine-learning training",
		Long: `DeepMarket lets universities share lab machines for distributed TensorFlow
training. Every lab machine runs one node; a node lends what its owner allows
and earns credits, and its owner spends credits to run jobs elsewhere.

Start here:
  deepmarket init                 make this machine's node (key, config.toml)
  deepmarket node run             run the node (keep it running; see the systemd unit)
  deepmarket lend --cores 4 --mem 8GiB --window 19:00-07:00
  deepmarket offers               see the market

The home directory is --home, else $DEEPMARKET_HOME, else ~/.deepmarket.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&c.homeDir, "home", node.DefaultHomeDir(), "node home directory")
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return usageError{fmt.Errorf("%w\nsee '%s --help'", err, cmd.CommandPath())}
	})
	root.AddCommand(
		newInitCmd(c), newNodeCmd(c), newKeysCmd(c), newStatusCmd(c), newLendCmd(c),
		newOffersCmd(c), newPeersCmd(c), newBidsCmd(c), newLedgerCmd(c), newDataCmd(c), newEnvCmd(c), newPricesCmd(c), newQuoteCmd(c), newSimCmd(c), newSubmitCmd(c), newJobsCmd(c), newLogsCmd(c), newCancelCmd(c), newTestnetCmd(c), newUICmd(c), newVersionCmd(c),
	)
	return root
}

// noArgs rejects positional arguments with a usage error.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageError{fmt.Errorf("%s takes no arguments, got %q", cmd.CommandPath(), args)}
	}
	return nil
}

func (c *cli) printJSON(v any) error {
	enc := json.NewEncoder(c.out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func (c *cli) table(header string, rows [][]string) {
	tw := tabwriter.NewWriter(c.out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	tw.Flush()
}

// showCmd completes a command that reads something from the node and
// prints it: as JSON with --json, else with text.
func showCmd[T any](c *cli, cmd *cobra.Command, fetch func(ctx context.Context, cl *api.Client, args []string) (T, error), text func(T) error) *cobra.Command {
	var asJSON bool
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		cl, err := c.client()
		if err != nil {
			return err
		}
		ctx, cancel := timeout(cmd.Context())
		defer cancel()
		v, err := fetch(ctx, cl, args)
		if err != nil {
			return err
		}
		if asJSON {
			return c.printJSON(v)
		}
		return text(v)
	}
	return cmd
}

func timeout(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, 30*time.Second)
}

func newVersionCmd(c *cli) *cobra.Command {
	return &cobra.Command{
		Use: "version", Short: "Print the DeepMarket version", Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			fmt.Fprintln(c.out, "deepmarket", node.Version)
			return nil
		},
	}
}
