#!/usr/bin/env bash
# runid_check.sh GIFTD PUSH_PULL: runs that cannot mix, on real processes.
#
#  1. A persisting giftd (127.0.0.1, port 0) runs examples/push_pull as run
#     "run-a" (GIFT_RUN_ID).
#  2. A second run, "run-b", against the same shard is refused: the worker
#     fails and its stderr names both runs and the reset.
#  3. giftd restarted on the same data directory still holds run-a (the run
#     id is checkpointed with the declaration) and refuses run-b again.
#  4. giftd restarted with --reset moves the data directory's state aside
#     (the same files in data/discarded-*/): run-b runs.
set -euo pipefail

giftd=${1:?usage: runid_check.sh GIFTD PUSH_PULL}
worker=${2:?}
work=$(mktemp -d "${TMPDIR:-/tmp}/runid-check-XXXXXX")
pid=''
cleanup() {
    local rc=$?
    [[ -n $pid ]] && { kill -KILL "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; }
    if [[ $rc -ne 0 ]]; then
        for f in giftd.log worker.err; do
            [[ -s $work/$f ]] && { echo "--- $f ---" >&2; tail -n 30 "$work/$f" >&2; }
        done
    fi
    rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "runid_check: FAIL: $*" >&2; exit 1; }

while IFS= read -r var; do unset "$var"; done < <(compgen -e | grep -E '^(GIFTD_|GIFT_)' || true)

# Starts giftd with its extra flags; sets pid and port.
start() {
    # A fresh ready file: the last giftd's line must not be read as this one's.
    rm -f "$work/ready"
    "$giftd" --bind 127.0.0.1 --port 0 --http-port 0 --world-size auto --data-dir "$work/data" \
        --checkpoint-steps 1 "$@" >"$work/ready" 2>>"$work/giftd.log" &
    pid=$!
    port=''
    for _ in $(seq 1 200); do
        if { read -r line <"$work/ready"; } 2>/dev/null && [[ $line == "giftd ready "* ]]; then
            port=$(sed -n 's/.* port=\([0-9]*\) .*/\1/p' <<<"$line")
            return 0
        fi
        sleep 0.05
    done
    fail "no ready line from giftd $*"
}
stop() { kill -TERM "$pid"; wait "$pid" 2>/dev/null || true; pid=''; }
run() {
    GIFT_SERVERS="127.0.0.1:$port" RANK=0 WORLD_SIZE=1 GIFT_RUN_ID=$1 timeout 60 "$worker" >"$work/worker.out" 2>"$work/worker.err"
}
refused() {
    if run run-b; then fail "run-b was accepted by a shard holding run-a ($1)"; fi
    for want in "run-a" "run-b" "giftctl reset" "fresh data directory"; do
        grep -q -- "$want" "$work/worker.err" || fail "$1: the refusal does not name '$want'"
    done
}

start
run run-a || fail "run-a against a fresh shard"
refused "same process"
stop
start
refused "after a restart"
stop
mkdir "$work/before"
cp -p "$work/data/checkpoint" "$work/data"/log-* "$work/before/"
start --reset
grep -q -- "--reset: moved the state of $work/data (.* entries) into $work/data/discarded-" \
    "$work/giftd.log" || fail "giftd --reset does not say what it did and where the state went"
# Moved aside, not deleted: run-a's files are in the discarded-* folder.
for f in "$work/before"/*; do
    cmp -s "$f" "$work/data"/discarded-*/"${f##*/}" ||
        fail "--reset: ${f##*/} is not in $work/data/discarded-*/ unchanged: $(ls -R "$work/data")"
done
run run-b || fail "run-b after giftd --reset"
stop
echo "runid_check: ok"
