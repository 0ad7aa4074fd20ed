#!/usr/bin/env bash
# lost_state_check.sh GIFTD WORKER: a shard restarted without its state is
# never silent, on real processes (127.0.0.1).
#
#  1. Two shards without checkpoints, two workers (tests/ops/gift_ops_worker,
#     a 60 s operation timeout). Once both workers have finished a few steps,
#     shard 1 is SIGKILLed and restarted empty on the same port. Each worker
#     must exit non-zero within 20 s (long before its timeout), its stderr
#     naming shard 1 by index and address, the lost state, and both fixes
#     (restart the run; --checkpoint-steps); the shard logs the refusal.
#  2. The same with checkpoints on shard 1 (--checkpoint-steps 1): the
#     restarted shard resumes from its data directory and both workers
#     finish with exit 0, with the same parameters.
set -euo pipefail

giftd=${1:?usage: lost_state_check.sh GIFTD WORKER}
worker=${2:?}
work=$(mktemp -d "${TMPDIR:-/tmp}/lost-state-check-XXXXXX")
spid=('' '') wpid=('' '')
cleanup() {
    local rc=$?
    for p in "${spid[@]}" "${wpid[@]}"; do
        [[ -n $p ]] && { kill -KILL "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; }
    done
    if [[ $rc -ne 0 ]]; then
        for f in giftd0.log giftd1.log w0.out w0.err w1.out w1.err; do
            [[ -s $work/$f ]] && { echo "--- $f ---" >&2; tail -n 20 "$work/$f" >&2; }
        done
    fi
    rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "lost_state_check: FAIL: $*" >&2; exit 1; }

while IFS= read -r var; do unset "$var"; done < <(compgen -e | grep -E '^(GIFTD_|GIFT_)' || true)
unset RANK WORLD_SIZE

port=('' '')
# start I PORT [FLAGS...]: shard I of 2 on PORT (0: any); sets spid[I], port[I].
start() {
    local i=$1 p=$2 line
    shift 2
    rm -f "$work/ready$i"
    "$giftd" --bind 127.0.0.1 --port "$p" --http-port off --shard-id "$i" --num-shards 2 --world-size 2 "$@" \
        >"$work/ready$i" 2>>"$work/giftd$i.log" &
    spid[$i]=$!
    for _ in $(seq 1 200); do
        if { read -r line <"$work/ready$i"; } 2>/dev/null && [[ $line == "giftd ready "* ]]; then
            port[$i]=$(sed -n 's/.* port=\([0-9]*\) .*/\1/p' <<<"$line")
            return 0
        fi
        sleep 0.05
    done
    fail "no ready line from giftd $i $*"
}
# workers STEPS: both ranks in the background.
workers() {
    for r in 0 1; do
        GIFT_SERVERS="127.0.0.1:${port[0]},127.0.0.1:${port[1]}" GIFT_RANK=$r GIFT_WORLD=2 \
            "$worker" --steps "$1" --sleep-ms 20 --timeout-ms 60000 \
            >"$work/w$r.out" 2>"$work/w$r.err" &
        wpid[$r]=$!
    done
}
# at_step N: waits (10 s at most) until both workers have finished step N.
at_step() {
    for _ in $(seq 1 200); do
        grep -qx "step $1" "$work/w0.out" 2>/dev/null && grep -qx "step $1" "$work/w1.out" 2>/dev/null &&
            return 0
        sleep 0.05
    done
    fail "the workers did not reach step $1"
}
# restart1 [FLAGS...]: SIGKILL shard 1, start it again on its port.
restart1() {
    kill -KILL "${spid[1]}"
    wait "${spid[1]}" 2>/dev/null || true
    spid[1]=''
    start 1 "${port[1]}" "$@"
}
# wait_worker R SECONDS: its exit status within SECONDS (fails past it).
wait_worker() {
    local r=$1 deadline=$((SECONDS + $2))
    while kill -0 "${wpid[$r]}" 2>/dev/null; do
        ((SECONDS < deadline)) || fail "worker $r still running $2 s after the restart (a timeout, not a refusal?)"
        sleep 0.1
    done
    local rc=0
    wait "${wpid[$r]}" || rc=$?
    wpid[$r]=''
    return $rc
}
stop_shards() {
    for i in 0 1; do
        [[ -n ${spid[$i]} ]] && { kill -TERM "${spid[$i]}"; wait "${spid[$i]}" 2>/dev/null || true; }
        spid[$i]=''
    done
}

# 1. Without checkpoints.
start 0 0
start 1 0
workers 100000
at_step 3
t0=$SECONDS
restart1
for r in 0 1; do
    rc=0
    wait_worker "$r" 20 || rc=$?
    [[ $rc -ne 0 ]] || fail "worker $r exited 0 although shard 1 lost its state"
    err=$(cat "$work/w$r.err")
    for want in "shard 1 (127.0.0.1:${port[1]})" "shard 1 lost this run's state" \
                "the worker has the mean of step" "it holds no tensors" \
                "Restart the whole run" "--checkpoint-steps N --data-dir DIR"; do
        grep -qF -- "$want" <<<"$err" ||
            fail "worker $r's error does not name '$want'; it says: $err"
    done
done
echo "lost_state_check: both workers refused $((SECONDS - t0)) s after the restart:"
grep -m1 -F "lost this run's state" "$work/w0.err" >&2
grep -q "refused a worker: it received the mean of step" "$work/giftd1.log" ||
    fail "shard 1 does not log the refusal: $(tail -n 5 "$work/giftd1.log")"
stop_shards

# 2. With checkpoints on shard 1: restored, the run goes on.
rm -f "$work"/w*.out "$work"/w*.err
start 0 0
start 1 0 --checkpoint-steps 1 --data-dir "$work/data1"
workers 40
at_step 3
restart1 --checkpoint-steps 1 --data-dir "$work/data1"
for r in 0 1; do
    rc=0
    wait_worker "$r" 60 || rc=$?
    [[ $rc -eq 0 ]] || fail "worker $r exited $rc after a restart with checkpoints: $(tail -n 3 "$work/w$r.err")"
done
grep -q "restored from" "$work/giftd1.log" || fail "shard 1 did not restore from its checkpoint"
h0=$(grep '^result' "$work/w0.out" | sed 's/ loss.*//') h1=$(grep '^result' "$work/w1.out" | sed 's/ loss.*//')
[[ -n $h0 && $h0 == "$h1" ]] || fail "the workers ended apart after a restored shard: '$h0' vs '$h1'"
stop_shards
echo "lost_state_check: ok"
