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
  python3-jsonschema python3-yaml scdoc iproute2 systemd
  docker.io docker-compose debootstrap
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

echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
