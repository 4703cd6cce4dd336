package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/mattn/go-isatty"
	"github.com/spf13/cobra"

	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/units"
)

func newDataCmd(c *cli) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "data",
		Short: "Share datasets and code by content address (add, get, ls, rm, gc)",
		Long: `Datasets, code and trained models move between nodes as content-addressed
blocks over bitswap: a CID names the exact bytes, and every block is checked
against it on arrival. 'data add' imports a file or directory tree into this
node and pins it; anyone can then 'data get' it by CID from any node that has
it. Fetched data is pinned too, so this node serves it to others until
'data rm'; 'data gc' frees the space of what is no longer pinned.

The node itself reads and writes the paths, as the user it runs as.

CIDs are those of plain IPFS with --cid-version=1 --raw-leaves
--chunker=size-1048576, so kubo users can fetch ours and we theirs.`,
		Example: `  deepmarket data add /usr/share/datasets/fashion-mnist
  deepmarket data get bafybei... -o ./fashion-mnist
  deepmarket data ls
  deepmarket data rm bafybei... && deepmarket data gc`,
	}
	cmd.AddCommand(newDataAddCmd(c), newDataGetCmd(c), newDataLsCmd(c), newDataRmCmd(c), newDataGCCmd(c))
	return cmd
}

func newDataAddCmd(c *cli) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "add PATH",
		Short: "Import a file or directory tree, pin it and print its CID",
		Args:  exactArgs(1, "PATH"),
		RunE: func(cmd *cobra.Command, args []string) error {
			path, err := filepath.Abs(args[0])
			if err != nil {
				return err
			}
			if _, err := os.Lstat(path); err != nil {
				return usageError{fmt.Errorf("data add: %w", err)}
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			bar := newProgressBar("adding "+filepath.Base(path), asJSON)
			p, err := cl.DataAdd(cmd.Context(), path, bar.update)
			bar.done(err)
			if err != nil {
				return interrupted(cmd.Context(), err, "the add was cancelled; nothing was pinned")
			}
			if asJSON {
				return c.printJSON(p)
			}
			fmt.Fprintf(c.out, "added %s (%s, %s)\n%s\n", p.Name, p.Kind, units.FormatSize(uint64(p.Size)), p.CID)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print {cid, size, ...} as JSON")
	return cmd
}

func newDataGetCmd(c *cli) *cobra.Command {
	var out string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "get CID",
		Short: "Fetch a CID from the network, pin it, and write it out",
		Long: `Fetch a CID from whichever peers have it and write it to -o (default
./CID): a directory becomes that directory, a file that file (or a file
named CID inside -o if -o is an existing directory). Every block is checked
against the CID. Blocks already here are not fetched again, so an
interrupted get resumes where it stopped. If no peer sends anything for a
minute the get fails, keeping what it has.`,
		Args: exactArgs(1, "CID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := cid.Decode(args[0]); err != nil {
				return usageError{fmt.Errorf("data get: %q is not a CID: %v", args[0], err)}
			}
			if out == "" {
				out = args[0]
			}
			abs, err := filepath.Abs(out)
			if err != nil {
				return err
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			bar := newProgressBar("fetching "+shortCID(args[0]), asJSON)
			r, err := cl.DataGet(cmd.Context(), args[0], abs, bar.update)
			bar.done(err)
			if err != nil {
				return interrupted(cmd.Context(), err, "the get was cancelled; the blocks fetched so far are kept, and running it again resumes")
			}
			if asJSON {
				return c.printJSON(r)
			}
			fmt.Fprintf(c.out, "fetched %s (%s, %s) to %s\n", r.CID, r.Kind, units.FormatSize(uint64(r.Size)), r.Path)
			return nil
		},
	}
	cmd.Flags().StringVarP(&out, "output", "o", "", "where to write it (default ./CID)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the result as JSON")
	return cmd
}

func newDataLsCmd(c *cli) *cobra.Command {
	cmd := &cobra.Command{Use: "ls", Short: "List pinned data (and unfinished gets)", Args: noArgs}
	return showCmd(c, cmd, func(ctx context.Context, cl *api.Client, _ []string) ([]api.DataPin, error) {
		return cl.DataList(ctx)
	}, func(pins []api.DataPin) error {
		if len(pins) == 0 {
			fmt.Fprintln(c.out, "nothing pinned (add with `deepmarket data add PATH`)")
			return nil
		}
		rows := make([][]string, 0, len(pins))
		for _, p := range pins {
			state := "pinned"
			if p.Partial {
				state = "partial (get again to resume)"
			}
			rows = append(rows, []string{p.CID, p.Kind, units.FormatSize(uint64(p.Size)), p.Name,
				p.AddedAt.Local().Format("2006-01-02 15:04"), state})
		}
		c.table("CID\tKIND\tSIZE\tNAME\tADDED\tSTATE", rows)
		return nil
	})
}

func newDataRmCmd(c *cli) *cobra.Command {
	return &cobra.Command{
		Use:   "rm CID",
		Short: "Unpin a CID (its blocks go at the next `data gc`)",
		Args:  exactArgs(1, "CID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := cid.Decode(args[0]); err != nil {
				return usageError{fmt.Errorf("data rm: %q is not a CID: %v", args[0], err)}
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			ctx, cancel := timeout(cmd.Context())
			defer cancel()
			if err := cl.DataRemove(ctx, args[0]); err != nil {
				return err
			}
			fmt.Fprintf(c.out, "unpinned %s (run `deepmarket data gc` to free its space)\n", args[0])
			return nil
		},
	}
}

func newDataGCCmd(c *cli) *cobra.Command {
	cmd := &cobra.Command{Use: "gc", Short: "Remove blocks no pin needs and free their disk space", Args: noArgs}
	return showCmd(c, cmd, func(ctx context.Context, cl *api.Client, _ []string) (api.DataGCResult, error) {
		return cl.DataGC(ctx)
	}, func(r api.DataGCResult) error {
		fmt.Fprintf(c.out, "removed %s (%s) that no pin needs, kept %s\n", units.Count(r.RemovedBlocks, "block", "blocks"),
			units.FormatSize(uint64(r.RemovedBytes)), units.Count(r.KeptBlocks, "block", "blocks"))
		switch {
		case r.ReclaimedBytes > 0:
			fmt.Fprintf(c.out, "returned %s of disk by rewriting pack files\n", units.FormatSize(uint64(r.ReclaimedBytes)))
		case r.RemovedBytes > 0:
			fmt.Fprintln(c.out, "their space stays in pack files until most of a pack is unused; then gc rewrites it and returns the space")
		}
		for _, c2 := range r.Incomplete {
			fmt.Fprintf(c.out, "warning: pinned %s has blocks missing; `deepmarket data get %s` fetches them again\n", c2, c2)
		}
		return nil
	})
}

// exactArgs wants n positional arguments, named in the error.
func exactArgs(n int, names string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usageError{fmt.Errorf("%s wants %s, got %d argument(s)\nsee '%s --help'", cmd.CommandPath(), names, len(args), cmd.CommandPath())}
		}
		return nil
	}
}

func interrupted(ctx context.Context, err error, what string) error {
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		return errors.New(what)
	}
	return err
}

func shortCID(s string) string {
	if len(s) > 16 {
		return s[:8] + "…" + s[len(s)-6:]
	}
	return s
}

// progressBar draws progress on stderr when it is a terminal (and the
// output is not JSON): bytes, percentage, rate and time left.
type progressBar struct {
	w     io.Writer
	label string
	start time.Time
	drawn bool
}

func newProgressBar(label string, quiet bool) *progressBar {
	b := &progressBar{label: label, start: time.Now()}
	if !quiet && isatty.IsTerminal(os.Stderr.Fd()) {
		b.w = os.Stderr
	}
	return b
}

func (b *progressBar) update(p api.Progress) {
	if b.w == nil {
		return
	}
	const width = 30
	elapsed := time.Since(b.start).Seconds()
	rate := float64(p.Done) / max(elapsed, 0.001)
	line := fmt.Sprintf("%s  %s", b.label, units.FormatSize(uint64(p.Done)))
	if p.Total > 0 {
		frac := min(float64(p.Done)/float64(p.Total), 1)
		filled := int(frac * width)
		eta := ""
		if rate > 0 && p.Done < p.Total {
			eta = " " + (time.Duration(float64(p.Total-p.Done) / rate * float64(time.Second))).Round(time.Second).String() + " left"
		}
		line = fmt.Sprintf("%s [%s%s] %3.0f%%  %s / %s  %s/s%s", b.label, strings.Repeat("=", filled), strings.Repeat(" ", width-filled),
			frac*100, units.FormatSize(uint64(p.Done)), units.FormatSize(uint64(p.Total)), units.FormatSize(uint64(rate)), eta)
	}
	fmt.Fprintf(b.w, "\r%-100s", line)
	b.drawn = true
}

func (b *progressBar) done(err error) {
	if b.w != nil && b.drawn {
		fmt.Fprintln(b.w)
	}
}
