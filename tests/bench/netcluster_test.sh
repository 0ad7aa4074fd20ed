#!/usr/bin/env bash
# netcluster_test.sh REPO BUILD: bench/netcluster/cluster.sh end to end, small.
#
#   1. 2 worker hosts + 1 server host, 5 steps of f32 and of fp8 through giftd
#      on a shaped link: both finish, eth0's counters in worker 0's namespace
#      agree with giftd's byte accounting within 5%, and nothing is left
#      behind (namespace, host-side veth, qdisc, process).
#   2. The harness killed with SIGKILL mid-run: its watchdog removes it all.
#   3. Harness and watchdog both killed: `cluster.sh --clean` (what every
#      start runs first) removes the leftovers.
#
# Exits 77 (skipped) where namespaces cannot be made or /usr/bin/python3 has
# no torch.
set -euo pipefail
repo=${1:?usage: netcluster_test.sh REPO BUILD}
build=${2:?}
cl="$repo/bench/netcluster/cluster.sh"
t0=$SECONDS

skip() { echo "netcluster_test: SKIP: $*" >&2; exit 77; }
fail() { echo "netcluster_test: FAIL: $*" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || skip "needs root to create network namespaces"
command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1 || skip "iproute2 (ip, tc) not found"
/usr/bin/python3 -c 'import torch' 2>/dev/null || skip "/usr/bin/python3 has no torch"
probe=gnc$$probe
ip netns add "$probe" 2>/dev/null || skip "cannot create a network namespace"
ip netns del "$probe"

work=$(mktemp -d "${TMPDIR:-/tmp}/gnc-test-XXXXXX")
trap 'rm -rf "$work"' EXIT
model=(--dim 64 --layers 1 --heads 2 --seq 32 --batch 4 --warmup 1 --val-every 5 --val-batches 1)

# left_of TAG DIR: what is left of run TAG ("" when nothing).
left_of() {
    local tag=$1 dir=$2 p what=""
    ip netns list | awk '{print $1}' | grep -q "^$tag" && what+=" namespace"
    ip -o link show | awk -F': ' '{print $2}' | grep -q "^$tag" && what+=" veth"
    tc qdisc show 2>/dev/null | grep -q "$tag" && what+=" qdisc"
    if [[ -s $dir/pids ]]; then
        while read -r _ p; do kill -0 "$p" 2>/dev/null && what+=" process:$p"; done <"$dir/pids"
    fi
    for p in ${3:-}; do kill -0 "$p" 2>/dev/null && what+=" process:$p"; done
    echo "$what"
}

# wait_gone TAG DIR [PIDS]: up to 10 s for everything of TAG to go.
wait_gone() {
    local left
    for _ in $(seq 1 100); do
        left=$(left_of "$@")
        [[ -z $left ]] && return 0
        sleep 0.1
    done
    echo "$left"
}

# --- 1. Normal runs --------------------------------------------------------
for arm in f32 fp8; do
    d="$work/$arm"
    "$cl" --arm "$arm" --out "$d" --build "$build" --workers 2 --servers 1 --steps 5 \
        --rate 200 --delay 0.25 -- "${model[@]}" >"$work/$arm.log" 2>&1 &
    pid=$!
    wait "$pid" || { cat "$work/$arm.log" >&2; fail "$arm: cluster.sh exited $?"; }
    [[ -s $d/summary.json && -s $d/cluster.json ]] || fail "$arm: no summary.json or cluster.json"
    left=$(wait_gone "gnc$pid" "$d")
    [[ -z $left ]] || fail "$arm: left behind after a normal end:$left"
    # Steps 2..5 (the first carries connection set-up): counters vs accounting.
    /usr/bin/python3 - "$d/log.csv" "$arm" <<'EOF' || fail "$arm: byte counts disagree"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))[1:]
nd = sum(int(r["netdev_bytes"]) for r in rows)
gw = sum(int(r["wire_bytes"]) for r in rows)
print(f"netcluster_test: {sys.argv[2]}: {len(rows)} steps, eth0 {nd} B, giftd {gw} B "
      f"({nd / gw - 1:+.2%})")
sys.exit(0 if len(rows) == 4 and gw > 0 and abs(nd / gw - 1) <= 0.05 else 1)
EOF
done

# start_long DIR: a long f32 run in the background; once both workers have
# started, sets $pid (the harness) and $inside (every process in its namespaces).
start_long() {
    local d=$1 ns
    "$cl" --arm f32 --out "$d" --build "$build" --workers 2 --servers 1 --steps 100000 \
        --rate 200 -- "${model[@]}" >"$d.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 300); do
        [[ $(grep -c '^worker ' "$d/pids" 2>/dev/null) == 2 ]] && break
        sleep 0.1
    done
    [[ $(grep -c '^worker ' "$d/pids" 2>/dev/null) == 2 ]] || fail "the run in $d did not start its workers"
    sleep 1
    inside=$(for ns in $(ip netns list | awk '{print $1}' | grep "^gnc$pid"); do ip netns pids "$ns"; done)
    [[ -n $inside ]] || fail "no process in the namespaces of run $pid"
}

# --- 2. SIGKILL of the harness ---------------------------------------------
d="$work/killed"
start_long "$d"
kill -KILL "$pid"
wait "$pid" 2>/dev/null || true
left=$(wait_gone "gnc$pid" "$d" "$inside")
[[ -z $left ]] || fail "left behind after SIGKILL of the harness:$left"
echo "netcluster_test: SIGKILL of the harness: its watchdog removed everything"

# --- 3. Harness and watchdog killed: the next start cleans up --------------
d="$work/orphan"
start_long "$d"
kill -KILL "$(awk '$1 == "watchdog" {print $2}' "$d/pids")" "$pid"
wait "$pid" 2>/dev/null || true
sleep 0.5
[[ -n $(left_of "gnc$pid" "$d" "$inside") ]] || fail "nothing was left to clean (the test is wrong)"
"$cl" --clean 2>&1 | sed 's/^/netcluster_test: /'
left=$(wait_gone "gnc$pid" "$d" "$inside")
[[ -z $left ]] || fail "left behind after cluster.sh --clean:$left"
echo "netcluster_test: ok ($((SECONDS - t0)) s)"
