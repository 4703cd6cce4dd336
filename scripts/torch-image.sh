#!/usr/bin/env bash
# Builds, once, the PyTorch base image the tests and examples/torch-fashion-mnist
# use: a minimal Debian (bookworm) with python3 and Debian's own PyTorch
# (python3-torch: CPU, with gloo), laid out by mmdebstrap through
# `deepmarket env debian`, as an OCI image layout directory in
# $DM_TORCH_IMAGE (default /var/cache/deepmarket/images/torch as root, else
# ~/.cache/deepmarket/images/torch). About 2 minutes and 480 MB (1.3 GB
# unpacked); kept while its package list is the same.
# Usage: scripts/torch-image.sh --install (mmdebstrap, with apt: run it
# before the build, which may then run beside other apt-get installs)
#        scripts/torch-image.sh BIN (the deepmarket binary)
set -euo pipefail

BIN=${1:?usage: scripts/torch-image.sh --install | BIN}
if [ "$(id -u)" -eq 0 ]; then def=/var/cache/deepmarket/images/torch; else def=$HOME/.cache/deepmarket/images/torch; fi
OUT=${DM_TORCH_IMAGE:-$def}
APT="python3-torch,python3-numpy"

say() { echo "torch-image: $*"; }
die() { echo "torch-image: ERROR: $*" >&2; exit 1; }

install_mmdebstrap() {
  command -v mmdebstrap >/dev/null && return 0
  SUDO=
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  command -v apt-get >/dev/null || die "no apt-get: install mmdebstrap by hand"
  say "installing mmdebstrap"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get install -y -q --no-install-recommends mmdebstrap >/tmp/torch-image-apt.log 2>&1 || {
    $SUDO apt-get update -q >>/tmp/torch-image-apt.log 2>&1 || die "apt-get update failed (see /tmp/torch-image-apt.log)"
    $SUDO apt-get install -y -q --no-install-recommends mmdebstrap >>/tmp/torch-image-apt.log 2>&1 \
      || die "apt-get install mmdebstrap failed (see /tmp/torch-image-apt.log)"
  }
}
if [ "$BIN" = --install ]; then
  install_mmdebstrap
  exit 0
fi
if [ -f "$OUT/index.json" ] && [ "$(cat "$OUT.packages" 2>/dev/null)" = "bookworm $APT" ]; then
  say "$OUT is built"
  exit 0
fi
install_mmdebstrap
say "building $OUT (Debian bookworm, $APT; about 2 minutes)"
rm -rf "$OUT" "$OUT.packages"
mkdir -p "$(dirname "$OUT")"
start=$(date +%s)
"$BIN" env debian "$OUT" --suite bookworm --apt "$APT" >/tmp/torch-image.log 2>&1 \
  || { tail -20 /tmp/torch-image.log >&2; die "env debian failed (see /tmp/torch-image.log)"; }
echo "bookworm $APT" > "$OUT.packages"
say "built $OUT in $(( $(date +%s) - start ))s: $(tail -1 /tmp/torch-image.log)"
