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

"$giftd" --bind 127.0.0.1 --port 0 --http-port 0 --data-dir "$work/data" \
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
