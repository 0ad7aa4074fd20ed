#!/usr/bin/env bash
# datadir_check.sh GIFTD WORKER: what giftd does with its data_dir, on real
# processes (127.0.0.1, world size 1, tests/ops/gift_ops_worker).
#
#  a. A second giftd on a data_dir in use exits 2 within seconds, its one
#     error line naming the directory and the first one's PID; the first
#     one's worker finishes as if nothing happened.
#  b. After a SIGKILL of the holder, a new giftd takes the lock (its own PID
#     in giftd.lock, mode 0600) and restores.
#  c. The checkpoint deleted, its step log kept: refused (exit 2) naming the
#     log and --discard-state; the log's bytes unchanged.
#  d. A stray log-999: refused naming it; the file kept, same bytes.
#  e. A file giftd does not know: refused naming it.
#  f. --discard-state moves all of it into data_dir/discarded-*/ (the same
#     bytes there) and starts empty; a new run then trains.
#  g. --reset also moves the state aside (a second discarded-* folder), and
#     nothing that was in data_dir is gone.
#  h. As root, in a private mount namespace (unshare -m), data_dir on a tiny
#     tmpfs that fills up: the pull fails saying the step could not be made
#     durable, naming the step log, "No space left on device" and what to do;
#     once space is freed, a restart replays the log (its cut record gone).
#     Skipped (one SKIP line) when not root or unshare fails.
set -euo pipefail

giftd=${1:?usage: datadir_check.sh GIFTD WORKER}
worker=${2:?}
self=$(readlink -f "$0")

while IFS= read -r var; do unset "$var"; done < <(compgen -e | grep -E '^(GIFTD_|GIFT_)' || true)
unset RANK WORLD_SIZE

fail() { echo "datadir_check: FAIL: $*" >&2; exit 1; }
ok() { echo "datadir_check: ok: $*"; }

cs=10 # checkpoint_steps
# start NAME DIR [FLAGS...]: a persisting giftd of world size 1 in the
# background; its ready line in $work/NAME.ready, its log in $work/NAME.log.
# Sets pid, port. Fails unless it is ready within 10 s.
start() {
    local name=$1 dir=$2 line
    shift 2
    rm -f "$work/$name.ready"
    "$giftd" --bind 127.0.0.1 --port 0 --http-port off --world-size 1 --data-dir "$dir" \
        --checkpoint-steps "$cs" "$@" >"$work/$name.ready" 2>>"$work/$name.log" &
    pid=$!
    for _ in $(seq 1 200); do
        if { read -r line <"$work/$name.ready"; } 2>/dev/null && [[ $line == "giftd ready "* ]]; then
            port=$(sed -n 's/.* port=\([0-9]*\) .*/\1/p' <<<"$line")
            return 0
        fi
        kill -0 "$pid" 2>/dev/null || fail "giftd $name exited before its ready line: $(tail -n 3 "$work/$name.log")"
        sleep 0.05
    done
    fail "no ready line from giftd $name $*"
}
# refused NAME DIR [FLAGS...]: giftd must exit 2 within 10 s; its log in
# $work/NAME.log, the output in $out.
refused() {
    local name=$1 dir=$2 rc=0
    shift 2
    timeout 10 "$giftd" --bind 127.0.0.1 --port 0 --http-port off --world-size 1 --data-dir "$dir" \
        --checkpoint-steps "$cs" "$@" >"$work/$name.ready" 2>"$work/$name.log" || rc=$?
    out=$(cat "$work/$name.log")
    [[ $rc -eq 2 ]] || fail "giftd $name exited $rc, wanted 2 (a refusal); it said: $out"
    [[ ! -s $work/$name.ready ]] || fail "giftd $name printed a ready line although refused"
}
says() { # says WHAT TEXT...: every TEXT is in $out
    local what=$1
    shift
    for want in "$@"; do
        grep -qF -- "$want" <<<"$out" || fail "$what does not say '$want'; it says: $out"
    done
}
# train STEPS [SLEEP_MS]: one worker (rank 0 of 1) against $port, in the
# background; sets wpid.
train() {
    GIFT_SERVERS="127.0.0.1:$port" GIFT_RANK=0 GIFT_WORLD=1 \
        timeout 60 "$worker" --steps "$1" --sleep-ms "${2:-0}" --timeout-ms 20000 \
        >"$work/w.out" 2>"$work/w.err" &
    wpid=$!
}
wait_train() {
    local rc=0
    wait "$wpid" || rc=$?
    wpid=''
    [[ $rc -eq 0 ]] || fail "the worker exited $rc: $(tail -n 3 "$work/w.err")"
}
kill_giftd() { kill -"$1" "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; pid=''; }
# same A B: files A and B hold the same bytes.
same() { cmp -s "$1" "$2" || fail "$1 differs from $2 ($(stat -c %s "$1" 2>&1) vs $(stat -c %s "$2" 2>&1) bytes)"; }

# ---------------------------------------------------------------------
# h, inside the private mount namespace: datadir_check.sh --full-disk
# GIFTD WORKER WORK (WORK is the caller's folder; it cleans it up).
if [[ ${3:-} == --full-disk ]]; then
    work=$4 pid='' wpid=''
    trap '[[ -n $wpid ]] && kill -KILL "$wpid" 2>/dev/null; [[ -n $pid ]] && kill -KILL "$pid" 2>/dev/null; umount "$work/small" 2>/dev/null || true' EXIT
    mkdir -p "$work/small"
    mount -t tmpfs -o size=2m,mode=0700 tmpfs "$work/small" || exit 77
    d=$work/small/data
    cs=1000000
    start full "$d"
    train 100000 20
    for _ in $(seq 1 200); do grep -qx "step 3" "$work/w.out" 2>/dev/null && break; sleep 0.05; done
    grep -qx "step 3" "$work/w.out" || fail "h: the worker did not reach step 3: $(tail -n 3 "$work/w.err")"
    # The rest of the tmpfs, outside data_dir: the next log append fails.
    dd if=/dev/zero of="$work/small/filler" bs=64k 2>/dev/null || true
    for _ in $(seq 1 300); do kill -0 "$wpid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$wpid" 2>/dev/null && fail "h: the worker still runs 30 s after the disk filled up"
    rc=0
    wait "$wpid" || rc=$?
    wpid=''
    [[ $rc -ne 0 ]] || fail "h: the worker exited 0 although its steps could not be made durable"
    out=$(cat "$work/full.log")
    says "h: giftd's log of the failed pull" "could not be made durable" \
        "the step log $d/log-0 could not be written (No space left on device)" \
        "free space on (or repair) the filesystem of $d" "then restart giftd"
    line=$(grep -m1 -F "could not be made durable" "$work/full.log")
    [[ $line == *"error -26 ("* ]] || fail "h: the pull's error is not GIFT_EIO (-26): $line"
    echo "datadir_check: h: the pull's error: ${line#*: }"
    out=$(cat "$work/w.err")
    says "h: the worker's stderr" "could not be made durable" "No space left on device" "free space"
    echo "datadir_check: h: the worker says: $(grep -m1 -F "could not be made durable" "$work/w.err")"
    kill_giftd KILL
    rm -f "$work/small/filler"
    start full2 "$d"
    grep -q "restored from $d" "$work/full2.log" ||
        fail "h: no restore after space was freed: $(tail -n 3 "$work/full2.log")"
    kill_giftd TERM
    ok "h: full disk: the pull says the step log could not be written and what to do; a restart with space restores"
    exit 0
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/datadir-check-XXXXXX")
pid='' wpid=''
cleanup() {
    local rc=$?
    for p in "$wpid" "$pid"; do
        [[ -n $p ]] && { kill -KILL "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; }
    done
    if [[ $rc -ne 0 ]]; then
        for f in "$work"/*.log "$work"/w.err; do
            [[ -s $f ]] && { echo "--- ${f##*/} ---" >&2; tail -n 15 "$f" >&2; }
        done
    fi
    rm -rf "$work"
}
trap cleanup EXIT
d=$work/data

# a. A second giftd on the same data_dir.
start a "$d"
first=$pid
train 43 50
for _ in $(seq 1 200); do grep -qx "step 2" "$work/w.out" 2>/dev/null && break; sleep 0.05; done
refused a2 "$d"
says "a: the second giftd" "data_dir $d is in use by another giftd, PID $first" "$d/giftd.lock"
[[ $(grep -c . <<<"$out") -eq 1 ]] || fail "a: the refusal is not one line: $out"
kill -0 "$first" 2>/dev/null || fail "a: the first giftd died when the second one started"
wait_train
[[ $(cat "$d/giftd.lock") == "$first" ]] || fail "a: giftd.lock holds '$(cat "$d/giftd.lock")', not $first"
[[ $(stat -c %a "$d/giftd.lock") == 600 ]] || fail "a: giftd.lock has mode $(stat -c %a "$d/giftd.lock")"
ok "a: the second giftd exits 2 naming $d and PID $first; the first one's run finished"

# b. SIGKILL of the holder: the next one takes the lock and restores.
kill_giftd KILL
start b "$d"
grep -q "restored from $d" "$work/b.log" || fail "b: no restore after SIGKILL: $(tail -n 3 "$work/b.log")"
[[ $(cat "$d/giftd.lock") == "$pid" ]] || fail "b: giftd.lock holds '$(cat "$d/giftd.lock")', not $pid"
kill_giftd KILL
ok "b: after SIGKILL a new giftd takes the lock and restores"

# The state as it is now: the checkpoint of step 40 (generation G) and its
# log-G with the records of steps 40 to 42.
logs=("$d"/log-*)
[[ ${#logs[@]} -eq 1 && -e ${logs[0]} && -s $d/checkpoint ]] ||
    fail "expected one checkpoint and one step log in $d: $(ls -la "$d")"
log=${logs[0]##*/}
[[ $log != log-0 ]] || fail "the checkpoint's log is log-0: no generation to miss"
mkdir "$work/copy"
cp -p "$d/checkpoint" "$d/$log" "$work/copy/"
[[ -s $d/$log ]] || fail "$d/$log is empty: no records after the checkpoint to keep"

# c. The checkpoint deleted, the log kept.
rm "$d/checkpoint"
refused c "$d"
says "c: the refusal" "data_dir $d holds what giftd cannot account for" \
    "$log (a step log of generation ${log#log-} without the checkpoint it extends)" "--discard-state" \
    "nothing was changed" "Put back the checkpoint"
same "$d/$log" "$work/copy/$log"
cp -p "$work/copy/checkpoint" "$d/"
ok "c: checkpoint missing: refused (exit 2), $log kept byte for byte ($(stat -c %s "$d/$log") B)"

# d. A stray log-999.
head -c 424 /dev/urandom >"$d/log-999"
cp -p "$d/log-999" "$work/copy/"
refused d "$d"
says "d: the refusal" "log-999 (a step log newer than the checkpoint" "--discard-state"
same "$d/log-999" "$work/copy/log-999"
same "$d/$log" "$work/copy/$log"
ok "d: a stray log-999: refused, kept"

# e. A file giftd does not know (log-999 still there: both named).
echo "operator notes" >"$d/notes.txt"
cp -p "$d/notes.txt" "$work/copy/"
refused e "$d"
says "e: the refusal" "notes.txt (not a file giftd writes)" "log-999"
same "$d/notes.txt" "$work/copy/notes.txt"
ok "e: an unknown file: refused naming it"

# f. --discard-state: everything moved aside, the same bytes; starts empty.
start f "$d" --discard-state
moved=("$d"/discarded-*)
[[ ${#moved[@]} -eq 1 && -d ${moved[0]} ]] || fail "f: not one discarded-* folder: $(ls -la "$d")"
[[ ${moved[0]##*/} =~ ^discarded-[0-9]{8}T[0-9]{6}Z$ ]] || fail "f: the folder is named ${moved[0]##*/}"
for f in checkpoint "$log" log-999 notes.txt; do same "${moved[0]}/$f" "$work/copy/$f"; done
grep -qF -- "--discard-state: moved the state of $d (4 entries) into ${moved[0]}; this shard starts empty" \
    "$work/f.log" || fail "f: giftd does not log where the state went: $(cat "$work/f.log")"
grep -q "restored from" "$work/f.log" && fail "f: restored although the state was moved aside"
[[ ! -e $d/checkpoint && ! -e $d/$log && ! -e $d/log-999 && ! -e $d/notes.txt ]] ||
    fail "f: the state is still in $d: $(ls -la "$d")"
train 3
wait_train
kill_giftd TERM
ok "f: --discard-state moved 4 entries into ${moved[0]##*/} unchanged; a new run trained"

# g. --reset: moved aside too; nothing that was in data_dir is gone.
mkdir "$work/before"
cp -p "$d/checkpoint" "$d"/log-* "$work/before/"
before=$(cd "$work/before" && ls | sort | tr '\n' ' ')
start g "$d" --reset
kill_giftd TERM
mapfile -t folders < <(ls -d "$d"/discarded-* | sort)
[[ ${#folders[@]} -eq 2 ]] || fail "g: wanted 2 discarded-* folders: $(ls -la "$d")"
new=''
for f in "${folders[@]}"; do [[ $f == "${moved[0]}" ]] || new=$f; done
[[ -n $new ]] || fail "g: the first folder was replaced: ${folders[*]}"
for f in $before; do same "$new/$f" "$work/before/$f"; done
for f in checkpoint "$log" log-999 notes.txt; do same "${moved[0]}/$f" "$work/copy/$f"; done
grep -qF -- "--reset: moved the state of $d" "$work/g.log" || fail "g: --reset does not say where the state went"
ok "g: --reset moved $before into ${new##*/}; the earlier folder untouched"

# h. The full disk, in a private mount namespace.
if [[ $(id -u) -ne 0 ]]; then
    echo "datadir_check: SKIP h (full disk): not root, cannot mount a small tmpfs"
elif ! unshare -m --propagation private true 2>/dev/null; then
    echo "datadir_check: SKIP h (full disk): unshare -m fails here"
else
    rc=0
    unshare -m --propagation private -- bash "$self" "$giftd" "$worker" --full-disk "$work" || rc=$?
    if [[ $rc -eq 77 ]]; then
        echo "datadir_check: SKIP h (full disk): no tmpfs mount in a private namespace"
    elif [[ $rc -ne 0 ]]; then
        fail "h: the full-disk case exited $rc"
    fi
fi
echo "datadir_check: ok"
