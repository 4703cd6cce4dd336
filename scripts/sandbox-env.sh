#!/usr/bin/env bash
# Sets up what a lender needs to run jobs in the job sandbox, and checks it:
#  1. bubblewrap 0.8 or later (Debian package bubblewrap; 0.8 brought
#     --disable-userns, which keeps a job from making user namespaces);
#  2. unprivileged user namespaces, which bubblewrap builds the sandbox in;
#  3. /etc/passwd and /etc/group free of the uids jobs run as
#     (DM_UID_RANGE, default 70000-70999: the node's [executor] uid_range).
# A lender whose node cannot build the whole sandbox does not lend; this
# says why before the node does. Idempotent. Usage: scripts/sandbox-env.sh
set -euo pipefail

UID_RANGE=${DM_UID_RANGE:-70000-70999}

say() { echo "sandbox-env: $*"; }
die() { echo "sandbox-env: ERROR: $*" >&2; exit 1; }

# --- 1. bubblewrap -------------------------------------------------------------
if ! command -v bwrap >/dev/null; then
  SUDO=
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || die "need root (or sudo) to install bubblewrap"
    SUDO=sudo
  fi
  if command -v apt-get >/dev/null; then
    say "installing bubblewrap"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get install -y -q --no-install-recommends bubblewrap >/tmp/sandbox-env-apt.log 2>&1 || {
      $SUDO apt-get update -q >>/tmp/sandbox-env-apt.log 2>&1 || die "apt-get update failed (see /tmp/sandbox-env-apt.log)"
      $SUDO apt-get install -y -q --no-install-recommends bubblewrap >>/tmp/sandbox-env-apt.log 2>&1 \
        || die "apt-get install bubblewrap failed (see /tmp/sandbox-env-apt.log)"
    }
  elif command -v dnf >/dev/null; then
    $SUDO dnf install -y bubblewrap || die "dnf install bubblewrap failed"
  else
    die "no apt-get or dnf: install bubblewrap 0.8 or later by hand"
  fi
fi
ver=$(bwrap --version | grep -oE '[0-9]+\.[0-9]+(\.[0-9]+)?' | head -n1)
IFS=. read -r major minor _ <<<"$ver"
if [ "${major:-0}" -eq 0 ] && [ "${minor:-0}" -lt 8 ]; then
  die "bubblewrap $ver is too old: 0.8 or later is needed (--disable-userns); upgrade it (Debian 12 and Ubuntu 24.04 ship 0.8)"
fi
say "bubblewrap $ver ok"

# --- 2. unprivileged user namespaces --------------------------------------------
max=$(cat /proc/sys/user/max_user_namespaces 2>/dev/null || echo 0)
[ "$max" -gt 0 ] || die "user namespaces are off: sysctl -w user.max_user_namespaces=15000 (and in /etc/sysctl.d/ to keep it)"
if [ -e /proc/sys/kernel/unprivileged_userns_clone ] && [ "$(cat /proc/sys/kernel/unprivileged_userns_clone)" != 1 ]; then
  die "unprivileged user namespaces are off: sysctl -w kernel.unprivileged_userns_clone=1 (and in /etc/sysctl.d/ to keep it)"
fi
if [ "$(id -u)" -eq 0 ] && command -v setpriv >/dev/null; then
  if ! out=$(setpriv --reuid 65534 --regid 65534 --clear-groups \
      bwrap --unshare-user --disable-userns --unshare-pid --unshare-net --ro-bind /usr /usr \
        --symlink usr/bin /bin --symlink usr/lib /lib --symlink usr/lib64 /lib64 --proc /proc --dev /dev -- /usr/bin/true 2>&1); then
    die "bubblewrap cannot build a sandbox here: $out (on Ubuntu 24.04 or later, AppArmor restricts user namespaces: keep the bwrap profile from the bubblewrap package)"
  fi
  say "a trial sandbox ran"
fi

# --- 3. the uids jobs run as ------------------------------------------------------
first=${UID_RANGE%-*}; last=${UID_RANGE#*-}
for db in /etc/passwd /etc/group; do
  hit=$(awk -F: -v a="$first" -v b="$last" '$3 >= a && $3 <= b {print $1 " (" $3 ")"; exit}' "$db")
  [ -z "$hit" ] || die "$hit in $db uses an id of the job uid range $UID_RANGE: pick another range ([executor] uid_range) or move the account"
done
say "job uid range $UID_RANGE is free"
