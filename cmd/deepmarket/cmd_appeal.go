package main

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	rpchttp "github.com/cometbft/cometbft/rpc/client/http"
	ctypes "github.com/cometbft/cometbft/rpc/core/types"
	"github.com/spf13/cobra"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/units"
)

var jobIDRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// jobArg checks that args[0] is a whole job ID.
func jobArg(args []string) error {
	if !jobIDRE.MatchString(args[0]) {
		return usageError{fmt.Errorf("%q is not a job ID (64 hex digits, as 'deepmarket jobs' prints with --json)", args[0])}
	}
	return nil
}

// signed signs one ledger transaction with this node's key and sends it
// through the node's ledger RPC (or rpc), waiting until it commits.
func (c *cli) signed(ctx context.Context, rpc string, do func(*ledger.Client) (*ctypes.ResultTx, error)) (*ctypes.ResultTx, error) {
	if err := c.home().Check(); err != nil {
		return nil, err
	}
	key, err := c.home().LoadKey()
	if err != nil {
		return nil, err
	}
	url, cfg, err := c.ledgerRPC(rpc)
	if err != nil {
		return nil, err
	}
	rc, err := rpchttp.New(url, "/websocket")
	if err != nil {
		return nil, fmt.Errorf("ledger RPC %s: %w", url, err)
	}
	res, err := do(ledger.NewClient(rc, key, cfg.Node.ChainID))
	var lerr *ledger.Error
	switch {
	case err == nil:
		return res, nil
	case errors.Is(err, ledger.ErrUnknownOutcome):
		var unknown *ledger.UnknownOutcomeError
		errors.As(err, &unknown)
		return nil, outcomeUnknown{hash: unknown.Hash, why: unknown.Reason}
	case errors.As(err, &lerr):
		return nil, fmt.Errorf("rejected: %s", lerr.Reason)
	}
	return nil, fmt.Errorf("%w (is this node's ledger RPC listening at %s?)", err, url)
}

func newAppealCmd(c *cli) *cobra.Command {
	var claim, evidence, reason, rpc string
	cmd := &cobra.Command{
		Use:   "appeal JOB --claim CREDITS --evidence CID [--reason TEXT]",
		Short: "Ask referees to pay this machine what a settlement's refusals kept back",
		Long: `Signs, with this node's key (the machine's), an appeal of the settlement of
JOB, in its dispute window: this machine says it is owed CREDITS more than the
settlement paid it, for rounds the job's holder refused. Its owner locks the
ledger's appeal bond. Validators drawn from the block's hash, none of them a
party to the case, recompute the contested check from the evidence (CID, the
content address of the model, the update and the validation batch) and vote:
overturned, the claim is paid and the bond comes back; upheld, the referees take
the bond. The node does this by itself after a settlement, when its own
recomputation of the holder's last refusal overturns it (the evidence is then
the payer's signed answer beside what the worker kept); this command is the
same by hand. Exit status: 0 appealed, 1 refused, 2 usage, 3 outcome unknown.`,
		Example: `  deepmarket ledger appeal 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08 --claim 0.8 --evidence bafybeigdyrzt --reason "rounds 3-6 refused"`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError{fmt.Errorf("%s takes one job ID", cmd.CommandPath())}
			}
			return jobArg(args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			amount, err := units.ParseCredits(claim)
			switch {
			case claim == "":
				return usageError{errors.New("--claim is required: what the settlement owes this machine beyond what it paid")}
			case err != nil:
				return usageError{fmt.Errorf("--claim: %v", err)}
			case amount == 0:
				return usageError{errors.New("--claim must be more than 0")}
			case evidence == "" || len(evidence) > ledger.MaxEvidenceLen || strings.ContainsAny(evidence, " \t\n"):
				return usageError{fmt.Errorf("--evidence is required: the content address (1 to %d characters) of what the referees recompute from", ledger.MaxEvidenceLen)}
			case len(reason) > ledger.MaxReasonLen:
				return usageError{fmt.Errorf("--reason: at most %d bytes", ledger.MaxReasonLen)}
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 60*time.Second)
			defer cancel()
			res, err := c.signed(ctx, rpc, func(cl *ledger.Client) (*ctypes.ResultTx, error) {
				return cl.Appeal(ctx, args[0], amount, evidence, reason)
			})
			if err != nil {
				return fmt.Errorf("appeal %w", err)
			}
			refs, deadline := attr(res, "referees"), attr(res, "deadline")
			fmt.Fprintf(c.out, "Appealed the settlement of job %s for %s credits (tx %s, height %d).\n", args[0][:12], units.FormatCredits(amount), res.Hash, res.Height)
			fmt.Fprintf(c.out, "Referees: %s; their verdict is due by %s (unix).\n", refs, deadline)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&claim, "claim", "", "credits owed beyond what the settlement paid (required)")
	f.StringVar(&evidence, "evidence", "", "content address of the evidence the referees recompute from (required)")
	f.StringVar(&reason, "reason", "", "why, in a few words")
	f.StringVar(&rpc, "rpc", "", "override this node's ledger RPC, e.g. http://127.0.0.1:7703")
	return cmd
}

func newVerdictCmd(c *cli) *cobra.Command {
	var overturn, uphold bool
	var rpc string
	cmd := &cobra.Command{
		Use:   "verdict JOB APPELLANT (--overturn | --uphold)",
		Short: "Vote, as a referee an appeal drew, on a payee's appeal",
		Long: `Signs, with this node's (a validator's) key, its vote on APPELLANT's appeal of
the settlement of JOB: --overturn if the refusal was wrong (the appellant is to
be paid), --uphold if it stands. Only the referees the appeal drew vote, once
each, before its deadline; the first side a majority takes decides it, and the
majority is paid the bond. 'deepmarket ledger appeal' prints the referees. A
validator's node votes by itself on the cases that drew it, once it has
recomputed the refusal from the appeal's evidence; this command is the same by
hand (a vote given twice is refused).`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 2 {
				return usageError{fmt.Errorf("%s takes a job ID and the appellant's address", cmd.CommandPath())}
			}
			if err := jobArg(args); err != nil {
				return err
			}
			if _, err := identity.ParseAddress(args[1]); err != nil {
				return usageError{fmt.Errorf("appellant: %v (addresses look like dm1...)", err)}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if overturn == uphold {
				return usageError{errors.New("say --overturn or --uphold")}
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 60*time.Second)
			defer cancel()
			res, err := c.signed(ctx, rpc, func(cl *ledger.Client) (*ctypes.ResultTx, error) {
				return cl.Verdict(ctx, args[0], args[1], overturn)
			})
			if err != nil {
				return fmt.Errorf("verdict %w", err)
			}
			fmt.Fprintf(c.out, "Voted (tx %s, height %d).\n", res.Hash, res.Height)
			switch attr(res, "verdict") {
			case ledger.VerdictOverturned:
				fmt.Fprintln(c.out, "The appeal is decided: overturned, the appellant is paid.")
			case ledger.VerdictUpheld:
				fmt.Fprintln(c.out, "The appeal is decided: upheld, the referees take the bond.")
			default:
				fmt.Fprintln(c.out, "Waiting for the other referees.")
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&overturn, "overturn", false, "the refusal was wrong: pay the appellant")
	f.BoolVar(&uphold, "uphold", false, "the refusal stands")
	f.StringVar(&rpc, "rpc", "", "override this node's ledger RPC, e.g. http://127.0.0.1:7703")
	return cmd
}

// attr is the value of key in a committed transaction's ledger event.
func attr(res *ctypes.ResultTx, key string) string {
	return ledger.ParseEvent(res.TxResult.Events).Get(key)
}
