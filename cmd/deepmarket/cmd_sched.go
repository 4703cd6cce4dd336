package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/scheduler"
	"github.com/deepmarket/deepmarket/units"
)

func newPricesCmd(c *cli) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "prices",
		Short: "Show what this node's scheduler charges now, per machine and market-wide",
		Long: `Prices follow load: a unit of a resource on a machine costs its base price when
the machine is idle and rises exponentially as it fills (the marginal-cost model
of Amir, Awerbuch and Borgstrom); a lender's reserve price is a floor, and a
machine that may leave costs more for its risk. Prices are in credits per
unit-hour (memory per GiB-hour). So two workers of the same shape cost
differently on one machine: the second is priced at the load the first
leaves (the LOAD column).`,
		Args: noArgs,
	}
	return showCmd(c, cmd, func(ctx context.Context, cl *api.Client, _ []string) (api.MarketPrices, error) {
		return cl.Prices(ctx)
	}, func(p api.MarketPrices) error {
		if len(p.Machines) == 0 {
			fmt.Fprintf(c.out, "no machines in view (subset %q): no offers held yet\n", p.Subset)
			return nil
		}
		fmt.Fprintf(c.out, "market (%d machines, subset %s), credits an hour:\n  lowest: %s\n  median: %s\n\n", len(p.Machines), p.Subset,
			labelledPrices(p.Lowest), labelledPrices(p.Median))
		rows := make([][]string, 0, len(p.Machines))
		for _, m := range p.Machines {
			state := "available"
			if !m.Available {
				state = "outside window"
			}
			rows = append(rows, []string{m.Moniker, m.Site, shortID(m.ID), fmt.Sprintf("%d/%s/%d", m.Free.Cores, units.FormatSize(m.Free.MemBytes), m.Free.GPUs),
				fmt.Sprintf("%.0f%%/%.0f%%/%.0f%%", 100*m.Load[0], 100*m.Load[1], 100*m.Load[2]), unitPrices(m.Unit), state})
		}
		c.table("MACHINE\tSITE\tPEER\tFREE (cores/mem/GPUs)\tLOAD\tPRICE (core/GiB/GPU per hour)\tSTATE", rows)
		return nil
	})
}

// labelledPrices says unit prices with their units.
func labelledPrices(u scheduler.UnitPrices) string {
	return fmt.Sprintf("%s a core, %s a GiB of memory, %s a GPU", units.FormatCredits(u.Core), units.FormatCredits(u.MemGiB), units.FormatCredits(u.GPU))
}

func unitPrices(u scheduler.UnitPrices) string {
	return fmt.Sprintf("%s/%s/%s", units.FormatCredits(u.Core), units.FormatCredits(u.MemGiB), units.FormatCredits(u.GPU))
}

func newQuoteCmd(c *cli) *cobra.Command {
	var workers, cores, gpus int
	var mem, maxPrice string
	var duration time.Duration
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "quote",
		Short: "Price a job shape on this node's scheduler, or see why it would not run",
		Example: `  deepmarket quote --workers 4 --cores 2 --mem 4GiB --duration 2h
  deepmarket quote --workers 2 --cores 4 --mem 16GiB --gpus 1 --duration 30m --max-price 25`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			size, err := units.ParseSize(mem)
			if err != nil {
				return usageError{fmt.Errorf("--mem: %v", err)}
			}
			req := api.QuoteRequest{Workers: workers, DurationS: int64(duration / time.Second),
				PerWorker: scheduler.Resources{Cores: uint32(max(cores, 0)), MemBytes: size, GPUs: uint32(max(gpus, 0))}}
			if cores < 0 || gpus < 0 {
				return usageError{fmt.Errorf("--cores and --gpus cannot be negative")}
			}
			if maxPrice != "" {
				if req.MaxPrice, err = units.ParseCredits(maxPrice); err != nil {
					return usageError{fmt.Errorf("--max-price: %v", err)}
				}
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			ctx, cancel := timeout(cmd.Context())
			defer cancel()
			q, err := cl.Quote(ctx, req)
			if err != nil {
				return err
			}
			if asJSON {
				return c.printJSON(q)
			}
			if !q.OK {
				fmt.Fprintf(c.out, "no quote (%d machines in view): %s\n", q.Machines, q.Rejection.Reason)
				return nil
			}
			fmt.Fprintf(c.out, "%s credits in all (%s an hour), done by %s\n", units.FormatCredits(q.Total), units.FormatCredits(q.PerHour),
				q.DoneAt.Local().Format("2006-01-02 15:04"))
			rows := make([][]string, 0, len(q.Workers))
			for i, w := range q.Workers {
				rows = append(rows, []string{fmt.Sprint(i), w.Moniker, w.Site, shortID(w.Machine), units.FormatCredits(w.PerHour)})
			}
			c.table("WORKER\tMACHINE\tSITE\tPEER\tPER HOUR", rows)
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&workers, "workers", 1, "number of workers")
	f.IntVar(&cores, "cores", 1, "cores per worker")
	f.StringVar(&mem, "mem", "1GiB", "memory per worker")
	f.IntVar(&gpus, "gpus", 0, "GPUs per worker")
	f.DurationVar(&duration, "duration", time.Hour, "expected run time")
	f.StringVar(&maxPrice, "max-price", "", "the most the job is worth, in credits (default: no limit)")
	f.BoolVar(&asJSON, "json", false, "print as JSON")
	return cmd
}
