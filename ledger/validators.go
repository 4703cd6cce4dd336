package ledger

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	abci "github.com/cometbft/cometbft/abci/types"
	cmted "github.com/cometbft/cometbft/crypto/ed25519"
	"github.com/oasisprotocol/curve25519-voi/curve"

	"github.com/deepmarket/deepmarket/identity"
)

// Limits of the validator set. At most MaxValidators validators of at most
// MaxValidatorPower each keep the total (10^8) far below CometBFT's bound
// on it (2^60).
const (
	MaxValidators     = 100
	MaxValidatorPower = 1_000_000
	MaxValidatorName  = 64
	// MaxPendingVotes bounds the votes one validator may have pending:
	// votes cost no credits, and the state must not grow without bound.
	MaxPendingVotes = 16
)

// Validator is a member of the validator set. Its key signs blocks and,
// being its node's key, also signs its account's transactions and votes.
type Validator struct {
	PubKey []byte `cbor:"pub_key"`
	Power  int64  `cbor:"power"`
	Name   string `cbor:"name,omitempty"`
}

// PendingVotes holds the votes cast on one key's power that have not carried.
type PendingVotes struct {
	PubKey []byte        `cbor:"pub_key"`
	Name   string        `cbor:"name,omitempty"` // for a key not in the set: the name its votes gave
	Votes  []PendingVote `cbor:"votes"`          // one per voter, sorted by voter key
}

// PendingVote is one validator's pending vote that a key have Power.
type PendingVote struct {
	Voter []byte `cbor:"voter"` // the voting validator's key
	Power int64  `cbor:"power"`
}

func (v *Validator) clone() *Validator {
	c := *v
	c.PubKey = append([]byte(nil), v.PubKey...)
	return &c
}

func (p *PendingVotes) clone() *PendingVotes {
	c := *p
	c.PubKey = append([]byte(nil), p.PubKey...)
	c.Votes = make([]PendingVote, len(p.Votes))
	for i, vote := range p.Votes {
		c.Votes[i] = PendingVote{Voter: append([]byte(nil), vote.Voter...), Power: vote.Power}
	}
	return &c
}

// keyOf names a validator key in the state's maps and in the store: hex,
// so that the maps' sorted order is the keys' byte order.
func keyOf(pub []byte) string { return hex.EncodeToString(pub) }

func b64(pub []byte) string { return base64.StdEncoding.EncodeToString(pub) }

// ParseValidatorKey reads an ed25519 public key written as base64 (the
// form `deepmarket keys show` prints as validator_pubkey, and CometBFT's
// genesis.json uses) or as hex (64 digits).
func ParseValidatorKey(s string) (ed25519.PublicKey, error) {
	s = strings.TrimSpace(s)
	var b []byte
	var err error
	if len(s) == 2*ed25519.PublicKeySize {
		b, err = hex.DecodeString(s)
	} else {
		b, err = base64.StdEncoding.DecodeString(s)
		if err != nil {
			b, err = base64.RawStdEncoding.DecodeString(s)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("validator key %q is neither base64 nor hex", s)
	}
	if len(b) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("validator key %q is %d bytes, want a 32-byte ed25519 public key", s, len(b))
	}
	if !validKey(b) {
		return nil, fmt.Errorf("validator key %q is not an ed25519 public key", s)
	}
	return b, nil
}

// validKey reports whether pub is an ed25519 point a key could sign for:
// on the curve and not of small order. A validator with any other key
// could never sign, and would stall the chain like one that is down.
func validKey(pub []byte) bool {
	var c curve.CompressedEdwardsY
	if _, err := c.SetBytes(pub); err != nil {
		return false
	}
	var p curve.EdwardsPoint
	if _, err := p.SetCompressedY(&c); err != nil {
		return false
	}
	return !p.IsSmallOrder()
}

func checkValidatorName(name string) error {
	if len(name) > MaxValidatorName {
		return reject(CodeInvalidValidator, "name is %d bytes, at most %d", len(name), MaxValidatorName)
	}
	if !utf8.ValidString(name) || strings.IndexFunc(name, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
		return reject(CodeInvalidValidator, "name %q: printable UTF-8 only", name)
	}
	return nil
}

func (s *State) powerOf(key string) int64 {
	if v, ok := s.Validators[key]; ok {
		return v.Power
	}
	return 0
}

func (s *State) totalPower() int64 {
	var t int64
	for _, v := range s.Validators {
		t += v.Power // bounded by MaxValidators * MaxValidatorPower
	}
	return t
}

// PowerNeeded is the least vote power that carries a change in a set of
// total power: more than two thirds of it.
func PowerNeeded(total int64) int64 { return 2*total/3 + 1 }

func (p *PendingVotes) find(voter string) int {
	if p == nil {
		return -1
	}
	for i, v := range p.Votes {
		if keyOf(v.Voter) == voter {
			return i
		}
	}
	return -1
}

// votePower is the power, at current powers, of the votes that the key
// have power.
func (s *State) votePower(p *PendingVotes, power int64) int64 {
	var sum int64
	for _, v := range p.Votes {
		if v.Power == power {
			sum += s.powerOf(keyOf(v.Voter))
		}
	}
	return sum
}

// powers lists the distinct powers p's votes ask for, ascending.
func (p *PendingVotes) powers() []int64 {
	var out []int64
	for _, v := range p.Votes {
		out = append(out, v.Power)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	uniq := out[:0]
	for i, v := range out {
		if i == 0 || v != out[i-1] {
			uniq = append(uniq, v)
		}
	}
	return uniq
}

func (s *State) votesBy(voter string) int {
	n := 0
	for _, p := range s.Pending {
		if p.find(voter) >= 0 {
			n++
		}
	}
	return n
}

// allowed checks that giving key power keeps the set within its rules:
// never empty, never more than MaxValidators.
func (s *State) allowed(key string, power int64) error {
	cur := s.powerOf(key)
	if power == 0 && cur > 0 && len(s.Validators) == 1 {
		return reject(CodeInvalidValidator, "removing the last validator would leave none: vote another in first")
	}
	if power > 0 && cur == 0 && len(s.Validators) >= MaxValidators {
		return reject(CodeInvalidValidator, "the set already has %d validators, the most allowed", len(s.Validators))
	}
	return nil
}

// vote checks a validator vote and returns its effect: it records the
// vote (or withdraws one), then makes every change that has the votes.
func (s *State) vote(c *call, m *ValidatorVote) (effect, error) {
	if len(m.PubKey) != ed25519.PublicKeySize {
		return nil, reject(CodeInvalidValidator, "validator key is %d bytes, want a 32-byte ed25519 public key", len(m.PubKey))
	}
	if m.Power > 0 && !validKey(m.PubKey) {
		return nil, reject(CodeInvalidValidator, "validator key %s is not an ed25519 public key", b64(m.PubKey))
	}
	if m.Power < 0 || m.Power > MaxValidatorPower {
		return nil, reject(CodeInvalidValidator, "power %d: want 0 (remove) to %d", m.Power, MaxValidatorPower)
	}
	if err := checkValidatorName(m.Name); err != nil {
		return nil, err
	}
	voterKey := c.d.tx.Signer
	voter := keyOf(voterKey)
	if _, ok := s.Validators[voter]; !ok {
		return nil, reject(CodeNotValidator, "%s (key %s) is not a validator: only the current validators vote on the set", c.signer, b64(voterKey))
	}
	key, target := keyOf(m.PubKey), b64(m.PubKey)
	cur, inSet := s.Validators[key]
	var curPower int64
	name := ""
	if inSet {
		curPower, name = cur.Power, cur.Name
	}
	p := s.Pending[key]
	if p != nil && !inSet {
		name = p.Name
	}
	mine := p.find(voter)
	ev := &event{accounts: []string{c.signer, string(identity.AddressOf(m.PubKey))},
		attrs: [][2]string{{"validator", target}, {"power", strconv.FormatInt(m.Power, 10)}}}

	// A vote for the power the key has is a vote to leave it: it withdraws
	// the voter's pending vote on the key.
	if m.Power == curPower {
		if mine < 0 && !inSet {
			return nil, reject(CodeInvalidValidator, "%s is not a validator: nothing to remove", target)
		}
		if mine < 0 {
			return nil, reject(CodeInvalidValidator, "validator %s already has power %d: nothing to vote for", target, curPower)
		}
		return func() *event {
			p.Votes = append(p.Votes[:mine], p.Votes[mine+1:]...)
			if len(p.Votes) == 0 {
				delete(s.Pending, key)
			}
			s.touch(pPending, key)
			ev.attrs = append(ev.attrs, [2]string{"withdrawn", "true"})
			return ev
		}, nil
	}
	if mine >= 0 && p.Votes[mine].Power == m.Power {
		total := s.totalPower()
		return nil, reject(CodeAlreadyVoted, "you already voted that %s have power %d; the vote has %d of the %d power it needs",
			target, m.Power, s.votePower(p, m.Power), PowerNeeded(total))
	}
	if m.Name != "" && name != "" && m.Name != name {
		return nil, reject(CodeInvalidValidator, "validator %s is named %q: vote with that name or none", target, name)
	}
	if mine < 0 && s.votesBy(voter) >= MaxPendingVotes {
		return nil, reject(CodeInvalidValidator, "you have %d votes pending, the most allowed: withdraw one first (vote for a key's current power)", MaxPendingVotes)
	}
	if err := s.allowed(key, m.Power); err != nil {
		return nil, err
	}
	return func() *event {
		if p == nil {
			p = &PendingVotes{PubKey: append([]byte(nil), m.PubKey...)}
			s.Pending[key] = p
		}
		if !inSet && p.Name == "" {
			p.Name = m.Name
		}
		if mine >= 0 {
			p.Votes[mine].Power = m.Power // a new vote on a key replaces the voter's old one
		} else {
			p.Votes = append(p.Votes, PendingVote{Voter: append([]byte(nil), voterKey...), Power: m.Power})
			sort.Slice(p.Votes, func(i, j int) bool { return keyOf(p.Votes[i].Voter) < keyOf(p.Votes[j].Voter) })
		}
		s.touch(pPending, key)
		if name == "" {
			name = p.Name
		}
		if name != "" {
			ev.attrs = append(ev.attrs, [2]string{"name", name})
		}
		for _, c := range s.carry() {
			ev.attrs = append(ev.attrs, [2]string{"carried", b64(c.pub) + "=" + strconv.FormatInt(c.power, 10)})
		}
		return ev
	}, nil
}

type change struct {
	key   string
	pub   []byte
	power int64
}

// carry makes every pending change whose voters hold more than 2/3 of the
// power, until none does, and returns them in the order made. Each change
// alters the powers by which every other pending vote is counted, so the
// count starts over after each; each change ends its key's pending votes,
// so the loop ends.
func (s *State) carry() []change {
	var made []change
	for {
		c, ok := s.nextCarried()
		if !ok {
			return made
		}
		s.setPower(c)
		made = append(made, c)
	}
}

// nextCarried finds the first change, in key and then power order, that
// has the votes and that the set's rules allow. A voter votes once per
// key, so at most one power of a key can have more than 2/3.
func (s *State) nextCarried() (change, bool) {
	total := s.totalPower()
	keys := make([]string, 0, len(s.Pending))
	for k := range s.Pending {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		p := s.Pending[key]
		for _, power := range p.powers() {
			if 3*s.votePower(p, power) > 2*total && s.allowed(key, power) == nil {
				return change{key: key, pub: p.PubKey, power: power}, true
			}
		}
	}
	return change{}, false
}

// setPower makes a carried change: the key gets its power (0 removes
// it), its pending votes end, and the votes of a removed validator are
// dropped from every other key.
func (s *State) setPower(c change) {
	p := s.Pending[c.key]
	switch v, ok := s.Validators[c.key]; {
	case c.power == 0:
		delete(s.Validators, c.key)
	case ok:
		v.Power = c.power
	default:
		s.Validators[c.key] = &Validator{PubKey: append([]byte(nil), c.pub...), Power: c.power, Name: p.Name}
	}
	s.touch(pValidator, c.key)
	delete(s.Pending, c.key)
	s.touch(pPending, c.key)
	if c.power > 0 {
		return
	}
	for key, q := range s.Pending {
		if i := q.find(c.key); i >= 0 {
			q.Votes = append(q.Votes[:i], q.Votes[i+1:]...)
			if len(q.Votes) == 0 {
				delete(s.Pending, key)
			}
			s.touch(pPending, key)
		}
	}
}

// powers is each validator's power, by key.
func (s *State) powers() map[string]int64 {
	out := make(map[string]int64, len(s.Validators))
	for k, v := range s.Validators {
		out[k] = v.Power
	}
	return out
}

// updatesSince lists, sorted by key, the validators whose power differs
// from before: what FinalizeBlock tells CometBFT. One entry per key, so a
// key changed twice in a block (or added and removed) is sent once, as it
// ended, or not at all.
func (s *State) updatesSince(before map[string]int64) []abci.ValidatorUpdate {
	var keys []string
	for k := range before {
		keys = append(keys, k)
	}
	for k := range s.Validators {
		if _, ok := before[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var out []abci.ValidatorUpdate
	for _, k := range keys {
		if now := s.powerOf(k); now != before[k] {
			pub, _ := hex.DecodeString(k)
			out = append(out, abci.Ed25519ValidatorUpdate(pub, now))
		}
	}
	return out
}

// initValidators sets the genesis validator set from InitChain's
// validators, named by the genesis app state.
func (s *State) initValidators(vals []abci.ValidatorUpdate, names []GenesisValidatorName) error {
	for _, v := range vals {
		pub := v.PubKey.GetEd25519()
		if len(pub) != ed25519.PublicKeySize {
			return fmt.Errorf("genesis validator %v: only ed25519 keys can validate (a DeepMarket validator's key is its node key)", v.PubKey)
		}
		if v.Power <= 0 || v.Power > MaxValidatorPower {
			return fmt.Errorf("genesis validator %s: power %d, want 1 to %d", b64(pub), v.Power, MaxValidatorPower)
		}
		key := keyOf(pub)
		if _, dup := s.Validators[key]; dup {
			return fmt.Errorf("genesis validator %s listed twice", b64(pub))
		}
		s.Validators[key] = &Validator{PubKey: append([]byte(nil), pub...), Power: v.Power}
		s.admit(string(identity.AddressOf(pub)), GenesisAdmitter)
	}
	if len(s.Validators) > MaxValidators {
		return fmt.Errorf("genesis has %d validators, at most %d", len(s.Validators), MaxValidators)
	}
	for _, n := range names {
		v, ok := s.Validators[keyOf(n.PubKey)]
		if !ok {
			return fmt.Errorf("genesis app_state validators names %s, which is not a genesis validator", b64(n.PubKey))
		}
		v.Name = n.Name
	}
	return nil
}

type kv[T any] struct {
	K string
	V T
}

// sortedPtr lists a map's entries by key.
func sortedPtr[T any](m map[string]*T) []kv[T] {
	out := make([]kv[T], 0, len(m))
	for k, v := range m {
		out = append(out, kv[T]{K: k, V: *v})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].K < out[j].K })
	return out
}

// ValidatorInfo is a validator as the validators query shows it.
type ValidatorInfo struct {
	PubKey  []byte `json:"pub_key"` // base64 in JSON
	Address string `json:"address"` // CometBFT's validator address (hex), as its /validators shows
	Account string `json:"account"` // the DeepMarket account of the same key
	Power   int64  `json:"power"`
	Name    string `json:"name,omitempty"`
}

// ProposalInfo is a pending change: the votes that one key have one power.
type ProposalInfo struct {
	PubKey    []byte   `json:"pub_key"`
	Name      string   `json:"name,omitempty"`
	Power     int64    `json:"power"` // 0: remove
	Current   int64    `json:"current_power"`
	Voters    []string `json:"voters"`     // the voting validators' accounts
	VotePower int64    `json:"vote_power"` // their power now
	Needed    int64    `json:"needed"`     // the vote power that carries it: more than 2/3 of the total
}

// ValidatorSet is the answer to the validators query: the set as of the
// last executed block and the changes voted on but not carried.
type ValidatorSet struct {
	Height     int64           `json:"height"`
	TotalPower int64           `json:"total_power"`
	Validators []ValidatorInfo `json:"validators"` // by power, descending, then key
	Proposals  []ProposalInfo  `json:"proposals"`  // by key, then power
}

func (s *State) validatorSet() ValidatorSet {
	total := s.totalPower()
	out := ValidatorSet{Height: s.Height, TotalPower: total, Validators: []ValidatorInfo{}, Proposals: []ProposalInfo{}}
	for _, kv := range sortedPtr(s.Validators) {
		v := kv.V
		out.Validators = append(out.Validators, ValidatorInfo{PubKey: v.PubKey, Address: cmted.PubKey(v.PubKey).Address().String(),
			Account: string(identity.AddressOf(v.PubKey)), Power: v.Power, Name: v.Name})
	}
	sort.SliceStable(out.Validators, func(i, j int) bool { return out.Validators[i].Power > out.Validators[j].Power })
	for _, kv := range sortedPtr(s.Pending) {
		p := kv.V
		name := p.Name
		if v, ok := s.Validators[kv.K]; ok {
			name = v.Name
		}
		for _, power := range p.powers() {
			pi := ProposalInfo{PubKey: p.PubKey, Name: name, Power: power, Current: s.powerOf(kv.K),
				VotePower: s.votePower(&p, power), Needed: PowerNeeded(total), Voters: []string{}}
			for _, v := range p.Votes {
				if v.Power == power {
					pi.Voters = append(pi.Voters, string(identity.AddressOf(v.Voter)))
				}
			}
			out.Proposals = append(out.Proposals, pi)
		}
	}
	return out
}

// checkValidators is CheckInvariants' part for the validator set: keys
// well formed and filed under themselves, powers within bounds, every
// pending vote cast by a current validator, once per key.
func (s *State) checkValidators() []string {
	var problems []string
	if len(s.Validators) > MaxValidators {
		problems = append(problems, fmt.Sprintf("%d validators, at most %d", len(s.Validators), MaxValidators))
	}
	for k, v := range s.Validators {
		if len(v.PubKey) != ed25519.PublicKeySize || keyOf(v.PubKey) != k {
			problems = append(problems, fmt.Sprintf("validator %s: key %x filed under another", k, v.PubKey))
		}
		if v.Power <= 0 || v.Power > MaxValidatorPower {
			problems = append(problems, fmt.Sprintf("validator %s: power %d", k, v.Power))
		}
	}
	for k, p := range s.Pending {
		if len(p.PubKey) != ed25519.PublicKeySize || keyOf(p.PubKey) != k || len(p.Votes) == 0 {
			problems = append(problems, fmt.Sprintf("pending votes on %s: malformed", k))
		}
		for i, v := range p.Votes {
			if _, ok := s.Validators[keyOf(v.Voter)]; !ok {
				problems = append(problems, fmt.Sprintf("pending votes on %s: %x is not a validator", k, v.Voter))
			}
			if i > 0 && keyOf(p.Votes[i-1].Voter) >= keyOf(v.Voter) {
				problems = append(problems, fmt.Sprintf("pending votes on %s: voters not sorted or repeated", k))
			}
			if v.Power == s.powerOf(k) {
				problems = append(problems, fmt.Sprintf("pending votes on %s: a vote for its current power", k))
			}
		}
	}
	return problems
}
