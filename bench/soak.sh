#!/usr/bin/env bash
# soak.sh [GIFTD] [WORKER]: the soak benchmark (bench/RESULTS.md, "Durability").
#
# Two giftd shards (aggregate ordered, checkpoints every 200 steps with the
# step log on, data_dir under a temporary folder) and SOAK_WORKERS (4)
# worker processes of tests/long/train_worker.c (f32 and fp8-e4m3 GIFT
# tensors, geometry refreshed every 50 steps, rows times SOAK_SCALE (4)) run
# SOAK_STEPS steps (12000: about 10 minutes on two cores). Every SOAK_EVERY
# (5) seconds it samples each shard's resident memory and open file
# descriptors (/proc) and its /metrics (error frames). At the end it prints
# a table and writes SOAK_OUT (bench/out/soak.json):
#   RSS flat after warm-up (the first 20% of steps): the median of the last
#   quarter of the samples within 5% of the median of the first quarter
#   (the min and max are reported too)
#   open fds constant after warm-up (every worker connected; the checkpoint
#   writer's fds for the folder and checkpoint.tmp, open for milliseconds,
#   are not counted)
#   no error frames (giftd_errors_total) and every worker exits 0
#   steps/s stable: per-100-step rates of rank 0, min / median / max
# Exit status 1 if a criterion fails. Run it niced on a shared machine:
#   nice -n 10 bench/soak.sh build/server/giftd build/tests/long/gift-train-worker
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
giftd=${1:-$here/../build/server/giftd}
worker=${2:-$here/../build/tests/long/gift-train-worker}
steps=${SOAK_STEPS:-12000}
nw=${SOAK_WORKERS:-4}
scale=${SOAK_SCALE:-4}
every=${SOAK_EVERY:-5}
out=${SOAK_OUT:-$here/out/soak.json}
work=$(mktemp -d "${TMPDIR:-/tmp}/giftd-soak-XXXXXX")
declare -a spid=(0 0) sport=(0 0) hport=(0 0) wpid=()

cleanup() {
    for p in "${spid[@]}" "${wpid[@]}"; do
        [[ $p != 0 ]] && kill -KILL "$p" 2>/dev/null || true
    done
    wait 2>/dev/null || true
    [[ -n ${KEEP_WORK:-} ]] || rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "soak: FAIL: $*" >&2; exit 1; }
for tool in curl; do command -v $tool >/dev/null || fail "$tool is needed"; done
while IFS= read -r var; do unset "$var"; done < <(compgen -e | grep '^GIFTD_\|^GIFT_' || true)

for i in 0 1; do
    "$giftd" --bind 127.0.0.1 --port 0 --http-port 0 --shard-id $i --num-shards 2 \
        --world-size "$nw" --data-dir "$work/data$i" --checkpoint-steps 200 --stall-warn 10 \
        >"$work/s$i.ready" 2>"$work/s$i.log" &
    spid[$i]=$!
    for _ in $(seq 1 400); do
        line=$(head -n 1 "$work/s$i.ready" 2>/dev/null || true)
        if [[ $line == "giftd ready "* ]]; then
            sport[$i]=$(sed -n 's/.* port=\([0-9]*\) .*/\1/p' <<<"$line")
            hport[$i]=$(sed -n 's/.* http_port=\([0-9]*\)$/\1/p' <<<"$line")
            break
        fi
        sleep 0.025
    done
    [[ ${sport[$i]} != 0 ]] || fail "shard $i did not start"
done
servers="127.0.0.1:${sport[0]},127.0.0.1:${sport[1]}"
t0=$(date +%s.%N)
for ((r = 0; r < nw; r++)); do
    GIFT_SERVERS=$servers GIFT_RANK=$r GIFT_WORLD=$nw "$worker" --steps "$steps" --refresh 50 \
        --scale "$scale" --out "$work/w$r.bin" --progress "$work/w$r.progress" \
        >"$work/w$r.log" 2>&1 &
    wpid+=($!)
done

metric() { # metric SHARD NAME: the sum of a metric's samples
    curl -s --max-time 5 "http://127.0.0.1:${hport[$1]}/metrics" |
        awk -v n="$2" '$1 == n || index($1, n "{") == 1 { s += $2 } END { printf "%d\n", s }'
}
echo "t_s step rss0_kib rss1_kib fds0 fds1 errors0 errors1" >"$work/samples"
alive=1
while ((alive)); do
    alive=0
    for p in "${wpid[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    t=$(echo "$(date +%s.%N) - $t0" | bc)
    step=$(grep '^step ' "$work/w0.progress" 2>/dev/null | tail -n 1 | cut -d' ' -f2 || true)
    row="$t ${step:-0}"
    for i in 0 1; do
        row+=" $(awk '/^VmRSS/ {print $2}' /proc/${spid[$i]}/status)"
    done
    for i in 0 1; do
        ls -l /proc/${spid[$i]}/fd 2>/dev/null | awk 'NR > 1 {print $NF}' | sort >"$work/fds$i.now"
        # Not counted: the checkpoint writer's own short-lived fds (the
        # folder it fsyncs, checkpoint.tmp); they are logged in fd-changes.
        row+=" $(grep -cv -E "/data$i(/checkpoint\.tmp)?\$" "$work/fds$i.now")"
        if [[ -s $work/fds$i.last ]] && ! cmp -s "$work/fds$i.now" "$work/fds$i.last"; then
            { echo "t=$t shard $i fds changed:"; diff "$work/fds$i.last" "$work/fds$i.now"; } \
                >>"$work/fd-changes" || true
        fi
        mv "$work/fds$i.now" "$work/fds$i.last"
    done
    for i in 0 1; do row+=" $(metric $i giftd_errors_total)"; done
    echo "$row" >>"$work/samples"
    ((alive)) && sleep "$every"
done
wall=$(echo "$(date +%s.%N) - $t0" | bc)
werr=0
for p in "${wpid[@]}"; do wait "$p" || werr=$((werr + 1)); done
[[ $werr == 0 ]] || { cat "$work"/w*.log >&2; }

python3 - "$work/samples" "$work/w0.progress" "$steps" "$nw" "$scale" "$wall" "$werr" "$out" <<'PY'
import json, statistics, sys
samples, progress, steps, nw, scale, wall, werr, out = sys.argv[1:]
steps, nw, scale, wall, werr = int(steps), int(nw), int(scale), float(wall), int(werr)
rows = [l.split() for l in open(samples).read().splitlines()[1:]]
rows = [[float(x) for x in r] for r in rows if len(r) == 8]
# The last sample is taken after the workers exited (their sockets closed).
warm = [r for r in rows[:-1] if r[1] >= 0.2 * steps]
rates = [float(l.split()[2]) for l in open(progress) if l.startswith("rate ")]
rates_w = rates[len(rates) // 5:] or rates
res = {"steps": steps, "workers": nw, "shards": 2, "scale": scale, "wall_s": round(wall, 1),
       "samples": len(rows), "worker_failures": werr}
ok = werr == 0
for i in (0, 1):
    rss = [r[2 + i] for r in warm]
    fds = [r[4 + i] for r in warm]
    q = max(1, len(rss) // 4)
    first, last = statistics.median(rss[:q]), statistics.median(rss[-q:])
    grow = (last - first) / first
    res[f"shard{i}"] = {"rss_kib_min": min(rss), "rss_kib_max": max(rss),
                        "rss_kib_first_quarter": first, "rss_kib_last_quarter": last,
                        "rss_growth": round(grow, 4), "fds_min": min(fds), "fds_max": max(fds),
                        "error_frames": rows[-1][6 + i] if rows else None}
    ok &= abs(grow) <= 0.05 and min(fds) == max(fds) and rows[-1][6 + i] == 0
res["steps_per_s"] = {"min": min(rates_w), "median": statistics.median(rates_w),
                      "max": max(rates_w), "overall": round(steps / wall, 2)} if rates_w else {}
res["pass"] = bool(ok)
print(f"soak: {steps} steps, {nw} workers, 2 shards, scale {scale}: {wall:.0f} s, "
      f"{steps / wall:.1f} steps/s overall")
print("| shard | RSS after warm-up, min - max (MiB) | first / last quarter (MiB) | growth "
      "| open fds | error frames |")
print("|---|---|---|---:|---|---:|")
for i in (0, 1):
    s = res[f"shard{i}"]
    print(f"| {i} | {s['rss_kib_min']/1024:.1f} - {s['rss_kib_max']/1024:.1f} | "
          f"{s['rss_kib_first_quarter']/1024:.2f} / {s['rss_kib_last_quarter']/1024:.2f} | "
          f"{100*s['rss_growth']:+.1f}% | {int(s['fds_min'])} - {int(s['fds_max'])} | "
          f"{int(s['error_frames'])} |")
if rates_w:
    r = res["steps_per_s"]
    print(f"steps/s per 100 steps after warm-up: min {r['min']:.1f} median {r['median']:.1f} "
          f"max {r['max']:.1f}")
print("soak:", "PASS" if ok else "FAIL")
json.dump(res, open(out, "w"), indent=1)
sys.exit(0 if ok else 1)
PY
