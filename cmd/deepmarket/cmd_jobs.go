package main

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/spf13/cobra"

	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/jobs"
	"github.com/deepmarket/deepmarket/units"
)

func newSubmitCmd(c *cli) *cobra.Command {
	var yes, wait, asJSON, verbose bool
	cmd := &cobra.Command{
		Use:   "submit JOB.toml",
		Short: "Submit a training job: quote it, confirm, pay into escrow, launch it on lent machines",
		Long: `submit reads a job spec (see examples/fashion-mnist/job.toml), adds its bundle and
dataset directories to storage, bids on the market, and shows the cheapest
quote: the machines, their sites, the price per hour and the most the job can
cost. Once you confirm (or with --yes), the node commits the machines' holds,
locks the job's max price in escrow on the ledger and launches the workers.
What the workers use is paid; the rest is refunded when the job ends.

When no machine can take the job now, or only above its max price, it waits
in this node's queue (for up to max_wait, 24h unless the spec says) and bids
again as machines free up; submit says why it waits and what running it now
would cost. Nothing is paid while it waits; cancel takes it out.`,
		Example: `  deepmarket submit job.toml                  # shows the quote, asks to confirm
  deepmarket submit job.toml --yes --wait      # no question; follow the logs to the end
  deepmarket submit job.toml --yes --json`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError{fmt.Errorf("submit takes one job spec file, got %d arguments", len(args))}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			path := args[0]
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			f, err := jobs.DecodeFile(b)
			if err != nil {
				return usageError{fmt.Errorf("%s: %w", path, err)}
			}
			base, err := filepath.Abs(filepath.Dir(path))
			if err != nil {
				return err
			}
			if err := resolveImageName(cmd.Context(), c, &f, base); err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			// Check here first, for errors that name the file.
			if _, err := f.Validate(base); err != nil {
				return usageError{fmt.Errorf("%s: %w", path, err)}
			}
			// Without --yes the quote is confirmed at the terminal; with no
			// terminal to ask, say so before bidding rather than leave a job
			// waiting for an answer that cannot come.
			if !yes && !isatty.IsTerminal(os.Stdin.Fd()) {
				return usageError{errors.New("no terminal to confirm the quote at: run with --yes to submit without asking (the quote is still shown)")}
			}

			cl, err := c.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if !asJSON {
				fmt.Fprintf(os.Stderr, "adding inputs and asking the market for quotes...\n")
			}
			sctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
			defer cancel()
			j, err := cl.Submit(sctx, api.SubmitRequest{Spec: f, BaseDir: base, Yes: yes})
			if err != nil {
				return err
			}
			if j.State == jobs.Failed {
				if asJSON {
					return c.printJSON(submitOut(j))
				}
				return fmt.Errorf("job %s: %s", short(j.ID), j.Reason)
			}
			if !yes {
				question := "Submit this job? [y/N] "
				if j.State == jobs.Waiting {
					showWait(c.out, j)
					question = "Leave it in the queue, to run when machines free up? [y/N] "
				} else {
					showQuote(c.out, j)
					// What lenders read of this node as a payer.
					if rec, err := cl.Record(ctx, ""); err == nil {
						fmt.Fprintf(c.out, "your record as a payer (lenders may refuse a bid by it): %s\n\n", payerLine(rec.Payer))
					}
				}
				fmt.Fprint(c.out, question)
				answers := make(chan string, 1)
				go func() {
					a, _ := bufio.NewReader(os.Stdin).ReadString('\n')
					answers <- a
				}()
				var answer string
				select {
				case answer = <-answers:
				case <-ctx.Done(): // Ctrl-C at the question: nothing is submitted
					cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					cl.CancelJob(cctx, j.ID)
					fmt.Fprintln(c.out, "\nnot submitted; the machines' holds are released")
					return ctx.Err()
				}
				if a := strings.ToLower(strings.TrimSpace(answer)); a != "y" && a != "yes" {
					if _, err := cl.CancelJob(ctx, j.ID); err != nil {
						return err
					}
					fmt.Fprintln(c.out, "not submitted; the machines' holds are released")
					return nil
				}
				if j, err = cl.ConfirmJob(ctx, j.ID); err != nil {
					return err
				}
			}
			if asJSON && !wait {
				return c.printJSON(submitOut(j))
			}
			if !asJSON {
				fmt.Fprintf(c.out, "job %s submitted (%s)\n", j.ID, j.State)
				if yes && j.State == jobs.Waiting {
					showWait(c.out, j)
				}
			}
			if !wait {
				if !asJSON {
					fmt.Fprintf(c.out, "follow it with: deepmarket logs %s -f\n", short(j.ID))
				}
				return nil
			}
			var out io.WriteCloser = nopCloser{io.Discard}
			if !asJSON {
				out = logWriter(c.out, verbose)
			}
			err = followLogs(ctx, cl, j.ID, 0, out)
			out.Close()
			if err != nil {
				return err
			}
			j, err = cl.Job(ctx, j.ID)
			if err != nil {
				return err
			}
			if asJSON {
				return c.printJSON(submitOut(j))
			}
			printJobEnd(c.out, j)
			if j.State != jobs.Succeeded {
				return fmt.Errorf("job %s %s: %s", short(j.ID), j.State, j.Reason)
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "submit without asking to confirm the quote")
	cmd.Flags().BoolVar(&wait, "wait", false, "follow the job's logs until it ends (with its progress); exit non-zero unless it succeeded")
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "with --wait: also print TensorFlow's start-up messages (left out by default)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print {job_id, state, max_price, ...} as JSON")
	return cmd
}

func submitOut(j *jobs.Job) map[string]any {
	out := map[string]any{"job_id": j.ID, "state": j.State, "max_price": j.Spec.MaxPrice, "reason": j.Reason,
		"result_cid": j.ResultCID, "cost": j.Cost}
	if j.Queue != nil {
		out["queue"] = j.Queue
	}
	if r := j.Current(); r != nil {
		out["per_hour"] = r.PerHour
		out["quoted_total"] = r.Quoted
		out["workers"] = r.Workers
		if r.Predicted != nil {
			out["predicted"] = r.Predicted
		}
	}
	return out
}

func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

func showQuote(w io.Writer, j *jobs.Job) {
	r := j.Current()
	fmt.Fprintf(w, "\njob %s (%s): %s of %s each\n", short(j.ID), j.Spec.Name, units.Count(j.Spec.Workers, "worker", "workers"),
		units.FormatResources(j.Spec.Cores, j.Spec.MemBytes, j.Spec.GPUs))
	for i, wk := range r.Workers {
		name := wk.Moniker
		if name == "" {
			name = short(wk.Machine)
		}
		fmt.Fprintf(w, "  worker %d  %-16s %-12s %s credits/h\n", i, name, wk.Site, units.FormatCredits(wk.PerHour))
	}
	explainPrices(w, r.Workers, "  ")
	fmt.Fprintf(w, "price: %s credits an hour; at most %s credits for %s (your max price %s, locked in escrow, the rest refunded)\n",
		units.FormatCredits(r.PerHour), units.FormatCredits(r.Quoted), j.Spec.MaxDuration, units.FormatCredits(j.Spec.MaxPrice))
	if j.Spec.Floor > 0 {
		fmt.Fprintf(w, "floor: each machine is paid at least %.0f%% of its price for the time its worker runs, whatever its progress\n", 100*j.Spec.Floor)
	}
	fmt.Fprintln(w)
	if p := r.Predicted; p != nil {
		fmt.Fprintf(w, "predicted: %s to train (%s of it exchanging weights), %.0f ms a step, %.2fx one worker's speed",
			seconds(p.TotalSeconds), seconds(p.CommSeconds), p.StepMillis, p.SpeedUp)
		if p.Fewest < len(r.Workers) {
			fmt.Fprintf(w, "; %s would finish sooner", units.Count(p.Fewest, "worker", "workers"))
		}
		fmt.Fprint(w, "\n\n")
	} else {
		fmt.Fprintf(w, "expected duration: not predicted (give [training] steps and params in the spec for a prediction); it runs %s at most\n\n",
			j.Spec.MaxDuration)
	}
}

// showWait says why a job waits in the queue, where, and what running it
// now would cost.
func showWait(w io.Writer, j *jobs.Job) {
	q := j.Queue
	if q == nil {
		return
	}
	fmt.Fprintf(w, "\njob %s (%s) waits in this node's queue, position %d: %s\n", short(j.ID), j.Spec.Name, q.Position, q.Why)
	if q.PriceNow > 0 {
		fmt.Fprintf(w, "it would run now for %s credits; its max price is %s (raise max_price to run it sooner)\n",
			units.FormatCredits(q.PriceNow), units.FormatCredits(j.Spec.MaxPrice))
	}
	fmt.Fprintf(w, "it bids again as machines free up (by %s at the latest), for up to %s; nothing is paid while it waits,\nand deepmarket cancel %s takes it out of the queue\n\n",
		q.NextBid.Local().Format("15:04:05"), j.Spec.MaxWait, short(j.ID))
}

// seconds is a prediction's time, rounded as a person reads it.
func seconds(s float64) time.Duration {
	d := time.Duration(s * float64(time.Second))
	if d >= time.Minute {
		return d.Round(time.Second)
	}
	return d.Round(100 * time.Millisecond)
}

func printJobEnd(w io.Writer, j *jobs.Job) {
	fmt.Fprintf(w, "\njob %s %s", short(j.ID), j.State)
	if j.Reason != "" {
		fmt.Fprintf(w, ": %s", j.Reason)
	}
	fmt.Fprintf(w, "\ncost: %s credits\n", units.FormatCredits(j.Cost))
	if j.ResultCID != "" {
		fmt.Fprintf(w, "result: %s (%s)\n", j.ResultCID, resultHint(j))
	}
}

// followLogs prints a job's log from offset until the job ends.
func followLogs(ctx context.Context, cl *api.Client, id string, offset int64, out io.Writer) error {
	for {
		lg, err := cl.JobLogs(ctx, id, offset)
		if err != nil {
			return err
		}
		io.WriteString(out, lg.Data)
		offset = lg.Next
		if lg.Done {
			return nil
		}
		if lg.Data == "" {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Second):
			}
		}
	}
}

func newJobsCmd(c *cli) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "jobs",
		Short: "List the jobs submitted from this node",
		Args:  noArgs,
	}
	showCmd(c, cmd, func(ctx context.Context, cl *api.Client, _ []string) ([]jobs.Job, error) {
		return cl.Jobs(ctx)
	}, func(js []jobs.Job) error {
		if len(js) == 0 {
			fmt.Fprintln(c.out, "no jobs yet: deepmarket submit JOB.toml")
			return nil
		}
		rows := make([][]string, 0, len(js))
		for _, j := range js {
			state := string(j.State)
			if j.State == jobs.Waiting && j.Queue != nil && j.Queue.Position > 0 {
				state = fmt.Sprintf("waiting (#%d)", j.Queue.Position)
			}
			accuracy, took, ended := "-", "-", "-"
			if s := j.Summary; s != nil {
				if s.Percent > 0 && !j.State.Terminal() {
					state += fmt.Sprintf(" %s%%", strconv.FormatFloat(s.Percent, 'f', -1, 64))
				}
				if s.Accuracy > 0 {
					accuracy = fmt.Sprintf("%.4f", s.Accuracy)
				}
				if s.Duration > 0 {
					took = (time.Duration(s.Duration) * time.Second).String()
				}
				if !s.Ended.IsZero() {
					ended = s.Ended.Local().Format("01-02 15:04")
				}
			}
			rows = append(rows, []string{short(j.ID), j.Spec.Name, state, fmt.Sprint(j.Spec.Workers), accuracy, took,
				units.FormatCredits(j.Cost), j.Created.Local().Format("01-02 15:04"), ended, j.ResultCID})
		}
		c.table("JOB\tNAME\tSTATE\tWORKERS\tACCURACY\tTOOK\tCOST\tSUBMITTED\tENDED\tRESULT", rows)
		return nil
	})
	show := &cobra.Command{
		Use:   "show ID",
		Short: "Show a job: its state, workers, cost and result",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError{errors.New("jobs show takes one job ID (a unique prefix will do)")}
			}
			return nil
		},
	}
	showCmd(c, show, func(ctx context.Context, cl *api.Client, args []string) (*jobs.Job, error) {
		return cl.Job(ctx, args[0])
	}, func(j *jobs.Job) error {
		fmt.Fprintf(c.out, "job %s (%s): %s", j.ID, j.Spec.Name, j.State)
		if j.Reason != "" {
			fmt.Fprintf(c.out, ": %s", j.Reason)
		}
		if q := j.Queue; q != nil && j.State == jobs.Waiting {
			fmt.Fprintf(c.out, "\nin the queue since %s (%s), position %d, %s so far; bids again by %s",
				q.Since.Local().Format("2006-01-02 15:04:05"), time.Since(q.Since).Round(time.Second), q.Position,
				units.Count(q.Bids, "bid", "bids"), q.NextBid.Local().Format("15:04:05"))
			if q.PriceNow > 0 {
				fmt.Fprintf(c.out, "\nit would run now for %s credits (its max price: %s)", units.FormatCredits(q.PriceNow), units.FormatCredits(j.Spec.MaxPrice))
			}
		}
		printSummary(c.out, j)
		fmt.Fprintf(c.out, "\ncommand: %s\nbundle %s, dataset %s", strings.Join(j.Spec.Command, " "), j.BundleCID, orStr(j.DatasetCID, "none"))
		if img := cmp.Or(j.ImageCID, j.Spec.Image); img != "" {
			fmt.Fprintf(c.out, ", image %s (the job's own environment)", img)
		}
		fmt.Fprintf(c.out, "\ncost %s credits of at most %s\n", units.FormatCredits(j.Cost), units.FormatCredits(j.Spec.MaxPrice))
		if r := j.Current(); r != nil {
			rows := make([][]string, 0, len(r.Workers))
			for i, w := range r.Workers {
				note := w.Reason
				if r.Held() {
					note = heldNote(w)
				}
				rows = append(rows, []string{fmt.Sprint(i), orStr(w.Moniker, short(w.Machine)), w.Site, string(w.State),
					units.FormatCredits(w.PerHour), note})
			}
			fmt.Fprintf(c.out, "run %d%s:\n", len(j.Runs), map[bool]string{true: " (the job was re-placed once)"}[len(j.Runs) > 1])
			if h := r.Holder; h != nil {
				fmt.Fprintf(c.out, "the model is held by this machine (its holder: %s%s); each machine is paid for its accepted rounds\n",
					h.State, map[bool]string{true: ", " + h.Reason}[h.Reason != ""])
			}
			c.table("WORKER\tMACHINE\tSITE\tSTATE\tCREDITS/H\tNOTE", rows)
			explainPrices(c.out, r.Workers, "")
		}
		if j.ResultCID != "" {
			fmt.Fprintf(c.out, "result: %s (%s)\n", j.ResultCID, resultHint(j))
		}
		return nil
	})
	cmd.AddCommand(show)
	return cmd
}

// explainPrices says why workers of one job cost differently, when they do.
func explainPrices(w io.Writer, ws []jobs.Worker, indent string) {
	for _, wk := range ws {
		if wk.PerHour != ws[0].PerHour {
			fmt.Fprintf(w, "%s(a worker's price is its machine's marginal cost at the load the job's workers placed before it leave,\n"+
				"%sand the lender's reserve price at least: deepmarket prices shows each machine's load)\n", indent, indent)
			return
		}
	}
}

// resultHint is where the README puts a job's result: outside its bundle.
func resultHint(j *jobs.Job) string {
	return fmt.Sprintf("deepmarket data get %s -o ~/%s-result", j.ResultCID, j.Spec.Name)
}

// printSummary says a job's progress, result and times (jobs.Summary)
// after its state line.
func printSummary(w io.Writer, j *jobs.Job) {
	s := j.Summary
	if s == nil {
		return
	}
	if s.Total > 0 && !j.State.Terminal() {
		fmt.Fprintf(w, "\n%s", jobs.ProgressLine(s))
	} else if s.Accuracy > 0 || s.Loss != 0 {
		fmt.Fprintf(w, "\nresult: ")
		if s.Accuracy > 0 {
			fmt.Fprintf(w, "accuracy %.4f, ", s.Accuracy)
		}
		fmt.Fprintf(w, "loss %.4g (%s)", s.Loss, s.From)
	}
	switch {
	case !s.Ended.IsZero() && !s.Started.IsZero():
		fmt.Fprintf(w, "\nran %s: %s to %s", time.Duration(s.Duration)*time.Second, s.Started.Local().Format("2006-01-02 15:04:05"),
			s.Ended.Local().Format("15:04:05"))
	case !s.Ended.IsZero():
		fmt.Fprintf(w, "\nended %s", s.Ended.Local().Format("2006-01-02 15:04:05"))
	case !s.Started.IsZero():
		fmt.Fprintf(w, "\nrunning for %s, since %s", time.Duration(s.Duration)*time.Second, s.Started.Local().Format("2006-01-02 15:04:05"))
	}
}

// heldNote is what the holder of a held run says of worker w.
func heldNote(w jobs.Worker) string {
	note := fmt.Sprintf("%s accepted (%.0f s), %d refused", units.Count(w.Accepted, "round", "rounds"), w.AcceptedSeconds, w.Refused)
	switch {
	case w.Forfeited:
		note += ", forfeited its pay: failed a spot check (" + w.CheckFailure + ")"
	case w.Dropped:
		note += ", dropped"
	}
	if w.ChecksPassed > 0 {
		note += fmt.Sprintf(", %s passed", units.Count(w.ChecksPassed, "spot check", "spot checks"))
	} else if w.HeldSeconds > 0 && !w.Forfeited {
		note += fmt.Sprintf(", pay for %.0f s held back until it passes a spot check", w.HeldSeconds)
	}
	if w.Reason != "" {
		note += "; " + w.Reason
	}
	return note
}

func orStr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func newLogsCmd(c *cli) *cobra.Command {
	var follow, verbose bool
	cmd := &cobra.Command{
		Use:   "logs ID",
		Short: "Print a job's log: what the node did and every worker's output",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError{errors.New("logs takes one job ID (a unique prefix will do)")}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.client()
			if err != nil {
				return err
			}
			out := logWriter(c.out, verbose)
			defer out.Close()
			if follow {
				return followLogs(cmd.Context(), cl, args[0], 0, out)
			}
			var off int64
			for {
				lg, err := cl.JobLogs(cmd.Context(), args[0], off)
				if err != nil {
					return err
				}
				io.WriteString(out, lg.Data)
				if lg.Data == "" {
					return nil
				}
				off = lg.Next
			}
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing until the job ends")
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "also print TensorFlow's start-up messages (left out by default)")
	return cmd
}

func newCancelCmd(c *cli) *cobra.Command {
	return &cobra.Command{
		Use:   "cancel ID",
		Short: "Stop a job: its machines are paid for the time used, the rest is refunded",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError{errors.New("cancel takes one job ID (a unique prefix will do)")}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.client()
			if err != nil {
				return err
			}
			j, err := cl.CancelJob(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(c.out, "job %s %s; cost %s credits\n", short(j.ID), j.State, units.FormatCredits(j.Cost))
			if j.Reason != "" {
				fmt.Fprintf(c.out, "%s\n", j.Reason)
			}
			return nil
		},
	}
}

// resolveImageName puts in f the CID of an image its spec names as `env
// add` recorded it: an image that is neither a CID nor a path (relative
// to base) there is looked up on the node.
func resolveImageName(ctx context.Context, c *cli, f *jobs.File, base string) error {
	ref := f.Image
	if ref == "" || jobs.IsCID(ref) {
		return nil
	}
	p := ref
	if !filepath.IsAbs(p) {
		p = filepath.Join(base, p)
	}
	if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
		return nil // a path: Validate checks it
	}
	if api.CheckEnvName(ref) != nil {
		return nil // not a name either: Validate says what is wrong
	}
	cl, err := c.client()
	if err != nil {
		return err
	}
	ctx, cancel := timeout(ctx)
	defer cancel()
	img, err := cl.EnvShow(ctx, ref)
	if err != nil {
		if ae := (*api.Error)(nil); errors.As(err, &ae) && ae.Status == http.StatusNotFound {
			return usageError{fmt.Errorf("image %q: no such directory, CID or image name (see `deepmarket env ls`)", ref)}
		}
		return err
	}
	f.Image = img.CID
	return nil
}
