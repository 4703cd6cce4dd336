#!/usr/bin/env bash
# Installs what the dashboard's browser tests need: Debian's chromium, which
# they drive headless with chromedp (node/ui_browser_test.go).
# Idempotent: when chromium is already there it only checks and exits.
# Env: DM_CHROMIUM (a browser to use instead; checked, nothing installed).
# Usage: scripts/browser-env.sh
set -euo pipefail

DEB_PKGS=(chromium)
LOG=/tmp/browser-env-apt.log

say() { echo "browser-env: $*"; }
die() { echo "browser-env: ERROR: $*" >&2; exit 1; }

# check BIN: the browser starts and prints its version.
check() {
  local v
  v=$("$1" --headless --no-sandbox --version 2>/dev/null) || die "$1 is installed but does not start (try: $1 --headless --no-sandbox --version)"
  say "ok: $1 ($v)"
}

if [ -n "${DM_CHROMIUM:-}" ]; then
  [ -x "$DM_CHROMIUM" ] || die "DM_CHROMIUM=$DM_CHROMIUM is not an executable"
  check "$DM_CHROMIUM"
  exit 0
fi

deb_installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
missing=()
for p in "${DEB_PKGS[@]}"; do deb_installed "$p" || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  command -v apt-get >/dev/null || die "apt-get not found; install ${missing[*]} by hand (or set DM_CHROMIUM)"
  SUDO=
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || die "need root (or sudo) to install ${missing[*]}"
    SUDO=sudo
  fi
  say "installing Debian packages: ${missing[*]} (first time: a minute or two)"
  export DEBIAN_FRONTEND=noninteractive
  if ! $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >"$LOG" 2>&1; then
    say "apt-get install failed; running apt-get update and retrying"
    $SUDO apt-get update -q >>"$LOG" 2>&1 || die "apt-get update failed (see $LOG)"
    $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$LOG" 2>&1 \
      || die "apt-get install ${missing[*]} failed (see $LOG)"
  fi
fi
[ -x /usr/bin/chromium ] || die "/usr/bin/chromium missing after installing chromium"
check /usr/bin/chromium
