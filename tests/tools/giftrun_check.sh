#!/usr/bin/env bash
# giftrun_check.sh GIFTRUN PUSH_PULL SOURCE_DIR: the launcher end to end,
# with real giftd shards (GIFTRUN is build/tools/giftrun, which finds
# build/server/giftd and build/client/libgiftclient.so.0 beside it).
#
#  1. Training: 2 workers and 2 shards train examples/train_llama.py for 10
#     steps (a tiny model); rank 0's last step and every prefix are in the
#     output, and giftrun exits 0; every shard logs each rank's Hello as
#     authenticated (the key giftrun generated), and that key is gone after.
#     Without torch, examples/push_pull (the C example) is run instead and the
#     test exits 77 (skipped) at the end.
#  2. Variables: every worker gets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
#     MASTER_PORT, GIFT_SERVERS, GIFT_RANK, GIFT_WORLD, one GIFT_RUN_ID, the
#     build's libgiftclient as GIFT_LIBRARY and one GIFT_AUTH_KEY_FILE (mode
#     600 in a folder of mode 700 while the run lasts, gone after it); every
#     shard (through a --giftd wrapper that prints its arguments) got
#     --world-size 3 and --auth-key-file of that file.
#  3. A worker SIGKILLed mid-run: giftrun exits 137 within 15 s naming that
#     worker; a shard SIGKILLed: non-zero, naming the shard; SIGINT to giftrun:
#     130; SIGTERM: 143; SIGHUP: 129. After each, no process of the run is
#     left and the run's key file is gone.
#  4. Several nodes on one machine: a shards-only giftrun (fixed ports) and a
#     workers-only one (--servers, --nnodes 2 --node-rank 1: ranks 2 and 3 of
#     4) against it, both with the user's key (--auth-key-file, and
#     GIFT_AUTH_KEY_FILE), which giftrun uses and leaves in place; SIGTERM
#     ends the shards-only one with 0.
#  5. Keys: $GIFT_AUTH_KEY_FILE is used instead of a generated key (the Hello
#     authenticated, the file kept); --no-auth runs unauthenticated even with
#     $GIFT_AUTH_KEY_FILE set (no key for shards or workers, the Hello not
#     authenticated).
#  6. Usage errors exit 2 with a message that says what to give.
# giftrun runs with TMPDIR=$work/tmp, so that a run folder left behind
# (giftrun-*) is seen.
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
mkdir -p "$work/data" "$work/tmp"
run=(env "TMPDIR=$work/tmp" "$giftrun" --data-dir "$work/data" --grace 5)
# key_gone WHAT KEY: the run's generated key KEY, and its folder, are gone
key_gone() {
    [[ -n $2 ]] || fail "$1: no key file path in the output"
    [[ $2 == "$work/tmp/giftrun-"*/auth_key ]] || fail "$1: the key is '$2', not in a run folder of $work/tmp"
    [[ ! -e $2 && ! -e $(dirname "$2") ]] || fail "$1: the key $2 (or its folder) is still there after giftrun exited"
    no_run_dirs "$1"
}
# no_run_dirs WHAT: no run folder of giftrun's is left in $work/tmp
no_run_dirs() {
    local left
    left=$(find "$work/tmp" -maxdepth 1 -name 'giftrun-*' | tr '\n' ' ')
    [[ -z $left ]] || fail "$1: run folders left in $work/tmp: $left"
}
# shard_key OUT: the key file shard0 says it checks Hellos against
shard_key() { sed -n 's/^\[shard0\] .*authentication on: workers must prove the key of \(.*\) at Hello$/\1/p' "$1" | head -n 1; }

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
for s in 0 1; do
    for r in 0 1; do
        grep -qE "^\[shard$s\] .*hello from rank $r of 2 \(.*\), authenticated\$" "$work/train.out" ||
            fail "shard$s did not log rank $r's Hello as authenticated: $(grep -E "^\[shard$s\] .*hello from" "$work/train.out" | tr '\n' '|')"
    done
done
key=$(shard_key "$work/train.out")
key_gone "after a finished run" "$key"
step "every shard's Hellos authenticated with the generated $key, gone after the run"
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
echo "key $GIFT_AUTH_KEY_FILE mode $(stat -c %a "$GIFT_AUTH_KEY_FILE") folder $(stat -c %a "${GIFT_AUTH_KEY_FILE%/*}")"
EOF
real_giftd=$(dirname "$giftrun")/../server/giftd
[[ -x $real_giftd ]] || fail "no giftd at $real_giftd"
printf '#!/bin/bash\necho "argv $*" >&2\nexec %q "$@"\n' "$real_giftd" >"$work/giftd-argv"
chmod +x "$work/giftd-argv"
timeout 60 "${run[@]}" --giftd "$work/giftd-argv" -w 3 -s 2 -- bash "$work/env.sh" \
    >"$work/env.out" 2>&1 || fail "env run: exit status $?"
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
keys=$(sed -n 's/^\[worker[0-2]\] key //p' "$work/env.out" | sort -u)
[[ $(grep -c '^\[worker[0-2]\] key ' "$work/env.out") -eq 3 && $keys == *" mode 600 folder 700" &&
    $(wc -l <<<"$keys") -eq 1 ]] || fail "the workers' key files: '$keys' (expected one, mode 600 in a folder of 700)"
key=${keys%% mode *}
for s in 0 1; do
    argv=$(sed -n "s/^\[shard$s\] argv //p" "$work/env.out")
    [[ " $argv " == *" --world-size 3 "* ]] || fail "shard$s was not given --world-size 3: $argv"
    [[ " $argv " == *" --auth-key-file $key "* ]] || fail "shard$s was not given --auth-key-file $key: $argv"
done
key_gone "after the variables run" "$key"
step "variables: ranks 0..2 of 3, GIFT_SERVERS=$servers, GIFT_LIBRARY=$lib, key $key mode 600"
step "the shards got --world-size 3 and --auth-key-file $key; the key is gone after the run"

# --- 3. failures -----------------------------------------------------------------------
# The workers write their pid first, so that one can be killed by pid.
cat >"$work/worker.sh" <<'EOF'
echo "key=${GIFT_AUTH_KEY_FILE:-}"
echo $$ >"$PIDDIR/worker$RANK.pid"
exec "$@"
EOF
train 100000
long=("${cmd[@]}")
[[ $have_torch -eq 1 ]] || long=(bash -c 'while :; do sleep 1; done')
export PIDDIR=$work
start_long() { # start_long OUT [CMD...]: a long 2-worker, 2-shard run in the background
    local out=$1
    shift
    [[ $# -gt 0 ]] || set -- "${long[@]}"
    rm -f "$work"/worker*.pid
    "${run[@]}" -w 2 -s 2 -- bash "$work/worker.sh" "$@" >"$out" 2>&1 &
    bg=$!
    wait_for "$work/worker1.pid" .
    wait_for "$work/worker0.pid" .
    if [[ $have_torch -eq 1 && $* == "${long[*]}" ]]; then wait_for "$out" '^\[worker0\] step +5 '; else sleep 1; fi
}
# run_key OUT: the key file worker0 was given
run_key() { sed -n 's/^\[worker0\] key=//p' "$1" | head -n 1; }
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
key_gone "worker1 SIGKILLed" "$(run_key "$work/kill-worker.out")"
step "worker1 SIGKILLed: giftrun exited 137 within ${secs} s, naming it; nothing left, key gone"

start_long "$work/kill-shard.out"
shard=$(pgrep -f -- "--data-dir $work/data/shard-1( |$)")
kill -KILL "$shard"
finish "shard1 SIGKILLed"
[[ $rc -eq 137 ]] || fail "shard1 SIGKILLed: giftrun exit status $rc, expected 137"
grep -q "^giftrun: shard1 (pid $shard) was killed by SIGKILL; stopping the other 3 processes" \
    "$work/kill-shard.out" || fail "the message does not name shard1 (pid $shard)"
key_gone "shard1 SIGKILLed" "$(run_key "$work/kill-shard.out")"
step "shard1 SIGKILLed: giftrun exited 137 within ${secs} s, naming it; nothing left, key gone"

start_long "$work/sigint.out"
kill -INT "$bg"
finish "SIGINT"
[[ $rc -eq 130 ]] || fail "SIGINT: giftrun exit status $rc, expected 130"
grep -q '^giftrun: got SIGINT; stopping everything' "$work/sigint.out" || fail "no SIGINT message"
key_gone "SIGINT" "$(run_key "$work/sigint.out")"
step "SIGINT: giftrun exited 130 within ${secs} s; nothing left, key gone"

# SIGTERM and SIGHUP, with workers that only sleep; the key is there (mode
# 600) until then.
for sig in TERM HUP; do
    start_long "$work/sig$sig.out" bash -c 'while :; do sleep 1; done'
    key=$(run_key "$work/sig$sig.out")
    mode=$(stat -c %a "$key" 2>&1) || true
    [[ $mode == 600 ]] || fail "SIG$sig run: the key '$key' has mode '$mode' while the run lasts, expected 600"
    kill -"$sig" "$bg"
    finish "SIG$sig"
    want=$((128 + $(kill -l "$sig")))
    [[ $rc -eq $want ]] || fail "SIG$sig: giftrun exit status $rc, expected $want"
    grep -q "^giftrun: got SIG$sig; stopping everything" "$work/sig$sig.out" || fail "no SIG$sig message"
    key_gone "SIG$sig" "$key"
    step "SIG$sig: giftrun exited $rc within ${secs} s; the key (mode $mode during the run) gone, nothing left"
done

# --- 4. shards and workers started apart -----------------------------------------
user_key=$work/user_key
(umask 077 && head -c 32 /dev/urandom | base64 >"$user_key")
base=
for _ in 1 2 3 4 5; do
    try=$(free_base_port 4)
    "${run[@]}" --workers 0 --shards 2 --world 4 --nnodes 2 --node-rank 0 --bind 127.0.0.1 \
        --base-port "$try" --auth-key-file "$user_key" >"$work/shards.out" 2>&1 &
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
[[ $(shard_key "$work/shards.out") == "$user_key" ]] ||
    fail "shards-only: shard0 checks '$(shard_key "$work/shards.out")', not --auth-key-file $user_key"
rc=0
GIFT_AUTH_KEY_FILE=$user_key timeout 60 "${run[@]}" --nnodes 2 --node-rank 1 --run-id test-run -w 2 \
    --servers "127.0.0.1:$base,127.0.0.1:$((base + 2))" -- bash "$work/env.sh" \
    >"$work/workers.out" 2>&1 || rc=$?
[[ $rc -eq 0 ]] || fail "workers-only run: exit status $rc"
for r in 2 3; do
    grep -q "^\[worker$r\] vars RANK=$r WORLD_SIZE=4 LOCAL_RANK=$((r - 2)) .*GIFT_SERVERS=127.0.0.1:$base,127.0.0.1:$((base + 2)) GIFT_RUN_ID=test-run$" \
        "$work/workers.out" || fail "worker$r of node 1: wrong variables"
    grep -q "^\[worker$r\] key $user_key mode 600 " "$work/workers.out" ||
        fail "worker$r of node 1 was not given GIFT_AUTH_KEY_FILE=$user_key: $(grep "^\[worker$r\] key" "$work/workers.out")"
done
kill -TERM "$shards_pid"
finish "shards-only giftrun SIGTERMed"
[[ $rc -eq 0 ]] || fail "shards-only giftrun after SIGTERM: exit status $rc, expected 0"
[[ -f $user_key ]] || fail "giftrun removed the user's key $user_key"
no_run_dirs "shards and workers apart"
step "apart: shards-only on ports $base, $((base + 2)); node 1's workers are ranks 2, 3 of 4; SIGTERM: 0"
step "apart: both used the user's key $user_key and left it in place"

# --- 5. the user's key, and none ---------------------------------------------------------
rc=0
GIFT_AUTH_KEY_FILE=$user_key timeout 60 "${run[@]}" -w 1 -s 1 -- "$push_pull" >"$work/userkey.out" 2>&1 || rc=$?
[[ $rc -eq 0 ]] || fail "a run with GIFT_AUTH_KEY_FILE=$user_key: exit status $rc"
[[ $(shard_key "$work/userkey.out") == "$user_key" ]] ||
    fail "GIFT_AUTH_KEY_FILE=$user_key: shard0 checks '$(shard_key "$work/userkey.out")'"
grep -qE '^\[shard0\] .*hello from rank 0 of 1 \(.*\), authenticated$' "$work/userkey.out" ||
    fail "GIFT_AUTH_KEY_FILE: the Hello is not authenticated: $(grep 'hello from' "$work/userkey.out")"
[[ -f $user_key ]] || fail "giftrun removed \$GIFT_AUTH_KEY_FILE $user_key"
no_run_dirs "a run with the user's key"
step "GIFT_AUTH_KEY_FILE: the shard checks $user_key, the Hello authenticated, the file kept"

rc=0
# shellcheck disable=SC2016  # the worker's own variable
GIFT_AUTH_KEY_FILE=$user_key timeout 60 "${run[@]}" --giftd "$work/giftd-argv" --no-auth -w 1 -s 1 -- \
    bash -c 'echo "key=${GIFT_AUTH_KEY_FILE:-none}"; exec "$0"' "$push_pull" >"$work/noauth.out" 2>&1 || rc=$?
[[ $rc -eq 0 ]] || fail "--no-auth run: exit status $rc"
hello=$(grep '^\[shard0\] .*hello from rank 0 of 1 ' "$work/noauth.out" || true)
[[ -n $hello && $hello != *authenticated* ]] || fail "--no-auth: shard0's Hello line is '$hello'"
if grep -q 'authentication on' "$work/noauth.out"; then
    fail "--no-auth: the shard checks a key: $(grep 'authentication on' "$work/noauth.out")"
fi
argv=$(sed -n 's/^\[shard0\] argv //p' "$work/noauth.out")
[[ $argv != *--auth-key-file* && " $argv " == *" --world-size 1 "* ]] || fail "--no-auth: shard0's arguments: $argv"
grep -q '^\[worker0\] key=none$' "$work/noauth.out" ||
    fail "--no-auth: the worker has $(grep '^\[worker0\] key=' "$work/noauth.out")"
grep -q '^giftrun: --no-auth: ' "$work/noauth.out" || fail "--no-auth: giftrun does not say so"
no_run_dirs "a --no-auth run"
step "--no-auth: no key for shard or worker (despite GIFT_AUTH_KEY_FILE), the Hello unauthenticated"

# --- 6. usage errors -------------------------------------------------------------------
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
usage "--no-auth and --auth-key-file exclude each other" --no-auth --auth-key-file "$user_key" -- true
"$giftrun" --help | grep -q 'GIFT_SERVERS' || fail "--help does not list GIFT_SERVERS"
"$giftrun" --help | grep -q -- '--no-auth' || fail "--help does not list --no-auth"
"$giftrun" --help | grep -q 'unauthenticated' || fail "--help does not say --no-auth is unauthenticated"
step "usage errors: exit 2 with what to give"

if [[ $have_torch -eq 0 ]]; then
    step "skipped the training parts: $py has no torch"
    exit 77
fi
step "ok"
