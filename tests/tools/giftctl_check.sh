#!/usr/bin/env bash
# giftctl_check.sh GIFTD GIFTCTL WORKER: giftctl against a real giftd.
#
#  1. Before any worker: `giftctl status` says so and does not fix the
#     shard's world size (giftd_world_size stays 0).
#  2. A worker (tests/ops/gift_ops_worker) pushes step 0 as rank 0 of a world
#     of 2; rank 1 never comes. `giftctl status --json` parses and names rank
#     1 as missing for every tensor at step 0; the text form shows it too.
#  3. `giftctl stats --json`, `ping`, `ping --ready` answer; promtool accepts
#     a /metrics scrape taken in this state (tensors declared, a step
#     waiting), which tests/server/metrics_check.sh does not reach.
#  4. Exit codes: 2 for usage errors, 1 for a shard that does not answer;
#     a dead shard is named by its protocol port, with the --servers fix.
#  4b. Four dead shards (ports that accept and never answer, two of them
#     accepting at the application level too) beside the live one: status,
#     stats and ping ask all shards at once, so each takes less than two
#     --timeout in all (one shard after another: four or more), prints the
#     live shard's answer in its --servers place, names every dead one with
#     its error, and exits 1.
#  5. Against a shard with an auth_key_file: status without the key, or with
#     a wrong one, fails naming the reason; with the key it answers. (Skipped
#     with a note when this giftd cannot start with a key.)
# Exit 77 (skipped) when curl or python3 is missing; promtool is optional.
set -euo pipefail

giftd=${1:?usage: giftctl_check.sh GIFTD GIFTCTL WORKER}
giftctl=${2:?}
worker=${3:?}
py=/usr/bin/python3
for tool in curl "$py"; do
    command -v "$tool" >/dev/null 2>&1 || { echo "giftctl_check: $tool not found; skipping" >&2; exit 77; }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/giftctl-check-XXXXXX")
pids=()
cleanup() {
    local rc=$?
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    if [[ $rc -ne 0 && $rc -ne 77 ]]; then
        for f in giftd.log worker.out worker.err; do
            [[ -s $work/$f ]] && { echo "--- $f ---" >&2; tail -n 30 "$work/$f" >&2; }
        done
    fi
    rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "giftctl_check: FAIL: $*" >&2; exit 1; }

while IFS= read -r var; do unset "$var"; done < <(compgen -e | grep -E '^(GIFTD_|GIFT_)' || true)
unset RANK WORLD_SIZE

"$giftd" --bind 127.0.0.1 --port 0 --http-port 0 --world-size auto --data-dir "$work/data" \
    >"$work/ready" 2>"$work/giftd.log" &
pids+=($!)
port='' http_port=''
for _ in $(seq 1 200); do
    if read -r line <"$work/ready" 2>/dev/null && [[ $line == "giftd ready "* ]]; then
        port=$(sed -n 's/.* port=\([0-9]*\) .*/\1/p' <<<"$line")
        http_port=$(sed -n 's/.* http_port=\([0-9]*\)$/\1/p' <<<"$line")
        break
    fi
    sleep 0.05
done
[[ -n $port && -n $http_port ]] || fail "no ready line from giftd"
ctl=("$giftctl" --servers "127.0.0.1:$port" --http "127.0.0.1:$http_port" --timeout 5)

# 1. No worker yet.
out=$("${ctl[@]}" status) || fail "status before any worker exited $?"
grep -q "no worker has connected yet" <<<"$out" || fail "status before any worker: $out"
curl -sf "http://127.0.0.1:$http_port/metrics" | grep -qx 'giftd_world_size 0' ||
    fail "giftctl status changed the shard's world size"

# 2. Rank 0 of 2 pushes step 0; rank 1 is held back.
GIFT_SERVERS="127.0.0.1:$port" GIFT_RANK=0 GIFT_WORLD=2 \
    "$worker" --steps 1 --timeout-ms 60000 >"$work/worker.out" 2>"$work/worker.err" &
pids+=($!)
for _ in $(seq 1 200); do
    grep -q '^pushed 0$' "$work/worker.out" 2>/dev/null && break
    sleep 0.05
done
grep -q '^pushed 0$' "$work/worker.out" || fail "the worker did not push step 0"

"${ctl[@]}" --json status >"$work/status.json" || fail "status --json exited $?"
"$py" - "$work/status.json" <<'PY' || fail "status --json: $(cat "$work/status.json")"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["command"] == "status" and d["ok"] is True, d
(s,) = d["shards"]
assert s["world_size"] == 2, s
names = {t["name"]: t for t in s["tensors"]}
assert set(names) == {"embed", "mlp.down", "norm"}, names
for t in s["tensors"]:
    assert t["step"] == 0, t
    assert t["missing_ranks"] == [1], t
    assert t["bytes_in"] > 0, t
    assert isinstance(t["epoch"], int), t
    assert "codec" in t and "boundary_hit_rate" in t, t
print("status --json: rank 1 missing at step 0 on", len(names), "tensors")
PY
out=$("${ctl[@]}" status) || fail "status exited $?"
grep -Eq '^ +[0-9]+ +embed +0 +1 ' <<<"$out" || fail "text status does not show rank 1 missing: $out"

"${ctl[@]}" --json stats >"$work/stats.json" || fail "stats --json exited $?"
"$py" - "$work/stats.json" <<'PY' || fail "stats --json: $(cat "$work/stats.json")"
import json, sys
d = json.load(open(sys.argv[1]))
(s,) = d["shards"]
assert d["ok"] and s["shard_id"] == 0 and s["pushes"] >= 1 and s["tensors"] == 3, s
PY
# policy: the worker declared no geometry tensor, so no shard owns one.
"${ctl[@]}" --json policy >"$work/policy.json" || fail "policy --json exited $?"
"$py" -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["command"] == "policy" and d["ok"] and d["shards"][0]["tensors"] == [], d' "$work/policy.json" ||
    fail "policy --json: $(cat "$work/policy.json")"
out=$("${ctl[@]}" policy) || fail "policy exited $?"
[[ $out == *"0 geometry tensors owned here"* ]] || fail "text policy: $out"
"${ctl[@]}" ping >/dev/null || fail "ping exited $?"
"${ctl[@]}" ping --ready >/dev/null || fail "ping --ready exited $?"
"${ctl[@]}" --json ping | "$py" -c 'import json,sys; d=json.load(sys.stdin); assert d["ok"], d' ||
    fail "ping --json"
if command -v promtool >/dev/null 2>&1; then
    curl -sf "http://127.0.0.1:$http_port/metrics" >"$work/metrics.txt"
    grep -q '^giftd_tensor_missing_ranks{.*} 1$' "$work/metrics.txt" || fail "no missing rank in /metrics"
    promtool check metrics <"$work/metrics.txt" || fail "promtool check metrics"
else
    echo "giftctl_check: promtool not found; /metrics check skipped" >&2
fi

# 4. Exit codes.
set +e
"$giftctl" --bogus status >/dev/null 2>&1; [[ $? -eq 2 ]] || fail "unknown option: want exit 2"
"$giftctl" frobnicate >/dev/null 2>&1; [[ $? -eq 2 ]] || fail "unknown command: want exit 2"
"$giftctl" --servers 127.0.0.1:1 --timeout 2 ping >/dev/null 2>&1; [[ $? -eq 1 ]] || fail "dead shard ping: want exit 1"
"$giftctl" --servers 127.0.0.1:1 --timeout 2 --world 2 --json status >"$work/dead.json" 2>/dev/null; rc=$?
set -e
[[ $rc -eq 1 ]] || fail "dead shard status: want exit 1, got $rc"
"$py" -c 'import json,sys; d=json.load(open(sys.argv[1])); assert not d["ok"] and d["shards"][0]["error"]' "$work/dead.json" ||
    fail "dead shard status --json: $(cat "$work/dead.json")"
# A wrong --servers (no --world) names the shard's own port and the fix, not
# the HTTP port next to it or --world.
set +e
out=$("$giftctl" --servers 127.0.0.1:1 --timeout 2 status 2>&1)
set -e
[[ $out == *"127.0.0.1:1"*"refused"*"--servers"* && $out != *"127.0.0.1:2"* && $out != *"--world"* ]] ||
    fail "dead shard status names the wrong port or fix: $out"
# 4b. Dead shards beside the live one, asked at once. The helper listens on 8
# ports (a protocol and an HTTP port per dead shard), accepts on two of them
# and holds those connections without a byte, never accepts on the others
# (the kernel completes the handshake all the same), and exits after 60 s
# whatever happens.
"$py" - "$work/dead-ports" <<'PY' &
import os, select, signal, socket, sys
signal.alarm(60)
socks = []
for _ in range(8):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    socks.append(s)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(" ".join(str(s.getsockname()[1]) for s in socks) + "\n")
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
held, accepting = [], socks[:2]
while True:
    for s in select.select(accepting, [], [])[0]:
        held.append(s.accept()[0])
PY
pids+=($!)
for _ in $(seq 1 100); do [[ -s $work/dead-ports ]] && break; sleep 0.05; done
read -r -a dp <"$work/dead-ports" || fail "the dead-shard helper gave no ports"
[[ ${#dp[@]} -eq 8 ]] || fail "the dead-shard helper gave ${#dp[@]} ports"
to=3
servers="127.0.0.1:${dp[0]},127.0.0.1:${dp[1]},127.0.0.1:$port,127.0.0.1:${dp[2]},127.0.0.1:${dp[3]}"
https="127.0.0.1:${dp[4]},127.0.0.1:${dp[5]},127.0.0.1:$http_port,127.0.0.1:${dp[6]},127.0.0.1:${dp[7]}"
# dead_check ARGS...: giftctl ARGS against the five; exit 1 in under 2 x --timeout.
dead_check() {
    local t0 t1 rc ms
    t0=$(date +%s%N)
    set +e
    "$giftctl" --servers "$servers" --http "$https" --timeout "$to" "$@" >"$work/dead.out" 2>&1
    rc=$?
    set -e
    t1=$(date +%s%N)
    out=$(cat "$work/dead.out")
    ms=$(((t1 - t0) / 1000000))
    [[ $rc -eq 1 ]] || fail "$* with 4 dead shards: want exit 1, got $rc: $out"
    ((ms < 2 * to * 1000)) ||
        fail "$* with 4 dead shards took $ms ms, not below 2 x --timeout $to s (asked one after another?): $out"
    echo "giftctl_check: $* with 4 dead shards and 1 live: $ms ms (--timeout $to s), exit 1"
}
dead_check stats
mapfile -t lines <"$work/dead.out"
k=0
for i in 0 1 2 3 4; do
    if ((i == 2)); then
        [[ ${lines[$k]:-} == "shard 127.0.0.1:$port (id 0), world 2" ]] ||
            fail "stats: line $k is not the live shard's answer: $out"
        [[ ${lines[$((k + 2))]:-} == *"pushes "* ]] || fail "stats: the live shard's counters: $out"
        k=$((k + 3))
    else
        d=${dp[$((i < 2 ? i : i - 1))]}
        [[ ${lines[$k]:-} =~ ^shard\ 127\.0\.0\.1:$d:\ ERROR\ .+ ]] ||
            fail "stats: line $k does not name dead shard 127.0.0.1:$d with its error: $out"
        k=$((k + 1))
    fi
done
dead_check --json status
"$py" - "$work/dead.out" "$port" "${dp[@]:0:4}" <<'PY' || fail "status --json with dead shards: $out"
import json, sys
d = json.load(open(sys.argv[1]))
live, dead = int(sys.argv[2]), [int(p) for p in sys.argv[3:]]
assert d["command"] == "status" and d["ok"] is False, d
assert [s["port"] for s in d["shards"]] == dead[:2] + [live] + dead[2:], d
for s in d["shards"]:
    if s["port"] == live:
        assert s["ok"] and s["world_size"] == 2 and len(s["tensors"]) == 3, s
    else:
        assert not s["ok"] and s["error"], s
PY
dead_check ping
for d in "${dp[@]:0:4}"; do
    grep -Eq "^127\.0\.0\.1:$d DOWN: .+" <<<"$out" || fail "ping does not name dead shard $d: $out"
done
grep -Eq "^127\.0\.0\.1:$port live " <<<"$out" || fail "ping does not show the live shard: $out"
kill -KILL "${pids[-1]}" 2>/dev/null || true
wait "${pids[-1]}" 2>/dev/null || true

# 5. Authentication.
umask 077
head -c 32 /dev/urandom | base64 >"$work/key"
head -c 32 /dev/urandom | base64 >"$work/wrong-key"
"$giftd" --bind 127.0.0.1 --port 0 --http-port 0 --world-size 2 --auth-key-file "$work/key" \
    --data-dir "$work/data-auth" >"$work/ready-auth" 2>"$work/giftd-auth.log" &
pids+=($!)
aport='' ahttp=''
for _ in $(seq 1 100); do
    if read -r line <"$work/ready-auth" 2>/dev/null && [[ $line == "giftd ready "* ]]; then
        aport=$(sed -n 's/.* port=\([0-9]*\) .*/\1/p' <<<"$line")
        ahttp=$(sed -n 's/.* http_port=\([0-9]*\)$/\1/p' <<<"$line")
        break
    fi
    kill -0 "${pids[-1]}" 2>/dev/null || break
    sleep 0.05
done
if [[ -z $aport ]]; then
    echo "giftctl_check: this giftd does not start with an auth_key_file; authentication not checked" >&2
else
    actl=("$giftctl" --servers "127.0.0.1:$aport" --http "127.0.0.1:$ahttp" --timeout 5)
    set +e
    out=$("${actl[@]}" status 2>&1); rc=$?
    set -e
    [[ $rc -eq 1 && $out == *"requires authentication"* ]] || fail "status without the key: rc $rc: $out"
    set +e
    out=$("${actl[@]}" --auth-key-file "$work/wrong-key" status 2>&1); rc=$?
    set -e
    [[ $rc -eq 1 ]] || fail "status with a wrong key: rc $rc: $out"
    GIFT_AUTH_KEY_FILE="$work/key" "${actl[@]}" --json stats >"$work/auth.json" ||
        fail "stats with the key: $(cat "$work/auth.json")"
    "$py" -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["ok"] and d["shards"][0]["world_size"] == 2, d' "$work/auth.json" ||
        fail "stats with the key: $(cat "$work/auth.json")"
    "${actl[@]}" ping >/dev/null || fail "ping of an authenticating shard"
    echo "giftctl_check: authentication: refused without the key and with a wrong one, answered with it"
fi
echo "giftctl_check: ok"
