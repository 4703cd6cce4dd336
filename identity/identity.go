package identity

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

// AddressPrefix is the bech32 human-readable part of every account address.
const AddressPrefix = "dm"

// addressLen is how many bytes of SHA-256(pubkey) name an account.
const addressLen = 20

// ErrBadAddress is returned for strings that are not a DeepMarket address.
var ErrBadAddress = errors.New("not a DeepMarket address")

// Address is an account address in its only printed form, "dm1...".
type Address string

// AddressOf returns the account address of an ed25519 public key.
func AddressOf(pub ed25519.PublicKey) Address {
	sum := sha256.Sum256(pub)
	return Address(bech32Encode(AddressPrefix, sum[:addressLen]))
}

// ParseAddress checks that s is a well-formed address and returns it.
func ParseAddress(s string) (Address, error) {
	hrp, payload, err := bech32Decode(s)
	if err != nil {
		return "", fmt.Errorf("%w: %q: %v", ErrBadAddress, s, err)
	}
	if hrp != AddressPrefix {
		return "", fmt.Errorf("%w: %q: prefix %q, want %q", ErrBadAddress, s, hrp, AddressPrefix)
	}
	if len(payload) != addressLen {
		return "", fmt.Errorf("%w: %q: %d bytes, want %d", ErrBadAddress, s, len(payload), addressLen)
	}
	return Address(s), nil
}

// Key is an ed25519 key pair: a node's libp2p identity and, by default, its
// account.
type Key struct {
	priv ed25519.PrivateKey
}

// GenerateKey makes a new random key.
func GenerateKey() (*Key, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate ed25519 key: %w", err)
	}
	return &Key{priv: priv}, nil
}

// KeyFromSeed builds a key from a 32-byte seed (tests and benchmarks use it
// for reproducible identities).
func KeyFromSeed(seed []byte) (*Key, error) {
	if len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("seed is %d bytes, want %d", len(seed), ed25519.SeedSize)
	}
	return &Key{priv: ed25519.NewKeyFromSeed(seed)}, nil
}

// Public returns the raw 32-byte public key.
func (k *Key) Public() ed25519.PublicKey { return k.priv.Public().(ed25519.PublicKey) }

// Address returns the account this key controls.
func (k *Key) Address() Address { return AddressOf(k.Public()) }

// Sign signs msg with the key.
func (k *Key) Sign(msg []byte) []byte { return ed25519.Sign(k.priv, msg) }

// PrivKey returns the key as a libp2p private key, for the libp2p host.
func (k *Key) PrivKey() crypto.PrivKey {
	pk, err := crypto.UnmarshalEd25519PrivateKey(k.priv)
	if err != nil {
		panic(fmt.Sprintf("ed25519 key of valid length rejected by libp2p: %v", err))
	}
	return pk
}

// PeerID returns the libp2p peer ID of the key.
func (k *Key) PeerID() peer.ID { return PeerIDOf(k.Public()) }

// PeerIDOf returns the libp2p peer ID of a raw ed25519 public key, or "" if
// the key is malformed.
func PeerIDOf(pub ed25519.PublicKey) peer.ID {
	pk, err := crypto.UnmarshalEd25519PublicKey(pub)
	if err != nil {
		return ""
	}
	id, err := peer.IDFromPublicKey(pk)
	if err != nil {
		return ""
	}
	return id
}

// PublicKeyOf is the raw public key a peer ID carries (every DeepMarket
// peer's is an ed25519 key inlined in its ID): the inverse of PeerIDOf.
func PublicKeyOf(p peer.ID) (ed25519.PublicKey, error) {
	pk, err := p.ExtractPublicKey()
	if err != nil {
		return nil, fmt.Errorf("peer %s carries no key: %w", p, err)
	}
	if pk.Type() != crypto.Ed25519 {
		return nil, fmt.Errorf("peer %s: a %s key, not ed25519", p, pk.Type())
	}
	raw, err := pk.Raw()
	if err != nil {
		return nil, fmt.Errorf("peer %s: %w", p, err)
	}
	return raw, nil
}

// AddressOfPeer is the account address of the key peer p carries: the
// address its machine is paid at and signs its transactions with.
func AddressOfPeer(p peer.ID) (Address, error) {
	raw, err := PublicKeyOf(p)
	if err != nil {
		return "", err
	}
	return AddressOf(raw), nil
}

// keyFileMagic starts a key file so a wrong file is recognised at once.
const keyFileMagic = "deepmarket-ed25519-v1\n"

// SaveKey writes the key's seed to path with mode 0600, refusing to replace
// an existing file.
func SaveKey(path string, k *Key) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("save key: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("save key: %w", err)
	}
	data := append([]byte(keyFileMagic), k.priv.Seed()...)
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("save key %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("save key %s: %w", path, err)
	}
	return f.Close()
}

// LoadKey reads a key written by SaveKey.
func LoadKey(path string) (*Key, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load key: %w", err)
	}
	if len(data) != len(keyFileMagic)+ed25519.SeedSize || string(data[:len(keyFileMagic)]) != keyFileMagic {
		return nil, fmt.Errorf("load key %s: not a DeepMarket key file", path)
	}
	return KeyFromSeed(data[len(keyFileMagic):])
}

// Ed25519 returns the raw private key, for libraries that take one
// (CometBFT's validator key).
func (k *Key) Ed25519() ed25519.PrivateKey { return k.priv }
