#!/usr/bin/env bash
# netns_test.sh GIFTD GIFTCTL WORKER CONF: the compose topology (2 shards, 2
# workers) as real processes on four "hosts": network namespaces joined by
# veth pairs to a bridge in a fifth one, one address per host.
#
#   10.77.0.10 shard 0   10.77.0.11 shard 1   10.77.0.20 worker 0   10.77.0.21 worker 1
#
# Every shard runs `giftd --config CONF` (docker/giftd.conf, the file the
# compose services mount) with only GIFTD_SHARD_ID and the data folder set
# per host, and no authentication (GIFTD_AUTH_KEY_FILE=""; the key is the
# secret's business). The workers run tests/ops/gift_ops_worker, a
# deterministic training loop, and wait for `giftctl ping --ready` on both
# shards first, as compose's depends_on: service_healthy does.
#
# Run 1 trains undisturbed. Run 2, on fresh shards, cuts shard 1's link
# (`ip link set eth0 down` in its namespace) for CUT_S seconds in the
# middle, and (RESET=both, the default) drops both ends of the worker
# connections of shard 1 meanwhile, so the workers must reconnect and
# replay, not just wait for TCP to retransmit. The test checks that the run stalled while the
# link was down, that both workers reconnected and finished every step, and
# that they end with parameters bit-identical to run 1's (the hash the worker
# prints). STEPS, CUT_AT, CUT_S, SLEEP_MS and RESET may be set from outside.
#
# Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN): exits 77 (skipped), saying why,
# without it. The namespaces and every process are removed on any exit.
set -euo pipefail

giftd=${1:?usage: netns_test.sh GIFTD GIFTCTL WORKER CONF}
giftctl=${2:?}
worker=${3:?}
conf=${4:?}
STEPS=${STEPS:-300}
CUT_AT=${CUT_AT:-60}
CUT_S=${CUT_S:-3}
SLEEP_MS=${SLEEP_MS:-10}
RESET=${RESET:-both}

skip() { echo "netns_test: SKIP: $*" >&2; exit 77; }
[[ $(id -u) -eq 0 ]] || skip "needs root to create network namespaces"
command -v ip >/dev/null 2>&1 || skip "iproute2 (ip) not found"

tag=g$$
ns_sw=${tag}sw
hosts=(s0 s1 w0 w1)
declare -A addr=([s0]=10.77.0.10 [s1]=10.77.0.11 [w0]=10.77.0.20 [w1]=10.77.0.21)
work=$(mktemp -d "${TMPDIR:-/tmp}/giftd-netns-XXXXXX")
pids=()
made=()
t_start=$SECONDS

cleanup() {
    local rc=$?
    set +e
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
    for n in "${made[@]}"; do ip netns del "$n" 2>/dev/null; done
    if [[ $rc -ne 0 && $rc -ne 77 ]]; then
        for f in "$work"/*.log "$work"/*.out; do
            [[ -s $f ]] && { echo "--- ${f##*/} ---" >&2; tail -n 15 "$f" >&2; }
        done
    fi
    rm -rf "$work"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
fail() { echo "netns_test: FAIL: $*" >&2; exit 1; }

# --- The network ------------------------------------------------------------
ip netns add "$ns_sw" 2>"$work/netns.err" || skip "cannot create a network namespace: $(cat "$work/netns.err")"
made+=("$ns_sw")
ip -n "$ns_sw" link set lo up
ip -n "$ns_sw" link add br0 type bridge
ip -n "$ns_sw" link set br0 up
for h in "${hosts[@]}"; do
    ns=$tag$h
    ip netns add "$ns"
    made+=("$ns")
    ip -n "$ns" link set lo up
    # eth0 in the host's namespace, its peer on the bridge.
    ip link add "${tag}$h" type veth peer name "${tag}p$h"
    ip link set "${tag}$h" netns "$ns"
    ip link set "${tag}p$h" netns "$ns_sw"
    ip -n "$ns" link set "${tag}$h" name eth0
    ip -n "$ns" addr add "${addr[$h]}/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns_sw" link set "${tag}p$h" master br0
    ip -n "$ns_sw" link set "${tag}p$h" up
done

servers="${addr[s0]}:7070,${addr[s1]}:7070"
scrub=$(compgen -e | grep -E '^(GIFTD_|GIFT_)' | sed 's/^/-u /' | tr '\n' ' ' || true)

# start_shards RUN: giftd on s0 and s1 with fresh data folders.
start_shards() {
    local run=$1 i
    for i in 0 1; do
        mkdir -p "$work/data-$run-s$i"
        # shellcheck disable=SC2086
        ip netns exec "${tag}s$i" env $scrub GIFTD_SHARD_ID=$i \
            GIFTD_DATA_DIR="$work/data-$run-s$i" GIFTD_AUTH_KEY_FILE= \
            "$giftd" --config "$conf" >"$work/run$run-s$i.out" 2>"$work/run$run-s$i.log" &
        pids+=($!)
        eval "shard_pid_$i=$!"
    done
    # What depends_on: service_healthy waits for, seen from a worker host.
    for _ in $(seq 1 100); do
        ip netns exec "${tag}w0" "$giftctl" --servers "$servers" --timeout 1 ping --ready \
            >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    fail "the shards did not become ready, as seen from worker 0's host"
}

# stop_shards: SIGTERM, as docker stop / kubelet would.
stop_shards() {
    local i p
    for i in 0 1; do
        p=$(eval echo "\$shard_pid_$i")
        kill -TERM "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
}

# start_workers RUN
start_workers() {
    local run=$1 r
    for r in 0 1; do
        # shellcheck disable=SC2086
        ip netns exec "${tag}w$r" env $scrub GIFT_SERVERS="$servers" GIFT_RANK=$r GIFT_WORLD=2 \
            "$worker" --steps "$STEPS" --sleep-ms "$SLEEP_MS" --timeout-ms 30000 \
            >"$work/run$run-w$r.out" 2>"$work/run$run-w$r.log" &
        pids+=($!)
        eval "worker_pid_$r=$!"
    done
}

# wait_workers RUN: both exit 0 within 60 s; sets $result to their common result.
wait_workers() {
    local run=$1 r p
    for r in 0 1; do
        p=$(eval echo "\$worker_pid_$r")
        for _ in $(seq 1 600); do
            kill -0 "$p" 2>/dev/null || break
            sleep 0.1
        done
        kill -0 "$p" 2>/dev/null && fail "run $run: worker $r still running after 60 s"
        wait "$p" || fail "run $run: worker $r exited $?"
    done
    local a b
    a=$(grep '^result ' "$work/run$run-w0.out" | sed 's/ reconnects=.*//')
    b=$(grep '^result ' "$work/run$run-w1.out" | sed 's/ reconnects=.*//')
    [[ -n $a && $a == "$b" ]] || fail "run $run: the workers disagree: '$a' vs '$b'"
    result=$a
}

last_step() { # last_step FILE
    grep '^step ' "$1" 2>/dev/null | tail -n 1 | cut -d' ' -f2 || true
}

# --- Run 1: no fault -----------------------------------------------------
start_shards 1
start_workers 1
wait_workers 1
res1=$result
stop_shards
echo "netns_test: run 1 (no cut):  $res1 ($((SECONDS - t_start)) s so far)"

# --- Run 2: shard 1's link cut for CUT_S seconds ---------------------------
start_shards 2
start_workers 2
for _ in $(seq 1 300); do
    s=$(last_step "$work/run2-w0.out")
    [[ -n $s && $s -ge $CUT_AT ]] && break
    sleep 0.05
done
[[ -n ${s:-} && $s -ge $CUT_AT ]] || fail "run 2 did not reach step $CUT_AT"
ip -n "${tag}s1" link set eth0 down
before=$(last_step "$work/run2-w0.out")
# A link that comes back keeps its TCP connections, and the run just
# resumes. To make the workers reconnect and replay as well, RESET=both (the
# default) also drops both ends of every worker connection of shard 1 while
# the link is down, as a host whose network stack restarted would: the
# workers must reconnect (retrying until the link is back) and replay.
# RESET=shard drops only the shard's ends: a worker with nothing unsent to
# shard 1 then holds a half-open connection that only TCP keepalive or a
# heartbeat would expose. RESET=0: the cut alone.
reset_done=0
if [[ $RESET == both || $RESET == shard ]]; then
    if ip netns exec "${tag}s1" ss -K state established '( sport = :7070 )' >"$work/ss.out" 2>&1; then
        reset_done=1
    else
        # ss -K needs a kernel with CONFIG_INET_DIAG_DESTROY.
        echo "netns_test: ss -K failed ($(head -n 1 "$work/ss.out")); the cut alone is tested" >&2
    fi
fi
if [[ $RESET == both && $reset_done == 1 ]]; then
    for r in 0 1; do
        ip netns exec "${tag}w$r" ss -K state established "( dst ${addr[s1]}:7070 )" >"$work/ss.out" 2>&1 ||
            fail "ss -K (socket destroy) failed in worker $r's host: $(cat "$work/ss.out")"
    done
fi
sleep "$CUT_S"
after_cut=$(last_step "$work/run2-w0.out")
ip -n "${tag}s1" link set eth0 up
echo "netns_test: run 2: link of shard 1 down for ${CUT_S} s at step $before; step $after_cut when it came back"
# One step may finish on its way when the link goes; none after that.
((after_cut - before <= 1)) || fail "the run went on while shard 1 was cut off ($before -> $after_cut)"
wait_workers 2
res2=$result
stop_shards
echo "netns_test: run 2 (cut):     $res2"
grep -h '^result ' "$work/run2-w0.out" "$work/run2-w1.out" | sed 's/^/netns_test:   /'
[[ $(last_step "$work/run2-w0.out") -eq $((STEPS - 1)) ]] || fail "run 2 did not finish every step"
if [[ $RESET == both && $reset_done == 1 ]]; then
    for r in 0 1; do
        grep -Eq '^result .* reconnects=[1-9]' "$work/run2-w$r.out" ||
            fail "worker $r did not reconnect after shard 1 dropped its connection"
    done
fi
[[ $res1 == "$res2" ]] || fail "the run with the cut ended differently: '$res1' vs '$res2'"
echo "netns_test: ok: same parameters with and without the cut ($((SECONDS - t_start)) s)"
