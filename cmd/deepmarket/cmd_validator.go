package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	cmted "github.com/cometbft/cometbft/crypto/ed25519"
	cmtp2p "github.com/cometbft/cometbft/p2p"
	rpchttp "github.com/cometbft/cometbft/rpc/client/http"
	"github.com/spf13/cobra"

	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node"
)

// The validator commands talk to CometBFT's RPC ([ledger] rpc_listen)
// directly, as `ledger audit` does, rather than through the node's API:
// reading the set needs no key, and a vote is signed here with the node key
// from the home directory, the key CometBFT validates with.

// ledgerRPC is the URL of the home's ledger RPC, or rpc if given, and the
// home's config (zero when rpc is given and there is no home).
func (c *cli) ledgerRPC(rpc string) (string, node.Config, error) {
	h := c.home()
	if err := h.Check(); err != nil {
		if rpc != "" {
			return rpc, node.Config{}, nil
		}
		return "", node.Config{}, fmt.Errorf("%w (or pass --rpc http://HOST:PORT)", err)
	}
	cfg, err := node.LoadConfig(h.ConfigPath())
	if err != nil {
		return "", cfg, err
	}
	if rpc != "" {
		return rpc, cfg, nil
	}
	addr := strings.TrimPrefix(cfg.Ledger.RPCListen, "tcp://")
	if host, port, err := net.SplitHostPort(addr); err == nil && (host == "" || net.ParseIP(host).IsUnspecified()) {
		addr = net.JoinHostPort("127.0.0.1", port)
	}
	return "http://" + addr, cfg, nil
}

func newValidatorsCmd(c *cli) *cobra.Command {
	var asJSON bool
	var rpc string
	cmd := &cobra.Command{
		Use:   "validators",
		Short: "List the ledger's validators and the changes voted on but not carried",
		Long: `Lists the validator set as the ledger holds it after the last block (CometBFT
applies a change two blocks after the one that carried it), and each pending
change with the power of the validators who voted for it and the power it
needs: more than 2/3 of the total. Reads this node's ledger RPC ([ledger]
rpc_listen), or any node's with --rpc.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			url, _, err := c.ledgerRPC(rpc)
			if err != nil {
				return err
			}
			cl, err := rpchttp.New(url, "/websocket")
			if err != nil {
				return fmt.Errorf("ledger RPC %s: %w", url, err)
			}
			ctx, cancel := timeout(cmd.Context())
			defer cancel()
			set, err := ledger.ReadValidators(ctx, cl)
			if err != nil {
				return fmt.Errorf("%w (is a node's ledger RPC listening at %s?)", err, url)
			}
			if asJSON {
				return c.printJSON(set)
			}
			c.printValidators(set)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON (keys in base64)")
	cmd.Flags().StringVar(&rpc, "rpc", "", "CometBFT RPC of any node, e.g. http://10.0.0.5:7703")
	return cmd
}

func (c *cli) printValidators(set *ledger.ValidatorSet) {
	names := map[string]string{}
	fmt.Fprintf(c.out, "%d validators at height %d, total power %d; a change needs more than 2/3: %d\n",
		len(set.Validators), set.Height, set.TotalPower, ledger.PowerNeeded(set.TotalPower))
	var rows [][]string
	for _, v := range set.Validators {
		names[v.Account] = v.Name
		rows = append(rows, []string{orDash(v.Name), strconv.FormatInt(v.Power, 10), base64.StdEncoding.EncodeToString(v.PubKey), v.Account})
	}
	c.table("NAME\tPOWER\tVALIDATOR PUBKEY\tACCOUNT", rows)
	if len(set.Proposals) == 0 {
		fmt.Fprintln(c.out, "\nNo changes pending.")
		return
	}
	fmt.Fprintln(c.out, "\nPending changes:")
	rows = nil
	for _, p := range set.Proposals {
		var voters []string
		for _, v := range p.Voters {
			if n := names[v]; n != "" {
				v = n
			}
			voters = append(voters, v)
		}
		change := fmt.Sprintf("%d -> %d", p.Current, p.Power)
		if p.Power == 0 {
			change = fmt.Sprintf("remove (%d)", p.Current)
		}
		rows = append(rows, []string{orDash(p.Name), base64.StdEncoding.EncodeToString(p.PubKey), change,
			fmt.Sprintf("%d/%d", p.VotePower, p.Needed), strings.Join(voters, ",")})
	}
	c.table("NAME\tVALIDATOR PUBKEY\tPOWER\tVOTES/NEEDED\tVOTED", rows)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func newValidatorCmd(c *cli) *cobra.Command {
	cmd := &cobra.Command{Use: "validator", Short: "Vote on the validator set (validators only)"}
	var power int64
	var name, rpc string
	var asJSON bool
	vote := &cobra.Command{
		Use:   "vote PUBKEY --power N [--name NAME]",
		Short: "Vote, as a validator, to add a validator, change its power or remove it",
		Long: `Signs, with this node's key, a vote that the validator with key PUBKEY have
power N (0 removes it; at most 1000000), and waits until it commits. The
change is made once validators holding more than 2/3 of the total power have
voted for it; CometBFT applies it two blocks later. Only current validators
vote. Voting again for another power moves your vote; voting for the power the
key has withdraws it.

PUBKEY is the new node's ed25519 public key, in base64 (the validator_pubkey
that 'deepmarket keys show' prints on that node) or as 64 hex digits.

A university becomes a validator in three steps: it joins as a full node
(deepmarket init --genesis ...; deepmarket node run) and waits until its
ledger has caught up; it sends its validator_pubkey to the validators; enough
of them run this command. Once the others hold 2/3 of the power or less, no
block commits without the new validator: the command warns when a change
would do that.`,
		Example: `  deepmarket ledger validator vote Goi1mkI/Q1Wt053L8X3j/atWfKhRduG/Fd5lIp8M7jk= --power 10 --name psu
  deepmarket ledger validator vote 1a88b59a423f4355add39dcbf17de3fdab567ca85176e1bf15de65229f0cee39 --power 0`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError{fmt.Errorf("%s takes one validator key (base64 or hex)", cmd.CommandPath())}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			pub, err := ledger.ParseValidatorKey(args[0])
			if err != nil {
				return usageError{fmt.Errorf("%v (run 'deepmarket keys show' on the new node: its validator_pubkey)", err)}
			}
			if !cmd.Flags().Changed("power") {
				return usageError{fmt.Errorf("--power is required: the validator's new power, 0 to remove it")}
			}
			if power < 0 || power > ledger.MaxValidatorPower {
				return usageError{fmt.Errorf("--power %d: want 0 (remove) to %d", power, ledger.MaxValidatorPower)}
			}
			if err := c.home().Check(); err != nil {
				return err
			}
			key, err := c.home().LoadKey()
			if err != nil {
				return err
			}
			url, cfg, err := c.ledgerRPC(rpc)
			if err != nil {
				return err
			}
			rc, err := rpchttp.New(url, "/websocket")
			if err != nil {
				return fmt.Errorf("ledger RPC %s: %w", url, err)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 60*time.Second)
			defer cancel()
			cl := ledger.NewClient(rc, key, cfg.Node.ChainID)
			if set, err := cl.Validators(ctx); err == nil {
				c.warnIfChainWouldWait(ctx, rc, set, pub, power)
			}
			res, err := cl.VoteValidator(ctx, pub, power, name)
			if err != nil {
				var lerr *ledger.Error
				switch {
				// The reason CometBFT relays already starts with the code.
				case errors.As(err, &lerr) && lerr.Code == ledger.CodeNotValidator:
					return fmt.Errorf("vote rejected: %s (this node's validator_pubkey is %s; see 'deepmarket ledger validators')",
						lerr.Reason, base64.StdEncoding.EncodeToString(key.Public()))
				case errors.As(err, &lerr) && lerr.Code == ledger.CodeBadNonce:
					return fmt.Errorf("vote rejected: %s (the node is sending its own transactions with this key: try again)", lerr.Reason)
				case errors.As(err, &lerr):
					return fmt.Errorf("vote rejected: %s", lerr.Reason)
				}
				return fmt.Errorf("vote: %w (is this node's ledger RPC listening at %s?)", err, url)
			}
			target := base64.StdEncoding.EncodeToString(pub)
			ev := ledger.ParseEvent(res.TxResult.Events)
			carried := slices.ContainsFunc(ev.All("carried"), func(v string) bool { return strings.HasPrefix(v, target+"=") })
			withdrawn := ev.Get("withdrawn") != ""
			set, err := cl.Validators(ctx)
			if err != nil {
				return err
			}
			if asJSON {
				return c.printJSON(struct {
					Hash       string               `json:"hash"`
					Height     int64                `json:"height"`
					Carried    bool                 `json:"carried"`
					Validators *ledger.ValidatorSet `json:"validators"`
				}{res.Hash.String(), res.Height, carried, set})
			}
			if withdrawn {
				fmt.Fprintf(c.out, "Withdrew your pending vote on %s, which has power %d (tx %s, height %d).\n", target, power, res.Hash, res.Height)
				return nil
			}
			fmt.Fprintf(c.out, "Voted that %s have power %d (tx %s, height %d).\n", target, power, res.Hash, res.Height)
			switch {
			case carried:
				fmt.Fprintf(c.out, "The change carried: the ledger's set has it, and CometBFT's from height %d.\n", res.Height+2)
			default:
				for _, p := range set.Proposals {
					if p.Power == power && base64.StdEncoding.EncodeToString(p.PubKey) == target {
						fmt.Fprintf(c.out, "Votes for it hold %d of the %d power it needs; waiting for more validators.\n", p.VotePower, p.Needed)
					}
				}
			}
			return nil
		},
	}
	f := vote.Flags()
	f.Int64Var(&power, "power", 0, "the validator's new voting power: 0 removes it (required)")
	f.StringVar(&name, "name", "", "a new validator's name, e.g. its university (at most 64 bytes)")
	f.StringVar(&rpc, "rpc", "", "override this node's ledger RPC, e.g. http://127.0.0.1:7703")
	f.BoolVar(&asJSON, "json", false, "print the result and the set as JSON")
	cmd.AddCommand(vote)
	return cmd
}

// warnIfChainWouldWait warns when the change would leave the other
// validators with 2/3 of the power or less: from then on no block commits
// without the validator's signature, so its node had better be running.
// Its ledger node ID comes from the same key; being this node's peer shows
// it runs.
func (c *cli) warnIfChainWouldWait(ctx context.Context, rc *rpchttp.HTTP, set *ledger.ValidatorSet, pub ed25519.PublicKey, power int64) {
	var cur int64
	for _, v := range set.Validators {
		if bytes.Equal(v.PubKey, pub) {
			cur = v.Power
		}
	}
	others := set.TotalPower - cur
	if power <= cur || 3*others > 2*(others+power) {
		return
	}
	id := cmtp2p.PubKeyToID(cmted.PubKey(pub))
	peer := "is not among this node's ledger peers"
	if ni, err := rc.NetInfo(ctx); err == nil {
		for _, p := range ni.Peers {
			if p.NodeInfo.ID() == id {
				peer = "is this node's ledger peer"
			}
		}
	}
	fmt.Fprintf(os.Stderr, "warning: with power %d the others hold %d of %d, not more than 2/3: once the change carries, no block\n"+
		"commits unless this validator signs. Its ledger node (ID %s) %s; make sure it runs and has caught up.\n",
		power, others, others+power, id, peer)
}
