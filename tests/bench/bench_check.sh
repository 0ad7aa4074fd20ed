#!/usr/bin/env bash
# bench_check.sh GIFT_BENCH GIFTD: the benchmarks run end to end, small, and write
# the JSON they promise. Performance is never asserted here (bench/ measures
# it); this checks that each subcommand completes, that its JSON parses and
# holds every row asked for with finite, positive figures, and that bad
# options fail with exit 2 and a message instead of running.
#
#  1. gift-bench codec --mib 2 --repeats 1: a row per format and transform
#     (Euclidean, GIFT, Hadamard);
#     again with --chunk-mib 1 (two calls per encode, as the client does):
#     the same rows, and the same round-trip error for every format whose
#     blocks do not cross the 1 MiB boundary (all but nvfp4, whose tensor
#     scale is per call).
#  2. gift-bench fidelity on a small synthetic layer: Euclidean, Hadamard and GIFT rows
#     of fp8-e4m3 and nvfp4, errors finite and in (0, 1); with the step's own
#     batch sketched, full-rank GIFT fp8's whitened ratio within 15% of the
#     relative-error prediction (fp8_oracle_whitened_ratio); with numpy,
#     bench/convergence_report.py fidelity on a small dump of three layers.
#  3. gift-bench cluster: 1 shard it starts itself, 1 worker, 8 MiB in 1 MiB
#     chunks, f32 and fp8-e4m3, Euclidean and GIFT, --inplace, 3 steps: every
#     row has 3 measured steps and positive goodput; the raw baselines and the
#     4 KiB probe ran; the targets block is present; the per-byte costs of both
#     sides are finite and positive, passes by kind summing to the total; no giftd
#     is left behind.
# Exit 77 (skipped) without /usr/bin/python3.
set -euo pipefail

bench=${1:?usage: bench_check.sh GIFT_BENCH GIFTD}
giftd=${2:?usage: bench_check.sh GIFT_BENCH GIFTD}
py=/usr/bin/python3
[[ -x $py ]] || { echo "bench_check: $py not found; skipping" >&2; exit 77; }

work=$(mktemp -d "${TMPDIR:-/tmp}/bench-check-XXXXXX")
# gift-bench cluster starts giftd through this link, so its shards can be
# told from those of tests running beside this one.
ln -s "$(readlink -f "$giftd")" "$work/giftd"
trap 'pkill -KILL -f "$work/giftd" 2>/dev/null || true; rm -rf "$work"' EXIT
fail() { echo "bench_check: FAIL: $*" >&2; exit 1; }

run() { # name args...: runs gift-bench, output to $work/name.txt
    local name=$1; shift
    if ! timeout 300 "$bench" "$@" >"$work/$name.txt" 2>&1; then
        tail -n 30 "$work/$name.txt" >&2
        fail "gift-bench $* exited non-zero"
    fi
}

# 1. codec
run codec codec --mib 2 --repeats 1 --json "$work/codec.json"
run codec-chunks codec --mib 2 --chunk-mib 1 --repeats 1 --json "$work/codec-chunks.json"
"$py" - "$work/codec.json" "$work/codec-chunks.json" <<'PY' || fail "codec JSON (above)"
import json, math, sys
whole, chunked = (json.load(open(f)) for f in sys.argv[1:3])
assert whole["chunk_mib"] == 0 and chunked["chunk_mib"] == 1, \
    f"chunk_mib {whole['chunk_mib']} / {chunked['chunk_mib']}, expected 0 / 1"
want = {(f, t) for f in ("f32", "bf16", "fp8-e4m3", "fp8-e5m2", "nvfp4")
        for t in ("euclidean", "gift", "hadamard")}
for j in (whole, chunked):
    rows = j["rows"]
    got = {(r["format"], r["transform"]) for r in rows}
    assert want <= got, f"codec rows missing (chunk_mib {j['chunk_mib']}): {sorted(want - got)}"
    for r in rows:
        for k in ("encode_gbps", "decode_gbps"):
            v = r[k]
            assert isinstance(v, (int, float)) and math.isfinite(v) and v > 0, f"{r['format']} {r['transform']} {k} = {v}"
err = {(r["format"], r["transform"]): r["roundtrip_rel_l2"] for r in whole["rows"]}
for r in chunked["rows"]:
    key = (r["format"], r["transform"])
    if r["format"] != "nvfp4":
        assert r["roundtrip_rel_l2"] == err[key], f"{key}: relL2 {r['roundtrip_rel_l2']} in 1 MiB calls, {err[key]} in one"
PY

# 2. fidelity
run fidelity fidelity --rows 64 --cols 128 --workers 2 --tokens 512 --json "$work/fidelity.json"
"$py" - "$work/fidelity.json" <<'PY' || fail "fidelity JSON (above)"
import json, math, sys
j = json.load(open(sys.argv[1]))
rows = j["rows"]
for fmt in ("fp8-e4m3", "nvfp4"):
    for tr in ("euclidean", "gift", "hadamard"):
        sel = [r for r in rows if r["format"] == fmt and r["transform"] == tr]
        assert sel, f"no {fmt} {tr} row"
        for r in sel:
            for k in ("rel_l2", "whitened", "muon"):
                v = r[k]
                assert math.isfinite(v) and 0 < v < 1, f"{fmt} {tr} k={r.get('k')} {k} = {v}"
PY
# With the step's own batch sketched, the full-rank geometry is the metric's
# own; fp8's relative-error model must then predict GIFT fp8's whitened ratio.
run fidelity-same fidelity --rows 64 --cols 128 --workers 2 --tokens 512 --sketch-batch same \
    --json "$work/fidelity-same.json"
"$py" - "$work/fidelity-same.json" <<'PY' || fail "fidelity oracle prediction (above)"
import json, math, sys
j = json.load(open(sys.argv[1]))
pred = j["fp8_oracle_whitened_ratio"]
full = [r for r in j["rows"] if r["format"] == "fp8-e4m3" and r["transform"] == "gift" and r["k_full"]]
assert full, "no full-rank GIFT fp8 row"
got = full[0]["whitened_x_euclidean_fp8"]
assert math.isfinite(pred) and 0 < pred < 1, f"fp8_oracle_whitened_ratio = {pred}"
assert abs(got / pred - 1) < 0.15, f"full-rank GIFT fp8 whitened {got:.3f}x, predicted {pred:.3f}x"
PY

# 2b. convergence_report.py fidelity on a dump of three layers at one step, two
# of them identical: one JSON per layer and the whole update's ratios, each a
# weighted mean of the layers' and so between their smallest and largest.
if "$py" -c 'import numpy' 2>/dev/null; then
    "$py" - "$work/dump/step10" <<'PY' || fail "writing a test dump"
import json, os, sys
import numpy as np
d = sys.argv[1]
os.makedirs(d)
shapes = {}
for name, (r, c, seed) in {"blocks.0.a": (32, 64, 2), "blocks.0.b": (96, 48, 3),
                           "head": (32, 64, 2)}.items():
    g = np.random.default_rng(seed)
    v = np.linalg.qr(g.standard_normal((c, c)))[0]
    sd = np.sqrt(np.arange(1, c + 1) ** -1.4)
    for w in range(2):
        x = (g.standard_normal((256, c)) * sd) @ v.T
        dy = g.standard_normal((256, r))
        (dy.T @ x / 256).astype(np.float32).tofile(f"{d}/{name}.grad.rank{w}.f32")
        (x.T @ x / 256).astype(np.float32).tofile(f"{d}/{name}.cov.rank{w}.f32")
    shapes[f"{name}.grad"], shapes[f"{name}.cov"] = [r, c], [c, c]
json.dump(shapes, open(f"{d}/shapes.json", "w"))
PY
    "$py" "$(dirname "$0")/../../bench/convergence_report.py" fidelity --dump "$work/dump" \
        --bench "$bench" --out "$work/fid-report" >"$work/fid-report.txt" 2>&1 \
        || { tail -n 20 "$work/fid-report.txt" >&2; fail "convergence_report.py fidelity"; }
    "$py" - "$work/fid-report" <<'PY' || fail "convergence_report.py model-wide figures (above)"
import json, sys
summ = json.load(open(sys.argv[1] + "/fidelity-summary.json"))
wide = json.load(open(sys.argv[1] + "/model-wide.json"))
names = ["blocks.0.a", "blocks.0.b", "head"]
assert [s["layer"] for s in summ] == names, [s["layer"] for s in summ]
a, b, c = summ
assert a["g8_whitened_ratio"] == c["g8_whitened_ratio"], "identical layers a and head differ"
assert len(wide) == 1 and wide[0]["step"] == 10 and wide[0]["layers"] == names, wide
for key in ("g8_whitened_ratio", "g8_muon_ratio", "e4_whitened_ratio", "e4_muon_ratio"):
    lo, hi = min(s[key] for s in summ), max(s[key] for s in summ)
    v = wide[0][key]
    assert lo * (1 - 1e-9) <= v <= hi * (1 + 1e-9), f"model-wide {key} {v:.4f} outside the layers' {lo:.4f}..{hi:.4f}"
w = wide[0]
assert abs(w["weight_muon"][0] - w["weight_muon"][2]) < 1e-9, w["weight_muon"]
# As Muon applies it: the head (AdamW's) left out, blocks.0.b (96 x 48) scaled by sqrt(2).
assert w["weight_muon_applied"][2] == 0.0, w["weight_muon_applied"]
assert abs(w["weight_muon_applied"][1] - 2 ** 0.5 * w["weight_muon"][1]) < 1e-9 * w["weight_muon"][1], w
lo, hi = sorted((a["g8_muon_ratio"], b["g8_muon_ratio"]))
assert lo * (1 - 1e-9) <= w["g8_muon_applied_ratio"] <= hi * (1 + 1e-9), f"applied {w['g8_muon_applied_ratio']:.4f} outside {lo:.4f}..{hi:.4f}"
PY
fi

# 3. cluster
run cluster cluster --mib 8 --chunk-mib 1 --steps 3 --warmup 1 --codecs f32,fp8-e4m3 \
    --transforms euclidean,gift --k 8 --rtt-iters 50 --stream-reps 2 --inplace \
    --giftd "$work/giftd" --json "$work/cluster.json"
"$py" - "$work/cluster.json" <<'PY' || fail "cluster JSON (above)"
import json, math, sys
j = json.load(open(sys.argv[1]))
assert j["inplace"] == 1, f"inplace = {j['inplace']}"
rows = j["rows"]
want = {(c, t) for c in ("f32", "fp8-e4m3") for t in ("euclidean", "gift")}
got = {(r["codec"], r["transform"]) for r in rows}
assert got == want, f"cluster rows {sorted(got)}, expected {sorted(want)}"
for r in rows:
    assert r["steps"] == 3, f"{r['codec']} {r['transform']}: {r['steps']} measured steps, expected 3"
    for k in ("goodput_gbps", "wire_gbps", "step_p50_ms"):
        v = r[k]
        assert math.isfinite(v) and v > 0, f"{r['codec']} {r['transform']} {k} = {v}"
    # Per-byte costs: measured on both sides (our own shards), finite and positive.
    for k in ("worker_io_ns_per_payload_byte", "worker_io_ns_per_fp32_byte", "worker_passes",
              "shard_ns_per_payload_byte", "shard_passes"):
        v = r[k]
        assert isinstance(v, (int, float)) and math.isfinite(v) and v > 0, f"{r['codec']} {r['transform']} {k} = {v}"
    for side in ("worker", "shard"):
        kinds = r[f"{side}_passes_by_kind"]
        assert abs(sum(kinds.values()) - r[f"{side}_passes"]) < 1e-6, f"{side} passes by kind {kinds} vs {r[side + '_passes']}"
assert j["per_byte_costs"]["shard_figures"] == "measured", j["per_byte_costs"]
t = j["targets"]
for k in ("f32_wire_x_raw_stream", "fp8_goodput_x_f32", "probe_4k_x_raw_rtt"):
    assert math.isfinite(t[k]) and t[k] > 0, f"targets {k} = {t[k]}"
PY
for _ in 1 2 3 4 5 6 7 8 9 10; do
    pgrep -f "$work/giftd" >/dev/null 2>&1 || break
    sleep 0.2
done
if pgrep -f "$work/giftd" >/dev/null 2>&1; then
    fail "a giftd started by gift-bench cluster is still running: $(pgrep -af "$work/giftd")"
fi
grep -q "giftd" "$work/cluster.txt" || fail "cluster output does not name the shards it started"

# 4. bad options: exit 2 and a message, nothing run
for args in "cluster --steps 0" "cluster --codecs f33" "codec --mib -1" "codec --mib 2 --chunk-mib 3" \
    "fidelity --damping 0" "fidelity --damping x" \
    "nosuch"; do
    set +e
    # shellcheck disable=SC2086
    "$bench" $args >"$work/bad.txt" 2>&1
    rc=$?
    set -e
    [[ $rc -eq 2 ]] || { cat "$work/bad.txt" >&2; fail "gift-bench $args: exit $rc, expected 2"; }
    [[ -s $work/bad.txt ]] || fail "gift-bench $args: exit 2 without a message"
done
echo "bench_check: codec, fidelity, cluster and bad options: all passed"
