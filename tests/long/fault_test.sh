#!/usr/bin/env bash
# fault_test.sh GIFTD WORKER: "nothing acknowledged is lost", end to end.
#
# Two giftd shards (checkpoint_steps 50, a data_dir each, aggregate ordered)
# and two worker processes (tests/long/train_worker.c: deterministic SGD on
# f32 tensors and fp8-e4m3 tensors with GIFT geometry, refreshed every 25
# steps) run STEPS steps:
#   run A  without faults;
#   run B  the same, with shard 1 SIGKILLed at about STEPS*0.4 and restarted
#          (same port, same data_dir), then shard 0 stopped with SIGTERM at
#          about STEPS*0.7 and restarted;
#   run C  the same, with worker 1 SIGKILLed in step STEPS/2 + 8 and
#          restarted from its own checkpoint (it saves its parameters every
#          step), the other worker and both shards running on.
# Each run must finish with parameters bit-identical to run A's on both
# ranks. Then a corrupt and a truncated checkpoint must each make giftd
# exit non-zero with a message naming the problem, before it listens.
# FAULT_STEPS overrides STEPS (default 300). Bounded: about 20 s on two
# cores in a release build.
set -euo pipefail

giftd=${1:?usage: fault_test.sh path/to/giftd path/to/gift-train-worker}
worker=${2:?usage: fault_test.sh path/to/giftd path/to/gift-train-worker}
steps=${FAULT_STEPS:-300}
work=$(mktemp -d "${TMPDIR:-/tmp}/giftd-fault-XXXXXX")
declare -a spid=(0 0) sport=(0 0) wpid=(0 0)

cleanup() {
    local rc=$?
    for p in "${spid[@]}" "${wpid[@]}"; do
        if [[ $p != 0 ]] && kill -0 "$p" 2>/dev/null; then
            kill -KILL "$p" 2>/dev/null || true
        fi
    done
    wait 2>/dev/null || true
    if [[ $rc -ne 0 && $rc -ne 77 ]]; then
        for f in "$work"/*.log; do
            [[ -s $f ]] || continue
            echo "--- $f ---" >&2
            tail -n 25 "$f" >&2
        done
    fi
    [[ -n ${KEEP_WORK:-} ]] || rm -rf "$work"
}
trap cleanup EXIT

fail() {
    echo "fault_test: FAIL: $*" >&2
    exit 1
}
note() { echo "fault_test: $*"; }

while IFS= read -r var; do unset "$var"; done < <(compgen -e | grep '^GIFTD_\|^GIFT_' || true)

# start_shard I RUN [PORT]: starts shard I of run RUN (port 0: pick one).
start_shard() {
    local i=$1 run=$2 port=${3:-0} line=''
    : >"$work/$run-s$i.ready"
    "$giftd" --bind 127.0.0.1 --port "$port" --http-port -1 --shard-id "$i" --num-shards 2 \
        --world-size 2 --data-dir "$work/$run-data$i" --checkpoint-steps 50 \
        --stall-warn 5 >"$work/$run-s$i.ready" 2>>"$work/$run-s$i.log" &
    spid[$i]=$!
    for _ in $(seq 1 400); do
        if read -r line <"$work/$run-s$i.ready" 2>/dev/null && [[ $line == "giftd ready "* ]]; then
            sport[$i]=$(sed -n 's/.* port=\([0-9]*\) .*/\1/p' <<<"$line")
            return 0
        fi
        kill -0 "${spid[$i]}" 2>/dev/null || fail "shard $i of run $run exited before it was ready"
        sleep 0.025
    done
    fail "shard $i of run $run: no ready line within 10 s"
}

# start_worker R RUN [EXTRA...]
start_worker() {
    local r=$1 run=$2
    shift 2
    GIFT_SERVERS="127.0.0.1:${sport[0]},127.0.0.1:${sport[1]}" GIFT_RANK=$r GIFT_WORLD=2 \
        "$worker" --steps "$steps" --out "$work/$run-w$r.bin" --progress "$work/$run-w$r.progress" \
        --save-every 1 "$@" >>"$work/$run-w$r.log" 2>&1 &
    wpid[$r]=$!
}

# wait_step R RUN N: waits until worker R of RUN has finished step N.
wait_step() {
    local r=$1 run=$2 n=$3 last
    for _ in $(seq 1 4000); do
        last=$(grep "^step " "$work/$run-w$r.progress" 2>/dev/null | tail -n 1 | cut -d" " -f2 || true)
        [[ -n $last && $last -ge $n ]] && return 0
        kill -0 "${wpid[$r]}" 2>/dev/null || fail "worker $r of run $run exited before step $n"
        sleep 0.01
    done
    fail "worker $r of run $run did not reach step $n within 40 s"
}

wait_workers() {
    local run=$1
    for r in 0 1; do
        wait "${wpid[$r]}" || fail "worker $r of run $run failed (see $run-w$r.log)"
        wpid[$r]=0
    done
}

stop_shards() { # SIGTERM both, expect exit 0 and a checkpoint
    local run=$1
    for i in 0 1; do
        kill -TERM "${spid[$i]}"
        wait "${spid[$i]}" || fail "shard $i of run $run exited non-zero after SIGTERM"
        spid[$i]=0
        [[ -s $work/$run-data$i/checkpoint ]] || fail "shard $i of run $run left no checkpoint"
    done
}

t_start=$SECONDS

# Run A: no fault.
start_shard 0 A
start_shard 1 A
start_worker 0 A
start_worker 1 A
wait_workers A
stop_shards A
cmp -s "$work/A-w0.bin" "$work/A-w1.bin" || fail "run A: the two ranks ended with different parameters"
note "run A: $steps steps in $((SECONDS - t_start)) s; $(cat "$work/A-w0.log")"

# Run B: shard 1 SIGKILLed, then shard 0 SIGTERMed, each restarted.
t=$SECONDS
start_shard 0 B
start_shard 1 B
start_worker 0 B
start_worker 1 B
wait_step 0 B $((steps * 2 / 5))
kill -KILL "${spid[1]}"
wait "${spid[1]}" 2>/dev/null || true
note "run B: shard 1 killed at worker 0's step $(grep '^step ' "$work/B-w0.progress" | tail -n 1 | cut -d' ' -f2)"
sleep 0.3
start_shard 1 B "${sport[1]}"
grep -q "restored from" "$work/B-s1.log" || fail "run B: the restarted shard 1 did not restore its state"
wait_step 0 B $((steps * 7 / 10))
kill -TERM "${spid[0]}"
wait "${spid[0]}" || fail "run B: shard 0 exited non-zero after SIGTERM"
note "run B: shard 0 stopped (SIGTERM) at worker 0's step $(grep '^step ' "$work/B-w0.progress" | tail -n 1 | cut -d' ' -f2)"
start_shard 0 B "${sport[0]}"
wait_workers B
stop_shards B
for r in 0 1; do
    cmp -s "$work/A-w$r.bin" "$work/B-w$r.bin" ||
        fail "run B: rank $r's parameters differ from the run without faults"
done
note "run B: bit-identical to run A ($((SECONDS - t)) s); rank 0: $(cat "$work/B-w0.log")"

# Run C: worker 1 SIGKILLs itself after step K (and after starting step
# K + 1's pushes) and is restarted from its own checkpoint of step K. K + 1
# is not a geometry refresh step (docs/TROUBLESHOOTING.md, "Restarting one worker").
t=$SECONDS
k=$((steps / 2 + 7))
start_shard 0 C
start_shard 1 C
start_worker 0 C
start_worker 1 C --die-after "$k"
if wait "${wpid[1]}"; then fail "run C: worker 1 did not die"; fi
wpid[1]=0
resume_at=$(od -An -tu8 -N8 "$work/C-w1.bin.ckpt" | tr -d ' ')
[[ $resume_at == $((k + 1)) ]] || fail "run C: worker 1's checkpoint is at step $resume_at, not $((k + 1))"
note "run C: worker 1 killed itself during step $((k + 1)); restarting from its checkpoint"
cp "$work/C-w1.bin.ckpt" "$work/C-w1.resume"
start_worker 1 C --resume "$work/C-w1.resume"
wait_workers C
stop_shards C
for r in 0 1; do
    cmp -s "$work/A-w$r.bin" "$work/C-w$r.bin" ||
        fail "run C: rank $r's parameters differ from the run without faults"
done
note "run C: bit-identical to run A ($((SECONDS - t)) s)"

# Damaged checkpoints are refused, giftd exits non-zero and says why.
ck=$work/B-data0/checkpoint
cp "$ck" "$work/good"
size=$(stat -c %s "$ck")
printf '\x5a' | dd of="$ck" bs=1 seek=$((size / 2)) conv=notrunc status=none
if "$giftd" --port 0 --http-port -1 --shard-id 0 --num-shards 2 --world-size 2 \
    --data-dir "$work/B-data0" --checkpoint-steps 50 >/dev/null 2>"$work/corrupt.log"; then
    fail "giftd started from a corrupt checkpoint"
fi
grep -q "checksum" "$work/corrupt.log" || fail "corrupt checkpoint: no message naming the checksum"
head -c $((size - 100)) "$work/good" >"$ck"
if "$giftd" --port 0 --http-port -1 --shard-id 0 --num-shards 2 --world-size 2 \
    --data-dir "$work/B-data0" --checkpoint-steps 50 >/dev/null 2>"$work/truncated.log"; then
    fail "giftd started from a truncated checkpoint"
fi
grep -q "truncated" "$work/truncated.log" || fail "truncated checkpoint: no message saying so"
note "damaged checkpoints refused: $(grep -o 'cannot restore.*' "$work/corrupt.log" | head -c 200)"
note "PASS in $((SECONDS - t_start)) s"
