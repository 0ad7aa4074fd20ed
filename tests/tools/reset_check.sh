#!/usr/bin/env bash
# reset_check.sh GIFTD GIFTCTL PUSH_PULL WORKER: `giftctl reset` over the wire,
# on real processes (127.0.0.1).
#
#  1. A persisting giftd runs examples/push_pull as run "run-a". A second
#     run, "run-b", is refused with the run-id message, which names the
#     working command (giftctl reset --servers ... --run-id run-a).
#  2. `giftctl reset --run-id run-x` is refused (exit 1) naming the run held,
#     and changes nothing: run-b is still refused.
#  3. `giftctl reset --run-id run-a` drops the state and the files (exit 0,
#     says what it dropped); run-b then runs. Restarted on its data
#     directory, giftd holds run-b (what the reset left is consistent).
#  4. A worker connected (tests/ops/gift_ops_worker, rank 0 of 2, waiting
#     for rank 1): reset is refused naming it and --force; with --force it
#     goes through, and the worker fails within seconds saying why.
#  5. With an auth_key_file: reset without the key is refused, a rank key is
#     a usage error (exit 2), the shared secret resets.
set -euo pipefail

giftd=${1:?usage: reset_check.sh GIFTD GIFTCTL PUSH_PULL WORKER}
giftctl=${2:?}
push_pull=${3:?}
worker=${4:?}
work=$(mktemp -d "${TMPDIR:-/tmp}/reset-check-XXXXXX")
pid='' wpid=''
cleanup() {
    local rc=$?
    for p in "$wpid" "$pid"; do
        [[ -n $p ]] && { kill -KILL "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; }
    done
    if [[ $rc -ne 0 ]]; then
        for f in giftd.log run.err ctl.out worker.err; do
            [[ -s $work/$f ]] && { echo "--- $f ---" >&2; tail -n 20 "$work/$f" >&2; }
        done
    fi
    rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "reset_check: FAIL: $*" >&2; exit 1; }

while IFS= read -r var; do unset "$var"; done < <(compgen -e | grep -E '^(GIFTD_|GIFT_)' || true)
unset RANK WORLD_SIZE

# start [FLAGS...]: a persisting giftd; sets pid, port, http.
start() {
    local line
    rm -f "$work/ready"
    "$giftd" --bind 127.0.0.1 --port 0 --http-port 0 --world-size auto --data-dir "$work/data" \
        --checkpoint-steps 1 "$@" >"$work/ready" 2>>"$work/giftd.log" &
    pid=$!
    for _ in $(seq 1 200); do
        if { read -r line <"$work/ready"; } 2>/dev/null && [[ $line == "giftd ready "* ]]; then
            port=$(sed -n 's/.* port=\([0-9]*\) .*/\1/p' <<<"$line")
            http=$(sed -n 's/.* http_port=\([0-9]*\)$/\1/p' <<<"$line")
            return 0
        fi
        sleep 0.05
    done
    fail "no ready line from giftd $*"
}
stop() { kill -TERM "$pid"; wait "$pid" 2>/dev/null || true; pid=''; }
run() {
    GIFT_SERVERS="127.0.0.1:$port" RANK=0 WORLD_SIZE=1 GIFT_RUN_ID=$1 timeout 60 "$push_pull" \
        >/dev/null 2>"$work/run.err"
}
# ctl WANT_RC ARGS...: giftctl reset with ARGS; its output in ctl.out.
ctl() {
    local want=$1 rc=0
    shift
    timeout 30 "$giftctl" --servers "127.0.0.1:$port" --http "127.0.0.1:$http" --timeout 5 \
        reset "$@" >"$work/ctl.out" 2>&1 || rc=$?
    [[ $rc -eq $want ]] || fail "giftctl reset $* exited $rc, wanted $want: $(cat "$work/ctl.out")"
}
has() { # has FILE WHAT TEXT...: every TEXT is in FILE
    local f=$1 what=$2
    shift 2
    for want in "$@"; do
        grep -qF -- "$want" "$work/$f" || fail "$what does not say '$want': $(cat "$work/$f")"
    done
}

# 1. A second run is refused, naming the command that resets.
start
run run-a || fail "run-a against a fresh shard: $(tail -n 3 "$work/run.err")"
if run run-b; then fail "run-b was accepted by a shard holding run-a"; fi
has run.err "the run-id refusal" "run-a" "run-b" "giftctl reset --servers HOST:PORT --run-id run-a" \
    "fresh data directory"

# 2. Another run id: refused, nothing changed.
ctl 1 --run-id run-x
has ctl.out "reset --run-id run-x" "127.0.0.1:$port: NOT RESET" "holds run 'run-a', not run 'run-x'" \
    "nothing changed"
if run run-b; then fail "run-b was accepted after a refused reset"; fi

# 3. The reset; run-b runs; a restart keeps run-b.
ctl 0 --run-id run-a
has ctl.out "reset --run-id run-a" "(id 0): reset: dropped run 'run-a'" "moved its checkpoint and step logs aside" \
    "it adopts the next run"
grep -q "reset (giftctl): dropped run 'run-a'" "$work/giftd.log" || fail "giftd does not log the reset"
run run-b || fail "run-b after giftctl reset: $(tail -n 3 "$work/run.err")"
stop
start
if run run-a; then fail "after a restart, run-a was accepted by a shard holding run-b"; fi
has run.err "the refusal after a restart" "holds the state of run 'run-b'"

# 4. A connected worker: refused without --force, closed with it.
ctl 0
GIFT_SERVERS="127.0.0.1:$port" GIFT_RANK=0 GIFT_WORLD=2 GIFT_RUN_ID=run-c \
    "$worker" --steps 1 --timeout-ms 60000 >"$work/worker.out" 2>"$work/worker.err" &
wpid=$!
for _ in $(seq 1 200); do
    grep -q '^pushed 0$' "$work/worker.out" 2>/dev/null && break
    sleep 0.05
done
grep -q '^pushed 0$' "$work/worker.out" || fail "the worker did not push step 0"
ctl 1
has ctl.out "reset with a worker connected" "NOT RESET" "1 worker of run 'run-c' is connected" \
    "(rank 0)" "--force" "nothing changed"
kill -0 "$wpid" 2>/dev/null || fail "a refused reset stopped the worker"
ctl 0 --force --run-id run-c
has ctl.out "reset --force" "dropped run 'run-c'" "closed 1 worker connection"
for _ in $(seq 1 100); do kill -0 "$wpid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$wpid" 2>/dev/null && fail "the worker still runs 10 s after reset --force"
rc=0
wait "$wpid" || rc=$?
wpid=''
[[ $rc -ne 0 ]] || fail "the worker exited 0 after its shard was reset under it"
has worker.err "the worker's error" "was reset by \`giftctl reset --force\`" "restart the run"
stop

# 5. Authentication.
umask 077
printf 'reset-check shared secret 0123456789\n' >"$work/secret"
"$giftctl" --auth-key-file "$work/secret" rank-key 0 >"$work/rank0.key"
start --auth-key-file "$work/secret"
ctl 1
has ctl.out "reset without the key" "NOT RESET" "requires authentication"
ctl 2 --auth-key-file "$work/rank0.key"
has ctl.out "reset with a rank key" "a reset needs the shards' shared secret"
ctl 0 --auth-key-file "$work/secret"
has ctl.out "reset with the secret" "(id 0): reset: it held nothing"
ctl 0 --auth-key-file "$work/secret" --json
/usr/bin/python3 - "$work/ctl.out" <<'PY' || fail "reset --json: $(cat "$work/ctl.out")"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["command"] == "reset" and d["ok"] is True, d
s = d["shards"][0]
assert s["ok"] is True and s["shard_id"] == 0 and s["run_id"] == "" and s["tensors"] == 0, s
assert s["closed"] == 0 and s["files"] is True, s
PY
stop
echo "reset_check: ok"
