package service

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"

	cmttypes "github.com/cometbft/cometbft/types"

	"github.com/deepmarket/deepmarket/identity"
	"github.com/deepmarket/deepmarket/ledger"
	"github.com/deepmarket/deepmarket/node/api"
	"github.com/deepmarket/deepmarket/node/fault"
)

// Ledger answers /ledger: balances, history, transactions this node
// signs, consents and audits. The ledger's own errors go to node/api as
// they are: it maps a refusal to its code and an unknown outcome to the
// transaction's hash.
type Ledger struct {
	Account     identity.Address // this node's
	Client      *ledger.Client
	Chain       *ledger.Chain
	GenesisPath string
}

// Balance is an account's balance and nonce; addr empty is this node's.
func (l *Ledger) Balance(ctx context.Context, addr string) (api.Balance, error) {
	a, err := addressOr(addr, l.Account)
	if err != nil {
		return api.Balance{}, err
	}
	acct, err := l.Client.Account(ctx, a)
	if err != nil {
		return api.Balance{}, err
	}
	return api.Balance{Address: string(a), Balance: acct.Balance, Nonce: acct.Nonce, Height: l.Chain.Height()}, nil
}

// Record is an account's records as a payer and as a machine; addr empty
// is this node's.
func (l *Ledger) Record(ctx context.Context, addr string) (api.Record, error) {
	a, err := addressOr(addr, l.Account)
	if err != nil {
		return api.Record{}, err
	}
	payer, err := l.Client.PayerRecord(ctx, string(a))
	if err != nil {
		return api.Record{}, err
	}
	machine, err := l.Client.MachineRecord(ctx, string(a))
	if err != nil {
		return api.Record{}, err
	}
	return api.Record{Address: string(a), Payer: payer, Machine: machine, Height: l.Chain.Height()}, nil
}

// History is an account's transactions, newest first.
func (l *Ledger) History(ctx context.Context, addr string, limit int) ([]ledger.HistoryEntry, error) {
	a, err := addressOr(addr, l.Account)
	if err != nil {
		return nil, err
	}
	return l.Client.History(ctx, a, limit)
}

// Send signs and sends a transfer, grant, admission or link as this node.
// It tells prepared the transaction's hash before sending it, then waits
// for its commit.
func (l *Ledger) Send(ctx context.Context, req api.SendRequest, prepared func(api.SendPrepared)) (api.SendResult, error) {
	typ, msg, err := sendMessage(req)
	if err != nil {
		return api.SendResult{}, err
	}
	var p *ledger.Prepared
	for attempt := 0; ; attempt++ {
		if p, err = l.Client.Prepare(ctx, typ, msg); err != nil {
			return api.SendResult{}, err
		}
		if prepared != nil {
			prepared(api.SendPrepared{Hash: p.Hash, Nonce: p.Nonce})
		}
		err = l.Client.Broadcast(ctx, p)
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
		return api.SendResult{}, err
	}
	wctx, cancel := context.WithTimeout(ctx, ledger.DefaultCommitTimeout)
	defer cancel()
	r, err := l.Client.Wait(wctx, p.Hash)
	if err != nil {
		return api.SendResult{}, err
	}
	return api.SendResult{Hash: p.Hash, Height: r.Height}, nil
}

// sendMessage turns a send request into the transaction it asks for.
func sendMessage(req api.SendRequest) (string, any, error) {
	typ, msg, err := ledger.BuildSend(ledger.Send{Kind: req.Kind, To: req.To, Amount: req.Amount, Memo: req.Memo, Consent: req.Consent})
	return typ, msg, requestError(err)
}

// requestError turns a request value the ledger cannot use into a fault
// that names the request's field.
func requestError(err error) error {
	var bad *ledger.FieldError
	if errors.As(err, &bad) {
		return &fault.Error{Kind: fault.Malformed, Field: bad.Field, Message: bad.Reason, Err: err}
	}
	return err
}

// Consent is this machine's signed consent to earn into req.Owner's
// account, for its link as the ledger has it now.
func (l *Ledger) Consent(ctx context.Context, req api.ConsentRequest) (api.Consent, error) {
	owner, ttl, err := ledger.ConsentTerms(req.Owner, req.TTLSeconds)
	if err != nil {
		return api.Consent{}, requestError(err)
	}
	c, err := l.Client.ConsentTo(ctx, owner, ttl)
	if err != nil {
		return api.Consent{}, err
	}
	return api.Consent{Machine: string(l.Account), Owner: string(owner), Expires: c.Expiry, Token: ledger.EncodeConsent(c)}, nil
}

// TxStatus says what became of a transaction.
func (l *Ledger) TxStatus(ctx context.Context, hash string) (ledger.TxStatus, error) {
	if raw, err := hex.DecodeString(hash); err != nil || len(raw) != 32 {
		return ledger.TxStatus{}, fault.New(fault.Malformed, "hash", "transaction hash %q: want 64 hex digits", hash)
	}
	return l.Client.TxStatus(ctx, hash)
}

// Audit replays this node's chain from the genesis in its home,
// verifying every commit.
func (l *Ledger) Audit(ctx context.Context) (*ledger.AuditReport, error) {
	doc, err := cmttypes.GenesisDocFromFile(l.GenesisPath)
	if err != nil {
		return nil, fmt.Errorf("read genesis %s: %w", l.GenesisPath, err)
	}
	return ledger.AuditWith(ctx, l.Chain.Client(), ledger.AuditOptions{Genesis: doc, GenesisSource: l.GenesisPath})
}

var _ api.Ledger = (*Ledger)(nil)
