// Package storage moves datasets and code between DeepMarket nodes as
// content-addressed blocks.
//
// It owns the node's blockstore (badger v4 through go-ds-badger4 for every
// block's entry, small blocks inline; blocks of 16 KiB or more in
// append-only pack files beside it), UnixFS import and export (CIDv1, raw
// leaves, a fixed-size chunker), pins, garbage collection of unpinned
// blocks, and bitswap on the node's libp2p host. Every block is checked
// against its CID when imported or received from a peer, and again
// whenever it is read from disk (small blocks by their hash, packed ones by
// the CRC-32C taken when written): a block that fails is dropped, never
// served, and fetched again.
//
// The defaults are those of plain IPFS with `--cid-version=1 --raw-leaves
// --chunker=size-1048576`, so kubo produces the same CIDs for the same
// files and can fetch ours over bitswap.
//
// storage takes a libp2p host.Host and a content router; it must not
// import node, p2p, ledger or scheduler.
package storage
