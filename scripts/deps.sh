#!/usr/bin/env bash
# Installs, only when missing, every Debian package giftd needs to build, test and demo.
# Runs as root (apt-get); as another user it uses sudo when that exists.
set -euo pipefail

PKGS=(
  build-essential cmake pkg-config clang-format clang libclang-rt-dev
  libuv1-dev libprotobuf-c-dev protobuf-c-compiler libjemalloc-dev check
  libopenblas-dev libopenblas0-pthread liblapacke-dev libinih-dev libsodium-dev
  curl prometheus
  python3-torch python3-numpy python3-pytest python3-matplotlib
  python3-venv python3-pip python3-setuptools python3-wheel
  python3-jsonschema python3-yaml scdoc iproute2 systemd
  docker.io docker-compose debootstrap
  slurmctld slurmd slurm-client munge
)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "deps: all ${#PKGS[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then SUDO=sudo; else
    echo "deps: missing ${missing[*]} and not root; install them and rerun" >&2
    exit 1
  fi
fi

# apt_get ARGS...: apt-get, waiting while another apt-get or dpkg (say an
# unattended upgrade) holds its lock, instead of failing at once: it retries
# every 10 s for up to GIFT_APT_WAIT seconds (default 300), then gives up with
# apt's own message.
apt_get() {
  local waited=0 err rc
  err=$(mktemp)
  while :; do
    rc=0
    $SUDO apt-get "$@" 2>"$err" || rc=$?
    if [ "$rc" -eq 0 ]; then
      cat "$err" >&2
      rm -f "$err"
      return 0
    fi
    if ! grep -qE 'Could not get lock|Unable to acquire the dpkg frontend lock|Unable to lock' "$err" ||
       [ "$waited" -ge "${GIFT_APT_WAIT:-300}" ]; then
      cat "$err" >&2
      rm -f "$err"
      [ "$waited" -eq 0 ] || echo "deps: still locked after ${waited} s; rerun when the other apt is done" >&2
      return "$rc"
    fi
    if [ "$waited" -eq 0 ]; then
      echo "deps: another apt or dpkg holds the package lock ($(grep -m1 -oE '/var/[^ ]*lock[-a-z]*' "$err" || echo its lock));" \
           "waiting up to ${GIFT_APT_WAIT:-300} s" >&2
    fi
    sleep 10
    waited=$((waited + 10))
  done
}

echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt_get update -q
apt_get install -y -q --no-install-recommends "${missing[@]}"
