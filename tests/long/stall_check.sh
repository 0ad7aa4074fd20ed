#!/usr/bin/env bash
# stall_check.sh GIFTD WORKER: a stall is a diagnosis, not a silent hang.
#
# One shard (world size 2, stall_warn 1 s, stall_timeout 3 s) and one worker
# of rank 0; rank 1 never comes. Checks that giftd logs which rank is
# missing for which tensor and step, that /metrics names it
# (giftd_tensor_missing_rank{...,rank="1"} and giftd_stalls_total), that
# promtool accepts the page when it is installed, and that the worker's
# waiting pull fails with GIFT_ETIMEDOUT after stall_timeout instead of
# hanging. About 5 s.
set -euo pipefail

giftd=${1:?usage: stall_check.sh path/to/giftd path/to/gift-train-worker}
worker=${2:?usage: stall_check.sh path/to/giftd path/to/gift-train-worker}
work=$(mktemp -d "${TMPDIR:-/tmp}/giftd-stall-XXXXXX")
spid=0 wpid=0
cleanup() {
    local rc=$?
    for p in $spid $wpid; do
        [[ $p != 0 ]] && kill -KILL "$p" 2>/dev/null || true
    done
    wait 2>/dev/null || true
    if [[ $rc -ne 0 ]]; then
        for f in "$work"/*.log; do echo "--- $f ---" >&2; tail -n 20 "$f" >&2; done
    fi
    rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "stall_check: FAIL: $*" >&2; exit 1; }
command -v curl >/dev/null || { echo "stall_check: curl not found; skipping"; exit 77; }
while IFS= read -r var; do unset "$var"; done < <(compgen -e | grep '^GIFTD_\|^GIFT_' || true)

"$giftd" --bind 127.0.0.1 --port 0 --http-port 0 --world-size 2 --stall-warn 1 \
    --stall-timeout 3 >"$work/ready" 2>"$work/giftd.log" &
spid=$!
port='' hport=''
for _ in $(seq 1 400); do
    line=$(head -n 1 "$work/ready" 2>/dev/null || true)
    if [[ $line == "giftd ready "* ]]; then
        port=$(sed -n 's/.* port=\([0-9]*\) .*/\1/p' <<<"$line")
        hport=$(sed -n 's/.* http_port=\([0-9]*\)$/\1/p' <<<"$line")
        break
    fi
    sleep 0.025
done
[[ -n $port ]] || fail "giftd did not start"

GIFT_SERVERS=127.0.0.1:$port GIFT_RANK=0 GIFT_WORLD=2 "$worker" --steps 5 --out "$work/w.bin" \
    >"$work/worker.log" 2>&1 &
wpid=$!
# The warning, naming the missing rank, within stall_warn + the 1 s tick.
for _ in $(seq 1 100); do
    grep -q "stall: .* missing ranks 1" "$work/giftd.log" && break
    sleep 0.05
done
grep -q "stall: tensor [0-9]* (.*) chunk [0-9]* step 0 .* missing ranks 1" "$work/giftd.log" ||
    fail "no stall warning naming tensor, step and missing rank 1"
curl -s --max-time 5 "http://127.0.0.1:$hport/metrics" >"$work/metrics"
grep -q '^giftd_tensor_missing_rank{key="[0-9]*",tensor="[^"]*",step="0",rank="1"} 1$' \
    "$work/metrics" || fail "/metrics does not name rank 1 as missing"
grep -q '^giftd_stalls_total [1-9]' "$work/metrics" || fail "giftd_stalls_total is 0"
if command -v promtool >/dev/null; then
    promtool check metrics <"$work/metrics" >/dev/null 2>"$work/promtool.log" ||
        fail "promtool rejects /metrics during a stall: $(head -c 300 "$work/promtool.log")"
fi
# After stall_timeout the parked pulls fail: the worker stops with a timeout.
if wait $wpid; then fail "the worker completed although rank 1 never pushed"; fi
wpid=0
grep -qi "timed out\|timeout" "$work/worker.log" ||
    fail "the worker did not fail with a timeout: $(head -c 300 "$work/worker.log")"
grep -q "stall_timeout" "$work/giftd.log" || fail "giftd did not log the timed-out pulls"
echo "stall_check: PASS ($(grep -o 'stall: .*' "$work/giftd.log" | head -n 1))"
