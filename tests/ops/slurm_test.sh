#!/usr/bin/env bash
# slurm_test.sh BINARY_DIR SOURCE_DIR: examples/slurm/giftd-hetjob.sbatch
# submitted with sbatch to a real Slurm (Debian's slurmctld and slurmd 22.05,
# munge), started by this test on this machine with all its state in a
# temporary folder:
#
#   - munged with a generated key and its own socket; slurmctld; two slurmd
#     on this machine, one per node name that resolves here (this host's
#     name, partition "cpu", and localhost, partition "gpu", with 2 GPUs that
#     are character devices aliasing /dev/null: Slurm sets
#     CUDA_VISIBLE_DEVICES, torch finds no CUDA and trains on the CPU).
#     Slurm's backfill scheduler, the only one that starts heterogeneous
#     jobs, reserves whole nodes, so the two components need two nodes;
#     hence two slurmd (`slurmd -N NAME`, one port each).
#   - case 1: the script submitted unchanged, with only what
#     examples/slurm/README.md tells a site to set (node counts, CPUs,
#     memory, GPUs per node on sbatch's command line, one component each
#     side of ':'; SHARDS_PER_NODE, GPUS_PER_NODE, BASE_PORT, SHARD_BIND,
#     GIFT_BIN, GIFT_RUN_DIR, GIFT_TRAIN_ARGS in the environment of sbatch):
#     2 shards, 2 workers, 300 steps of a tiny model in f32. The job's output
#     file shows the shards ready, both workers through step 300, the shards
#     drained (checkpoint written on SIGTERM); `scontrol show job` says
#     COMPLETED, ExitCode=0:0, for both components. Its log.csv is the
#     reference for case 2.
#   - case 2: the same training, GIFT_RUN_ID and GIFT_RUN_DIR given, a shard
#     checkpoint every 5 steps, the workers' checkpoints (train_llama.py
#     --checkpoint, every step) in GIFT_RUN_DIR/workers; once the workers
#     are past step 20, `scancel --batch --signal=TERM` (what the script's
#     `--signal=B:TERM@120` sends before the time limit) reaches the batch
#     script during the workers' step: it drains the shards, which
#     checkpoint, and the workers save their last finished step and exit;
#     the job ends 143. A second job with the same GIFT_RUN_ID, GIFT_RUN_DIR
#     and GIFT_TRAIN_ARGS: both shards log the restore of their checkpoints
#     (shard 0 at the step it had reached), both workers "resumed from step
#     N" with N at most 2 steps behind shard 0's, and train on to step 300;
#     COMPLETED 0:0 for both components, and every loss in the two jobs'
#     log.csv equals case 1's at the same step (f32: the resume is exact).
#
# Every wait has a deadline; the jobs, the daemons and every process that
# carries this cluster's SLURM_CONF are stopped on every exit (trap).
# Exits 77 (skipped), saying why, without torch in /usr/bin/python3, without
# Slurm or munge (scripts/deps.sh installs slurmctld slurmd slurm-client
# munge), not as root (slurmd must be), or when the daemons cannot start.
set -euo pipefail

bin=$(cd "${1:?usage: slurm_test.sh BINARY_DIR SOURCE_DIR}" && pwd)
src=$(cd "${2:?}" && pwd)
# shellcheck source=tests/tools/ports.sh
. "$src/tests/tools/ports.sh"
me=slurm_test
py=/usr/bin/python3
JOB_WAIT_S=${JOB_WAIT_S:-240}   # the most one job may take, queued and run
# KEEP=1: leave the temporary folder (logs, job output) in place.
t_start=$SECONDS

skip() { echo "$me: SKIP: $*" >&2; exit 77; }
say() { echo "$me: $*"; }

"$py" -c 'import torch, numpy' 2>/dev/null || skip "no torch in $py (the example trains examples/train_llama.py)"
for c in slurmctld slurmd sbatch scontrol scancel squeue sinfo munged munge unmunge; do
    command -v "$c" >/dev/null 2>&1 || skip "no $c (scripts/deps.sh installs slurmctld slurmd slurm-client munge)"
done
[[ $(id -u) -eq 0 ]] || skip "slurmd runs jobs as their user and must run as root"
# The two node names: both must reach this machine, and be distinct.
cpu_node=$(hostname -s 2>/dev/null || hostname)
gpu_node=localhost
[[ $cpu_node != "$gpu_node" ]] || skip "this machine's name is localhost: no second node name"
getent hosts "$cpu_node" >/dev/null || skip "this machine's name $cpu_node does not resolve"
getent hosts "$gpu_node" >/dev/null || skip "localhost does not resolve"

work=$(mktemp -d "${TMPDIR:-/tmp}/giftd-slurm-XXXXXX")
chmod 755 "$work"   # munged checks that every folder above its socket is searchable
export SLURM_CONF=$work/slurm.conf
daemons=()          # pids of munged, slurmctld, slurmd (in the foreground, -D / -F)

# ours: every process that carries this cluster's SLURM_CONF (the daemons,
# slurmstepd, the jobs' processes), one pid per line.
ours() {
    local e p
    for e in /proc/[0-9]*/environ; do
        p=${e#/proc/}
        p=${p%/environ}
        tr '\0' '\n' 2>/dev/null <"$e" | grep -qxF "SLURM_CONF=$SLURM_CONF" && echo "$p"
    done
    return 0
}

logs() {
    local f
    for f in "$work"/log/*.log "$work"/munge/munged.log; do
        [[ -s $f ]] || continue
        echo "--- $f (last 15 lines)" >&2
        tail -n 15 "$f" >&2
    done
}

cleanup() {
    local rc=$? left p
    set +e
    if [[ ${#daemons[@]} -gt 0 ]]; then
        # The jobs first (their steps' processes), while the daemons still run.
        local jobs
        jobs=$(squeue -h -o %A 2>/dev/null)
        if [[ -n $jobs ]]; then
            # shellcheck disable=SC2086  # one job id per word
            scancel --full $jobs 2>/dev/null
            for _ in $(seq 1 100); do
                [[ -z $(squeue -h -o %A 2>/dev/null) ]] && break
                sleep 0.2
            done
        fi
        [[ $rc -ne 0 && $rc -ne 77 ]] && logs
        for ((i = ${#daemons[@]} - 1; i >= 0; i--)); do kill -TERM "${daemons[i]}" 2>/dev/null; done
        for _ in $(seq 1 100); do
            left=
            for p in "${daemons[@]}"; do kill -0 "$p" 2>/dev/null && left+=" $p"; done
            [[ -z $left ]] && break
            sleep 0.1
        done
        # shellcheck disable=SC2086  # one pid per word
        [[ -n $left ]] && { echo "$me: daemons$left did not stop on SIGTERM: SIGKILL" >&2; kill -KILL $left; }
        wait 2>/dev/null
    fi
    # Into a file, not a pipe: a pipe's other end would carry SLURM_CONF too.
    ours >"$work/left"
    left=$(tr '\n' ' ' <"$work/left")
    if [[ -n $left ]]; then
        echo "$me: processes of the cluster left: $left; SIGKILL" >&2
        # shellcheck disable=SC2086
        kill -KILL $left 2>/dev/null
        [[ $rc -eq 0 ]] && rc=1
    fi
    if [[ -n ${KEEP:-} ]]; then echo "$me: kept $work" >&2; else rm -rf "$work"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fail() {
    echo "$me: FAIL: $*" >&2
    local f
    for f in "$work"/job-*.out; do
        [[ -s $f ]] && { echo "--- $f (last 40 lines)" >&2; tail -n 40 "$f" >&2; }
    done
    exit 1
}

# --- munge: its own key, socket, pid, log and seed ---------------------------
mkdir -p "$work"/{munge,run,ctld,spool,log,dev,jobs}
chmod 700 "$work/munge"
chmod 755 "$work/run"
( umask 077; head -c 1024 /dev/urandom >"$work/munge/munge.key" )
chmod 400 "$work/munge/munge.key"
sock=$work/run/munge.sock
munged -F --key-file="$work/munge/munge.key" --socket="$sock" \
    --pid-file="$work/munge/munged.pid" --log-file="$work/munge/munged.log" \
    --seed-file="$work/munge/munged.seed" >"$work/munge/stderr" 2>&1 &
daemons+=($!)
for _ in $(seq 1 50); do
    munge -S "$sock" -n 2>/dev/null | unmunge -S "$sock" >/dev/null 2>&1 && break
    kill -0 "${daemons[0]}" 2>/dev/null || break
    sleep 0.2
done
munge -S "$sock" -n 2>/dev/null | unmunge -S "$sock" >/dev/null 2>&1 ||
    { cat "$work/munge/stderr" >&2; logs; skip "munged cannot start here (its log above)"; }

# --- slurm.conf: two nodes of this machine's size, one partition each ----------
read -r cpus boards sockets cores threads mem < <(slurmd -C | sed -n 's/.*CPUs=\([0-9]*\) Boards=\([0-9]*\) SocketsPerBoard=\([0-9]*\) CoresPerSocket=\([0-9]*\) ThreadsPerCore=\([0-9]*\) RealMemory=\([0-9]*\).*/\1 \2 \3 \4 \5 \6/p')
[[ -n ${mem:-} ]] || skip "slurmd -C does not describe this machine: $(slurmd -C 2>&1 | head -n 1)"
port=$(free_base_port 3)
# Two GPUs for the "gpu" node: character devices 1:3 (what /dev/null is),
# or, where mknod is not allowed, plain files (slurmd logs an error for
# each and counts them all the same).
for g in 0 1; do mknod "$work/dev/gpu$g" c 1 3 2>/dev/null || : >"$work/dev/gpu$g"; done
hw="CPUs=$cpus Boards=$boards SocketsPerBoard=$sockets CoresPerSocket=$cores ThreadsPerCore=$threads RealMemory=$mem"
cat >"$SLURM_CONF" <<EOF
# giftd's tests/ops/slurm_test.sh: a one-machine cluster, state in $work
ClusterName=gifttest
SlurmctldHost=$cpu_node(127.0.0.1)
SlurmctldPort=$port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$sock
CredType=cred/munge
StateSaveLocation=$work/ctld
SlurmdSpoolDir=$work/spool/%n
SlurmctldPidFile=$work/run/slurmctld.pid
SlurmdPidFile=$work/run/slurmd-%n.pid
SlurmctldLogFile=$work/log/slurmctld.log
SlurmdLogFile=$work/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# A container: no cgroups.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# Heterogeneous jobs start only from the backfill scheduler: every second.
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
ReturnToService=2
KillWait=10
MinJobAge=600
GresTypes=gpu
NodeName=$cpu_node NodeHostname=$cpu_node NodeAddr=127.0.0.1 Port=$((port + 1)) $hw State=UNKNOWN
NodeName=$gpu_node NodeHostname=$cpu_node NodeAddr=127.0.0.1 Port=$((port + 2)) $hw Gres=gpu:2 State=UNKNOWN
PartitionName=cpu Nodes=$cpu_node Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=$gpu_node MaxTime=INFINITE State=UP
EOF
echo "NodeName=$gpu_node Name=gpu File=$work/dev/gpu[0-1]" >"$work/gres.conf"

slurmctld -D -i >"$work/log/slurmctld.stderr" 2>&1 &
daemons+=($!)
slurmd -D -N "$cpu_node" >"$work/log/slurmd-cpu.stderr" 2>&1 &
daemons+=($!)
slurmd -D -N "$gpu_node" >"$work/log/slurmd-gpu.stderr" 2>&1 &
daemons+=($!)
idle() { [[ $(sinfo -h -N -o '%N %t' 2>/dev/null | awk '$2 == "idle"' | wc -l) -eq 2 ]]; }
for _ in $(seq 1 150); do
    idle && break
    for p in "${daemons[@]}"; do kill -0 "$p" 2>/dev/null || break 2; done
    sleep 0.2
done
if ! idle; then
    sinfo -N >&2 2>&1 || true
    logs
    skip "slurmctld and two slurmd cannot start here, or the nodes are not idle within 30 s (logs above)"
fi
say "Slurm $(sinfo -V | awk '{ print $2 }'): slurmctld on port $port, nodes $cpu_node (cpu) and $gpu_node (gpu, 2 GPUs), $cpus CPUs and $mem MB each"

# --- the jobs ------------------------------------------------------------------
while IFS= read -r var; do unset "$var"; done < <(compgen -e | grep -E '^(GIFTD_|GIFT_|SLURM_|SBATCH_|SRUN_)' | grep -vx SLURM_CONF || true)
unset RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT
export SLURM_CONF OPENBLAS_NUM_THREADS=1
# What README.md tells a site to set: counts and sizes on sbatch's command
# line (component 0 : component 1), the variables in its environment.
# The workers run `python3` from PATH: Debian's, which has torch.
mkdir -p "$work/bin"
printf '#!/bin/sh\nexec %s "$@"\n' "$py" >"$work/bin/python3"
chmod +x "$work/bin/python3"
export PATH=$work/bin:$PATH
export GIFT_BIN=$bin SHARDS_PER_NODE=2 GPUS_PER_NODE=2 SHARD_BIND=127.0.0.1
tiny="--dim 32 --layers 1 --heads 2 --seq 32 --batch 4 --warmup 2 --val-batches 1"
# Cases 1 and 2 train the same: case 2's stopped and resumed run must give
# case 1's losses. f32: no error feedback, whose residuals a resume loses.
steps=300
train="$tiny --comm f32 --steps $steps --val-every 10"
job_opts=(--parsable --output="$work/jobs/job-%j.out"
          --nodes=1 --cpus-per-task=1 --mem=1G :
          --nodes=1 --cpus-per-task=1 --gpus-per-node=2)

# submit VAR=VALUE...: sbatch of the example from the source tree (the
# script's SRC is the submit folder); prints the job id.
submit() {
    (cd "$src" && env "$@" sbatch "${job_opts[@]}" examples/slurm/giftd-hetjob.sbatch)
}

# states JOB: "STATE EXITCODE" of each component, one line each.
states() {
    scontrol show job "$1" 2>/dev/null | tr ' ' '\n' | awk -F= '
        $1 == "JobState" { s = $2 } $1 == "ExitCode" { print s, $2 }'
}

# wait_job JOB: until every component has ended, JOB_WAIT_S at most.
wait_job() {
    local deadline=$((SECONDS + JOB_WAIT_S)) st
    while ((SECONDS < deadline)); do
        st=$(states "$1")
        [[ -n $st ]] && ! grep -qE '^(PENDING|RUNNING|CONFIGURING|COMPLETING|SUSPENDED|REQUEUED|RESIZING|SIGNALING|STAGE_OUT)' <<<"$st" && return 0
        sleep 1
    done
    scontrol show job "$1" >&2
    fail "job $1 has not ended within $JOB_WAIT_S s"
}

out_of() { echo "$work/jobs/job-$1.out"; }
has() { grep -qF -- "$2" "$(out_of "$1")" || fail "job $1's output lacks '$2'"; }
# drained JOB: both shards of JOB got SIGTERM (not SIGKILL), wrote a
# checkpoint after it and stopped.
drained() {
    local s
    for s in 0 1; do
        sed -n "/shard=$s SIGTERM: finishing in-flight replies/,\$p" "$(out_of "$1")" >"$work/after-term"
        [[ -s $work/after-term ]] || fail "job $1: shard $s got no SIGTERM"
        grep -q "shard=$s checkpoint [0-9]* written" "$work/after-term" || fail "job $1: shard $s wrote no checkpoint after its SIGTERM"
        grep -q "shard=$s stopped" "$work/after-term" || fail "job $1: shard $s did not stop after its SIGTERM"
    done
    ! grep -qE 'task [0-9]+: Killed' "$(out_of "$1")" || fail "job $1: a step's task was killed: $(grep -E 'task [0-9]+: Killed' "$(out_of "$1")")"
}

# free ports for the shards: 2 shards, each a protocol and an HTTP port
shard_port() { free_base_port 4; }

# --- case 1: the example job, $steps steps ---------------------------------------
t=$SECONDS
p1=$(shard_port)
j1=$(submit BASE_PORT="$p1" GIFT_RUN_DIR="$work/run1" GIFTD_CHECKPOINT_STEPS=5 \
    GIFT_TRAIN_ARGS="$train --out $work/out1") || fail "sbatch (case 1)"
j1=${j1%%;*}
say "case 1: job $j1 submitted"
wait_job "$j1"
st=$(states "$j1")
[[ $st == $'COMPLETED 0:0\nCOMPLETED 0:0' ]] || fail "case 1: job $j1 ended '$(tr '\n' ' ' <<<"$st")', not COMPLETED 0:0 for both components"
for want in "giftd: 2 shards ($cpu_node:$p1,$cpu_node:$((p1 + 2))), 2 workers on $gpu_node" \
    "giftrun: run slurm-$j1: shards shard0 on 127.0.0.1:$p1, shard1 on 127.0.0.1:$((p1 + 2)) ready" \
    "giftrun: run slurm-$j1: 2 workers (ranks 0..1 of 2)" "[worker0] step $(printf %5d "$steps") " \
    'giftrun: done: 2 workers exited 0'; do
    has "$j1" "$want"
done
drained "$j1"
t1=$((SECONDS - t))
say "case 1: job $j1 COMPLETED 0:0 (both components) in $t1 s: shards ready, 2 workers through step $steps, shards drained"

# --- case 2: TERM to the batch script mid-run, then a job that resumes ------------
t=$SECONDS
p2=$(shard_port)
run_id=slurm-test-$$
wck=$work/run2/workers   # the workers' checkpoints, beside the shards'
j2=$(submit BASE_PORT="$p2" GIFT_RUN_DIR="$work/run2" GIFT_RUN_ID="$run_id" GIFTD_CHECKPOINT_STEPS=5 \
    GIFT_TRAIN_ARGS="$train --out $work/out2 --checkpoint $wck") || fail "sbatch (case 2)"
j2=${j2%%;*}
say "case 2: job $j2 submitted (run $run_id, $steps steps, worker checkpoints in $wck)"
deadline=$((SECONDS + JOB_WAIT_S))
until grep -q '^\[worker0\] step    20 ' "$(out_of "$j2")" 2>/dev/null; do
    ((SECONDS < deadline)) || fail "case 2: job $j2's workers not at step 20 within $JOB_WAIT_S s"
    states "$j2" | grep -qE '^(PENDING|RUNNING|CONFIGURING)' || fail "case 2: job $j2 ended early: $(states "$j2" | tr '\n' ' ')"
    sleep 0.5
done
# What --signal=B:TERM@120 sends before the time limit: TERM to the batch script.
scancel --batch --signal=TERM "$j2" || fail "scancel --batch --signal=TERM $j2"
wait_job "$j2"
st=$(states "$j2")
has "$j2" 'giftd: terminating, draining the shards'
drained "$j2"
for r in 0 1; do has "$j2" "[worker$r] train_llama: rank $r: SIGTERM: "; done
grep -q 'giftrun: done: 2 workers exited 0' "$(out_of "$j2")" && fail "case 2: job $j2's workers ran to the end: the TERM came too late"
ckpt=$(grep -F '[shard0]' "$(out_of "$j2")" | sed -n 's/.*checkpoint \([0-9]*\) written: .*oldest unfinished step \([0-9]*\).*/\1 \2/p' | tail -n 1)
[[ -n $ckpt ]] || fail "case 2: shard 0 wrote no checkpoint"
[[ ${ckpt#* } -ge 20 ]] || fail "case 2: shard 0's last checkpoint holds step ${ckpt#* }, not 20 or more"
say "case 2: job $j2: scancel --batch --signal=TERM at step 20+: the shards drained, shard 0's checkpoint ${ckpt% *} at step ${ckpt#* }; job ended $(tr '\n' ' ' <<<"$st")"

# The same run id, run folder and training again: the shards restore what
# they wrote, the workers what they saved, and the training goes on.
j3=$(submit BASE_PORT="$p2" GIFT_RUN_DIR="$work/run2" GIFT_RUN_ID="$run_id" GIFTD_CHECKPOINT_STEPS=5 \
    GIFT_TRAIN_ARGS="$train --out $work/out3 --checkpoint $wck") || fail "sbatch (case 2, resume)"
j3=${j3%%;*}
say "case 2: job $j3 submitted (run $run_id again, the same GIFT_RUN_DIR and training)"
wait_job "$j3"
st=$(states "$j3")
[[ $st == $'COMPLETED 0:0\nCOMPLETED 0:0' ]] || fail "case 2: job $j3 ended '$(tr '\n' ' ' <<<"$st")', not COMPLETED 0:0 for both components"
for s in 0 1; do
    has "$j3" "shard=$s restored from $work/run2/shard-$s: checkpoint found"
done
grep -F "shard=0 restored from $work/run2/shard-0: checkpoint found" "$(out_of "$j3")" |
    grep -q "oldest unfinished step ${ckpt#* }\$" ||
    fail "case 2: job $j3's shard 0 did not restore step ${ckpt#* }: $(grep -F 'shard=0 restored' "$(out_of "$j3")")"
# A worker resumes at most 2 steps behind the shards (they keep the mean of
# their last two finished steps) and never ahead of them.
resumed=()
for r in 0 1; do
    n=$(sed -n "s/^\[worker$r\] train_llama: rank $r resumed from step \([0-9]*\) .*/\1/p" "$(out_of "$j3")")
    [[ -n $n ]] || fail "case 2: job $j3's worker $r did not resume from its checkpoint"
    ((n <= ${ckpt#* } && n + 2 >= ${ckpt#* })) ||
        fail "case 2: job $j3's worker $r resumed from step $n; shard 0 restored step ${ckpt#* }"
    resumed+=("$n")
done
for want in "giftrun: run $run_id: 2 workers (ranks 0..1 of 2)" \
    "[worker0] step $(printf %5d "$steps") " 'giftrun: done: 2 workers exited 0'; do
    has "$j3" "$want"
done
! grep -q "step outside the shard's window" "$(out_of "$j3")" || fail "case 2: job $j3: a push outside the shard's window"
drained "$j3"
# Exact: every loss of the stopped and the resumed job is case 1's at that
# step, and the resumed job's rows run on to the last step.
awk -F, -v last="$steps" -v first=$((resumed[0] + 1)) '
    FNR == 1 { f++; next }
    f == 1 { ref[$1] = $2 "," $3; next }
    !($1 in ref) || ref[$1] != $2 "," $3 { print FILENAME ": step " $1 ": " $2 "," $3 " where case 1 has " ref[$1]; bad = 1 }
    f == 3 { n++; if (n == 1 && $1 > first + 1) { print FILENAME " starts at step " $1; bad = 1 } end = $1 }
    END { if (end != last) { print "the resumed job ends at step " end ", not " last; bad = 1 }
          exit bad }' "$work/out1/log.csv" "$work/out2/log.csv" "$work/out3/log.csv" >"$work/cmp" ||
    fail "case 2: the stopped and resumed run differs from case 1: $(head -n 5 "$work/cmp")"
t2=$((SECONDS - t))
say "case 2: job $j3: both shards restored their checkpoints (shard 0 at step ${ckpt#* }), the workers resumed from steps ${resumed[*]} and trained to step $steps with case 1's losses; COMPLETED 0:0 ($t2 s for case 2)"

say "ok in $((SECONDS - t_start)) s"
