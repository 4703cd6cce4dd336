#!/usr/bin/env bash
# Checks that DeepMarket and plain IPFS (kubo) interoperate, both ways:
# the same CIDs for the same files, kubo fetching our data over bitswap, and
# our node fetching kubo's (CIDv0 and CIDv1). Needs `ipfs` (kubo) on PATH
# and bin/deepmarket (make build). Everything runs on loopback in a
# temporary directory. Usage: scripts/interop-kubo.sh
set -euo pipefail
command -v ipfs >/dev/null || { echo "kubo's ipfs is not on PATH" >&2; exit 2; }
DM=${DM:-$(cd "$(dirname "$0")/.." && pwd)/bin/deepmarket}
W=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$W"' EXIT
export IPFS_PATH=$W/ipfs

mkdir -p "$W/ds/sub"
head -c 3000000 /dev/urandom >"$W/ds/big.bin"
echo hi >"$W/ds/sub/.hidden"
: >"$W/ds/empty"

$DM init --home "$W/dm" --api 127.0.0.1:0 --listen /ip4/127.0.0.1/tcp/0 --chain-id interop \
  --ledger-p2p tcp://127.0.0.1:0 --ledger-rpc tcp://127.0.0.1:0 >/dev/null
$DM node run --home "$W/dm" >"$W/dm.log" 2>&1 &
for _ in $(seq 100); do $DM status --home "$W/dm" >/dev/null 2>&1 && break; sleep 0.2; done

ipfs init --profile test >/dev/null
ours=$($DM data add "$W/ds" --json --home "$W/dm" | python3 -c 'import json,sys; print(json.load(sys.stdin)["cid"])')
theirs=$(ipfs add -Q --only-hash --cid-version=1 --raw-leaves --chunker=size-1048576 -r -H "$W/ds")
[ "$ours" = "$theirs" ] || { echo "FAIL: CIDs differ: ours $ours, kubo $theirs" >&2; exit 1; }
echo "ok: same CID as ipfs add --cid-version=1 --raw-leaves --chunker=size-1048576: $ours"

ipfs daemon >"$W/ipfs.log" 2>&1 &
for _ in $(seq 100); do grep -q "Daemon is ready" "$W/ipfs.log" && break; sleep 0.2; done
addr=$($DM status --home "$W/dm" --json | python3 -c 'import json,sys; print([a for a in json.load(sys.stdin)["addrs"] if "/tcp/" in a][0])')
ipfs swarm connect "$addr" >/dev/null
timeout 60 ipfs get "$ours" -o "$W/from-dm" >/dev/null
diff -r "$W/ds" "$W/from-dm"
echo "ok: kubo fetched our directory over bitswap, identical"

head -c 5000000 /dev/urandom >"$W/kubo.bin"
v0=$(ipfs add -Q "$W/kubo.bin")
$DM data get "$v0" -o "$W/got-v0" --home "$W/dm" >/dev/null
cmp "$W/kubo.bin" "$W/got-v0"
v1=$(ipfs add -Q -r -H --cid-version=1 "$W/ds/sub")
$DM data get "$v1" -o "$W/got-v1" --home "$W/dm" >/dev/null
diff -r "$W/ds/sub" "$W/got-v1"
echo "ok: we fetched kubo's CIDv0 file ($v0) and CIDv1 directory ($v1), identical"
