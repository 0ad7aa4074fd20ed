#!/usr/bin/env bash
# Installs what is missing, builds, and runs the codec benchmark and the
# fidelity benchmark on a synthetic layer, printing both tables.
# JSON copies land in bench/out/.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/deps.sh
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >build.configure.log 2>&1 || { cat build.configure.log; exit 1; }
cmake --build build -j "${GIFT_JOBS:-2}" --target gift-bench

mkdir -p bench/out
echo "== gift-bench codec"
build/bench/gift-bench codec --mib 32 --repeats 5 --json bench/out/codec.json
echo
echo "== gift-bench fidelity (synthetic layer)"
build/bench/gift-bench fidelity --json bench/out/fidelity.json
