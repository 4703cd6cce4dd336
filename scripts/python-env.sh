#!/usr/bin/env bash
# Sets up what the Python training jobs (examples/fashion-mnist) need:
#  1. Debian packages: dataset-fashion-mnist (the real Fashion-MNIST IDX
#     files, gzipped, under /usr/share/datasets/fashion-mnist) and
#     python3-venv. (The job sandbox's bubblewrap: scripts/sandbox-env.sh.)
#  2. A virtualenv at ${DM_VENV:-<repo>/.venv} with the pinned packages below
#     and the project's own python/ package (deepmarket.train.DiLoCo).
# Idempotent: when everything is already there it only checks and exits
# (well under 2 s). Env: DM_VENV (venv path), PYTHON (interpreter for the
# venv; default /usr/bin/python3). Usage: scripts/python-env.sh
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
VENV=${DM_VENV:-$REPO/.venv}
# Pinned for Python 3.9-3.13 on x86_64 Linux. keras (3) and numpy are
# tensorflow-cpu's own dependencies, pinned to the versions it resolved to.
PINS=(tensorflow-cpu==2.20.0 keras==3.15.1 numpy==2.4.6)
# tf-keras (Keras 2) is what the jobs train with: Keras 3 cannot run
# MultiWorkerMirroredStrategy across workers. Its wheel requires the package
# "tensorflow", which tensorflow-cpu provides under another name, so it is
# installed without dependencies.
NODEPS_PINS=(tf-keras==2.20.1)
DATA_DIR=/usr/share/datasets/fashion-mnist
DEB_PKGS=(dataset-fashion-mnist python3-venv)

say() { echo "python-env: $*"; }
die() { echo "python-env: ERROR: $*" >&2; exit 1; }

if [ -z "${PYTHON:-}" ]; then
  if [ -x /usr/bin/python3 ]; then PYTHON=/usr/bin/python3; else PYTHON=$(command -v python3 || true); fi
fi
[ -n "$PYTHON" ] && [ -x "$PYTHON" ] || die "python interpreter '${PYTHON:-python3}' not found or not executable (set PYTHON=/path/to/python3)"

# --- 1. Debian packages -------------------------------------------------------
deb_installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
missing=()
for p in "${DEB_PKGS[@]}"; do deb_installed "$p" || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  command -v apt-get >/dev/null || die "apt-get not found; install ${missing[*]} by hand"
  SUDO=
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || die "need root (or sudo) to install ${missing[*]}"
    SUDO=sudo
  fi
  say "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  if ! $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >/tmp/python-env-apt.log 2>&1; then
    say "apt-get install failed; running apt-get update and retrying"
    $SUDO apt-get update -q >>/tmp/python-env-apt.log 2>&1 || die "apt-get update failed (see /tmp/python-env-apt.log)"
    $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >>/tmp/python-env-apt.log 2>&1 \
      || die "apt-get install ${missing[*]} failed (see /tmp/python-env-apt.log)"
  fi
fi
for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
  [ -f "$DATA_DIR/$f.gz" ] || [ -f "$DATA_DIR/$f" ] || die "dataset file $DATA_DIR/$f(.gz) missing after install"
done
say "dataset ok: $DATA_DIR"

# --- 2. virtualenv with pinned packages ---------------------------------------
site_packages() { compgen -G "$VENV/lib/python3*/site-packages" | head -n1; }

# True when every pinned package is installed in the venv at exactly its version
# (checked through the .dist-info folder names, without starting Python/pip).
venv_complete() {
  [ -x "$VENV/bin/python" ] || return 1
  local sp; sp=$(site_packages) || return 1
  [ -n "$sp" ] || return 1
  local pin name ver
  shopt -s nocaseglob
  for pin in "${PINS[@]}" "${NODEPS_PINS[@]}"; do
    name=${pin%%==*}; ver=${pin#*==}
    name=${name//-/_}; name=${name//./_}
    if ! compgen -G "$sp/${name}-${ver}.dist-info" >/dev/null; then shopt -u nocaseglob; return 1; fi
  done
  shopt -u nocaseglob
  return 0
}

# The project's own package (python/deepmarket: DiLoCo for Keras jobs),
# reinstalled whenever its sources change (their hash is kept beside it).
pkg_hash() { (cd "$REPO/python" && find pyproject.toml deepmarket -name '*.py' -o -name pyproject.toml | LC_ALL=C sort | xargs sha256sum) | sha256sum | cut -c1-64; }
install_pkg() {
  local want; want=$(pkg_hash)
  local mark="$VENV/.deepmarket-python-hash"
  if [ -f "$mark" ] && [ "$(cat "$mark")" = "$want" ] && "$VENV/bin/python" -c 'import deepmarket' >/dev/null 2>&1; then
    say "deepmarket package ok"
    return
  fi
  say "installing the deepmarket package (python/) into $VENV"
  local tmp; tmp=$(mktemp -d)
  cp -r "$REPO/python/pyproject.toml" "$REPO/python/README.md" "$REPO/python/deepmarket" "$tmp/"
  "$VENV/bin/python" -m pip install --disable-pip-version-check --no-input -q --no-deps --no-build-isolation "$tmp" \
    || { rm -rf "$tmp"; die "pip install ./python failed"; }
  rm -rf "$tmp"
  "$VENV/bin/python" -c 'import deepmarket.train' >/dev/null 2>&1 || die "the deepmarket package does not import"
  echo "$want" > "$mark"
}

# A wheelhouse for offline `deepmarket env build`s of the examples: the
# build backend of examples/torch-fashion-mnist's project (setuptools).
if [ "$(id -u)" -eq 0 ]; then WHEELS_DEF=/var/cache/deepmarket/wheels; else WHEELS_DEF=$HOME/.cache/deepmarket/wheels; fi
WHEELS=${DM_WHEELHOUSE:-$WHEELS_DEF}
WHEEL_PINS=(setuptools==80.9.0)
wheelhouse() {
  [ -f "$WHEELS/setuptools-80.9.0-py3-none-any.whl" ] && return 0
  mkdir -p "$WHEELS"
  "$VENV/bin/python" -m pip download --disable-pip-version-check --no-input -q --only-binary=:all: --no-deps \
    -d "$WHEELS" "${WHEEL_PINS[@]}" || die "pip download ${WHEEL_PINS[*]} into $WHEELS failed"
  say "wheelhouse $WHEELS: ${WHEEL_PINS[*]}"
}

if venv_complete; then
  say "venv ok: $VENV (${PINS[*]} ${NODEPS_PINS[*]})"
  install_pkg
  wheelhouse
  exit 0
fi

if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1; then
  say "creating venv $VENV with $PYTHON ($("$PYTHON" -c 'import platform; print(platform.python_version())'))"
  "$PYTHON" -c 'import sys; sys.exit(0 if (3, 9) <= sys.version_info[:2] <= (3, 13) else 1)' \
    || die "$PYTHON is not Python 3.9-3.13, which tensorflow-cpu 2.20 needs"
  if [ -e "$VENV" ]; then
    [ -f "$VENV/pyvenv.cfg" ] || [ -z "$(ls -A "$VENV" 2>/dev/null)" ] \
      || die "$VENV exists and is not a virtualenv; move it away or set DM_VENV"
    rm -rf "$VENV"
  fi
  "$PYTHON" -m venv "$VENV" || die "python -m venv failed (is python3-venv installed?)"
fi
say "installing ${PINS[*]} ${NODEPS_PINS[*]} into $VENV (first time: about a minute)"
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check --no-input -q)
"${PIP[@]}" "${PINS[@]}" || die "pip install ${PINS[*]} failed"
"${PIP[@]}" --no-deps "${NODEPS_PINS[@]}" || die "pip install --no-deps ${NODEPS_PINS[*]} failed"
venv_complete || die "venv $VENV still lacks a pinned package after pip install"
TF_CPP_MIN_LOG_LEVEL=3 "$VENV/bin/python" -c 'import numpy, tensorflow, tf_keras' >/dev/null \
  || die "installed packages do not import"
install_pkg
wheelhouse
say "venv ready: $VENV"
