// Package identity owns DeepMarket's keys and the one human form of an
// account address.
//
// A node's key is an ed25519 key that is also its libp2p identity; an account
// is named by the bech32 string "dm1..." of the first 20 bytes of the SHA-256
// of its ed25519 public key. Every package that shows or checks an account
// (p2p, ledger, node, the CLI) uses Address from here, so there is exactly
// one spelling of an account everywhere.
//
// identity imports nothing from DeepMarket: it is a leaf that p2p, ledger,
// scheduler and storage may all use without importing each other.
package identity
