package main

import (
	"fmt"
	"os/exec"
	"runtime"
	"time"

	"github.com/spf13/cobra"
)

func newUICmd(c *cli) *cobra.Command {
	var open, asJSON bool
	cmd := &cobra.Command{
		Use:   "ui",
		Short: "Print a one-time login link to the node's dashboard",
		Long: `Ask the running node for a link that signs a browser on this machine into its
dashboard: balance and credits over time, machines and jobs, the lend and
submit forms, the market, the ledger and the network.

The link works once, for ten minutes; the browser then keeps a session cookie
for twelve hours (until the node restarts). Anyone who can read the node's
api.token can make links, as with every other command.`,
		Example: `  deepmarket ui
  deepmarket ui --open`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.client()
			if err != nil {
				return err
			}
			ctx, cancel := timeout(cmd.Context())
			defer cancel()
			link, err := cl.LoginLink(ctx)
			if err != nil {
				return err
			}
			if asJSON {
				return c.printJSON(link)
			}
			fmt.Fprintf(c.out, "Open this link in a browser on this machine (it works once, until %s):\n\n  %s\n\n",
				link.ExpiresAt.Local().Format(time.Kitchen), link.URL)
			if open {
				if err := openBrowser(link.URL); err != nil {
					fmt.Fprintf(c.out, "Could not open a browser (%v): open the link yourself.\n", err)
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&open, "open", false, "open the link in the default browser too")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print {url, expires_at} as JSON")
	return cmd
}

// openBrowser starts the desktop's browser on url without waiting for it.
func openBrowser(url string) error {
	var cmd *exec.Cmd
	switch runtime.GOOS {
	case "darwin":
		cmd = exec.Command("open", url)
	case "windows":
		cmd = exec.Command("rundll32", "url.dll,FileProtocolHandler", url)
	default:
		cmd = exec.Command("xdg-open", url)
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	go cmd.Wait() // reap it
	return nil
}
