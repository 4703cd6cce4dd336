package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	rpchttp "github.com/cometbft/cometbft/rpc/client/http"
	cmttypes "github.com/cometbft/cometbft/types"
	"github.com/spf13/cobra"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node"
	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/units"
)

func newLedgerCmd(c *cli) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ledger",
		Short: "Credits: balances, history, transfers, grants, members, machine links, and the audit",
		Long: `The credit ledger is replicated by every node (CometBFT). Amounts are in
credits with up to six decimals (1 credit = 1,000,000 micro-credits); --json
prints integers in micro-credits.`,
	}
	cmd.AddCommand(newBalanceCmd(c), newHistoryCmd(c), newRecordCmd(c), newSendCmd(c, ledger.TypeTransfer), newSendCmd(c, ledger.TypeGrant),
		newAdmitCmd(c), newConsentCmd(c), newLinkCmd(c), newTxCmd(c), newAuditCmd(c),
		newValidatorsCmd(c), newValidatorCmd(c), newAppealCmd(c), newVerdictCmd(c))
	return cmd
}

// addressArg accepts at most one argument, a well-formed address.
func addressArg(cmd *cobra.Command, args []string) error {
	if len(args) > 1 {
		return usageError{fmt.Errorf("%s takes at most one address", cmd.CommandPath())}
	}
	if len(args) == 1 {
		if _, err := identity.ParseAddress(args[0]); err != nil {
			return usageError{fmt.Errorf("%v (addresses look like dm1...)", err)}
		}
	}
	return nil
}

func firstOr(args []string) string {
	if len(args) == 0 {
		return ""
	}
	return args[0]
}

func newBalanceCmd(c *cli) *cobra.Command {
	cmd := &cobra.Command{Use: "balance [ADDR]", Short: "Show an account's balance (default: this node's)", Args: addressArg}
	return showCmd(c, cmd, func(ctx context.Context, cl *api.Client, args []string) (api.Balance, error) {
		return cl.Balance(ctx, firstOr(args))
	}, func(b api.Balance) error {
		fmt.Fprintf(c.out, "%s  %s credits  (at height %d)\n", b.Address, units.FormatCredits(b.Balance), b.Height)
		return nil
	})
}

func newRecordCmd(c *cli) *cobra.Command {
	cmd := &cobra.Command{Use: "record [ADDR]", Short: "Show an account's track records as a payer and as a machine (default: this node's)",
		Long: `A payer's record counts its escrows that closed, what its own settlements paid
against what it owed (the rest its machines had to lodge receipts for), the
failed marks it gave and how many were disputed, and the rounds of its held jobs
its holders refused. Lenders may refuse a payer by it ([lend] min_payer_paid).
A machine's record counts its paid work completed and failed, what it earned,
and its rounds refused (a statistic of its own: a refusal is not a failure).`,
		Args: addressArg}
	return showCmd(c, cmd, func(ctx context.Context, cl *api.Client, args []string) (api.Record, error) {
		return cl.Record(ctx, firstOr(args))
	}, func(r api.Record) error {
		fmt.Fprintf(c.out, "%s  (at height %d)\n", r.Address, r.Height)
		fmt.Fprintf(c.out, "  as a payer:   %s\n", payerLine(r.Payer))
		m := r.Machine
		fmt.Fprintf(c.out, "  as a machine: %d completed, %d failed, earned %s credits; %s\n",
			m.Completed, m.Failed, units.FormatCredits(m.Earned), refusedLine(m.Refused, m.Rounds))
		return nil
	})
}

// payerLine is a payer's record in words.
func payerLine(p ledger.PayerRecord) string {
	if p.Closed == 0 && p.Rounds == 0 {
		return "no escrow closed yet"
	}
	paid := "paid all it owed"
	if p.Owed > 0 && p.Paid < p.Owed {
		paid = fmt.Sprintf("paid %.1f%% of the %s credits it owed", 100*float64(p.Paid)/float64(p.Owed), units.FormatCredits(p.Owed))
	}
	line := fmt.Sprintf("%s closed, %s; %s given (%d disputed); %s",
		units.Count(int(min(p.Closed, 1<<31)), "escrow", "escrows"), paid, units.Count(int(min(p.Marks, 1<<31)), "failed mark", "failed marks"),
		p.Disputed, refusedLine(p.Refused, p.Rounds))
	if p.AppealsLost > 0 {
		line += fmt.Sprintf("; %s lost to referees", units.Count(int(min(p.AppealsLost, 1<<31)), "appeal", "appeals"))
	}
	return line
}

// refusedLine is how many held rounds were refused of how many.
func refusedLine(refused, rounds uint64) string {
	if rounds == 0 {
		return "no held rounds"
	}
	return fmt.Sprintf("%d of %d held rounds refused (%.1f%%)", refused, rounds, 100*float64(refused)/float64(rounds))
}

func newHistoryCmd(c *cli) *cobra.Command {
	var limit int
	cmd := &cobra.Command{Use: "history [ADDR]", Short: "List what moved credits for an account, newest first", Args: addressArg}
	cmd.Flags().IntVar(&limit, "limit", 50, "how many transactions at most")
	var who string // the account whose history this is
	return showCmd(c, cmd, func(ctx context.Context, cl *api.Client, args []string) ([]ledger.HistoryEntry, error) {
		who = firstOr(args)
		if who == "" {
			st, err := cl.Status(ctx)
			if err != nil {
				return nil, err
			}
			who = st.Account
		}
		return cl.History(ctx, who, limit)
	}, func(h []ledger.HistoryEntry) error {
		if len(h) == 0 {
			fmt.Fprintln(c.out, "No transactions yet.")
			return nil
		}
		var rows [][]string
		for _, e := range h {
			detail := []string{}
			for _, k := range []string{"from", "to", "job", "memo"} {
				if v := e.Attrs[k]; v != "" {
					if k == "job" && len(v) > 12 {
						v = v[:12]
					}
					detail = append(detail, k+"="+v)
				}
			}
			amount := e.Attrs["amount"]
			sign := historySign(e, who)
			if e.Type == "settle" {
				// What the settlement moved for this account: its pay as a
				// machine, or its refund as the payer.
				amount = ""
				for _, p := range e.Paid {
					if a, v, ok := strings.Cut(p, "="); ok && a == who {
						amount = v
					}
				}
				if amount == "" && e.Attrs["from"] == who {
					amount = e.Attrs["refund"]
					detail = append(detail, "(refund)")
				}
			} else if amount == "" {
				amount = e.Attrs["refund"]
			}
			if amount != "" {
				v, _ := strconv.ParseUint(amount, 10, 64)
				amount = units.FormatCredits(v)
				if v > 0 {
					amount = sign + amount
				}
			}
			for _, p := range e.Paid { // machine=micro-credits, shown in credits like the column
				if a, v, ok := strings.Cut(p, "="); ok {
					if n, err := strconv.ParseUint(v, 10, 64); err == nil {
						p = "paid " + a + " " + units.FormatCredits(n)
					}
				}
				detail = append(detail, p)
			}
			rows = append(rows, []string{strconv.FormatInt(e.Height, 10), e.Type, amount, strings.Join(detail, " ")})
		}
		c.table("HEIGHT\tTYPE\tCREDITS (+ in, - out)\tDETAILS", rows)
		return nil
	})
}

// historySign is which way a transaction moved credits for account who:
// "+" in, "-" out, "" neither (a grant its issuer made: minted, not paid).
func historySign(e ledger.HistoryEntry, who string) string {
	switch e.Type {
	case ledger.TypeTransfer:
		if e.Attrs["from"] == who && e.Attrs["to"] != who {
			return "-"
		}
		if e.Attrs["to"] == who && e.Attrs["from"] != who {
			return "+"
		}
	case ledger.TypeGrant, ledger.TypeClaim:
		if e.Attrs["to"] == who {
			return "+"
		}
		if e.Type == ledger.TypeClaim && e.Attrs["from"] == who {
			return "-" // a receipt lodged against this payer's settlement: out of its refund
		}
	case ledger.TypeOpenEscrow:
		if e.Attrs["from"] == who {
			return "-"
		}
	case ledger.TypeSettle, ledger.TypeExpire: // pay to a machine, the rest back to the payer
		return "+"
	}
	return ""
}

// outcomeUnknown is a send whose outcome the CLI cannot know: the
// transaction may have committed, or may still.
type outcomeUnknown struct{ hash, why string }

func (e outcomeUnknown) Error() string {
	if e.hash == "" {
		return fmt.Sprintf("outcome unknown: the node stopped before naming the transaction (%s); check with `deepmarket ledger history`", e.why)
	}
	return fmt.Sprintf("outcome unknown: transaction %s; check with `deepmarket ledger tx %s`", e.hash, e.hash)
}

func (e outcomeUnknown) Is(target error) bool { return target == ledger.ErrUnknownOutcome }

const sendExitStatus = `
Exit status: 0 committed; 1 rejected by the ledger (it never took effect) or
not sent; 2 bad command line; 3 outcome unknown (the node stopped or did not
see the commit in time): the transaction may still commit, and the message
names it: check with ` + "`deepmarket ledger tx HASH`" + `.`

func newSendCmd(c *cli, kind string) *cobra.Command {
	var asJSON bool
	var memo string
	use, short := "transfer ADDR AMOUNT", "Send credits to another account"
	long := "Signs a transfer with this node's account, sends it and waits for its block."
	if kind == ledger.TypeGrant {
		use, short = "grant ADDR AMOUNT", "Issue new credits to a member (issuers only, within quota)"
		long = "Signs a grant with this node's account (an issuer), sends it and waits for its block. The recipient\nbecomes a member."
	}
	cmd := &cobra.Command{
		Use: use, Short: short, Args: cobra.ExactArgs(2), Long: long + "\n" + sendExitStatus,
		Example: "  deepmarket ledger " + strings.Fields(use)[0] + " dm1qje8qcjtdsz9a3aq2e7kv3wgwrkapzlunwqgpu 12.5",
		RunE: func(cmd *cobra.Command, args []string) error {
			to, err := identity.ParseAddress(args[0])
			if err != nil {
				return usageError{fmt.Errorf("%v (addresses look like dm1...)", err)}
			}
			amount, err := units.ParseCredits(args[1])
			if err != nil {
				return usageError{err}
			}
			if amount == 0 {
				return usageError{fmt.Errorf("amount must be more than 0")}
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 60*time.Second)
			defer cancel()
			if kind == ledger.TypeTransfer { // say so before sending anything
				b, err := cl.Balance(ctx, "")
				if err != nil {
					return err
				}
				if b.Balance < amount {
					return fmt.Errorf("cannot send %s credits: your balance is %s", units.FormatCredits(amount), units.FormatCredits(b.Balance))
				}
			}
			return c.send(ctx, cl, api.SendRequest{Kind: kind, To: string(to), Amount: amount, Memo: memo}, kind, asJSON, func(res api.SendResult) {
				fmt.Fprintf(c.out, "Sent %s credits to %s (tx %s, height %d)\n", units.FormatCredits(amount), to, res.Hash, res.Height)
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	if kind == ledger.TypeTransfer {
		cmd.Flags().StringVar(&memo, "memo", "", "a note stored with the transfer (at most 256 bytes)")
	}
	return cmd
}

func newTxCmd(c *cli) *cobra.Command {
	var asJSON bool
	var rpc string
	cmd := &cobra.Command{
		Use:   "tx HASH",
		Short: "Tell what became of a transaction: committed, failed, refused, pending, dropped or unknown",
		Long: `Asks this node what became of a transaction (the hash transfer and grant print).
committed: in a block, it took effect. failed: in a block, the ledger refused it
there. refused: the ledger refused it before any block. pending: in the node's
mempool. dropped: never committed, and its signer's nonce moved past it, so it
never can be. unknown: not seen; it may still arrive (ask again).
Refused and dropped are known for this node's own transactions; with --rpc,
any node tells committed, failed and pending.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError{fmt.Errorf("%s takes one transaction hash", cmd.CommandPath())}
			}
			if raw, err := hex.DecodeString(args[0]); err != nil || len(raw) != 32 {
				return usageError{fmt.Errorf("%q is not a transaction hash (64 hex digits)", args[0])}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := timeout(cmd.Context())
			defer cancel()
			var st ledger.TxStatus
			var err error
			if rpc != "" {
				cl, herr := rpchttp.New(rpc, "/websocket")
				if herr != nil {
					return usageError{fmt.Errorf("--rpc: %w", herr)}
				}
				st, err = ledger.ReadTxStatus(ctx, cl, args[0])
			} else {
				cl, cerr := c.client()
				if cerr != nil {
					return cerr
				}
				st, err = cl.TxStatus(ctx, strings.ToUpper(args[0]))
			}
			if err != nil {
				return err
			}
			if asJSON {
				return c.printJSON(st)
			}
			fmt.Fprintln(c.out, describeTx(st))
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	cmd.Flags().StringVar(&rpc, "rpc", "", "ask this CometBFT RPC instead of this node, e.g. http://10.0.0.5:7703")
	return cmd
}

func describeTx(st ledger.TxStatus) string {
	switch st.State {
	case ledger.TxCommitted:
		return fmt.Sprintf("transaction %s: committed at height %d", st.Hash, st.Height)
	case ledger.TxFailed:
		return fmt.Sprintf("transaction %s: failed in block %d (ledger code %d: %s); it took no effect", st.Hash, st.Height, st.Code, st.Reason)
	case ledger.TxRefused:
		return fmt.Sprintf("transaction %s: refused by the ledger (code %d: %s); it took no effect", st.Hash, st.Code, st.Reason)
	case ledger.TxPending:
		return fmt.Sprintf("transaction %s: pending in the node's mempool", st.Hash)
	case ledger.TxDropped:
		return fmt.Sprintf("transaction %s: dropped (%s); it took no effect", st.Hash, st.Reason)
	}
	return fmt.Sprintf("transaction %s: unknown (%s); ask again", st.Hash, st.Reason)
}

func newAuditCmd(c *cli) *cobra.Command {
	var asJSON, trustServed bool
	var rpc, genesis string
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Replay the whole chain from genesis and prove the books balance",
		Long: `A light client of the chain: starting from a genesis, it tracks the validator
set and checks that more than 2/3 of it signed every block's commit, fetches
every block over CometBFT RPC, re-executes each in a fresh ledger, compares the
app hash after every block with the one the chain committed to, checks every
invariant (supply = balances + escrowed, nothing negative), and prints supply,
balances, escrowed and each account's flows. Exits non-zero on any mismatch.

The genesis is --genesis FILE; without it, this node's genesis.json when
auditing this node. Auditing another node (--rpc) without --genesis replays
from the genesis that node serves, which proves only that its chain agrees
with a genesis it chose (a fork with the same chain ID passes): the audit says
which genesis it trusted (and its sha256) and fails, unless
--trust-served-genesis accepts it. Pin the genesis you trust with --genesis.
Works from any machine against any node's RPC (--rpc); without it, reads this
node's ledger RPC ([ledger] rpc_listen).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			opts := ledger.AuditOptions{TrustServedGenesis: trustServed}
			if genesis != "" {
				doc, err := cmttypes.GenesisDocFromFile(genesis)
				if err != nil {
					return usageError{fmt.Errorf("--genesis: %w", err)}
				}
				opts.Genesis, opts.GenesisSource = doc, genesis
			}
			if rpc == "" {
				h := c.home()
				if err := h.Check(); err != nil {
					return fmt.Errorf("%w (or pass --rpc http://HOST:PORT)", err)
				}
				cfg, err := node.LoadConfig(h.ConfigPath())
				if err != nil {
					return err
				}
				rpc = "http://" + strings.TrimPrefix(cfg.Ledger.RPCListen, "tcp://")
				if opts.Genesis == nil {
					doc, err := cmttypes.GenesisDocFromFile(h.GenesisPath())
					if err != nil {
						return fmt.Errorf("read genesis: %w", err)
					}
					opts.Genesis, opts.GenesisSource = doc, h.GenesisPath()
				}
			}
			if !asJSON {
				last := time.Now()
				opts.Progress = func(h, latest int64) {
					if time.Since(last) > 500*time.Millisecond || h == latest {
						fmt.Fprintf(os.Stderr, "\rreplayed %d/%d blocks", h, latest)
						last = time.Now()
					}
				}
			}
			rep, err := ledger.Audit(cmd.Context(), rpc, opts)
			if opts.Progress != nil {
				fmt.Fprintln(os.Stderr)
			}
			if err != nil {
				return fmt.Errorf("%w (is a node's ledger RPC listening at %s?)", err, rpc)
			}
			if asJSON {
				if err := c.printJSON(rep); err != nil {
					return err
				}
			} else {
				status := "OK"
				if !rep.OK {
					status = "FAILED"
				}
				fmt.Fprintf(c.out, "audit %s: chain %s, height %d, %d transactions replayed (%d accepted), %d commits verified\n",
					status, rep.ChainID, rep.Height, rep.Txs, rep.TxsOK, rep.Commits)
				problems := rep.Problems
				if rep.Pinned {
					fmt.Fprintf(c.out, "genesis: %s (sha256 %s)\n", rep.Genesis, rep.GenesisHash)
				} else {
					fmt.Fprintf(c.out, "genesis: trusted the genesis served by %s (sha256 %s): pass --genesis FILE to check against your own\n", rpc, rep.GenesisHash)
					if !trustServed {
						problems = problems[1:] // the first problem says so: said above
					}
				}
				fmt.Fprintf(c.out, "supply %s = balances %s + escrowed %s + staked %s credits\n", units.FormatCredits(rep.Supply),
					units.FormatCredits(rep.Balances), units.FormatCredits(rep.Escrowed), units.FormatCredits(rep.Staked))
				if rep.Burned > 0 {
					fmt.Fprintf(c.out, "burned %s credits: withheld for refused rounds\n", units.FormatCredits(rep.Burned))
				}
				var rows [][]string
				for _, a := range rep.Accounts {
					rows = append(rows, []string{a.Address, units.FormatCredits(a.Balance), units.FormatCredits(a.In), units.FormatCredits(a.Out)})
				}
				if len(rows) > 0 {
					c.table("ACCOUNT\tBALANCE\tIN\tOUT", rows)
				}
				for _, p := range problems {
					fmt.Fprintln(c.out, "problem:", p)
				}
			}
			switch {
			case !rep.Pinned && !trustServed && len(rep.Problems) == 1:
				return fmt.Errorf("the genesis was not pinned: audit against the genesis you trust with --genesis FILE, " +
					"or accept the one the node serves with --trust-served-genesis")
			case !rep.OK:
				return fmt.Errorf("audit found %d problems", len(rep.Problems))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	cmd.Flags().StringVar(&rpc, "rpc", "", "CometBFT RPC of any node, e.g. http://10.0.0.5:7703")
	cmd.Flags().StringVar(&genesis, "genesis", "", "the genesis.json to start from (pins the chain; default: this node's; with --rpc, required unless --trust-served-genesis)")
	cmd.Flags().BoolVar(&trustServed, "trust-served-genesis", false, "with --rpc and no --genesis, accept the genesis the node serves (a fork with the same chain ID passes)")
	return cmd
}

// send sends req through the node and reports its outcome: done on a
// commit, "rejected" only when the ledger refused it, "outcome unknown"
// (exit 3, with the hash) when nobody can tell yet.
func (c *cli) send(ctx context.Context, cl *api.Client, req api.SendRequest, what string, asJSON bool, done func(api.SendResult)) error {
	hash := ""
	res, err := cl.SendStream(ctx, req, func(p api.SendPrepared) { hash = p.Hash })
	var unknown *ledger.UnknownOutcomeError
	var apiErr *api.Error
	switch {
	case errors.As(err, &unknown):
		if unknown.Hash != "" {
			hash = unknown.Hash
		}
		if asJSON {
			c.printJSON(map[string]string{"hash": hash, "outcome": api.OutcomeUnknown})
		}
		return outcomeUnknown{hash: hash, why: unknown.Reason}
	case hash != "" && errors.Is(err, context.DeadlineExceeded):
		return outcomeUnknown{hash: hash, why: "no answer in time"}
	case errors.As(err, &apiErr) && apiErr.Code != 0:
		if hash != "" {
			return fmt.Errorf("%s rejected: %w (transaction %s; it never took effect)", what, err, hash)
		}
		return fmt.Errorf("%s rejected: %w", what, err)
	case err != nil:
		return fmt.Errorf("%s not made: %w", what, err)
	}
	if asJSON {
		return c.printJSON(res)
	}
	done(res)
	return nil
}

func newAdmitCmd(c *cli) *cobra.Command {
	var asJSON, revoke bool
	cmd := &cobra.Command{
		Use:   "admit ADDR",
		Short: "Admit an account as a member (issuers only): its machines' offers count, its bids are heard",
		Long: `Signs an admission with this node's account, which must be an issuer of the
network (a university), sends it and waits for its block. Members' machines
are placed on and paid; offers of machines no member backs are ignored.
A grant admits its recipient too. --revoke ends a membership this issuer
granted.
` + sendExitStatus,
		Example: "  deepmarket ledger admit dm1qje8qcjtdsz9a3aq2e7kv3wgwrkapzlunwqgpu\n" +
			"  deepmarket ledger admit --revoke dm1qje8qcjtdsz9a3aq2e7kv3wgwrkapzlunwqgpu",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			to, err := identity.ParseAddress(args[0])
			if err != nil {
				return usageError{fmt.Errorf("%v (addresses look like dm1...)", err)}
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 60*time.Second)
			defer cancel()
			kind, did := ledger.TypeAdmit, "Admitted"
			if revoke {
				kind, did = "revoke", "Revoked the membership of"
			}
			return c.send(ctx, cl, api.SendRequest{Kind: kind, To: string(to)}, kind, asJSON, func(res api.SendResult) {
				fmt.Fprintf(c.out, "%s %s (tx %s, height %d)\n", did, to, res.Hash, res.Height)
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	cmd.Flags().BoolVar(&revoke, "revoke", false, "end the membership instead")
	return cmd
}

func newConsentCmd(c *cli) *cobra.Command {
	var asJSON bool
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "consent OWNER",
		Short: "On a machine: sign its consent to earn into OWNER's account (step 1 of linking)",
		Long: `Signs, with this machine's key, its consent to earn into OWNER's member
account, and prints a token. Run ` + "`deepmarket ledger link TOKEN`" + ` on OWNER's node
within --ttl to link the machine: then its offers count as OWNER's, and what
it earns goes there. A consent names the machine's link as it is now, so it
works once and cannot be replayed after the link changes.`,
		Example: "  deepmarket ledger consent dm1qje8qcjtdsz9a3aq2e7kv3wgwrkapzlunwqgpu",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			owner, err := identity.ParseAddress(args[0])
			if err != nil {
				return usageError{fmt.Errorf("%v (addresses look like dm1...)", err)}
			}
			if ttl < time.Second || ttl > node.MaxConsentTTL*time.Second {
				return usageError{fmt.Errorf("--ttl %s: want 1s to %s", ttl, node.MaxConsentTTL*time.Second)}
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			res, err := cl.Consent(ctx, api.ConsentRequest{Owner: string(owner), TTLSeconds: int(ttl / time.Second)})
			if err != nil {
				return err
			}
			if asJSON {
				return c.printJSON(res)
			}
			fmt.Fprintf(c.out, "This machine (%s) consents to earn into %s until %s.\nOn the owner's node, run:\n\n  deepmarket ledger link %s\n",
				res.Machine, res.Owner, time.Unix(res.Expires, 0).Format(time.DateTime), res.Token)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	cmd.Flags().DurationVar(&ttl, "ttl", node.DefaultConsentTTL*time.Second, "how long the consent is good for (at most 59m)")
	return cmd
}

func newLinkCmd(c *cli) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "link TOKEN",
		Short: "On the owner's node: link a machine that consented (step 2 of linking)",
		Long: `Sends, signed by this node's member account, the link a machine consented to
with ` + "`deepmarket ledger consent`" + `: the machine is then registered under this
account, its offers count, and what it earns is paid here.
` + sendExitStatus,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.client()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 60*time.Second)
			defer cancel()
			return c.send(ctx, cl, api.SendRequest{Kind: "link", Consent: args[0]}, "link", asJSON, func(res api.SendResult) {
				fmt.Fprintf(c.out, "Linked the machine to this account (tx %s, height %d)\n", res.Hash, res.Height)
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	return cmd
}
