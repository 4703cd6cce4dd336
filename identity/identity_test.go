package identity

import (
	"bytes"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

func TestAddressRoundTrip(t *testing.T) {
	k, err := KeyFromSeed(bytes.Repeat([]byte{7}, 32))
	if err != nil {
		t.Fatal(err)
	}
	a := k.Address()
	if !strings.HasPrefix(string(a), "dm1") {
		t.Fatalf("address %q lacks dm1 prefix", a)
	}
	got, err := ParseAddress(string(a))
	if err != nil || got != a {
		t.Fatalf("ParseAddress(%q) = %q, %v", a, got, err)
	}
	// Upper case is the same address in bech32.
	if _, err := ParseAddress(strings.ToUpper(string(a))); err != nil {
		t.Fatalf("upper case rejected: %v", err)
	}
}

func TestParseAddressRejects(t *testing.T) {
	k, _ := KeyFromSeed(bytes.Repeat([]byte{1}, 32))
	good := string(k.Address())
	flipped := []byte(good)
	if flipped[10] == 'q' {
		flipped[10] = 'p'
	} else {
		flipped[10] = 'q'
	}
	cases := map[string]string{
		"empty":        "",
		"no separator": "dmqqqqqq",
		"bad checksum": string(flipped),
		"wrong prefix": bech32Encode("cosmos", make([]byte, 20)),
		"wrong length": bech32Encode("dm", make([]byte, 19)),
		"mixed case":   "dM" + good[2:],
		"bad char":     good[:8] + "b" + good[9:],
	}
	for name, in := range cases {
		if _, err := ParseAddress(in); err == nil {
			t.Errorf("%s: ParseAddress(%q) accepted", name, in)
		}
	}
}

func TestBech32KnownVector(t *testing.T) {
	// BIP-173 valid test vector.
	hrp, data, err := bech32Decode("A12UEL5L")
	if err != nil || hrp != "a" || len(data) != 0 {
		t.Fatalf("decode BIP-173 vector: %q %x %v", hrp, data, err)
	}
}

func TestKeyFileRoundTripAndMode(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "node.key")
	k, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	if err := SaveKey(path, k); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("key mode %v, want 0600", st.Mode().Perm())
	}
	if err := SaveKey(path, k); err == nil {
		t.Fatal("SaveKey overwrote an existing key")
	}
	k2, err := LoadKey(path)
	if err != nil {
		t.Fatal(err)
	}
	if k2.PeerID() != k.PeerID() || k2.Address() != k.Address() {
		t.Fatal("loaded key differs")
	}
	os.WriteFile(filepath.Join(dir, "junk"), []byte("hello"), 0o600)
	if _, err := LoadKey(filepath.Join(dir, "junk")); err == nil {
		t.Fatal("junk key file accepted")
	}
}

func TestPeerIDMatchesLibp2p(t *testing.T) {
	k, _ := GenerateKey()
	if PeerIDOf(k.Public()) != k.PeerID() {
		t.Fatal("PeerIDOf and Key.PeerID differ")
	}
	if PeerIDOf([]byte{1, 2, 3}) != "" {
		t.Fatal("malformed key gave a peer ID")
	}
}

// TestAddressOfPeer: a peer ID gives back the key and the address of the
// key it was made from; an ID that carries no ed25519 key gives an error.
func TestAddressOfPeer(t *testing.T) {
	k, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := PublicKeyOf(k.PeerID())
	if err != nil || !pub.Equal(k.Public()) {
		t.Fatalf("PublicKeyOf: %x, %v; want %x", pub, err, k.Public())
	}
	if a, err := AddressOfPeer(k.PeerID()); err != nil || a != k.Address() {
		t.Fatalf("AddressOfPeer: %s, %v; want %s", a, err, k.Address())
	}
	// A secp256k1 key is inlined in its peer ID too, and is not a ledger key.
	sk, _, err := crypto.GenerateSecp256k1Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	other, err := peer.IDFromPrivateKey(sk)
	if err != nil {
		t.Fatal(err)
	}
	if a, err := AddressOfPeer(other); err == nil {
		t.Errorf("a secp256k1 peer has address %s", a)
	}
	if _, err := PublicKeyOf(peer.ID("not a peer id")); err == nil {
		t.Error("a malformed peer ID gave a key")
	}
}
