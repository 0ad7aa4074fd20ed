#!/usr/bin/env bash
# scaling_check.sh SCALING_SH GIFT_BENCH GIFTD: bench/scaling.sh end to end, tiny.
#
# W = 1 x S = 1,2 with a 4 MiB tensor, 3 steps: both cells run, scaling.json
# holds one cell per (W, S, codec) of f32 and fp8-e4m3 with finite, positive
# aggregate wire, cores busy, wire per busy core and raw-TCP ratio, and
# scaling.md has their rows; a bad flag exits 2. Performance is not asserted.
# Exit 77 (skipped) without /usr/bin/python3.
set -euo pipefail

sh=${1:?usage: scaling_check.sh SCALING_SH GIFT_BENCH GIFTD}
bench=${2:?usage: scaling_check.sh SCALING_SH GIFT_BENCH GIFTD}
giftd=${3:?usage: scaling_check.sh SCALING_SH GIFT_BENCH GIFTD}
py=/usr/bin/python3
[[ -x $py ]] || { echo "scaling_check: $py not found; skipping" >&2; exit 77; }
work=$(mktemp -d "${TMPDIR:-/tmp}/scaling-check-XXXXXX")
# The shards start through this link, so they can be told from other tests'.
ln -s "$(readlink -f "$giftd")" "$work/giftd"
trap 'pkill -KILL -f "$work/giftd" 2>/dev/null || true; rm -rf "$work"' EXIT
fail() { echo "scaling_check: FAIL: $*" >&2; exit 1; }

if ! timeout 120 "$sh" --bench "$bench" --giftd "$work/giftd" --python "$py" --workers 1 \
    --shards 1,2 --mib 4 --chunk-mib 1 --steps 3 --warmup 1 --row-seconds 1 --rtt-iters 20 \
    --stream-reps 1 --cell-timeout 60 --out "$work/out" >"$work/out.txt" 2>&1; then
    tail -n 30 "$work/out.txt" >&2
    fail "scaling.sh exited non-zero"
fi
"$py" - "$work/out" <<'PY' || fail "scaling.json / scaling.md (above)"
import json, math, sys
d = sys.argv[1]
j = json.load(open(d + "/scaling.json"))
got = {(c["workers"], c["shards"], c["codec"]) for c in j["cells"]}
want = {(1, s, c) for s in (1, 2) for c in ("f32", "fp8-e4m3")}
assert got == want, f"cells {sorted(got)}, expected {sorted(want)}"
for c in j["cells"]:
    for k in ("aggregate_wire_gbps", "aggregate_goodput_gbps", "cores_busy",
              "aggregate_wire_gbps_per_busy_core", "raw_stream_gbps", "aggregate_wire_x_raw_stream"):
        v = c[k]
        assert isinstance(v, (int, float)) and math.isfinite(v) and v > 0, f"{c['source']} {c['codec']} {k} = {v}"
    assert abs(c["aggregate_wire_x_raw_stream"] * c["raw_stream_gbps"] - c["aggregate_wire_gbps"]) < 1e-9
md = open(d + "/scaling.md").read()
rows = [l for l in md.splitlines() if l.startswith("| 1 | ")]
assert len(rows) == 4, f"scaling.md: {len(rows)} cell rows, expected 4:\n{md}"
PY
set +e
"$sh" --bench "$bench" --shards 0 >"$work/bad.txt" 2>&1
rc=$?
set -e
[[ $rc -eq 2 && -s $work/bad.txt ]] || { cat "$work/bad.txt" >&2; fail "--shards 0: exit $rc, expected 2 with a message"; }
echo "scaling_check: both cells ran and were summarised"
