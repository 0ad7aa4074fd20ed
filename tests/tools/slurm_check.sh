#!/usr/bin/env bash
# slurm_check.sh BINARY_DIR SOURCE_DIR: examples/slurm/giftd-hetjob.sbatch run
# as Slurm would run it, on this machine: a fake srun (one task per node, the
# step's SLURM_* variables, then exec) and a fake scontrol on PATH, one "CPU
# node" and one "GPU node", both 127.0.0.1. The batch script starts the
# shards through giftrun --slurm --workers 0, waits for them with giftctl,
# trains examples/train_llama.py for 10 steps with 2 workers through giftrun
# --slurm --servers, and drains the shards; it must exit 0, the shards must
# have written their checkpoints in RUN_DIR/shard-0 and shard-1, and nothing
# of the run may be left. Exit 77 (skipped) without torch. GIFT_TEST_PRELOAD
# (the sanitizer build's runtimes) goes into LD_PRELOAD of the workers' Python.
set -euo pipefail
# shellcheck source=ports.sh
. "$(dirname "$0")/ports.sh"

bin=${1:?usage: slurm_check.sh BINARY_DIR SOURCE_DIR}
src=${2:?}
py=/usr/bin/python3
preload=${GIFT_TEST_PRELOAD:-}
"$py" -c 'import torch, numpy' 2>/dev/null || { echo "slurm_check: no torch in $py; skipping" >&2; exit 77; }

work=$(mktemp -d "${TMPDIR:-/tmp}/giftrun-slurm-XXXXXX")
bg=
cleanup() {
    local rc=$? left
    [[ -n $bg ]] && { kill -KILL "$bg" 2>/dev/null || true; wait "$bg" 2>/dev/null || true; }
    left=$(pgrep -f -- "$work" || true)
    # shellcheck disable=SC2086  # one pid per word
    [[ -n $left ]] && kill -KILL $left 2>/dev/null
    rm -rf "$work"
    exit "$rc"
}
trap cleanup EXIT
fail() {
    echo "slurm_check: FAIL: $*" >&2
    [[ -s $work/job.out ]] && tail -n 40 "$work/job.out" >&2
    exit 1
}

mkdir -p "$work/fake"
cat >"$work/fake/scontrol" <<'EOS'
#!/bin/bash
# scontrol show hostnames LIST: one name per line (LIST is comma-separated here)
[[ $1 == show && $2 == hostnames ]] || { echo "fake scontrol: $*" >&2; exit 1; }
tr ',' '\n' <<<"$3"
EOS
cat >"$work/fake/srun" <<'EOS'
#!/bin/bash
# srun --het-group=G [--ntasks-per-node=1] [--kill-on-bad-exit=1] CMD...: the
# one task of a one-node step on component G.
group=
while [[ $1 == --* ]]; do
    case $1 in
        --het-group=*) group=${1#*=} ;;
        --ntasks-per-node=1 | --kill-on-bad-exit=*) ;;
        *) echo "fake srun: unexpected $1" >&2; exit 1 ;;
    esac
    shift
done
var=SLURM_JOB_NODELIST_HET_GROUP_$group
export SLURM_STEP_NODELIST=${!var} SLURM_STEP_NUM_NODES=1 SLURM_NODEID=0 SLURM_PROCID=0 SLURM_LOCALID=0
exec "$@"
EOS
# python3: Debian's, with the sanitizer runtimes first when the library needs them.
if [[ -n $preload ]]; then
    printf '#!/bin/bash\nLD_PRELOAD=%q ASAN_OPTIONS=detect_leaks=0 exec %q "$@"\n' \
        "$preload" "$py" >"$work/fake/python3"
else
    printf '#!/bin/bash\nexec %q "$@"\n' "$py" >"$work/fake/python3"
fi
chmod +x "$work/fake/srun" "$work/fake/scontrol" "$work/fake/python3"

while IFS= read -r var; do unset "$var"; done < <(compgen -e | grep -E '^(GIFTD_|GIFT_|SLURM_)' || true)
unset RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT
export OPENBLAS_NUM_THREADS=1

rc=1
for _ in 1 2 3 4 5; do # a fixed port may still be taken between check and bind: try another
    port=$(free_base_port 4)
    rc=0
    PATH=$work/fake:$PATH SLURM_JOB_ID=4242 SLURM_SUBMIT_DIR=$src \
        SLURM_JOB_NODELIST_HET_GROUP_0=127.0.0.1 SLURM_JOB_NODELIST_HET_GROUP_1=127.0.0.1 \
        GIFT_BIN=$bin GIFT_RUN_DIR=$work/run SHARDS_PER_NODE=2 GPUS_PER_NODE=2 \
        BASE_PORT=$port SHARD_BIND=127.0.0.1 GIFTD_CHECKPOINT_STEPS=5 \
        GIFT_TRAIN_ARGS="--dim 32 --layers 1 --heads 2 --seq 32 --batch 4 --warmup 2 --steps 10 --val-every 5 --val-batches 1 --out $work/out" \
        timeout 180 bash "$src/examples/slurm/giftd-hetjob.sbatch" >"$work/job.out" 2>&1 || rc=$?
    [[ $rc -eq 0 ]] && break
    grep -q 'address already in use' "$work/job.out" || break
done
[[ $rc -eq 0 ]] || fail "the batch script exited $rc"
for want in "giftd: 2 shards (127.0.0.1:$port,127.0.0.1:$((port + 2))), 2 workers on 127.0.0.1" \
    'giftrun: run slurm-4242: shards shard0 on 127.0.0.1:' \
    'giftrun: run slurm-4242: 2 workers (ranks 0..1 of 2)' '[worker0] step    10 ' \
    'giftrun: done: 2 workers exited 0'; do
    grep -qF -- "$want" "$work/job.out" || fail "job output lacks '$want'"
done
for s in 0 1; do
    [[ -n $(ls -A "$work/run/shard-$s" 2>/dev/null) ]] || fail "no checkpoint in RUN_DIR/shard-$s"
done
sleep 0.5
left=$(pgrep -f -- "$work" || true)
[[ -z $left ]] || fail "processes left behind: $left"
echo "slurm_check: giftd-hetjob.sbatch: shards and 2 workers through giftrun --slurm, 10 steps, checkpoints in shard-0 and shard-1, nothing left"
