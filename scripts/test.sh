#!/usr/bin/env bash
# make test's suites, after deps and lint: every Go package's tests, the
# Python package's unit tests beside them (their TensorFlow runs use the
# cores the Go end-to-end tests spend waiting on timers and peers; niced a
# little, so that the nodes' timers, which have peers waiting, come first), then
# the fuzzers. The Python output is printed whole after the Go output; the
# exit status is the first failing suite's.
#
# Environment: GO (go), VENV (the tensorflow virtualenv), FUZZEXECS and
# FUZZTIME (how many inputs each fuzzer tries).
set -uo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
VENV=${VENV:-/opt/deepmarket/venv}
FUZZEXECS=${FUZZEXECS:-20000x}
FUZZTIME=${FUZZTIME:-60000x}

py_log=$(mktemp)
# The node and testnet packages' tests keep their nodes' homes (node store, blockstore,
# ledger, CometBFT) on a tmpfs: those stores flush to disk hundreds of
# times a second (the queue test alone: about 2,200 writes and 700 flushes
# a second), so on a slower disk every test that runs beside them waits on
# it. The jobs' work dirs stay on disk (/var/tmp), where the sandbox's
# disk bounds hold. DM_TEST_TMPFS=0 keeps the homes on disk.
state=""
if [ "$(id -u)" = 0 ] && [ "${DM_TEST_TMPFS:-1}" != 0 ]; then
	state=$(mktemp -d /tmp/dm-test-state.XXXXXX)
	if mount -t tmpfs -o size=8g,mode=1777 dm-test-state "$state"; then
		export DM_TEST_STATE_DIR=$state
	else
		rmdir "$state"
		state=""
	fi
fi
cleanup() {
	rm -f "$py_log"
	if [ -n "$state" ]; then
		umount -l "$state" && rmdir "$state"
	fi
}
trap cleanup EXIT
start=$(date +%s)
(
	TF_CPP_MIN_LOG_LEVEL=2 nice -n 5 "$VENV/bin/python3" -m unittest discover -s python/tests -t python >"$py_log" 2>&1
) &
py=$!

# The longest package first (./node, 10-15 minutes), so that go test's two
# slots run it from the start beside the others (./cmd/deepmarket and
# ./ledger, then ./testnet, whose TensorFlow jobs come once the Python
# suite's are done) rather than after them.
DM_PYTHON=$VENV/bin/python3 DM_REQUIRE_TF=1 DM_REQUIRE_BROWSER=1 DM_REQUIRE_ROOT=1 \
	"$GO" test -count=1 -timeout 25m ./node ./cmd/deepmarket ./ledger ./testnet ./...
go_rc=$?
echo "== go test: exit $go_rc after $(( $(date +%s) - start ))s"

wait "$py"
py_rc=$?
echo "== python unittest (ran beside go test): exit $py_rc"
cat "$py_log"

fuzz_rc=0
for f in "FuzzValidate ./p2p $FUZZEXECS" "FuzzCheckTx ./ledger $FUZZEXECS" "FuzzDecodeTx ./ledger $FUZZEXECS" "FuzzDecodeEntry ./storage $FUZZTIME"; do
	set -- $f
	echo "== fuzz $1 $2 ($3)"
	"$GO" test -run '^$' -fuzz "$1" -fuzztime "$3" "$2" || { fuzz_rc=$?; break; }
done

for rc in "$go_rc" "$py_rc" "$fuzz_rc"; do
	if [ "$rc" -ne 0 ]; then
		exit "$rc"
	fi
done
echo "== every suite passed in $(( $(date +%s) - start ))s"
