package ledger

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/deepmarket/deepmarket/identity"
)

// Appeals and referees. A payee of a settled escrow that the payer's
// holder refused (rounds booked refused, an update judged bad, a spot
// check said failed) appeals in the escrow's dispute window: it names
// what it says it is owed beyond what the settlement paid (Claim, at most
// what the escrow still holds; claims are not reserved against each other,
// so no payee can shut another out) and where the evidence is, and its owner locks Params.AppealBond. The block's hash
// draws Params.Referees validators that are not party to the case (the
// payer, the appellant, its owner); they recompute the contested check
// and vote. The first side a majority of the drawn referees takes wins:
//
//   - overturned: the appellant is paid its claim from the escrow, its
//     bond comes back, and the payer pays the majority's referees as much
//     as the bond from what the escrow still holds; the payer's record
//     counts an appeal lost;
//   - upheld: the bond goes to the majority's referees; the machine's
//     record counts an appeal lost.
//
// A failed mark on the appellant follows the verdict: overturned, it is
// disputed and does not count; upheld, it counts even if the machine
// disputed it, and the machine cannot dispute it again.
//
// What the settlement withheld for the appellant's refused rounds
// (Escrow.Withheld) follows the verdict too: overturned, the claim is
// paid from it first; upheld, it goes back to the payer with the refund.
// Otherwise it is burned when the escrow closes: refusing a round never
// pays the payer, unless referees say the refusal had its cause.
//
// A case no majority decides by its deadline (Params.VerdictWindow) lapses
// when the escrow closes: the bond comes back and nothing else moves. The
// escrow does not close while a case is open: an appeal made late in the
// window moves Closes to its deadline.

// MaxReferees bounds Params.Referees.
const MaxReferees = 21

// MaxEvidenceLen bounds an appeal's evidence address (bytes).
const MaxEvidenceLen = 128

// Case is one appeal, kept in its escrow.
type Case struct {
	Appellant string   `cbor:"appellant" json:"appellant"`
	Owner     string   `cbor:"owner" json:"owner"` // who locked the bond, and is paid
	Claim     uint64   `cbor:"claim" json:"claim"`
	Bond      uint64   `cbor:"bond" json:"bond"`
	Evidence  string   `cbor:"evidence" json:"evidence"`
	Reason    string   `cbor:"reason,omitempty" json:"reason,omitempty"`
	Referees  []string `cbor:"referees" json:"referees"` // in the order drawn
	Votes     []Vote   `cbor:"votes,omitempty" json:"votes,omitempty"`
	Deadline  int64    `cbor:"deadline" json:"deadline"`
	// Verdict is empty while the case is open, then VerdictOverturned,
	// VerdictUpheld or VerdictLapsed.
	Verdict string `cbor:"verdict,omitempty" json:"verdict,omitempty"`
}

// Verdicts a case ends with.
const (
	VerdictOverturned = "overturned"
	VerdictUpheld     = "upheld"
	VerdictLapsed     = "lapsed"
)

// Vote is one referee's vote on a case.
type Vote struct {
	Referee  string `cbor:"referee" json:"referee"`
	Overturn bool   `cbor:"overturn" json:"overturn"`
}

func (k Case) clone() Case {
	k.Referees = append([]string(nil), k.Referees...)
	k.Votes = append([]Vote(nil), k.Votes...)
	return k
}

// open reports whether the case waits for its verdict.
func (k *Case) open() bool { return k.Verdict == "" }

// bonds is what the escrow's open cases hold beside its Amount.
func (e *Escrow) bonds() uint64 {
	var b uint64
	for i := range e.Cases {
		if e.Cases[i].open() {
			b += e.Cases[i].Bond // each is at most the appellant's balance: the sum fits
		}
	}
	return b
}

func (e *Escrow) caseOf(appellant string) int {
	for i := range e.Cases {
		if e.Cases[i].Appellant == appellant {
			return i
		}
	}
	return -1
}

// appealStanding admits an appeal by a payee of an open escrow.
func (s *State) appealStanding(d *decoded, m *Appeal) error { return s.isPayee(d, m.Job) }

// verdictStanding admits a verdict by a validator, and refuses anyone
// else's as CodeNotReferee.
func (s *State) verdictStanding(d *decoded, _ *Verdict) error {
	if _, ok := s.Validators[keyOf(d.tx.Signer)]; ok {
		return nil
	}
	return reject(CodeNotReferee, "%s is not a validator: only the referees an appeal drew give verdicts", d.signer)
}

// eligibleReferees are the validators' accounts that are not party to a
// case of payer against appellant (whose owner is owner), sorted.
func (s *State) eligibleReferees(payer, appellant, owner string) []string {
	var out []string
	for _, v := range s.Validators {
		if v.Power <= 0 || len(v.PubKey) != ed25519.PublicKeySize {
			continue
		}
		a := string(identity.AddressOf(ed25519.PublicKey(v.PubKey)))
		if a == payer || a == appellant || a == owner || s.ownerOf(a) == payer || s.ownerOf(a) == owner {
			continue
		}
		out = append(out, a)
	}
	sort.Strings(out)
	return out
}

// draw picks k of eligible in an order the block's hash fixes: the
// appellant cannot know its referees when it signs, and every node draws
// the same ones. (A proposer that is the payer could try blocks until one
// draws referees it likes; they are still validators outside the case.)
func (s *State) draw(eligible []string, k int, job, appellant string) []string {
	pool := append([]string(nil), eligible...)
	seed := sha256.Sum256([]byte(string(s.seed) + "\x00" + job + "\x00" + appellant))
	var out []string
	for i := 0; i < k && len(pool) > 0; i++ {
		h := sha256.Sum256(append(seed[:], byte(i)))
		j := int(binary.BigEndian.Uint64(h[:8]) % uint64(len(pool)))
		out = append(out, pool[j])
		pool = append(pool[:j], pool[j+1:]...)
	}
	return out
}

func (s *State) appeal(c *call, m *Appeal) (effect, error) {
	if err := checkJob(m.Job); err != nil {
		return nil, err
	}
	if m.Evidence == "" || len(m.Evidence) > MaxEvidenceLen || strings.ContainsFunc(m.Evidence, func(r rune) bool { return r <= ' ' || r > '~' }) {
		return nil, reject(CodeMalformed, "evidence must be a content address of 1 to %d printable ASCII bytes", MaxEvidenceLen)
	}
	if len(m.Reason) > MaxReasonLen || !utf8.ValidString(m.Reason) {
		return nil, reject(CodeMalformed, "reason must be UTF-8 of at most %d bytes", MaxReasonLen)
	}
	e, ok := s.Escrows[m.Job]
	if !ok {
		return nil, reject(CodeUnknownEscrow, "no open escrow for job %s", m.Job)
	}
	if !e.hasPayee(c.signer) {
		return nil, reject(CodeNotPayee, "%s is not a payee of job %s", c.signer, m.Job)
	}
	if e.Settled == 0 {
		return nil, reject(CodeNotSettled, "job %s is not settled: there is no refusal to appeal yet (lodge receipts in the window it opens)", m.Job)
	}
	if c.now >= e.Settled+s.Params.DisputeWindow {
		return nil, reject(CodeExpired, "the dispute window of job %s ended at %d", m.Job, e.Settled+s.Params.DisputeWindow)
	}
	if e.caseOf(c.signer) >= 0 {
		return nil, reject(CodeAlreadyVoted, "%s appealed the settlement of job %s already", c.signer, m.Job)
	}
	// Claims are not reserved against each other: one payee claiming the
	// whole escrow must not shut the others out. Referees judge the amount
	// with the cause, and a case is paid from what the escrow holds when it
	// is decided.
	if m.Claim == 0 || m.Claim > e.Amount {
		return nil, reject(CodeInvalidAmount, "claim %d: want 1 to %d (what the escrow holds)", m.Claim, e.Amount)
	}
	owner, registered := s.registered(c.signer)
	if !registered {
		return nil, reject(CodeNotRegistered, "%s is not a registered machine: no member's bond can back its appeal", c.signer)
	}
	bond := s.Params.AppealBond
	if s.balanceOf(owner) < bond {
		return nil, reject(CodeInsufficientFunds, "the appeal bond is %d and %s holds %d", bond, owner, s.balanceOf(owner))
	}
	eligible := s.eligibleReferees(e.Payer, c.signer, owner)
	if len(eligible) == 0 {
		return nil, reject(CodeNoReferees, "no validator is outside the case to judge it")
	}
	for _, r := range eligible {
		if err := s.canCredit(r, 2*bond); err != nil {
			return nil, err
		}
	}
	if err := s.canCredit(owner, m.Claim+bond); err != nil {
		return nil, err
	}
	return func() *event {
		refs := s.draw(eligible, int(s.Params.Referees), m.Job, c.signer)
		k := Case{Appellant: c.signer, Owner: owner, Claim: m.Claim, Bond: bond, Evidence: m.Evidence, Reason: m.Reason,
			Referees: refs, Deadline: c.now + s.Params.VerdictWindow}
		s.debit(owner, bond)
		e.Cases = append(e.Cases, k)
		sort.Slice(e.Cases, func(i, j int) bool { return e.Cases[i].Appellant < e.Cases[j].Appellant })
		if k.Deadline > e.Closes {
			e.Closes = k.Deadline
			s.queueClosing(closing{at: e.Closes, job: m.Job})
		}
		s.touch(pEscrow, m.Job)
		return &event{accounts: append([]string{c.signer, owner, e.Payer}, refs...),
			attrs: [][2]string{{"job", m.Job}, {"appellant", c.signer}, {"owner", owner}, {"payer", e.Payer}, {"claim", u(m.Claim)},
				{"bond", u(bond)}, {"referees", strings.Join(refs, ",")}, {"deadline", strconv.FormatInt(k.Deadline, 10)}}}
	}, nil
}

func (s *State) verdict(c *call, m *Verdict) (effect, error) {
	if err := checkJob(m.Job); err != nil {
		return nil, err
	}
	e, ok := s.Escrows[m.Job]
	if !ok {
		return nil, reject(CodeUnknownEscrow, "no open escrow for job %s", m.Job)
	}
	i := e.caseOf(m.Appellant)
	if i < 0 {
		return nil, reject(CodeUnknownEscrow, "%s has not appealed the settlement of job %s", m.Appellant, m.Job)
	}
	k := &e.Cases[i]
	switch {
	case !k.open():
		return nil, reject(CodeClosedAppeal, "the appeal of %s on job %s is decided: %s", m.Appellant, m.Job, k.Verdict)
	case c.now >= k.Deadline:
		return nil, reject(CodeClosedAppeal, "the appeal of %s on job %s was to be decided by %d", m.Appellant, m.Job, k.Deadline)
	case !contains(k.Referees, c.signer):
		return nil, reject(CodeNotReferee, "%s is not a referee of the appeal of %s on job %s", c.signer, m.Appellant, m.Job)
	}
	for _, v := range k.Votes {
		if v.Referee == c.signer {
			return nil, reject(CodeAlreadyVoted, "%s voted on this appeal already", c.signer)
		}
	}
	return func() *event {
		k.Votes = append(k.Votes, Vote{Referee: c.signer, Overturn: m.Overturn})
		ev := &event{accounts: []string{c.signer, m.Appellant, e.Payer},
			attrs: [][2]string{{"job", m.Job}, {"appellant", m.Appellant}, {"referee", c.signer}, {"overturn", strconv.FormatBool(m.Overturn)}}}
		need := len(k.Referees)/2 + 1
		var over, up []string
		for _, v := range k.Votes {
			if v.Overturn {
				over = append(over, v.Referee)
			} else {
				up = append(up, v.Referee)
			}
		}
		switch {
		case len(over) >= need:
			paid, fee := s.overturn(e, k, over)
			ev.accounts = append(ev.accounts, k.Owner)
			ev.accounts = append(ev.accounts, over...)
			ev.attrs = append(ev.attrs, [2]string{"verdict", VerdictOverturned}, [2]string{"owner", k.Owner}, [2]string{"paid", u(paid + k.Bond)},
				[2]string{"fee", u(fee)}, [2]string{"majority", strings.Join(over, ",")})
		case len(up) >= need:
			s.uphold(e, k, up)
			ev.accounts = append(ev.accounts, k.Owner)
			ev.accounts = append(ev.accounts, up...)
			ev.attrs = append(ev.attrs, [2]string{"verdict", VerdictUpheld}, [2]string{"owner", k.Owner},
				[2]string{"fee", u(k.Bond)}, [2]string{"majority", strings.Join(up, ",")})
		}
		if !k.open() {
			s.closeSooner(e, m.Job)
		}
		s.touch(pEscrow, m.Job)
		return ev
	}, nil
}

// closeSooner brings a settled escrow's closing back to the end of its
// dispute window, or the deadline of a case still open if later, once a
// case is decided: the payer's refund waits for no case that is over.
func (s *State) closeSooner(e *Escrow, job string) {
	closes := e.Settled + s.Params.DisputeWindow
	for i := range e.Cases {
		if k := &e.Cases[i]; k.open() {
			closes = max(closes, k.Deadline)
		}
	}
	if closes < e.Closes {
		e.Closes = closes
		s.queueClosing(closing{at: closes, job: job})
	}
}

// overturn decides k for its appellant: it is paid its claim (what the
// escrow still holds, at most) and its bond back, and the payer pays the
// majority's referees as much as the bond from what is left.
func (s *State) overturn(e *Escrow, k *Case, majority []string) (paid, fee uint64) {
	k.Verdict = VerdictOverturned
	paid = min(k.Claim, e.Amount)
	e.Amount -= paid
	e.setClaimed(k.Appellant, e.claimed(k.Appellant)+paid, e.claimedSeq(k.Appellant))
	e.withhold(k.Appellant, func(w uint64) uint64 { return w - min(w, paid) }) // paid from what its rounds were withheld
	s.credit(k.Owner, paid+k.Bond)
	if s.countsFor(k.Appellant, e.Payer, paid) {
		rec := s.machine(k.Appellant)
		rec.Earned = satAdd(rec.Earned, paid)
	}
	if i := e.markIndex(k.Appellant); i >= 0 {
		e.Marks[i].Disputed = true // the referees found no cause
	}
	fee = min(k.Bond, e.Amount)
	e.Amount -= fee
	s.split(fee, majority, e.Payer)
	if s.isMember(e.Payer) {
		r := s.payer(e.Payer)
		r.AppealsLost = satAdd(r.AppealsLost, 1)
	}
	return paid, fee
}

// uphold decides k against its appellant: its bond goes to the majority's
// referees.
func (s *State) uphold(e *Escrow, k *Case, majority []string) {
	k.Verdict = VerdictUpheld
	e.withhold(k.Appellant, func(uint64) uint64 { return 0 }) // the refusal had its cause: the payer's again
	if i := e.markIndex(k.Appellant); i >= 0 {
		e.Marks[i].Disputed = false // an upheld dispute: the mark has its cause, and counts
	}
	s.split(k.Bond, majority, k.Owner)
	rec := s.machine(k.Appellant)
	rec.AppealsLost = satAdd(rec.AppealsLost, 1)
}

// withhold sets what e withholds for payee p's refused rounds to f of
// what it withholds now, dropping the entry at 0.
func (e *Escrow) withhold(p string, f func(uint64) uint64) {
	for i := range e.Withheld {
		if e.Withheld[i].Payee == p {
			if e.Withheld[i].Amount = f(e.Withheld[i].Amount); e.Withheld[i].Amount == 0 {
				e.Withheld = append(e.Withheld[:i], e.Withheld[i+1:]...)
			}
			return
		}
	}
}

// split credits amount to the referees in equal shares, the remainder to
// rest.
func (s *State) split(amount uint64, referees []string, rest string) {
	share := amount / uint64(len(referees))
	for _, r := range referees {
		s.credit(r, share)
	}
	s.credit(rest, amount-share*uint64(len(referees)))
}

// lapse ends e's undecided cases as the escrow closes: their bonds come
// back.
func (s *State) lapse(e *Escrow) {
	for i := range e.Cases {
		if k := &e.Cases[i]; k.open() {
			k.Verdict = VerdictLapsed
			s.credit(k.Owner, k.Bond)
		}
	}
}

func (e *Escrow) claimedSeq(p string) uint64 {
	for _, c := range e.Claimed {
		if c.Payee == p {
			return c.Seq
		}
	}
	return 0
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// queueClosing puts c in the queue of escrows to close, in order.
func (s *State) queueClosing(c closing) {
	i := sort.Search(len(s.closing), func(i int) bool {
		q := s.closing[i]
		return q.at > c.at || (q.at == c.at && q.job >= c.job)
	})
	s.closing = append(s.closing, closing{})
	copy(s.closing[i+1:], s.closing[i:])
	s.closing[i] = c
}

// checkCases is checkEscrow's part for the cases.
func checkCases(job string, e *Escrow) []string {
	var problems []string
	for i, k := range e.Cases {
		if !e.hasPayee(k.Appellant) {
			problems = append(problems, fmt.Sprintf("escrow %s: appellant %s is not a payee", job, k.Appellant))
		}
		if i > 0 && e.Cases[i-1].Appellant >= k.Appellant {
			problems = append(problems, fmt.Sprintf("escrow %s: cases out of order", job))
		}
		if len(k.Referees) == 0 || len(k.Votes) > len(k.Referees) {
			problems = append(problems, fmt.Sprintf("escrow %s: case of %s has %d referees and %d votes", job, k.Appellant, len(k.Referees), len(k.Votes)))
		}
		for _, v := range k.Votes {
			if !contains(k.Referees, v.Referee) {
				problems = append(problems, fmt.Sprintf("escrow %s: %s voted on the case of %s without being drawn", job, v.Referee, k.Appellant))
			}
		}
		if k.open() && k.Deadline > e.Closes {
			problems = append(problems, fmt.Sprintf("escrow %s closes at %d, before the case of %s is due (%d)", job, e.Closes, k.Appellant, k.Deadline))
		}
	}
	return problems
}

// Docket is an open case as a referee it drew reads it (/cases/ADDR).
type Docket struct {
	Job       string `json:"job"`
	Payer     string `json:"payer"`
	PayerKey  []byte `json:"payer_key"`
	Appellant string `json:"appellant"`
	Claim     uint64 `json:"claim"`
	Evidence  string `json:"evidence"`
	Deadline  int64  `json:"deadline"`
	// Cap is the most referees should find owed: AppealCap.
	Cap uint64 `json:"cap"`
}

// docket lists the open cases that drew referee and wait for its vote,
// by job.
func (s *State) docket(referee string) []Docket {
	out := []Docket{}
	for job, e := range s.Escrows {
		for i := range e.Cases {
			k := &e.Cases[i]
			if !k.open() || !slices.Contains(k.Referees, referee) ||
				slices.ContainsFunc(k.Votes, func(v Vote) bool { return v.Referee == referee }) {
				continue
			}
			out = append(out, Docket{Job: job, Payer: e.Payer, PayerKey: e.PayerKey, Appellant: k.Appellant,
				Claim: k.Claim, Evidence: k.Evidence, Deadline: k.Deadline, Cap: AppealCap(e, k.Appellant)})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Job+out[i].Appellant < out[j].Job+out[j].Appellant })
	return out
}

// AppealCap is the most a payee of e can be owed for its refused rounds,
// as referees judge a claim: what the settlement withheld for it, or,
// when the settlement withheld nothing, three times what it was paid (a
// floor of at least MinFloor of the price, p2p's 0.25, paid for the
// whole time: the rest is at most three times the floor).
func AppealCap(e *Escrow, payee string) uint64 {
	for _, w := range e.Withheld {
		if w.Payee == payee && w.Amount > 0 {
			return w.Amount
		}
	}
	for _, c := range e.Claimed {
		if c.Payee == payee {
			return 3 * c.Amount
		}
	}
	return 0
}
