#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test: the normal build and
# the address+undefined sanitizer build. Exits non-zero if anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/deps.sh

JOBS="${GIFT_JOBS:-2}"
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"

run_build() {
  local dir="$1"; shift
  echo "== configure $dir ($*)"
  cmake -S . -B "$dir" "$@" >"$dir.configure.log" 2>&1 || { cat "$dir.configure.log"; return 1; }
  echo "== build $dir"
  cmake --build "$dir" -j "$JOBS"
  echo "== test $dir"
  ctest --test-dir "$dir" --output-on-failure -j "$JOBS"
}

mkdir -p build
run_build build -DCMAKE_BUILD_TYPE=RelWithDebInfo
# The sanitizer build skips CUDA: nvcc objects are not instrumented.
run_build build-asan -DCMAKE_BUILD_TYPE=Debug -DGIFT_SANITIZE=ON -DGIFT_WITH_CUDA=OFF
echo "== all tests passed"
