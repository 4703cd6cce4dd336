package ledger

import (
	"bytes"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestBuildSend: each kind a send names becomes its transaction, with the
// values given; a value that cannot be used is refused naming its field,
// before anything is signed.
func TestBuildSend(t *testing.T) {
	k, machine := key(t, 1), key(t, 2)
	to := string(k.Address())
	consent := SignLinkConsent(machine, testChain, k.Address(), Registration{Owner: string(machine.Address()), Height: 5}, 1_800_000_600)
	token := EncodeConsent(consent)
	ok := []struct {
		send Send
		typ  string
		msg  any
	}{
		{Send{To: to, Amount: 5, Memo: "m"}, TypeTransfer, &Transfer{To: to, Amount: 5, Memo: "m"}},
		{Send{Kind: TypeTransfer, To: to, Amount: 5}, TypeTransfer, &Transfer{To: to, Amount: 5}},
		{Send{Kind: TypeGrant, To: to, Amount: 6, Memo: "ignored"}, TypeGrant, &Grant{To: to, Amount: 6}},
		{Send{Kind: TypeAdmit, To: to}, TypeAdmit, &Admit{Account: to}},
		{Send{Kind: SendRevoke, To: to}, TypeAdmit, &Admit{Account: to, Revoke: true}},
		{Send{Kind: SendLink, Consent: token}, TypeLinkMachine, &LinkMachine{Consent: consent}},
		{Send{Kind: TypeLinkMachine, Consent: " " + token + "\n", To: "not read", Amount: 9}, TypeLinkMachine, &LinkMachine{Consent: consent}},
	}
	for _, c := range ok {
		typ, msg, err := BuildSend(c.send)
		if err != nil {
			t.Fatalf("%+v: %v", c.send, err)
		}
		if typ != c.typ || !bytes.Equal(mustEncode(msg), mustEncode(c.msg)) {
			t.Fatalf("%+v: built a %s %+v, want a %s %+v", c.send, typ, msg, c.typ, c.msg)
		}
		if _, err := NewTx(k, testChain, typ, 0, msg); err != nil {
			t.Fatalf("%+v: the message built does not sign as a %s: %v", c.send, typ, err)
		}
	}
	refused := []struct {
		send  Send
		field string
		says  string
	}{
		{Send{To: "dm1nope", Amount: 5}, "to", "dm1nope"},
		{Send{Amount: 5}, "to", ""},
		{Send{To: to}, "amount", "more than 0"},
		{Send{Kind: TypeGrant, To: to}, "amount", "more than 0"},
		{Send{Kind: TypeAdmit, To: to, Amount: 1}, "amount", "a admit moves no credits"},
		{Send{Kind: SendRevoke, To: to, Amount: 1}, "amount", "moves no credits"},
		{Send{Kind: "mint", To: to}, "kind", `kind "mint"`},
		{Send{Kind: "mint", To: "dm1nope"}, "to", ""},
		{Send{Kind: SendLink, To: to}, "consent", "not a consent token"},
		{Send{Kind: SendLink, Consent: "!!"}, "consent", "ledger consent OWNER"},
		{Send{Kind: SendLink, Consent: base64.RawURLEncoding.EncodeToString([]byte(`{"Owner":"x","Extra":1}`))}, "consent", "not a consent token: "},
	}
	for _, c := range refused {
		typ, msg, err := BuildSend(c.send)
		var bad *FieldError
		if !errors.As(err, &bad) || bad.Field != c.field || !strings.Contains(bad.Reason, c.says) || typ != "" || msg != nil {
			t.Fatalf("%+v: %s %v %v, want a refusal of %q saying %q", c.send, typ, msg, err, c.field, c.says)
		}
	}
}

// TestConsentTerms: an owner's address and a lifetime within what the
// ledger accepts, the default when none is asked; anything else is refused
// naming its field.
func TestConsentTerms(t *testing.T) {
	owner := string(key(t, 1).Address())
	for ask, want := range map[int]time.Duration{0: DefaultConsentTTL * time.Second, 1: time.Second, MaxRequestedConsentTTL: MaxRequestedConsentTTL * time.Second} {
		a, ttl, err := ConsentTerms(owner, ask)
		if err != nil || string(a) != owner || ttl != want {
			t.Fatalf("ttl %d: %s %s %v, want %s %s", ask, a, ttl, err, owner, want)
		}
	}
	if MaxRequestedConsentTTL >= MaxConsentTTL {
		t.Fatalf("a consent may be asked for %ds, which the ledger refuses once block time trails the clock", MaxRequestedConsentTTL)
	}
	for _, c := range []struct {
		owner string
		ttl   int
		field string
	}{
		{"dm1nope", 60, "owner"},
		{owner, -1, "ttl_s"},
		{owner, MaxRequestedConsentTTL + 1, "ttl_s"},
	} {
		var bad *FieldError
		if _, _, err := ConsentTerms(c.owner, c.ttl); !errors.As(err, &bad) || bad.Field != c.field {
			t.Fatalf("%q for %ds: %v, want a refusal of %q", c.owner, c.ttl, err, c.field)
		}
	}
}

// TestConsentToken: a token decodes into the consent it was made from,
// which still verifies, and is text a person can paste: base64url, no
// padding.
func TestConsentToken(t *testing.T) {
	k, machine := key(t, 1), key(t, 2)
	c := SignLinkConsent(machine, testChain, k.Address(), Registration{Owner: string(machine.Address()), Changed: 2, Height: 9}, 1_800_000_600)
	token := EncodeConsent(c)
	if strings.ContainsAny(token, "+/= \n") {
		t.Fatalf("token %q is not unpadded base64url", token)
	}
	got, err := DecodeConsent(token)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(mustEncode(got), mustEncode(c)) || !verify(got.Machine, got.signBytes(testChain), got.Sig) {
		t.Fatalf("decoded %+v from a token of %+v", got, c)
	}
	for _, bad := range []string{"", "   ", token[:len(token)-4] + "!!!!"} {
		if _, err := DecodeConsent(bad); err == nil {
			t.Fatalf("%q decoded as a consent", bad)
		}
	}
}
