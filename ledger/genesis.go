package ledger

import (
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"math/bits"
	"time"

	cmted "github.com/cometbft/cometbft/crypto/ed25519"
	cmttypes "github.com/cometbft/cometbft/types"

	"github.com/deepmarket/deepmarket/identity"
)

// GenesisState is the ledger's part of genesis.json (app_state). Its
// balance holders and issuers, and the genesis validators' accounts, are
// the first members.
type GenesisState struct {
	Issuers  []GenesisIssuer  `json:"issuers"`
	Balances []GenesisBalance `json:"balances"`
	// Members are accounts admitted at genesis without credits (a
	// university's lab machines, say).
	Members []string `json:"members,omitempty"`
	Params  *Params  `json:"params,omitempty"`
	// Validators names the genesis validators: CometBFT's genesis lists
	// their keys and powers, and InitChain hands the app no names.
	Validators []GenesisValidatorName `json:"validators,omitempty"`
}

// GenesisValidatorName names a genesis validator (one per university).
type GenesisValidatorName struct {
	PubKey []byte `json:"pub_key"` // ed25519, base64 in JSON
	Name   string `json:"name"`
}

// GenesisIssuer is an issuer (one per university) and its quota.
type GenesisIssuer struct {
	Address string `json:"address"`
	Name    string `json:"name,omitempty"`
	Quota   uint64 `json:"quota"`
}

// GenesisBalance is an initial balance; it counts as a grant in the supply.
type GenesisBalance struct {
	Address string `json:"address"`
	Amount  uint64 `json:"amount"`
}

// State builds the initial state, checking every entry.
func (g GenesisState) State(chainID string) (*State, error) {
	s := NewState()
	s.ChainID = chainID
	s.Params = DefaultParams()
	if g.Params != nil {
		s.Params = *g.Params
	}
	if err := s.Params.validate(); err != nil {
		return nil, fmt.Errorf("genesis params: %w", err)
	}
	for _, is := range g.Issuers {
		if _, err := identity.ParseAddress(is.Address); err != nil {
			return nil, fmt.Errorf("genesis issuer: %w", err)
		}
		if _, dup := s.Issuers[is.Address]; dup {
			return nil, fmt.Errorf("genesis issuer %s listed twice", is.Address)
		}
		s.Issuers[is.Address] = &Issuer{Quota: is.Quota}
		s.admit(is.Address, GenesisAdmitter)
	}
	named := map[string]bool{}
	for _, v := range g.Validators {
		if len(v.PubKey) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("genesis validator name: key is %d bytes, want 32 (ed25519)", len(v.PubKey))
		}
		if err := checkValidatorName(v.Name); err != nil {
			return nil, fmt.Errorf("genesis validator %s: %w", b64(v.PubKey), err)
		}
		if named[keyOf(v.PubKey)] {
			return nil, fmt.Errorf("genesis validator %s named twice", b64(v.PubKey))
		}
		named[keyOf(v.PubKey)] = true
	}
	for _, b := range g.Balances {
		if _, err := identity.ParseAddress(b.Address); err != nil {
			return nil, fmt.Errorf("genesis balance: %w", err)
		}
		a := s.account(b.Address)
		var carry uint64
		a.Balance, carry = bits.Add64(a.Balance, b.Amount, 0)
		if carry != 0 {
			return nil, fmt.Errorf("genesis balance of %s overflows", b.Address)
		}
		s.Supply, carry = bits.Add64(s.Supply, b.Amount, 0)
		if carry != 0 {
			return nil, fmt.Errorf("genesis supply overflows")
		}
		s.admit(b.Address, GenesisAdmitter)
	}
	for _, m := range g.Members {
		if _, err := identity.ParseAddress(m); err != nil {
			return nil, fmt.Errorf("genesis member: %w", err)
		}
		s.admit(m, GenesisAdmitter)
	}
	return s, nil // its books are kept from the first write to the store
}

// GenesisValidator is a validator of a new network.
type GenesisValidator struct {
	Name   string
	PubKey ed25519.PublicKey
	Power  int64
}

// NewGenesis makes a CometBFT genesis document for a DeepMarket network.
// Unless app names the validators already, their names go into the app
// state, where the ledger's validator set finds them.
func NewGenesis(chainID string, validators []GenesisValidator, app GenesisState) (*cmttypes.GenesisDoc, error) {
	if len(validators) > MaxValidators {
		return nil, fmt.Errorf("genesis: %d validators, at most %d", len(validators), MaxValidators)
	}
	for _, v := range validators {
		if v.Power <= 0 || v.Power > MaxValidatorPower {
			return nil, fmt.Errorf("genesis validator %s: power %d, want 1 to %d", v.Name, v.Power, MaxValidatorPower)
		}
	}
	if app.Validators == nil {
		for _, v := range validators {
			if v.Name != "" {
				app.Validators = append(app.Validators, GenesisValidatorName{PubKey: v.PubKey, Name: v.Name})
			}
		}
	}
	if _, err := app.State(chainID); err != nil {
		return nil, err
	}
	appState, err := json.Marshal(app)
	if err != nil {
		return nil, err
	}
	doc := &cmttypes.GenesisDoc{
		GenesisTime:     time.Now().UTC().Truncate(time.Second),
		ChainID:         chainID,
		InitialHeight:   1,
		ConsensusParams: cmttypes.DefaultConsensusParams(),
		AppState:        appState,
	}
	for _, v := range validators {
		pk := cmted.PubKey(v.PubKey)
		doc.Validators = append(doc.Validators, cmttypes.GenesisValidator{Address: pk.Address(), PubKey: pk, Power: v.Power, Name: v.Name})
	}
	if err := doc.ValidateAndComplete(); err != nil {
		return nil, fmt.Errorf("genesis: %w", err)
	}
	return doc, nil
}
