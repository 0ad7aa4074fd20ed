#!/usr/bin/env bash
# bench/netcluster/cluster.sh: one training run (one "piece") of
# examples/train_llama.py on a small cluster of network namespaces that this
# script builds on this machine, then removes.
#
#   cluster.sh --arm ARM --out DIR [--workers W] [--servers S] [--colocated]
#              [--rate MBIT] [--delay MS] [--egress fair|fifo] [--mtu BYTES]
#              [--seed N] [--steps N] [--max-seconds T] [--build DIR]
#              [-- train_llama args...]
#   cluster.sh --clean        remove what killed runs left behind, and exit
#   cluster.sh --check        exit 0 where namespaces can be made, else 77
#
# The cluster: W worker hosts (w0..) and S server hosts (s0..), one network
# namespace each, every host's eth0 a veth to one bridge (in a namespace of
# its own), addresses 10.213.0.20+r (workers) and 10.213.0.10+i (servers).
# Each host's egress is shaped to --rate Mbit/s, every packet delayed by
# --delay ms (one way, a netem leaf). Defaults: 1000 Mbit/s, 0.25 ms, a plain
# gigabit link between racks; bench/netcluster/run.sh calibrates the two
# settings it measures from a compute-only step. --egress fair (the default)
# shares the rate among the destinations a host is sending to, as a host's
# fair-queuing qdisc (fq, fq_codel) or a multi-queue NIC does: an htb of the
# rate with one class per peer host (u32 on the destination address), each
# guaranteed rate/peers and allowed the whole rate, with 500 ms of queue.
# --egress fifo is one tbf of the rate with one 500 ms FIFO: whichever
# socket wrote first leaves first, so a worker's pushes to one shard can
# wait behind its pushes to another (the bufferbloated host; measured in
# RESULTS, time to quality).
# --rate 0 leaves the links unshaped. --mtu (default 9000, the jumbo frames
# of a cluster fabric) keeps the headers near 1% of the bytes. A kernel without sch_netem gets the
# rate alone (said on stderr; cluster.json records delay_ms_applied 0).
#
# ARM: a --comm of train_llama.py: f32 bf16 fp8 fp8-gift nvfp4 nvfp4-gift go
# through giftd (S shards on the S server hosts, or with --colocated on the
# worker hosts, shard i beside worker i mod W); ddp-allreduce ddp-fp16
# ddp-powersgd none are PyTorch's own (no shards; --servers ignored).
# Every worker reads its eth0 counters around each step (--netdev eth0).
#
# DIR receives log.csv and summary.json (rank 0), worker-R.log, giftd-I.log,
# pids (role and process id of everything it started) and cluster.json: the topology, the link, the shards' CPU seconds, each
# host's eth0 byte counters over the whole run. A run is bounded by --steps
# and by --max-seconds (default 1800) of wall time.
#
# Teardown: on exit, error, Ctrl-C or TERM a trap kills every process in the
# cluster's namespaces and deletes them; a watchdog process does the same if
# this script is killed with SIGKILL; and every start first removes what
# runs that are no longer alive left behind. Names start with gnc<pid of
# the run>. Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN): without it, or
# without `ip`/`tc`, it says so and exits 77.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
prefix=gnc

# gnc_clean_tag TAG: kill every process in TAG's namespaces, delete them and
# any host-side veth whose name starts with TAG.
gnc_clean_tag() {
    local tag=$1 ns p l left
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${tag}[a-z]" || true); do
        for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
    done
    for _ in $(seq 1 50); do
        left=0
        for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${tag}[a-z]" || true); do
            [[ -n $(ip netns pids "$ns" 2>/dev/null) ]] && left=1
        done
        [[ $left == 0 ]] && break
        sleep 0.1
    done
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${tag}[a-z]" || true); do
        ip netns del "$ns" 2>/dev/null || true
    done
    for l in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' |
               grep -E "^${tag}[a-z]" || true); do
        ip link del "$l" 2>/dev/null || true
    done
}

# gnc_clean_dead: clean every gnc<pid> tag whose run is no longer alive.
gnc_clean_dead() {
    local pids p
    pids=$( { ip netns list 2>/dev/null | awk '{print $1}'
              ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//'; } |
            sed -n "s/^${prefix}\([0-9][0-9]*\)[a-z].*/\1/p" | sort -u)
    for p in $pids; do
        if ! kill -0 "$p" 2>/dev/null; then
            echo "netcluster: removing what run $p left behind" >&2
            gnc_clean_tag "$prefix$p"
        fi
    done
}

skip() { echo "netcluster: SKIP: $*" >&2; exit 77; }
need_privilege() {
    [[ $(id -u) -eq 0 ]] || skip "needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) to create network namespaces"
    command -v ip >/dev/null 2>&1 || skip "iproute2 (ip) not found; scripts/deps.sh installs it"
    command -v tc >/dev/null 2>&1 || skip "tc (iproute2) not found; scripts/deps.sh installs it"
}

# The watchdog: `cluster.sh --reap PID TAG` waits for PID to end, then cleans TAG.
if [[ ${1:-} == --reap ]]; then
    while kill -0 "$2" 2>/dev/null; do sleep 0.2; done
    gnc_clean_tag "$3"
    exit 0
fi
if [[ ${1:-} == --check ]]; then
    need_privilege
    probe=$prefix$$probe
    ip netns add "$probe" 2>/dev/null || skip "cannot create a network namespace here"
    ip netns del "$probe"
    exit 0
fi
if [[ ${1:-} == --clean ]]; then
    need_privilege
    gnc_clean_dead
    exit 0
fi

arm="" out="" workers=2 servers=2 colocated=0 rate=1000 delay=0.25 egress=fair seed=1 steps=300
mtu=9000 max_seconds=1800 build="$repo/build" py=/usr/bin/python3 extra=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --arm) arm=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --workers) workers=$2; shift 2 ;;
        --servers) servers=$2; shift 2 ;;
        --colocated) colocated=1; shift ;;
        --rate) rate=$2; shift 2 ;;
        --delay) delay=$2; shift 2 ;;
        --egress) egress=$2; shift 2 ;;
        --mtu) mtu=$2; shift 2 ;;
        --seed) seed=$2; shift 2 ;;
        --steps) steps=$2; shift 2 ;;
        --max-seconds) max_seconds=$2; shift 2 ;;
        --build) build=$2; shift 2 ;;
        --) shift; extra=("$@"); break ;;
        -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
        *) echo "netcluster: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
[[ -n $arm && -n $out ]] || { echo "netcluster: --arm and --out are required (see --help)" >&2; exit 2; }
case "$arm" in
    f32|bf16|fp8|fp8-gift|nvfp4|nvfp4-gift) giftd_arm=1 ;;
    ddp-allreduce|ddp-fp16|ddp-powersgd|none) giftd_arm=0 ;;
    *) echo "netcluster: unknown --arm $arm" >&2; exit 2 ;;
esac
[[ $egress == fair || $egress == fifo ]] ||
    { echo "netcluster: --egress fair or fifo, not '$egress'" >&2; exit 2; }
((workers >= 1 && workers <= 8 && servers >= 1 && servers <= 8)) ||
    { echo "netcluster: 1..8 workers and servers" >&2; exit 2; }
giftd="$build/server/giftd"
lib="$build/client/libgiftclient.so.0"
[[ -x $giftd && -e $lib ]] || { echo "netcluster: build first ($giftd, $lib)" >&2; exit 1; }
case "$lib" in /*) ;; *) lib="$(pwd)/$lib" ;; esac
need_privilege
mkdir -p "$out"
out=$(cd "$out" && pwd)

tag=$prefix$$
ns_sw=${tag}sw
t_start=$(date +%s.%N)
gnc_clean_dead

cleanup() {
    local rc=$?
    set +e
    trap - EXIT INT TERM
    gnc_clean_tag "$tag"
    [[ -n ${reaper:-} ]] && kill "$reaper" 2>/dev/null
    if [[ $rc -ne 0 && $rc -ne 77 ]]; then
        for f in "$out"/worker-0.log "$out"/giftd-*.log; do
            [[ -s $f ]] && { echo "--- $f ---" >&2; tail -n 8 "$f" >&2; }
        done
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
fail() { echo "netcluster: FAIL: $*" >&2; exit 1; }

# The watchdog survives a SIGKILL of this script (its own session).
setsid "$0" --reap $$ "$tag" </dev/null >/dev/null 2>&1 &
reaper=$!
echo "harness $$" >"$out/pids"
echo "watchdog $reaper" >>"$out/pids"

# --- The network -----------------------------------------------------------
# leaf NS PARENT HANDLE: the queue under PARENT: netem with --delay (where the
# kernel has sch_netem; else said once, and the rate alone), or a FIFO of
# 500 ms at the rate.
leaf() {
    local ns=$1 parent=$2 handle=$3 q=$(( rate * 1000000 / 8 / 2 ))
    if [[ $delay != 0 && $delay_applied != none ]]; then
        if ip netns exec "$ns" tc qdisc add dev eth0 parent "$parent" handle "$handle" netem \
                delay "${delay}ms" limit 100000 2>"$out/netem.err"; then
            delay_applied=$delay
            rm -f "$out/netem.err"
            return
        fi
        # This kernel may lack sch_netem (CONFIG_NET_SCH_NETEM): rate only.
        echo "netcluster: no delay: tc netem failed ($(head -n 1 "$out/netem.err"));" \
             "the links are shaped by rate only" >&2
        delay_applied=none
        rm -f "$out/netem.err"
    fi
    [[ $egress == fifo ]] && return # tbf's own queue
    ip netns exec "$ns" tc qdisc add dev eth0 parent "$parent" handle "$handle" bfifo \
        limit $(( q > 4 * mtu ? q : 4 * mtu ))
}

# shape NS HOST: HOST's egress at --rate (see the header for fair and fifo).
shape() {
    local ns=$1 me=$2 burst peers=() p i=10
    # burst: at least one rate-millisecond and 64 KiB (a GSO segment).
    burst=$(( rate * 1000 / 8 / 1000 > 65536 ? rate * 1000 / 8 / 1000 : 65536 ))
    if [[ $egress == fifo ]]; then
        ip netns exec "$ns" tc qdisc add dev eth0 root handle 1: tbf rate "${rate}mbit" \
            burst "$burst" latency 500ms
        leaf "$ns" 1:1 10:
        return
    fi
    for p in "${hosts[@]}"; do [[ $p != "$me" ]] && peers+=("$p"); done
    if ! ip netns exec "$ns" tc qdisc add dev eth0 root handle 1: htb default 9 2>"$out/tc.err" ||
       ! ip netns exec "$ns" tc filter add dev eth0 parent 1: protocol ip prio 9 u32 \
           match ip dst 255.255.255.255/32 flowid 1:9 2>>"$out/tc.err"; then
        # No sch_htb or cls_u32 here: one FIFO, said, and recorded in cluster.json.
        echo "netcluster: --egress fair needs htb and the u32 classifier" \
             "($(head -n 1 "$out/tc.err")); using one FIFO per host" >&2
        ip netns exec "$ns" tc qdisc del dev eth0 root 2>/dev/null || true
        rm -f "$out/tc.err"
        egress=fifo
        shape "$ns" "$me"
        return
    fi
    rm -f "$out/tc.err"
    ip netns exec "$ns" tc class add dev eth0 parent 1: classid 1:1 htb rate "${rate}mbit" \
        ceil "${rate}mbit" burst "$burst" cburst "$burst" quantum $(( mtu + 64 ))
    # 1:9: what has no peer's address (ARP); small, and may borrow the rest.
    ip netns exec "$ns" tc class add dev eth0 parent 1:1 classid 1:9 htb \
        rate "$(( rate * 10 > 1 ? rate * 10 : 1 ))kbit" ceil "${rate}mbit" burst "$burst" \
        cburst "$burst" quantum $(( mtu + 64 ))
    leaf "$ns" 1:9 9:
    for p in "${peers[@]}"; do
        ip netns exec "$ns" tc class add dev eth0 parent 1:1 classid "1:$i" htb \
            rate "$(( rate * 990 / ${#peers[@]} > 1 ? rate * 990 / ${#peers[@]} : 1 ))kbit" \
            ceil "${rate}mbit" burst "$burst" cburst "$burst" quantum $(( mtu + 64 ))
        leaf "$ns" "1:$i" "$i:"
        ip netns exec "$ns" tc filter add dev eth0 parent 1: protocol ip prio 1 u32 \
            match ip dst "${addr[$p]}/32" flowid "1:$i"
        i=$((i + 1))
    done
}
hosts=()
delay_applied=0
declare -A addr=()
for ((r = 0; r < workers; r++)); do hosts+=("w$r"); addr[w$r]=10.213.0.$((20 + r)); done
if [[ $giftd_arm == 1 && $colocated == 0 ]]; then
    for ((i = 0; i < servers; i++)); do hosts+=("s$i"); addr[s$i]=10.213.0.$((10 + i)); done
fi
ip netns add "$ns_sw" 2>"$out/netns.err" ||
    skip "cannot create a network namespace: $(cat "$out/netns.err")"
rm -f "$out/netns.err"
ip -n "$ns_sw" link set lo up
ip -n "$ns_sw" link add br0 type bridge
ip -n "$ns_sw" link set br0 mtu "$mtu" up
for h in "${hosts[@]}"; do
    ns=$tag$h
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip link add "${tag}a$h" type veth peer name "${tag}b$h"
    ip link set "${tag}a$h" netns "$ns"
    ip link set "${tag}b$h" netns "$ns_sw"
    ip -n "$ns" link set "${tag}a$h" name eth0
    ip -n "$ns" addr add "${addr[$h]}/24" dev eth0
    ip -n "$ns" link set eth0 mtu "$mtu" up
    ip -n "$ns_sw" link set "${tag}b$h" mtu "$mtu"
    ip -n "$ns_sw" link set "${tag}b$h" master br0
    ip -n "$ns_sw" link set "${tag}b$h" up
done
# The shaping, once every host's address is known.
for h in "${hosts[@]}"; do
    [[ $rate != 0 ]] && shape "$tag$h" "$h"
done

counters() { # counters HOST: "tx rx" of its eth0
    ip netns exec "$tag$1" cat /sys/class/net/eth0/statistics/tx_bytes \
        /sys/class/net/eth0/statistics/rx_bytes | tr '\n' ' '
}
declare -A c0=()
for h in "${hosts[@]}"; do c0[$h]=$(counters "$h"); done

scrub=$(compgen -e | grep -E '^(GIFTD_|GIFT_|RANK$|WORLD_SIZE$|MASTER_)' | sed 's/^/-u /' | tr '\n' ' ' || true)
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1

# --- The shards ------------------------------------------------------------
shard_pids=()
gift_servers=""
if [[ $giftd_arm == 1 ]]; then
    for ((i = 0; i < servers; i++)); do
        if [[ $colocated == 1 ]]; then h=w$((i % workers)); port=$((7070 + i)); else h=s$i; port=7070; fi
        : >"$out/giftd-$i.ready"
        # shellcheck disable=SC2086
        ip netns exec "$tag$h" env $scrub "$giftd" --bind "${addr[$h]}" --port "$port" \
            --http-port -1 --shard-id "$i" --num-shards "$servers" --world-size "$workers" \
            --log-level warn >"$out/giftd-$i.ready" 2>"$out/giftd-$i.log" &
        shard_pids+=($!)
        echo "shard $!" >>"$out/pids"
        gift_servers="${gift_servers:+$gift_servers,}${addr[$h]}:$port"
    done
    for ((i = 0; i < servers; i++)); do
        for _ in $(seq 1 100); do grep -q '^giftd ready' "$out/giftd-$i.ready" && break; sleep 0.1; done
        grep -q '^giftd ready' "$out/giftd-$i.ready" || fail "shard $i did not start"
    done
fi

# --- The workers -----------------------------------------------------------
worker_pids=()
for ((r = workers - 1; r >= 0; r--)); do
    # shellcheck disable=SC2086
    ip netns exec "${tag}w$r" env $scrub GIFT_SERVERS="$gift_servers" GIFT_LIBRARY="$lib" \
        PYTHONPATH="$repo/python" RANK=$r WORLD_SIZE=$workers MASTER_ADDR="${addr[w0]}" \
        MASTER_PORT=29500 GLOO_SOCKET_IFNAME=eth0 \
        timeout -k 5 "$max_seconds" "$py" "$repo/examples/train_llama.py" --comm "$arm" \
        --seed "$seed" --steps "$steps" --netdev eth0 --out "$out" "${extra[@]}" \
        >"$out/worker-$r.log" 2>&1 &
    worker_pids+=($!)
    echo "worker $!" >>"$out/pids"
done
rc=0
for p in "${worker_pids[@]}"; do wait "$p" || rc=$?; done
[[ $rc == 0 ]] || fail "arm $arm: a worker exited $rc (see $out/worker-*.log)"

# The shards' CPU seconds (utime + stime), read before they are stopped.
hz=$(getconf CLK_TCK)
shard_cpu=()
for p in "${shard_pids[@]}"; do
    if [[ -r /proc/$p/stat ]]; then
        shard_cpu+=("$(awk -v hz="$hz" '{sub(/.*\) /, ""); printf "%.3f", ($12 + $13) / hz}' "/proc/$p/stat")")
    else
        shard_cpu+=(null)
    fi
done
for p in "${shard_pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
for p in "${shard_pids[@]}"; do wait "$p" 2>/dev/null || true; done

{
    printf '{"arm": "%s", "seed": %s, "workers": %s, "servers": %s, "colocated": %s,\n' \
        "$arm" "$seed" "$workers" "$([[ $giftd_arm == 1 ]] && echo "$servers" || echo 0)" \
        "$([[ $colocated == 1 ]] && echo true || echo false)"
    printf ' "mtu": %s, "rate_mbit": %s, "delay_ms": %s, "delay_ms_applied": %s, "egress": "%s", "steps": %s,\n' \
        "$mtu" "$rate" "$delay" "$([[ $delay_applied == none ]] && echo 0 || echo "$delay_applied")" "$egress" "$steps"
    printf ' "gift_servers": "%s",\n' "$gift_servers"
    printf ' "wall_s": %s, "date": "%s", "nproc": %s, "cpu": "%s",\n' \
        "$(awk -v a="$(date +%s.%N)" -v b="$t_start" 'BEGIN { printf "%.2f", a - b }')" "$(date -u +%FT%TZ)" "$(env -u OMP_NUM_THREADS nproc)" \
        "$(lscpu | sed -n 's/^Model name: *//p' | head -n 1)"
    printf ' "shard_cpu_s": [%s],\n' "$(IFS=,; echo "${shard_cpu[*]:-}")"
    printf ' "eth0_bytes": {'
    sep=""
    for h in "${hosts[@]}"; do
        read -r tx1 rx1 <<<"$(counters "$h")"
        read -r tx0 rx0 <<<"${c0[$h]}"
        printf '%s"%s": {"tx": %s, "rx": %s}' "$sep" "$h" $((tx1 - tx0)) $((rx1 - rx0))
        sep=", "
    done
    printf '}}\n'
} >"$out/cluster.json"
echo "netcluster: $arm seed $seed (${rate} Mbit/s, ${delay} ms): $(tail -n 1 "$out/worker-0.log")"
