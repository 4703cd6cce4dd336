package node

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	cfg "github.com/cometbft/cometbft/config"
	cmttypes "github.com/cometbft/cometbft/types"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/api"
)

// startLedger opens the ledger's state and starts this node's CometBFT
// replica of the chain in genesis.json.
func (n *Node) startLedger() error {
	doc, err := cmttypes.GenesisDocFromFile(n.home.GenesisPath())
	if err != nil {
		return fmt.Errorf("read genesis %s: %w", n.home.GenesisPath(), err)
	}
	if doc.ChainID != n.cfg.Node.ChainID {
		return fmt.Errorf("genesis %s is for chain %q but config.toml says chain_id %q", n.home.GenesisPath(), doc.ChainID, n.cfg.Node.ChainID)
	}
	app, err := ledger.OpenApp(n.home.LedgerDir(), n.log.With("module", "ledger"))
	if err != nil {
		return err
	}
	lc := n.cfg.Ledger
	n.chain, err = ledger.StartChain(ledger.ChainParams{
		Dir: n.home.CometDir(), Key: n.key, Genesis: doc, App: app,
		P2PListen: lc.P2PListen, RPCListen: lc.RPCListen, Peers: lc.Peers,
		Logger: n.log.With("module", "cometbft"), Metrics: true,
		Configure: func(c *cfg.Config) {
			c.Consensus.TimeoutCommit = lc.BlockTime.Duration
			c.Consensus.CreateEmptyBlocksInterval = lc.EmptyBlockInterval.Duration
		},
	})
	if err != nil {
		app.Close()
		if strings.Contains(err.Error(), "address already in use") {
			return fmt.Errorf("ledger: %w (set [ledger] p2p_listen and rpc_listen in %s)", err, n.home.ConfigPath())
		}
		return fmt.Errorf("ledger: %w", err)
	}
	n.ledgerApp = app
	n.reads = app
	var reads lenderReads = app
	n.machines.Store(&reads)
	n.ledger = ledger.NewClient(n.chain.Client(), n.key, n.cfg.Node.ChainID, ledger.WithOutbox(storeOutbox{n.store}))
	return nil
}

// storeOutbox keeps the ledger client's outbox in the node store: a node
// killed mid-transfer sends it again when it restarts, and can still say
// what became of it.
type storeOutbox struct{ s *Store }

const outboxKey = "ledger/outbox/"

func (o storeOutbox) Put(e ledger.OutboxEntry) error { return o.s.Put(outboxKey+e.Hash, &e) }
func (o storeOutbox) Delete(hash string) error       { return o.s.Delete(outboxKey + hash) }

func (o storeOutbox) List() ([]ledger.OutboxEntry, error) {
	var out []ledger.OutboxEntry
	err := o.s.Each(outboxKey, func(key string, doc []byte) error {
		var e ledger.OutboxEntry
		if err := json.Unmarshal(doc, &e); err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		out = append(out, e)
		return nil
	})
	return out, err
}

func (n *Node) stopLedger() {
	if err := n.chain.Stop(); err != nil {
		n.log.Warn("stop ledger", "err", err)
	}
	n.ledgerApp.Close()
}

// ledgerError turns a ledger rejection into an API error the CLI can show,
// and an unknown outcome into one that says so and names the transaction.
func ledgerError(err error) error {
	var lerr *ledger.Error
	var unknown *ledger.UnknownOutcomeError
	switch {
	case errors.As(err, &unknown):
		return &api.Error{Status: http.StatusGatewayTimeout, Message: err.Error(), Hash: unknown.Hash, Outcome: api.OutcomeUnknown}
	case errors.As(err, &lerr):
		return &api.Error{Status: http.StatusUnprocessableEntity, Code: lerr.Code, Message: lerr.Reason}
	case errors.Is(err, ledger.ErrNotSent):
		return &api.Error{Status: http.StatusServiceUnavailable, Message: err.Error()}
	}
	return err
}

func (n *Node) addressOrSelf(s string) (identity.Address, error) {
	if s == "" {
		return n.key.Address(), nil
	}
	a, err := identity.ParseAddress(s)
	if err != nil {
		return "", &api.Error{Status: http.StatusBadRequest, Field: "address", Message: err.Error()}
	}
	return a, nil
}

// Balance implements api.Ledger.
func (n *Node) Balance(ctx context.Context, addr string) (api.Balance, error) {
	a, err := n.addressOrSelf(addr)
	if err != nil {
		return api.Balance{}, err
	}
	acct, err := n.ledger.Account(ctx, a)
	if err != nil {
		return api.Balance{}, ledgerError(err)
	}
	return api.Balance{Address: string(a), Balance: acct.Balance, Nonce: acct.Nonce, Height: n.chain.Height()}, nil
}

// History implements api.Ledger.
func (n *Node) History(ctx context.Context, addr string, limit int) ([]ledger.HistoryEntry, error) {
	a, err := n.addressOrSelf(addr)
	if err != nil {
		return nil, err
	}
	h, err := n.ledger.History(ctx, a, limit)
	return h, ledgerError(err)
}

// Send implements api.Ledger: a transfer, grant, admission or link signed
// by this node. It
// tells prepared the transaction's hash before sending it, then waits for
// its commit.
func (n *Node) Send(ctx context.Context, req api.SendRequest, prepared func(api.SendPrepared)) (api.SendResult, error) {
	typ, msg, err := sendMessage(req)
	if err != nil {
		return api.SendResult{}, err
	}
	var p *ledger.Prepared
	for attempt := 0; ; attempt++ {
		if p, err = n.ledger.Prepare(ctx, typ, msg); err != nil {
			return api.SendResult{}, ledgerError(err)
		}
		if prepared != nil {
			prepared(api.SendPrepared{Hash: p.Hash, Nonce: p.Nonce})
		}
		err = n.ledger.Broadcast(ctx, p)
		if err == nil {
			break
		}
		// Another client of this key (`deepmarket validator vote`, say)
		// took the nonce: the transaction can never commit, so sign again
		// with the next one, once; the caller hears the new hash.
		var lerr *ledger.Error
		if attempt == 0 && (errors.As(err, &lerr) && lerr.Code == ledger.CodeBadNonce || errors.Is(err, ledger.ErrDuplicateTx)) {
			continue
		}
		return api.SendResult{}, ledgerError(err)
	}
	wctx, cancel := context.WithTimeout(ctx, ledger.DefaultCommitTimeout)
	defer cancel()
	r, err := n.ledger.Wait(wctx, p.Hash)
	if err != nil {
		return api.SendResult{}, ledgerError(err)
	}
	return api.SendResult{Hash: p.Hash, Height: r.Height}, nil
}

// sendMessage turns a send request into the transaction it asks for.
func sendMessage(req api.SendRequest) (string, any, error) {
	bad := func(field, format string, args ...any) (string, any, error) {
		return "", nil, &api.Error{Status: http.StatusBadRequest, Field: field, Message: fmt.Sprintf(format, args...)}
	}
	if req.Kind == "link" || req.Kind == ledger.TypeLinkMachine {
		consent, err := decodeConsent(req.Consent)
		if err != nil {
			return bad("consent", "%v", err)
		}
		return ledger.TypeLinkMachine, &ledger.LinkMachine{Consent: consent}, nil
	}
	to, err := identity.ParseAddress(req.To)
	if err != nil {
		return bad("to", "%v", err)
	}
	switch req.Kind {
	case "", ledger.TypeTransfer, ledger.TypeGrant:
		if req.Amount == 0 {
			return bad("amount", "amount must be more than 0")
		}
	default:
		if req.Amount != 0 {
			return bad("amount", "a %s moves no credits", req.Kind)
		}
	}
	switch req.Kind {
	case "", ledger.TypeTransfer:
		return ledger.TypeTransfer, &ledger.Transfer{To: string(to), Amount: req.Amount, Memo: req.Memo}, nil
	case ledger.TypeGrant:
		return ledger.TypeGrant, &ledger.Grant{To: string(to), Amount: req.Amount}, nil
	case ledger.TypeAdmit:
		return ledger.TypeAdmit, &ledger.Admit{Account: string(to)}, nil
	case "revoke":
		return ledger.TypeAdmit, &ledger.Admit{Account: string(to), Revoke: true}, nil
	}
	return bad("kind", "kind %q: want transfer, grant, admit, revoke or link", req.Kind)
}

// Consent implements api.Ledger: this machine's signed consent to earn
// into req.Owner's account, for its link as the ledger has it now.
func (n *Node) Consent(ctx context.Context, req api.ConsentRequest) (api.Consent, error) {
	owner, err := identity.ParseAddress(req.Owner)
	if err != nil {
		return api.Consent{}, &api.Error{Status: http.StatusBadRequest, Field: "owner", Message: err.Error()}
	}
	ttl := req.TTLSeconds
	if ttl == 0 {
		ttl = DefaultConsentTTL
	}
	if ttl < 1 || ttl > MaxConsentTTL {
		return api.Consent{}, &api.Error{Status: http.StatusBadRequest, Field: "ttl_s",
			Message: fmt.Sprintf("a consent is good for 1 to %d seconds, not %d", MaxConsentTTL, ttl)}
	}
	c, err := n.ledger.ConsentTo(ctx, owner, time.Duration(ttl)*time.Second)
	if err != nil {
		return api.Consent{}, ledgerError(err)
	}
	b, err := json.Marshal(c)
	if err != nil {
		return api.Consent{}, err
	}
	return api.Consent{Machine: string(n.key.Address()), Owner: string(owner), Expires: c.Expiry,
		Token: base64.RawURLEncoding.EncodeToString(b)}, nil
}

// A consent is good for DefaultConsentTTL seconds unless asked otherwise,
// and at most MaxConsentTTL: the ledger refuses one expiring more than
// ledger.MaxConsentTTL after the block that carries it, and block time
// trails the clock.
const (
	DefaultConsentTTL = 1800
	MaxConsentTTL     = ledger.MaxConsentTTL - 60
)

// decodeConsent reads a token Consent made.
func decodeConsent(token string) (ledger.LinkConsent, error) {
	var c ledger.LinkConsent
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimSpace(token))
	if err != nil || len(b) == 0 {
		return c, errors.New("not a consent token (run `deepmarket ledger consent OWNER` on the machine and pass what it prints)")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return c, fmt.Errorf("not a consent token: %v", err)
	}
	return c, nil
}

// TxStatus implements api.Ledger: what became of a transaction.
func (n *Node) TxStatus(ctx context.Context, hash string) (ledger.TxStatus, error) {
	if raw, err := hex.DecodeString(hash); err != nil || len(raw) != 32 {
		return ledger.TxStatus{}, &api.Error{Status: http.StatusBadRequest, Field: "hash", Message: fmt.Sprintf("transaction hash %q: want 64 hex digits", hash)}
	}
	return n.ledger.TxStatus(ctx, hash)
}

// Audit implements api.Ledger: replays this node's chain from the
// genesis in its home, verifying every commit.
func (n *Node) Audit(ctx context.Context) (*ledger.AuditReport, error) {
	doc, err := cmttypes.GenesisDocFromFile(n.home.GenesisPath())
	if err != nil {
		return nil, fmt.Errorf("read genesis %s: %w", n.home.GenesisPath(), err)
	}
	return ledger.AuditWith(ctx, n.chain.Client(), ledger.AuditOptions{Genesis: doc, GenesisSource: n.home.GenesisPath()})
}

var _ api.Ledger = (*Node)(nil)
