#!/usr/bin/env bash
# scaling.sh [options]: gift-bench cluster over a grid of W workers x S shards.
#
# For every (W, S) of --workers x --shards (default 1,2 x 1,2,4; a cell with
# W + S above --max-procs is skipped) it runs
#   gift-bench cluster --workers W --shards S --codecs f32,fp8-e4m3
#                      --transforms euclidean ... --json OUT/cluster-wW-sS.json
# one at a time, each under --cell-timeout seconds, then a python3 step (the
# first python3 on PATH, or --python; standard library only) writes
# OUT/scaling.json and OUT/scaling.md with, per (W, S, codec):
#   - aggregate wire GB/s: every worker's wire rate summed (client bytes out + in)
#   - goodput GB/s: per worker (mean) and summed over the workers
#   - cores busy: worker + shard CPU seconds per second of wall over the
#     measured steps (W x worker CPU per step + all shards' CPU per step,
#     over the mean wall time of a measured step)
#   - aggregate wire GB/s per busy core
#   - the raw-TCP streaming baseline of the same run, and aggregate wire over it
#   - the per-byte costs: worker I/O ns/payload B, shard ns/payload B, passes
# Everything runs on this machine's cores: on 2 cores the larger cells
# oversubscribe them, which is what the cores-busy column shows.
# Exit 0 when every cell ran, 1 when one failed (the others still run and
# are reported), 2 on a usage error.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
bench=$here/../build/bench/gift-bench
giftd=""
workers=1,2
shards=1,2,4
max_procs=6
steps=10
warmup=2
row_seconds=4
mib=64
chunk_mib=4
rtt_iters=200
stream_reps=2
cell_timeout=300
out=$here/out/scaling
py=""

usage() {
    cat <<EOF
usage: bench/scaling.sh [--bench PATH] [--giftd PATH] [--workers LIST] [--shards LIST]
                        [--max-procs N] [--steps N] [--warmup N] [--row-seconds X]
                        [--mib N] [--chunk-mib N] [--rtt-iters N] [--stream-reps N]
                        [--cell-timeout S] [--out DIR] [--python PATH]

Runs gift-bench cluster --codecs f32,fp8-e4m3 --transforms euclidean for every
W workers x S shards of the grid, one cell at a time, each with --json, then
writes DIR/scaling.json and DIR/scaling.md: per (W, S, codec) the aggregate wire
GB/s (all workers), goodput, cores busy (worker + shard CPU seconds per second
of wall), aggregate wire GB/s per busy core, the raw-TCP streaming baseline of
the same run and the wire rate over it, and the per-byte costs.

options:
  --bench PATH        gift-bench (default build/bench/gift-bench of this checkout)
  --giftd PATH        giftd, passed as gift-bench's --giftd (default: its own)
  --workers LIST      W values, comma-separated (default $workers)
  --shards LIST       S values, comma-separated (default $shards)
  --max-procs N       skip a cell with W + S above N (default $max_procs)
  --steps N           measured steps per row (default $steps)
  --warmup N          warm-up steps per row (default $warmup)
  --row-seconds X     a row stops after this long (default $row_seconds)
  --mib N             the tensor's MiB of fp32 (default $mib)
  --chunk-mib N       client chunk size (default $chunk_mib)
  --rtt-iters N       4 KiB round trips (default $rtt_iters)
  --stream-reps N     raw streaming repetitions (default $stream_reps)
  --cell-timeout S    wall limit of one cell, seconds (default $cell_timeout)
  --out DIR           output folder (default bench/out/scaling)
  --python PATH       python3 for the summary (default: the first python3 on PATH)
  --help              this text

Each cell's stdout and stderr go to DIR/cluster-wW-sS.txt. Exit 0 when every
cell ran, 1 when one failed (the rest still run and are reported), 2 on a
usage error.
EOF
}

die() { echo "scaling.sh: $*" >&2; exit 2; }
need() { [[ $# -ge 2 && -n $2 ]] || die "$1 needs a value (see --help)"; }
is_list() { [[ $1 =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]]; }
is_int() { [[ $1 =~ ^[1-9][0-9]*$ ]]; }

while [[ $# -gt 0 ]]; do
    case $1 in
        --help|-h) usage; exit 0 ;;
        --bench) need "$@"; bench=$2; shift 2 ;;
        --giftd) need "$@"; giftd=$2; shift 2 ;;
        --workers) need "$@"; workers=$2; shift 2 ;;
        --shards) need "$@"; shards=$2; shift 2 ;;
        --max-procs) need "$@"; max_procs=$2; shift 2 ;;
        --steps) need "$@"; steps=$2; shift 2 ;;
        --warmup) need "$@"; warmup=$2; shift 2 ;;
        --row-seconds) need "$@"; row_seconds=$2; shift 2 ;;
        --mib) need "$@"; mib=$2; shift 2 ;;
        --chunk-mib) need "$@"; chunk_mib=$2; shift 2 ;;
        --rtt-iters) need "$@"; rtt_iters=$2; shift 2 ;;
        --stream-reps) need "$@"; stream_reps=$2; shift 2 ;;
        --cell-timeout) need "$@"; cell_timeout=$2; shift 2 ;;
        --out) need "$@"; out=$2; shift 2 ;;
        --python) need "$@"; py=$2; shift 2 ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done
is_list "$workers" || die "--workers: '$workers' is not a list of positive integers"
is_list "$shards" || die "--shards: '$shards' is not a list of positive integers"
for v in max_procs steps mib chunk_mib rtt_iters stream_reps cell_timeout; do
    is_int "${!v}" || die "--${v//_/-}: '${!v}' is not a positive integer"
done
[[ $warmup =~ ^[0-9]+$ ]] || die "--warmup: '$warmup' is not an integer"
[[ $row_seconds =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--row-seconds: '$row_seconds' is not a number"
[[ -x $bench ]] || die "gift-bench not found at $bench (build it, or --bench PATH)"
if [[ -z $py ]]; then
    py=$(command -v python3 || true)
    [[ -n $py ]] || die "no python3 on PATH (or --python PATH)"
fi
mkdir -p "$out"

failed=0
ran=() # this run's JSON files: only these are summarised, not older ones in DIR
t_start=$SECONDS
IFS=, read -r -a wlist <<<"$workers"
IFS=, read -r -a slist <<<"$shards"
for w in "${wlist[@]}"; do
    for s in "${slist[@]}"; do
        cell=cluster-w$w-s$s
        if (( w + s > max_procs )); then
            echo "scaling.sh: W=$w S=$s: skipped ($((w + s)) processes > --max-procs $max_procs)" >&2
            continue
        fi
        rm -f "$out/$cell.json"
        args=(cluster --workers "$w" --shards "$s" --codecs "f32,fp8-e4m3" --transforms euclidean
              --steps "$steps" --warmup "$warmup" --row-seconds "$row_seconds" --mib "$mib"
              --chunk-mib "$chunk_mib" --rtt-iters "$rtt_iters" --stream-reps "$stream_reps"
              --json "$out/$cell.json")
        [[ -z $giftd ]] || args+=(--giftd "$giftd")
        echo "scaling.sh: W=$w S=$s ..." >&2
        t0=$SECONDS
        # gift-bench kills its own shards and workers on SIGTERM; -k: SIGKILL 10 s later.
        if timeout -k 10 "$cell_timeout" "$bench" "${args[@]}" >"$out/$cell.txt" 2>&1; then
            echo "scaling.sh: W=$w S=$s done in $((SECONDS - t0)) s" >&2
            ran+=("$out/$cell.json")
        else
            rc=$?
            failed=1
            rm -f "$out/$cell.json"
            echo "scaling.sh: W=$w S=$s failed (exit $rc; last lines of $out/$cell.txt):" >&2
            tail -n 5 "$out/$cell.txt" >&2 || true
        fi
    done
done

"$py" - "$out" "$workers" "$shards" ${ran[@]+"${ran[@]}"} <<'PY'
import json, math, os, sys

out = sys.argv[1]
cells = []
for path in sys.argv[4:]:
    with open(path) as f:
        j = json.load(f)
    raw = (j.get("raw_tcp") or {}).get("stream_gbps")
    w = j["workers"]
    for r in j["rows"]:
        if r["transform"] != "euclidean":
            continue
        def num(v):
            return v if isinstance(v, (int, float)) and math.isfinite(v) else None
        steps = r["steps"]
        meas = [x for x in r.get("measured_s_per_worker", []) if num(x)]
        step_wall = sum(meas) / len(meas) / steps if meas and steps > 0 else None
        wcpu, scpu = num(r.get("worker_cpu_ms_per_step")), num(r.get("shards_cpu_ms_per_step"))
        busy = ((w * wcpu + scpu) / 1e3 / step_wall
                if step_wall and wcpu is not None and scpu is not None else None)
        wire = sum(x for x in r["wire_per_worker_gbps"] if num(x) is not None)
        good = sum(x for x in r["goodput_per_worker_gbps"] if num(x) is not None)
        cells.append({
            "workers": w, "shards": j["shards"], "codec": r["codec"], "steps": steps,
            "source": os.path.basename(path),
            "aggregate_wire_gbps": wire,
            "goodput_per_worker_gbps": num(r["goodput_gbps"]),
            "aggregate_goodput_gbps": good,
            "worker_cpu_ms_per_step": wcpu, "shards_cpu_ms_per_step": scpu,
            "step_wall_ms": 1e3 * step_wall if step_wall else None,
            "cores_busy": busy,
            "aggregate_wire_gbps_per_busy_core": wire / busy if busy else None,
            "raw_stream_gbps": num(raw),
            "aggregate_wire_x_raw_stream": wire / raw if num(raw) else None,
            "worker_io_ns_per_payload_byte": num(r.get("worker_io_ns_per_payload_byte")),
            "shard_ns_per_payload_byte": num(r.get("shard_ns_per_payload_byte")),
            "worker_passes": num(r.get("worker_passes")),
            "shard_passes": num(r.get("shard_passes")),
            "cores": j.get("cores"), "cpu": j.get("cpu"), "date": j.get("date"),
        })
cells.sort(key=lambda c: (c["workers"], c["shards"], c["codec"] != "f32", c["codec"]))
with open(os.path.join(out, "scaling.json"), "w") as f:
    json.dump({"benchmark": "scaling", "grid_workers": sys.argv[2], "grid_shards": sys.argv[3],
               "definitions": {
                   "aggregate_wire_gbps": "sum over workers of client bytes_out + bytes_in per second",
                   "cores_busy": "(W x worker CPU ms/step + all shards' CPU ms/step) / mean wall ms of a measured step",
                   "aggregate_wire_gbps_per_busy_core": "aggregate_wire_gbps / cores_busy",
                   "aggregate_wire_x_raw_stream": "aggregate_wire_gbps / the same run's raw-TCP streaming GB/s (one direction)"},
               "cells": cells}, f, indent=1)
    f.write("\n")

def fmt(v, p=2):
    return "n/a" if v is None else f"{v:.{p}f}"

lines = ["## scaling: gift-bench cluster over W workers x S shards", ""]
if cells:
    lines.append(f"- {cells[0]['date']}; CPU {cells[0]['cpu']}; {cells[0]['cores']} cores; "
                 "euclidean rows; every process on this machine")
lines += ["- aggregate wire = every worker's client bytes out + in per second, summed; cores busy = "
          "(W x worker CPU + shards' CPU) per second of wall over the measured steps; "
          "x raw = aggregate wire / the same run's raw-TCP streaming rate (one direction)", "",
          "| W | S | codec | agg wire GB/s | goodput GB/s/worker | agg goodput GB/s | cores busy "
          "| agg wire GB/s per busy core | raw stream GB/s | agg wire x raw | worker I/O ns/payload B "
          "| shard ns/payload B | worker passes | shard passes |",
          "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
for c in cells:
    lines.append(f"| {c['workers']} | {c['shards']} | {c['codec']} | {fmt(c['aggregate_wire_gbps'])} "
                 f"| {fmt(c['goodput_per_worker_gbps'])} | {fmt(c['aggregate_goodput_gbps'])} "
                 f"| {fmt(c['cores_busy'])} | {fmt(c['aggregate_wire_gbps_per_busy_core'])} "
                 f"| {fmt(c['raw_stream_gbps'])} | {fmt(c['aggregate_wire_x_raw_stream'])} "
                 f"| {fmt(c['worker_io_ns_per_payload_byte'])} | {fmt(c['shard_ns_per_payload_byte'])} "
                 f"| {fmt(c['worker_passes'])} | {fmt(c['shard_passes'])} |")
if not cells:
    lines.append("(no cell completed)")
with open(os.path.join(out, "scaling.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
echo "scaling.sh: $((SECONDS - t_start)) s; $out/scaling.json, $out/scaling.md" >&2
exit "$failed"
