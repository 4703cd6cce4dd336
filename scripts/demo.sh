#!/usr/bin/env bash
# The five-minute tour (make demo): three universities on this machine, two
# lab machines lend, a third submits the Fashion-MNIST example; watch the
# job, the credits move, and every node's audit pass.
#
#   DM_BIN     the deepmarket binary (default bin/deepmarket)
#   DM_PYTHON  Python with tensorflow-cpu the lenders run the job with
#   DM_DEMO    where the testnet goes (default a new temporary directory)
#   DM_KEEP=1  leave the testnet running at the end (Ctrl-C stops it)
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${DM_BIN:-bin/deepmarket}
PY=${DM_PYTHON:-python3}
DIR=${DM_DEMO:-$(mktemp -d /tmp/deepmarket-demo.XXXXXX)/tn}

step() { printf '\n\033[1;36m== %s\033[0m\n' "$*"; }
dm() { echo "\$ deepmarket $*" >&2; "$BIN" "$@"; }

if [ "$(id -u)" != 0 ]; then
  echo "The demo lends machines, and lending enforces its limits with cgroups: run it as root (sudo make demo)." >&2
  exit 1
fi
if ! "$PY" -c 'import tensorflow' 2>/dev/null; then
  echo "$PY has no TensorFlow: run 'make deps' first (or set DM_PYTHON)." >&2
  exit 1
fi

step "1. Make a testnet: 3 universities, each with a validator; 4 lab machines"
# node0 and node3 are two machines of univ-a's lab; node1 is at univ-b.
dm testnet init --validators 3 --nodes 4 --sites 3 --python "$PY" --out "$DIR"

step "2. Start every node (logs in each home's node.log)"
"$BIN" testnet run "$DIR" >"$DIR/run.log" 2>&1 &
RUN=$!
cleanup() {
  if [ "${DM_KEEP:-}" = 1 ] && kill -0 $RUN 2>/dev/null; then
    echo "The testnet keeps running (pid $RUN): deepmarket testnet status $DIR; kill $RUN to stop it."
    return
  fi
  kill -INT $RUN 2>/dev/null && wait $RUN 2>/dev/null || true
}
trap cleanup EXIT
for _ in $(seq 120); do
  grep -q "is running" "$DIR/run.log" 2>/dev/null && break
  kill -0 $RUN 2>/dev/null || { cat "$DIR/run.log"; exit 1; }
  sleep 1
done
sed -n '/is running/,$p' "$DIR/run.log"
dm testnet status "$DIR"

N0=(--home "$DIR/node0") N1=(--home "$DIR/node3") N2=(--home "$DIR/node1")
step "3. Two lab machines at univ-a lend a core and 2 GiB each"
dm "${N0[@]}" lend --cores 1 --mem 2GiB
dm "${N1[@]}" lend --cores 1 --mem 2GiB
for _ in $(seq 60); do
  [ "$("$BIN" "${N2[@]}" offers --json | grep -c '"machine"')" -ge 2 ] && break
  sleep 1
done
dm "${N2[@]}" offers

step "4. A researcher at univ-b submits the Fashion-MNIST example: 2 workers, distributed TensorFlow"
before=$("$BIN" "${N2[@]}" ledger balance)
( cd examples/fashion-mnist && "$OLDPWD/$BIN" "${N2[@]}" submit job.toml --yes --wait )
ID=$("$BIN" "${N2[@]}" jobs --json | sed -n 's/.*"id": "\([0-9a-f]*\)".*/\1/p' | head -1)
dm "${N2[@]}" jobs show "$ID"

step "5. Credits moved: the submitter paid, the lenders earned"
echo "submitter before: $before"
for h in node0 node3 node1; do
  printf '%-6s ' "$h"; "$BIN" --home "$DIR/$h" ledger balance
done
dm "${N0[@]}" ledger history
dm "${N2[@]}" ledger history

step "6. Every node audits the ledger from genesis"
for h in val0 val1 val2 node0 node1 node2 node3; do
  printf '%-6s ' "$h"
  "$BIN" --home "$DIR/$h" ledger audit --json 2>/dev/null | "$PY" -c 'import json, sys
r = json.load(sys.stdin)
print("audit", "OK" if r["ok"] else "FAILED", "at height", r["height"], "app hash", r["app_hash"][:16],
      "supply", r["supply"] / 1e6, "escrowed", r["escrowed"] / 1e6, *r["problems"])'
done

step "Done. The testnet is in $DIR"
