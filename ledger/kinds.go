package ledger

import "fmt"

// txKinds is every kind of transaction the ledger takes, and everything it
// does by kind: the type a transaction names, the message its body
// decodes into, the check->effect handler that CheckTx and FinalizeBlock
// share (exec.go), what it spends from the signer's balance, and who
// besides members may sign it. A new kind is a new entry here, with its
// message (tx.go) and its handler; nothing else switches on kinds.
var txKinds = []txKind{
	kindOf[Transfer]{typ: TypeTransfer, handle: (*State).transfer, spend: func(m *Transfer) uint64 { return m.Amount }}.kind(),
	kindOf[Grant]{typ: TypeGrant, handle: (*State).grant}.kind(),
	kindOf[LinkMachine]{typ: TypeLinkMachine, handle: (*State).linkMachine}.kind(),
	kindOf[OpenEscrow]{typ: TypeOpenEscrow, handle: (*State).openEscrowTx, spend: func(m *OpenEscrow) uint64 { return m.Amount }}.kind(),
	kindOf[Settle]{typ: TypeSettle, handle: (*State).settle}.kind(),
	kindOf[Claim]{typ: TypeClaim, handle: (*State).claim, standing: (*State).payeeStanding}.kind(),
	kindOf[Expire]{typ: TypeExpire, handle: (*State).expire}.kind(),
	kindOf[Dispute]{typ: TypeDispute, handle: (*State).dispute, standing: (*State).disputeStanding}.kind(),
	kindOf[Appeal]{typ: TypeAppeal, handle: (*State).appeal, standing: (*State).appealStanding}.kind(),
	kindOf[Verdict]{typ: TypeVerdict, handle: (*State).verdict, standing: (*State).verdictStanding}.kind(),
	kindOf[ValidatorVote]{typ: TypeValidatorVote, handle: (*State).vote, standing: (*State).voterStanding}.kind(),
	kindOf[Admit]{typ: TypeAdmit, handle: (*State).admitTx}.kind(),
}

// kindByType finds a txKinds entry by the type a transaction names.
var kindByType = indexKinds(txKinds)

// txKind is an entry of txKinds. kindOf builds it, so that its functions
// and its message agree.
type txKind struct {
	typ string // Tx.Type, and the type of the event the transaction emits
	msg string // the message's Go type, for errors
	// carries reports whether msg is this kind's message (NewTx).
	carries func(msg any) bool
	// decode reads a body into this kind's message, in its canonical
	// encoding only.
	decode func(body []byte) (any, error)
	// handle checks the transaction against the state and returns its
	// effect, which cannot fail; a refusal is an *Error.
	handle func(s *State, c *call) (effect, error)
	// spend is what the transaction takes from the signer's balance:
	// CheckTx counts it beside the spends pending in the mempool.
	spend func(msg any) uint64
	// standing admits a signer that is not a member (State.standing), or
	// refuses it with its own code; nil: only members sign this kind.
	standing func(s *State, d *decoded) error
}

// kindOf is a txKinds entry written in terms of its message M.
type kindOf[M any] struct {
	typ    string
	handle func(s *State, c *call, m *M) (effect, error)
	// spend is nil for a kind that spends nothing.
	spend func(m *M) uint64
	// standing is nil for a kind only members sign.
	standing func(s *State, d *decoded, m *M) error
}

func (k kindOf[M]) kind() txKind {
	t := txKind{
		typ: k.typ,
		msg: fmt.Sprintf("%T", new(M)),
		carries: func(msg any) bool {
			switch msg.(type) {
			case *M, M:
				return true
			}
			return false
		},
		decode: func(body []byte) (any, error) { return decodeBody[M](body) },
		handle: func(s *State, c *call) (effect, error) { return k.handle(s, c, c.d.msg.(*M)) },
		spend: func(msg any) uint64 {
			if k.spend == nil {
				return 0
			}
			return k.spend(msg.(*M))
		},
	}
	if k.standing != nil {
		t.standing = func(s *State, d *decoded) error { return k.standing(s, d, d.msg.(*M)) }
	}
	return t
}

func indexKinds(kinds []txKind) map[string]*txKind {
	byType := make(map[string]*txKind, len(kinds))
	for i := range kinds {
		k := &kinds[i]
		if _, dup := byType[k.typ]; dup {
			panic(fmt.Sprintf("ledger: transaction type %q has two entries in txKinds", k.typ))
		}
		byType[k.typ] = k
	}
	return byType
}
