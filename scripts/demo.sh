#!/usr/bin/env bash
# Installs what is missing, builds, prints the codec and fidelity tables,
# then starts a local 2-shard giftd cluster on loopback and runs the cluster
# benchmark (workers through libgiftclient) against it. JSON copies land in
# bench/out/. The cluster is stopped on the way out, whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/deps.sh
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >build.configure.log 2>&1 || { cat build.configure.log; exit 1; }
# `programs` is what `cmake --install build` installs, so that works afterwards.
cmake --build build -j "${GIFT_JOBS:-2}" --target gift-bench programs

mkdir -p bench/out
echo "== gift-bench codec"
build/bench/gift-bench codec --mib 32 --repeats 5 --json bench/out/codec.json
echo
echo "== gift-bench fidelity (synthetic layer)"
build/bench/gift-bench fidelity --json bench/out/fidelity.json
echo

# A 2-shard cluster on 127.0.0.1, free ports, logs under bench/out/.
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
servers=""
for i in 0 1; do
  ready="bench/out/giftd-$i.ready"
  : >"$ready"
  build/server/giftd --port 0 --http-port 0 --shard-id "$i" --num-shards 2 --world-size 2 \
    >"$ready" 2>"bench/out/giftd-$i.log" &
  pids+=("$!")
  for _ in $(seq 1 100); do
    grep -q '^giftd ready' "$ready" && break
    sleep 0.1
  done
  port=$(sed -n 's/^giftd ready port=\([0-9]*\).*/\1/p' "$ready")
  [ -n "$port" ] || { echo "shard $i did not start; see bench/out/giftd-$i.log"; exit 1; }
  servers="${servers:+$servers,}127.0.0.1:$port"
done
echo "== gift-bench cluster (2 shards on $servers, 2 workers)"
build/bench/gift-bench cluster --servers "$servers" --workers 2 --list llama \
  --json bench/out/cluster.json

# The PyTorch integration: a short training run of examples/train_llama.py
# (a small byte-level Llama, 2 workers, through a fresh 2-shard cluster per
# run) for each wire format, then the comparison table. A minute or three on
# two cores; bench/convergence.sh with its defaults is the full benchmark.
cleanup
pids=()
if /usr/bin/python3 -c 'import torch, numpy' 2>/dev/null; then
  echo
  echo "== training through giftd (bench/convergence.sh, short run)"
  bench/convergence.sh --steps 150 --seeds 1 --comms "f32 bf16 fp8 fp8-gift nvfp4 nvfp4-gift" \
    --no-fidelity --out bench/out/convergence-demo -- \
    --dim 64 --seq 64 --batch 8 --warmup 15 --refresh 10 --val-every 25 --val-batches 4 --quiet
else
  echo "== training through giftd: skipped (/usr/bin/python3 has no torch; scripts/deps.sh installs it)"
fi

# Time to quality on a shaped cluster network (bench/netcluster/): the
# starved link (f32 communication ~3x the compute), one seed, PyTorch DDP's
# allreduce against fp8-gift and nvfp4-gift through giftd on 2 server hosts
# beside 2 worker hosts, 200 steps. A few minutes; bench/netcluster/run.sh
# with its defaults is the full table. Needs root for the namespaces.
echo
echo "== time to quality on a shaped link (bench/netcluster, starved link, seed 1)"
if ! /usr/bin/python3 -c 'import torch, matplotlib' 2>/dev/null; then
  echo "skipped: /usr/bin/python3 has no torch or matplotlib (scripts/deps.sh installs them)"
elif [ "$(id -u)" != 0 ]; then
  echo "skipped: network namespaces need root (CAP_NET_ADMIN, CAP_SYS_ADMIN)"
else
  cmake --build build -j "${GIFT_JOBS:-2}" --target giftclient giftd
  rm -rf bench/out/netcluster-demo
  rc=0
  bench/netcluster/run.sh --out bench/out/netcluster-demo --links starved --seeds 1 \
    --steps 200 --arms "none ddp-allreduce fp8-gift nvfp4-gift" || rc=$?
  [ "$rc" = 0 ] || [ "$rc" = 77 ] || exit "$rc"
fi
