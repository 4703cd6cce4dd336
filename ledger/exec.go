package ledger

import (
	"fmt"
	"sort"
	"strconv"

	abci "github.com/cometbft/cometbft/abci/types"

	"github.com/deepmarket/deepmarket/identity"
)

// EventType is the ABCI event every ledger transaction emits; its indexed
// attributes let `ledger history` find what moved credits for an account:
// tx_search "dm.account='dm1...'".
const EventType = "dm"

type event struct {
	typ      string
	accounts []string // every account the transaction touched
	attrs    [][2]string
}

func (e *event) abci() []abci.Event {
	attrs := []abci.EventAttribute{{Key: "type", Value: e.typ, Index: true}}
	seen := map[string]bool{}
	for _, a := range e.accounts {
		if !seen[a] {
			seen[a] = true
			attrs = append(attrs, abci.EventAttribute{Key: "account", Value: a, Index: true})
		}
	}
	for _, kv := range e.attrs {
		attrs = append(attrs, abci.EventAttribute{Key: kv[0], Value: kv[1], Index: kv[0] == "job"})
	}
	return []abci.Event{{Type: EventType, Attributes: attrs}}
}

func u(v uint64) string { return strconv.FormatUint(v, 10) }

// execute checks d against the state at block time now and, only if every
// check passes, applies it. A rejected transaction changes nothing.
func (s *State) execute(d *decoded, now int64) (*event, error) {
	signer := string(d.signer)
	acct := &Account{}
	if a, ok := s.Accounts[signer]; ok {
		acct = a
	}
	if d.tx.Nonce != acct.Nonce {
		return nil, reject(CodeBadNonce, "nonce %d, account %s expects %d", d.tx.Nonce, signer, acct.Nonce)
	}
	if _, err := s.apply(d, signer, acct, now, true); err != nil {
		return nil, err
	}
	acct = s.account(signer)
	ev, err := s.apply(d, signer, acct, now, false)
	if err != nil {
		panic(fmt.Sprintf("transaction passed its checks and then failed: %v", err))
	}
	acct.Nonce++
	s.touch(pAccount, signer)
	return ev, nil
}

// check runs every check of execute without changing anything (CheckTx).
func (s *State) check(d *decoded, now int64, nonce uint64) error {
	if d.tx.Nonce != nonce {
		return reject(CodeBadNonce, "nonce %d, account %s expects %d", d.tx.Nonce, d.signer, nonce)
	}
	acct := Account{Balance: s.balanceOf(string(d.signer)), Nonce: nonce}
	_, err := s.apply(d, string(d.signer), &acct, now, true)
	return err
}

func (s *State) credit(addr string, amount uint64) {
	a := s.account(addr)
	a.Balance += amount // callers check overflow first
	s.touch(pAccount, addr)
}

func (s *State) canCredit(addr string, amount uint64) error {
	if _, ok := add(s.balanceOf(addr), amount); !ok {
		return reject(CodeOverflow, "crediting %d would overflow %s's balance", amount, addr)
	}
	return nil
}

// apply checks d and, unless dry, applies it. Every case runs all of its
// checks before its first change, so a dry run that passes guarantees the
// real one does.
func (s *State) apply(d *decoded, signer string, acct *Account, now int64, dry bool) (*event, error) {
	switch m := d.msg.(type) {
	case *Transfer:
		if err := checkAddress("to", m.To); err != nil {
			return nil, err
		}
		if m.Amount == 0 {
			return nil, reject(CodeInvalidAmount, "transfer of zero")
		}
		if len(m.Memo) > 256 {
			return nil, reject(CodeMalformed, "memo longer than 256 bytes")
		}
		if acct.Balance < m.Amount {
			return nil, reject(CodeInsufficientFunds, "balance %d, transfer %d", acct.Balance, m.Amount)
		}
		if m.To != signer {
			if err := s.canCredit(m.To, m.Amount); err != nil {
				return nil, err
			}
		}
		if dry {
			return nil, nil
		}
		acct.Balance -= m.Amount
		s.credit(m.To, m.Amount)
		return &event{typ: TypeTransfer, accounts: []string{signer, m.To},
			attrs: [][2]string{{"from", signer}, {"to", m.To}, {"amount", u(m.Amount)}, {"memo", m.Memo}}}, nil

	case *Grant:
		iss, ok := s.Issuers[signer]
		if !ok {
			return nil, reject(CodeNotIssuer, "%s is not an issuer", signer)
		}
		if err := checkAddress("to", m.To); err != nil {
			return nil, err
		}
		if m.Amount == 0 {
			return nil, reject(CodeInvalidAmount, "grant of zero")
		}
		if m.Amount > iss.Quota {
			return nil, reject(CodeQuotaExceeded, "grant %d exceeds remaining quota %d", m.Amount, iss.Quota)
		}
		if _, ok := add(s.Supply, m.Amount); !ok {
			return nil, reject(CodeOverflow, "supply would overflow")
		}
		if err := s.canCredit(m.To, m.Amount); err != nil {
			return nil, err
		}
		if dry {
			return nil, nil
		}
		iss.Quota -= m.Amount
		s.touch(pIssuer, signer)
		s.Supply += m.Amount
		s.credit(m.To, m.Amount)
		return &event{typ: TypeGrant, accounts: []string{signer, m.To},
			attrs: [][2]string{{"from", signer}, {"to", m.To}, {"amount", u(m.Amount)}}}, nil

	case *LinkMachine:
		if len(m.Machine) != 32 || len(m.MachineSig) != 64 {
			return nil, reject(CodeMalformed, "machine key or signature missing")
		}
		if !verify(m.Machine, linkBytes(s.ChainID, identity.Address(signer)), m.MachineSig) {
			return nil, reject(CodeBadSignature, "the machine's signature does not verify")
		}
		if dry {
			return nil, nil
		}
		machine := string(identity.AddressOf(m.Machine))
		s.Links[machine] = signer
		s.touch(pLink, machine)
		return &event{typ: TypeLinkMachine, accounts: []string{signer, machine},
			attrs: [][2]string{{"owner", signer}, {"machine", machine}}}, nil

	case *OpenEscrow:
		if err := checkJob(m.Job); err != nil {
			return nil, err
		}
		if _, ok := s.Escrows[m.Job]; ok {
			return nil, reject(CodeEscrowExists, "escrow for job %s is already open", m.Job)
		}
		if m.Amount == 0 {
			return nil, reject(CodeInvalidAmount, "escrow of zero")
		}
		if m.Expiry <= now || m.Expiry > now+s.Params.MaxEscrowTTL {
			return nil, reject(CodeExpired, "expiry %d must be after block time %d and within %ds", m.Expiry, now, s.Params.MaxEscrowTTL)
		}
		if len(m.Payees) == 0 || len(m.Payees) > 1024 {
			return nil, reject(CodeMalformed, "%d payees; want 1 to 1024", len(m.Payees))
		}
		seen := map[string]bool{}
		for _, p := range m.Payees {
			if err := checkAddress("payee", p); err != nil {
				return nil, err
			}
			if seen[p] {
				return nil, reject(CodeMalformed, "payee %s listed twice", p)
			}
			seen[p] = true
		}
		if acct.Balance < m.Amount {
			return nil, reject(CodeInsufficientFunds, "balance %d, escrow %d", acct.Balance, m.Amount)
		}
		if dry {
			return nil, nil
		}
		acct.Balance -= m.Amount
		payees := append([]string(nil), m.Payees...)
		sort.Strings(payees)
		s.Escrows[m.Job] = &Escrow{Payer: signer, PayerKey: append([]byte(nil), d.tx.Signer...), Total: m.Amount, Amount: m.Amount, Expiry: m.Expiry, Payees: payees}
		s.touch(pEscrow, m.Job)
		return &event{typ: TypeOpenEscrow, accounts: []string{signer},
			attrs: [][2]string{{"job", m.Job}, {"from", signer}, {"amount", u(m.Amount)}, {"expiry", strconv.FormatInt(m.Expiry, 10)}}}, nil

	case *Settle:
		e, err := s.payerEscrow(m.Job, signer)
		if err != nil {
			return nil, err
		}
		owed := map[string]uint64{}
		var total uint64
		seen := map[string]bool{}
		for _, p := range m.Payments {
			if !e.hasPayee(p.Machine) {
				return nil, reject(CodeNotPayee, "%s is not a payee of job %s", p.Machine, m.Job)
			}
			if seen[p.Machine] {
				return nil, reject(CodeMalformed, "machine %s paid twice", p.Machine)
			}
			seen[p.Machine] = true
			var ok bool
			if total, ok = add(total, p.Amount); !ok || total > e.Total {
				return nil, reject(CodeInvalidAmount, "payments exceed the %d locked for job %s", e.Total, m.Job)
			}
			// What a machine already claimed counts toward what it is owed.
			if c := e.claimed(p.Machine); p.Amount > c {
				owed[p.Machine] = p.Amount - c
			}
		}
		var pay uint64
		for _, v := range owed {
			pay += v // bounded by total
		}
		if pay > e.Amount {
			return nil, reject(CodeInvalidAmount, "settlement pays %d but the escrow holds %d", pay, e.Amount)
		}
		for _, p := range m.Payments {
			if err := s.canCredit(s.ownerOf(p.Machine), owed[p.Machine]); err != nil {
				return nil, err
			}
		}
		if err := s.canCredit(signer, e.Amount-pay); err != nil {
			return nil, err
		}
		if dry {
			return nil, nil
		}
		ev := &event{typ: TypeSettle, accounts: []string{signer}, attrs: [][2]string{{"job", m.Job}, {"from", signer}}}
		for _, p := range m.Payments {
			owner := s.ownerOf(p.Machine)
			s.credit(owner, owed[p.Machine])
			rec := s.machine(p.Machine)
			if p.Failed {
				rec.Failed++
			} else {
				rec.Completed++
			}
			rec.Earned += owed[p.Machine]
			ev.accounts = append(ev.accounts, owner)
			ev.attrs = append(ev.attrs, [2]string{"paid", p.Machine + "=" + u(owed[p.Machine])})
		}
		refund := e.Amount - pay
		s.credit(signer, refund)
		delete(s.Escrows, m.Job)
		s.touch(pEscrow, m.Job)
		ev.attrs = append(ev.attrs, [2]string{"refund", u(refund)})
		return ev, nil

	case *Claim:
		r := m.Receipt
		if err := checkJob(r.Job); err != nil {
			return nil, err
		}
		e, ok := s.Escrows[r.Job]
		if !ok {
			return nil, reject(CodeUnknownEscrow, "no open escrow for job %s", r.Job)
		}
		if r.Payee != signer {
			return nil, reject(CodeNotPayee, "receipt is for %s, claimed by %s", r.Payee, signer)
		}
		if !e.hasPayee(signer) {
			return nil, reject(CodeNotPayee, "%s is not a payee of job %s", signer, r.Job)
		}
		if now < e.Expiry {
			return nil, reject(CodeNotExpired, "escrow expires at %d, block time %d: claims open then", e.Expiry, now)
		}
		if len(r.Sig) != 64 || !verify(e.PayerKey, receiptBytes(s.ChainID, r), r.Sig) {
			return nil, reject(CodeBadReceipt, "receipt is not signed by the payer %s", e.Payer)
		}
		already := e.claimed(signer)
		if r.Amount <= already {
			return nil, reject(CodeBadReceipt, "receipt covers %d, already claimed %d", r.Amount, already)
		}
		amount := min(r.Amount-already, e.Amount)
		if amount == 0 {
			return nil, reject(CodeInsufficientFunds, "escrow for job %s is empty", r.Job)
		}
		owner := s.ownerOf(signer)
		if err := s.canCredit(owner, amount); err != nil {
			return nil, err
		}
		if dry {
			return nil, nil
		}
		e.Amount -= amount
		e.setClaimed(signer, already+amount, r.Seq)
		s.touch(pEscrow, r.Job)
		s.credit(owner, amount)
		s.machine(signer).Earned += amount
		return &event{typ: TypeClaim, accounts: []string{signer, owner, e.Payer},
			attrs: [][2]string{{"job", r.Job}, {"to", owner}, {"amount", u(amount)}}}, nil

	case *Expire:
		e, err := s.payerEscrow(m.Job, signer)
		if err != nil {
			return nil, err
		}
		if now < e.Expiry+s.Params.ClaimGrace {
			return nil, reject(CodeNotExpired, "escrow can be expired from %d (expiry + %ds for claims), block time %d",
				e.Expiry+s.Params.ClaimGrace, s.Params.ClaimGrace, now)
		}
		if err := s.canCredit(signer, e.Amount); err != nil {
			return nil, err
		}
		if dry {
			return nil, nil
		}
		s.credit(signer, e.Amount)
		delete(s.Escrows, m.Job)
		s.touch(pEscrow, m.Job)
		return &event{typ: TypeExpire, accounts: []string{signer},
			attrs: [][2]string{{"job", m.Job}, {"refund", u(e.Amount)}}}, nil

	case *ValidatorVote:
		return s.vote(d, signer, m, dry)
	}
	return nil, reject(CodeUnknownType, "unknown transaction %T", d.msg)
}

func (s *State) payerEscrow(job, signer string) (*Escrow, error) {
	if err := checkJob(job); err != nil {
		return nil, err
	}
	e, ok := s.Escrows[job]
	if !ok {
		return nil, reject(CodeUnknownEscrow, "no open escrow for job %s", job)
	}
	if e.Payer != signer {
		return nil, reject(CodeNotPayer, "job %s is paid by %s, not %s", job, e.Payer, signer)
	}
	return e, nil
}

func (s *State) machine(addr string) *MachineRecord {
	r, ok := s.Machines[addr]
	if !ok {
		r = &MachineRecord{}
		s.Machines[addr] = r
	}
	s.touch(pMachine, addr)
	return r
}

func (e *Escrow) hasPayee(p string) bool {
	i := sort.SearchStrings(e.Payees, p)
	return i < len(e.Payees) && e.Payees[i] == p
}

func (e *Escrow) claimed(p string) uint64 {
	for _, c := range e.Claimed {
		if c.Payee == p {
			return c.Amount
		}
	}
	return 0
}

func (e *Escrow) setClaimed(p string, amount, seq uint64) {
	for i := range e.Claimed {
		if e.Claimed[i].Payee == p {
			e.Claimed[i].Amount, e.Claimed[i].Seq = amount, seq
			return
		}
	}
	e.Claimed = append(e.Claimed, Claimed{Payee: p, Amount: amount, Seq: seq})
	sort.Slice(e.Claimed, func(i, j int) bool { return e.Claimed[i].Payee < e.Claimed[j].Payee })
}
