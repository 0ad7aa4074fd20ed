#!/usr/bin/env bash
# bench/convergence.sh: train the byte-level Llama of examples/train_llama.py
# through a local giftd cluster once per (seed, --comm), all else equal, and
# compare: per-step CSVs, a PNG of the curves, a markdown table (final
# validation loss, mean and spread over seeds, gap to f32, wire bytes per
# step, steps per second), then gift-bench fidelity on gradients and input
# covariances dumped from the f32 run of the first seed. --no-fidelity skips
# that report; the dump is still written when --dump-steps is given (for
# `convergence_report.py fidelity` or `policy` later).
#
#   bench/convergence.sh [--steps N] [--seeds "1 2 3"] [--comms "f32 bf16 ..."]
#                        [--workers W] [--shards S] [--out DIR] [--build DIR]
#                        [--geometry-decay B] [--dump-steps "a,b"] [--no-fidelity]
#                        [-- train_llama args...]
#
# Every run gets a fresh cluster of S shards (the declared tensor list and the
# steps start anew) and W worker processes with RANK/WORLD_SIZE/MASTER_* as
# torchrun sets them. The shards run with geometry_decay B (default 0): the
# running average of each GIFT tensor's input covariance across refreshes.
# Seeds fix the model's initialisation and each worker's data order, so every
# --comm sees the same data. Results land in DIR (default
# bench/out/convergence): runs/<comm>-s<seed>/{log.csv,summary.json,
# server.json}, convergence.png, convergence.md, convergence.json, fidelity/.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

steps=200
seeds="1 2 3"
comms="f32 bf16 fp8 fp8-gift nvfp4 nvfp4-gift"
workers=2
shards=2
out=bench/out/convergence
build=build
dump_steps=""
dump_given=0
geometry_decay=0
fidelity=1
py=/usr/bin/python3
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --seeds) seeds=$2; shift 2 ;;
    --comms) comms=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --shards) shards=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --dump-steps) dump_steps=$2; dump_given=1; shift 2 ;;
    --no-fidelity) fidelity=0; shift ;;
    --) shift; extra=("$@"); break ;;
    --geometry-decay) geometry_decay=$2; shift 2 ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "convergence.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
# Dump steps default to 40% and 50% of the run (the first sketches the
# geometry, the second is measured) and the last two steps.
if [ -z "$dump_steps" ]; then
  dump_steps="$((steps * 2 / 5)),$((steps / 2)),$((steps - 11)),$((steps - 1))"
fi

giftd="$build/server/giftd"
lib="$build/client/libgiftclient.so.0"
[ -x "$giftd" ] && [ -e "$lib" ] || { echo "convergence.sh: build first ($giftd, $lib)" >&2; exit 1; }
case "$lib" in /*) ;; *) lib="$repo/$lib" ;; esac
export PYTHONPATH="$repo/python" GIFT_LIBRARY="$lib" PYTHONDONTWRITEBYTECODE=1
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
mkdir -p "$out/runs"

pids=()
stop_all() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
trap stop_all EXIT

# run_one COMM SEED: one training run on a fresh cluster.
run_one() {
  local comm=$1 seed=$2 dir="$out/runs/$1-s$2" servers="" port i
  mkdir -p "$dir"
  # The policy arms (train_llama.py's auto-8, auto-B) need shards that run
  # the geometry owner's policy with that budget: the worker cannot set it.
  local pol=()
  case $comm in
    auto-8) pol=(--policy auto) ;;
    auto-*) pol=(--policy auto --budget-bits "${comm#auto-}") ;;
  esac
  for ((i = 0; i < shards; i++)); do
    : >"$dir/giftd-$i.ready"
    "$giftd" --port 0 --http-port -1 --shard-id "$i" --num-shards "$shards" \
      --world-size "$workers" --geometry-decay "$geometry_decay" --log-level warn "${pol[@]}" \
      >"$dir/giftd-$i.ready" 2>"$dir/giftd-$i.log" &
    pids+=("$!")
    for _ in $(seq 1 100); do grep -q '^giftd ready' "$dir/giftd-$i.ready" && break; sleep 0.1; done
    port=$(sed -n 's/^giftd ready port=\([0-9]*\).*/\1/p' "$dir/giftd-$i.ready")
    [ -n "$port" ] || { echo "shard $i did not start; see $dir/giftd-$i.log" >&2; return 1; }
    servers="${servers:+$servers,}127.0.0.1:$port"
  done
  printf '{"geometry_decay": %s, "giftd_policy_args": "%s"}\n' "$geometry_decay" "${pol[*]}" >"$dir/server.json"
  # the rendezvous port: below the kernel's ephemeral range (32768-), where no
  # outgoing connection can hold it
  local mport=$((10000 + RANDOM % 20000)) wp=() r rc=0 dump=()
  if [ "$comm" = f32 ] && [ "$seed" = "$first_seed" ] && { [ "$fidelity" = 1 ] || [ "$dump_given" = 1 ]; }; then
    dump=(--dump "$out/dump" --dump-steps "$dump_steps")
  fi
  for ((r = workers - 1; r >= 0; r--)); do
    GIFT_SERVERS=$servers RANK=$r WORLD_SIZE=$workers MASTER_ADDR=127.0.0.1 MASTER_PORT=$mport \
      "$py" examples/train_llama.py --comm "$comm" --seed "$seed" --steps "$steps" \
      --out "$dir" "${dump[@]}" "${extra[@]}" >"$dir/worker-$r.log" 2>&1 &
    wp+=("$!")
  done
  for p in "${wp[@]}"; do wait "$p" || rc=$?; done
  stop_all
  if [ "$rc" != 0 ]; then
    echo "run $comm seed $seed failed ($rc); see $dir/worker-*.log" >&2
    tail -5 "$dir"/worker-0.log >&2
    return 1
  fi
  "$py" -c 'import json, sys; s = json.load(open(sys.argv[1])); print("val loss %.4f, %.3f MB/step/worker, %.2f steps/s" % (s["final_val_loss"], s["wire_bytes_per_step"] / 1e6, s["steps_per_s"]))' "$dir/summary.json"
}

first_seed=${seeds%% *}
t0=$(date +%s)
for seed in $seeds; do
  for comm in $comms; do
    printf '%-11s seed %s: ' "$comm" "$seed"
    run_one "$comm" "$seed"
  done
done
echo "training runs took $(( $(date +%s) - t0 )) s"

if [ "$fidelity" = 1 ] && [ -d "$out/dump" ]; then
  bench="$build/bench/gift-bench"
  "$py" bench/convergence_report.py fidelity --dump "$out/dump" --bench "$bench" \
    --out "$out/fidelity"
fi
"$py" bench/convergence_report.py report --out "$out"
