#!/usr/bin/env bash
# Installs what testnet/netlab's emulated networks need beyond a Linux kernel:
# iproute2 (ip, tc) for every lab, and nftables (nft) for the routers of sites
# behind a NAT (netlab.Config.NAT). As root, it then loads a NAT router's
# rules (masquerade, conntrack) in a scratch network namespace, to check that
# the kernel takes them. Idempotent: when both are installed it only checks.
# Usage: scripts/netlab-env.sh
set -euo pipefail

LOG=/tmp/netlab-env-apt.log

say() { echo "netlab-env: $*"; }
die() { echo "netlab-env: ERROR: $*" >&2; exit 1; }

# tool NAME: its path, looking in the sbin directories too (a user's PATH
# often lacks them; netlab looks there as well).
tool() {
  command -v "$1" 2>/dev/null && return 0
  local d
  for d in /usr/sbin /sbin /usr/bin /bin; do
    [ -x "$d/$1" ] && { echo "$d/$1"; return 0; }
  done
  return 1
}

missing=()
tool ip >/dev/null || missing+=(iproute2)
tool nft >/dev/null || missing+=(nftables)
if [ ${#missing[@]} -gt 0 ]; then
  command -v apt-get >/dev/null || die "apt-get not found; install ${missing[*]} by hand"
  SUDO=
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || die "need root (or sudo) to install ${missing[*]}"
    SUDO=sudo
  fi
  say "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  if ! $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >"$LOG" 2>&1; then
    say "apt-get install failed; running apt-get update and retrying"
    $SUDO apt-get update -q >>"$LOG" 2>&1 || die "apt-get update failed (see $LOG)"
    $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$LOG" 2>&1 \
      || die "apt-get install ${missing[*]} failed (see $LOG)"
  fi
fi
IP=$(tool ip) || die "ip missing after installing iproute2"
NFT=$(tool nft) || die "nft missing after installing nftables"
ver=$("$NFT" --version 2>/dev/null) || die "$NFT is installed but does not run"

# As root: a NAT router's rules, as netlab loads them, in a scratch namespace.
if [ "$(id -u)" -eq 0 ]; then
  ns="netlabenv$$"
  "$IP" netns add "$ns" || die "cannot create a network namespace (ip netns add)"
  trap '"$IP" netns del "$ns" 2>/dev/null || true' EXIT
  enter=("$IP" netns exec "$ns")
  if command -v nsenter >/dev/null; then enter=(nsenter "--net=/var/run/netns/$ns"); fi
  if ! out=$("${enter[@]}" "$NFT" -f - 2>&1 <<'EOF'
table ip netlab {
	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		oifname "wan" masquerade fully-random
	}
	chain forward {
		type filter hook forward priority filter; policy drop;
		ct state established,related accept
		iifname "gw0" accept
	}
	chain input {
		type filter hook input priority filter; policy accept;
		iifname "wan" ct state established,related accept
		iifname "wan" drop
	}
}
EOF
  ); then
    die "the kernel does not take a NAT router's nftables rules (needs nf_tables, nf_conntrack, nf_nat, nft_masq): $out"
  fi
  say "ok: $ver; a NAT router's rules load in a network namespace"
else
  say "ok: $ver (not root: the kernel's NAT support was not checked)"
fi
