#!/usr/bin/env bash
# giftrun_check.sh GIFTRUN PUSH_PULL SOURCE_DIR: the launcher end to end,
# with real giftd shards (GIFTRUN is build/tools/giftrun, which finds
# build/server/giftd and build/client/libgiftclient.so.0 beside it).
#
#  1. Training: 2 workers and 2 shards train examples/train_llama.py for 10
#     steps (a tiny model); rank 0's last step and every prefix are in the
#     output, and giftrun exits 0. Without torch, examples/push_pull (the C
#     example) is run instead and the test exits 77 (skipped) at the end.
#  2. Variables: every worker gets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
#     MASTER_PORT, GIFT_SERVERS, GIFT_RANK, GIFT_WORLD, one GIFT_RUN_ID and the
#     build's libgiftclient as GIFT_LIBRARY.
#  3. A worker SIGKILLed mid-run: giftrun exits 137 within 15 s naming that
#     worker; a shard SIGKILLed: non-zero, naming the shard; SIGINT to giftrun:
#     130. After each, no process of the run is left.
#  4. Several nodes on one machine: a shards-only giftrun (fixed ports) and a
#     workers-only one (--servers, --nnodes 2 --node-rank 1: ranks 2 and 3 of
#     4) against it; SIGTERM ends the shards-only one with 0.
#  5. Usage errors exit 2 with a message that says what to give.
# Every process of the run has this test's temporary folder in its command
# line (giftd through --data-dir), which is how "nothing left" is checked.
# GIFT_TEST_PRELOAD (the sanitizer build's runtimes) goes into LD_PRELOAD of
# the Python workers only.
set -euo pipefail
# shellcheck source=ports.sh
. "$(dirname "$0")/ports.sh"

giftrun=${1:?usage: giftrun_check.sh GIFTRUN PUSH_PULL SOURCE_DIR}
push_pull=${2:?}
src=${3:?}
py=/usr/bin/python3
command -v "$py" >/dev/null 2>&1 || { echo "giftrun_check: $py not found; skipping" >&2; exit 77; }

work=$(mktemp -d "${TMPDIR:-/tmp}/giftrun-check-XXXXXX")
bg=
leftovers() { pgrep -f -- "$work" || true; }
cleanup() {
    local rc=$?
    [[ -n $bg ]] && { kill -KILL "$bg" 2>/dev/null || true; wait "$bg" 2>/dev/null || true; }
    local left
    left=$(leftovers)
    # shellcheck disable=SC2086  # one pid per word
    [[ -n $left ]] && kill -KILL $left 2>/dev/null
    rm -rf "$work"
    exit "$rc"
}
trap cleanup EXIT
fail() {
    echo "giftrun_check: FAIL: $*" >&2
    for f in "$work"/*.out; do
        [[ -s $f ]] && { echo "--- $(basename "$f") ---" >&2; tail -n 25 "$f" >&2; }
    done
    exit 1
}
step() { echo "giftrun_check: $*"; }
no_leftovers() { # no_leftovers WHAT: fails when a process of the run survives
    local left
    for _ in $(seq 1 20); do
        left=$(leftovers)
        [[ -z $left ]] && return 0
        sleep 0.1
    done
    ps -o pid,args -p "$(tr '\n' ',' <<<"$left" | sed 's/,$//')" >&2 || true
    fail "$1: processes left behind"
}
# waits (up to 60 s) until FILE has a line matching REGEX
wait_for() {
    for _ in $(seq 1 600); do
        grep -qE -- "$2" "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    fail "no line matching '$2' in $(basename "$1") within 60 s"
}

preload=${GIFT_TEST_PRELOAD:-}
while IFS= read -r var; do unset "$var"; done < <(compgen -e | grep -E '^(GIFTD_|GIFT_)' || true)
unset RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT
export OPENBLAS_NUM_THREADS=1
mkdir -p "$work/data"
run=("$giftrun" --data-dir "$work/data" --grace 5)

have_torch=1
"$py" -c 'import torch, numpy' 2>/dev/null || have_torch=0
tiny=(--dim 32 --layers 1 --heads 2 --seq 32 --batch 4 --warmup 2 --val-every 5 --val-batches 1)
train() { # train STEPS: sets cmd to the worker command of a training run
    if [[ $have_torch -eq 1 ]]; then
        cmd=("$py" "$src/examples/train_llama.py" "${tiny[@]}" --steps "$1" --out "$work/out-$1")
        [[ -z $preload ]] ||
            cmd=(env "LD_PRELOAD=$preload" ASAN_OPTIONS=detect_leaks=0 "${cmd[@]}")
    else
        cmd=("$push_pull")
    fi
}

# --- 1. train 10 steps -----------------------------------------------------------
rc=0
train 10
timeout 120 "${run[@]}" --workers 2 --shards 2 -- "${cmd[@]}" >"$work/train.out" 2>&1 || rc=$?
[[ $rc -eq 0 ]] || fail "2 workers + 2 shards: exit status $rc"
for want in '^\[shard0\] giftd ready port=' '^\[shard1\] giftd ready port=' \
    '^giftrun: run [0-9a-f]{32}: 2 workers \(ranks 0\.\.1 of 2\)' 'hello from rank 1 of 2' \
    '^giftrun: done: 2 workers exited 0'; do
    grep -qE "$want" "$work/train.out" || fail "training output lacks '$want'"
done
if [[ $have_torch -eq 1 ]]; then
    grep -qE '^\[worker0\] step +10 +train ' "$work/train.out" || fail "no step 10 from rank 0"
    step "train_llama.py: 10 steps, 2 workers, 2 shards: $(grep '^\[worker0\] done' "$work/train.out")"
else
    grep -qE '^\[worker0\] step [0-9]+: ' "$work/train.out" || fail "no step line from push_pull"
    step "no torch: examples/push_pull with 2 workers, 2 shards instead"
fi
no_leftovers "after a finished run"

# --- 2. the variables --------------------------------------------------------------
cat >"$work/env.sh" <<'EOF'
echo "vars RANK=$RANK WORLD_SIZE=$WORLD_SIZE LOCAL_RANK=$LOCAL_RANK GIFT_RANK=$GIFT_RANK GIFT_WORLD=$GIFT_WORLD MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT GIFT_SERVERS=$GIFT_SERVERS GIFT_RUN_ID=$GIFT_RUN_ID"
echo "lib $GIFT_LIBRARY"
EOF
timeout 60 "${run[@]}" -w 3 -s 2 -- bash "$work/env.sh" >"$work/env.out" 2>&1 || fail "env run: exit status $?"
servers=$(sed -n 's/^giftrun: run .*, shards \(.*\)$/\1/p' "$work/env.out")
[[ $servers =~ ^127\.0\.0\.1:[0-9]+,127\.0\.0\.1:[0-9]+$ ]] || fail "shards line: '$servers'"
[[ $(grep -c '^\[worker[0-2]\] vars ' "$work/env.out") -eq 3 ]] || fail "not 3 workers"
for r in 0 1 2; do
    line=$(grep "^\[worker$r\] vars " "$work/env.out")
    for want in "RANK=$r " "WORLD_SIZE=3 " "LOCAL_RANK=$r " "GIFT_RANK=$r " "GIFT_WORLD=3 " \
        "MASTER_ADDR=127.0.0.1 " "GIFT_SERVERS=$servers "; do
        [[ $line == *"$want"* ]] || fail "worker$r lacks '$want': $line"
    done
    [[ $line =~ MASTER_PORT=[0-9]+\  ]] || fail "worker$r: no MASTER_PORT: $line"
done
[[ $(grep -o 'GIFT_RUN_ID=[0-9a-f]*$' "$work/env.out" | sort -u | wc -l) -eq 1 ]] ||
    fail "the workers do not share one GIFT_RUN_ID"
lib=$(sed -n 's/^\[worker0\] lib //p' "$work/env.out")
[[ $lib == */client/libgiftclient.so.0 && -e $lib ]] || fail "GIFT_LIBRARY is '$lib'"
step "variables: ranks 0..2 of 3, GIFT_SERVERS=$servers, GIFT_LIBRARY=$lib"

# --- 3. failures -----------------------------------------------------------------------
# The workers write their pid first, so that one can be killed by pid.
cat >"$work/worker.sh" <<'EOF'
echo $$ >"$PIDDIR/worker$RANK.pid"
exec "$@"
EOF
train 100000
long=("${cmd[@]}")
[[ $have_torch -eq 1 ]] || long=(bash -c 'while :; do sleep 1; done')
export PIDDIR=$work
start_long() { # start_long OUT: a long 2-worker, 2-shard run in the background
    rm -f "$work"/worker*.pid
    "${run[@]}" -w 2 -s 2 -- bash "$work/worker.sh" "${long[@]}" >"$1" 2>&1 &
    bg=$!
    wait_for "$work/worker1.pid" .
    wait_for "$work/worker0.pid" .
    if [[ $have_torch -eq 1 ]]; then wait_for "$1" '^\[worker0\] step +5 '; else sleep 1; fi
}
finish() { # finish WHAT: waits for giftrun (15 s at most); sets rc and secs
    local t0=$SECONDS
    rc=0
    for _ in $(seq 1 150); do kill -0 "$bg" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$bg" 2>/dev/null && fail "$1: giftrun still running 15 s later"
    wait "$bg" || rc=$?
    bg=
    secs=$((SECONDS - t0))
    no_leftovers "$1"
}

start_long "$work/kill-worker.out"
victim=$(cat "$work/worker1.pid")
kill -KILL "$victim"
finish "worker1 SIGKILLed"
[[ $rc -eq 137 ]] || fail "worker1 SIGKILLed: giftrun exit status $rc, expected 137"
grep -q "^giftrun: worker1 (pid $victim) was killed by SIGKILL; stopping the other 3 processes" \
    "$work/kill-worker.out" || fail "the message does not name worker1 (pid $victim)"
grep -q '^giftrun: failed: worker1 was killed by SIGKILL (exit status 137)' "$work/kill-worker.out" ||
    fail "no final 'failed: worker1' line"
step "worker1 SIGKILLed: giftrun exited 137 within ${secs} s, naming it; nothing left"

start_long "$work/kill-shard.out"
shard=$(pgrep -f -- "--data-dir $work/data/shard-1( |$)")
kill -KILL "$shard"
finish "shard1 SIGKILLed"
[[ $rc -eq 137 ]] || fail "shard1 SIGKILLed: giftrun exit status $rc, expected 137"
grep -q "^giftrun: shard1 (pid $shard) was killed by SIGKILL; stopping the other 3 processes" \
    "$work/kill-shard.out" || fail "the message does not name shard1 (pid $shard)"
step "shard1 SIGKILLed: giftrun exited 137 within ${secs} s, naming it; nothing left"

start_long "$work/sigint.out"
kill -INT "$bg"
finish "SIGINT"
[[ $rc -eq 130 ]] || fail "SIGINT: giftrun exit status $rc, expected 130"
grep -q '^giftrun: got SIGINT; stopping everything' "$work/sigint.out" || fail "no SIGINT message"
step "SIGINT: giftrun exited 130 within ${secs} s; nothing left"

# --- 4. shards and workers started apart -----------------------------------------
base=
for _ in 1 2 3 4 5; do
    try=$(free_base_port 4)
    "${run[@]}" --workers 0 --shards 2 --world 4 --nnodes 2 --node-rank 0 --bind 127.0.0.1 \
        --base-port "$try" >"$work/shards.out" 2>&1 &
    bg=$!
    for _ in $(seq 1 100); do
        grep -q 'ready; running until stopped' "$work/shards.out" && break
        kill -0 "$bg" 2>/dev/null || break
        sleep 0.1
    done
    if grep -q 'ready; running until stopped' "$work/shards.out"; then base=$try; break; fi
    wait "$bg" || true # a port in use: try others
    bg=
done
[[ -n $base ]] || fail "a shards-only giftrun did not start on 5 port choices"
grep -q "^giftrun: run [0-9a-f]*: shards shard0 on 127.0.0.1:$base, shard1 on 127.0.0.1:$((base + 2)) ready" \
    "$work/shards.out" || fail "shards-only: no line naming shard0 and shard1 on $base, $((base + 2))"
shards_pid=$bg
rc=0
timeout 60 "${run[@]}" --nnodes 2 --node-rank 1 --run-id test-run -w 2 \
    --servers "127.0.0.1:$base,127.0.0.1:$((base + 2))" -- bash "$work/env.sh" \
    >"$work/workers.out" 2>&1 || rc=$?
[[ $rc -eq 0 ]] || fail "workers-only run: exit status $rc"
for r in 2 3; do
    grep -q "^\[worker$r\] vars RANK=$r WORLD_SIZE=4 LOCAL_RANK=$((r - 2)) .*GIFT_SERVERS=127.0.0.1:$base,127.0.0.1:$((base + 2)) GIFT_RUN_ID=test-run$" \
        "$work/workers.out" || fail "worker$r of node 1: wrong variables"
done
kill -TERM "$shards_pid"
finish "shards-only giftrun SIGTERMed"
[[ $rc -eq 0 ]] || fail "shards-only giftrun after SIGTERM: exit status $rc, expected 0"
step "apart: shards-only on ports $base, $((base + 2)); node 1's workers are ranks 2, 3 of 4; SIGTERM: 0"

# --- 5. usage errors -------------------------------------------------------------------
usage() { # usage EXPECTED ARGS...: giftrun ARGS exits 2 printing EXPECTED
    local want=$1 out
    shift
    rc=0
    out=$("$giftrun" "$@" 2>&1) || rc=$?
    [[ $rc -eq 2 && $out == *"$want"* ]] || fail "giftrun $*: status $rc, '$out' lacks '$want'"
}
usage "no worker command" -w 2
usage "--hosts H0,H1" --nnodes 2 --node-rank 0 -w 1 -- true
usage "needs --world N" --workers 0
usage "--node-rank 2 must be in 0..1" --nnodes 2 --node-rank 2 --servers h:1 -- true
usage "must share one run id" --nnodes 2 --node-rank 0 --servers h:1 -- true
usage "cannot be combined with --shards" --servers h:1 --shards 1 -- true
"$giftrun" --help | grep -q 'GIFT_SERVERS' || fail "--help does not list GIFT_SERVERS"
step "usage errors: exit 2 with what to give"

if [[ $have_torch -eq 0 ]]; then
    step "skipped the training parts: $py has no torch"
    exit 77
fi
step "ok"
