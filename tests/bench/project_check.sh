#!/usr/bin/env bash
# project_check.sh PROJECT_PY: bench/project.py on small synthetic inputs.
#
#  1. one setting (W = 4, a tiny Llama): the ring allreduce sends
#     2 (W-1)/W x 4 bytes x params per worker, the fp16 hook half of it,
#     giftd f32 4 bytes x params and fp8 8.25/32 of it (no GIFT tensors);
#  2. every arm's step time is non-increasing in the link rate (1, 10,
#     100 Gbit/s), and at least the compute step;
#  3. --validate on a synthetic bench/netcluster folder: one row per arm but
#     `none`, ratio = predicted / measured, the paired prediction uses the
#     seed's compute step, the runs'-CPU one adds (CPU per step - W x the
#     compute-only run's) / cores to the compute, and only where the runs
#     have a CPU figure; the calibration's-CPU one (blind) adds W x (the
#     calibration's ddp-allreduce CPU per step at the kept rate - the
#     compute-only run's), plus the model's shard CPU, over the cores, to
#     each seed's compute step, and ignores a try at another rate and one
#     whose files are not JSON objects;
#  4. --project paper: giftd needs W shard hosts at equal link rates;
#  5. --cluster-json on a small fixture (written here): the shard CPU of the
#     codecs it has is W x (push + pull) x its shard ns/payload byte, the
#     worker's encode + decode is payload x its worker ns/B, a codec it lacks
#     keeps the model's figures, a gift arm takes its format's euclidean
#     figure, and the output names the file;
#  6. --chunk-kib 4: the giftd arms pipeline over the step's chunks per
#     shard (49 chunks of the tiny Llama, counted by hand from the client's
#     fusion and row blocks, over S = 2), and never take longer than with
#     the library's 4 MiB chunks (2 chunks: one fused bucket and w13);
#  7. bad flags and inputs exit 2 with a message.
# Exit 77 (skipped) without /usr/bin/python3.
set -euo pipefail

proj=${1:?usage: project_check.sh PROJECT_PY}
py=/usr/bin/python3
[[ -x $py ]] || { echo "project_check: $py not found; skipping" >&2; exit 77; }
work=$(mktemp -d "${TMPDIR:-/tmp}/project-check-XXXXXX")
trap 'rm -rf "$work"' EXIT

cat >"$work/costs.json" <<'EOF'
{"encode_ns_per_elem": {"f32": 0.3, "bf16": 0.3, "fp8": 0.4, "nvfp4": 0.7},
 "decode_ns_per_elem": {"f32": 0.4, "bf16": 0.5, "fp8": 0.3, "nvfp4": 0.3},
 "transform_ns_per_elem_k32": 3.0}
EOF
small=(--costs "$work/costs.json" --dim 64 --layers 1 --ffn 128 --vocab 64 --workers 4
       --servers 2 --compute-ms 10 --delay-ms 0.1)
for g in 1 10 100; do
    "$py" "$proj" "${small[@]}" --link-gbps "$g" --json "$work/g$g.json" >/dev/null
done
"$py" "$proj" "${small[@]}" --link-gbps 1 --chunk-kib 4 --json "$work/c4.json" >/dev/null

# synthetic netcluster output: calibration, report.json with two arms and `none`
mkdir -p "$work/nc/report"
cat >"$work/nc/calibration.json" <<'EOF'
{"compute_step_s": 0.07, "params": 467584, "workers": 2, "delay_ms": 0.25, "date": "x",
 "nproc": 2, "cpu": "test", "starved": {"rate_mbit": 83}}
EOF
cat >"$work/nc/report/report.json" <<'EOF'
{"calibration": {}, "links": {"starved": {"arms": {
 "ddp-allreduce": {"seeds": [1], "rate_mbit": 83, "workers": 2, "servers": 0,
   "colocated": false, "step_median_s": 0.25, "compute_s": 0.08,
   "per_seed": [{"seed": 1, "step_median_s": 0.25, "compute_s": 0.08, "delay_ms_applied": 0,
                 "cpu_s_per_step": 0.16}]},
 "nvfp4-gift-colo": {"seeds": [1], "rate_mbit": 83, "workers": 2, "servers": 2,
   "colocated": true, "step_median_s": 0.09, "compute_s": 0.05,
   "per_seed": [{"seed": 1, "step_median_s": 0.09, "compute_s": 0.05, "delay_ms_applied": 0}]},
 "none": {"seeds": [1], "rate_mbit": 83, "step_median_s": 0.07, "per_seed": []}}}}}
EOF
mkdir -p "$work/nc/calibration/compute"
echo '{"cpu_s_per_step": 0.06}' >"$work/nc/calibration/compute/summary.json"
# two calibration tries: the kept rate's (83 Mbit/s) and one at another rate,
# whose CPU must not be used
mkdir -p "$work/nc/calibration/starved.1" "$work/nc/calibration/starved.2"
echo '{"cpu_s_per_step": 0.20}' >"$work/nc/calibration/starved.1/summary.json"
echo '{"rate_mbit": 40}' >"$work/nc/calibration/starved.1/cluster.json"
echo '{"cpu_s_per_step": 0.07}' >"$work/nc/calibration/starved.2/summary.json"
echo '{"rate_mbit": 83}' >"$work/nc/calibration/starved.2/cluster.json"
# and a try whose files are JSON but not objects: skipped, not a crash
mkdir -p "$work/nc/calibration/starved.3"
echo '{"cpu_s_per_step": 0.5}' >"$work/nc/calibration/starved.3/summary.json"
echo '"83"' >"$work/nc/calibration/starved.3/cluster.json"
"$py" "$proj" --costs "$work/costs.json" --validate "$work/nc" --json "$work/val.json" \
    --md "$work/val.md" >/dev/null
"$py" "$proj" --costs "$work/costs.json" --project paper --json "$work/paper.json" >/dev/null

# a gift-bench cluster --json fixture: per-byte costs of f32 and fp8-e4m3 (euclidean),
# and a gift row whose figures must not be used
cat >"$work/cluster.json" <<'EOF'
{"benchmark": "cluster", "date": "fixture", "cpu": "test", "cores": 2, "workers": 1,
 "shards": 1, "external_cluster": false, "rows": [
 {"codec": "f32", "transform": "euclidean", "worker_io_ns_per_payload_byte": 1.0,
  "shard_ns_per_payload_byte": 2.0},
 {"codec": "fp8-e4m3", "transform": "euclidean", "worker_io_ns_per_payload_byte": 1.5,
  "shard_ns_per_payload_byte": 3.0},
 {"codec": "fp8-e4m3", "transform": "gift", "worker_io_ns_per_payload_byte": 9.0,
  "shard_ns_per_payload_byte": 9.0}]}
EOF
"$py" "$proj" "${small[@]}" --link-gbps 10 --cluster-json "$work/cluster.json" \
    --json "$work/cl.json" >"$work/cl.txt"
grep -q "per-byte CPU from $work/cluster.json" "$work/cl.txt" ||
    { echo "project_check: FAIL: --cluster-json output does not name the file:" >&2; cat "$work/cl.txt" >&2; exit 1; }

"$py" - "$work" <<'EOF'
import json, sys
w = sys.argv[1]
bad = []
def check(cond, msg):
    if not cond:
        bad.append(msg)
g = {r: json.load(open(f"{w}/g{r}.json")) for r in (1, 10, 100)}
n = g[1]["params"]
want_n = 64 * 64 * 2 + 2 * 64 + 3 * 64 * 64 + 64 * 64 + 2 * 128 * 64 + 64 * 128 + 64
check(n == want_n, f"params {n}, want {want_n}")
rows = {r["arm"]: r for r in g[1]["rows"]}
W = 4
def near(a, b):
    return abs(a - b) <= 1e-6 * max(abs(b), 1)
check(near(rows["ddp-allreduce"]["bytes_per_worker_tx"], 2 * (W - 1) / W * 4 * n),
      f"ring allreduce bytes {rows['ddp-allreduce']['bytes_per_worker_tx']}, "
      f"want 2(W-1)/W x 4 x {n} = {2 * (W - 1) / W * 4 * n}")
check(near(rows["ddp-fp16"]["bytes_per_worker_tx"], (W - 1) / W * 4 * n),
      f"fp16 hook bytes {rows['ddp-fp16']['bytes_per_worker_tx']}, want {(W - 1) / W * 4 * n}")
check(near(rows["f32"]["bytes_per_worker_tx"], 4 * n),
      f"giftd f32 bytes {rows['f32']['bytes_per_worker_tx']}, want {4 * n}")
check(near(rows["fp8"]["bytes_per_worker_tx"], 8.25 / 8 * n),
      f"giftd fp8 bytes {rows['fp8']['bytes_per_worker_tx']}, want {8.25 / 8 * n}")
check(rows["nvfp4-gift"]["bytes_per_worker_tx"] > rows["nvfp4"]["bytes_per_worker_tx"],
      "nvfp4-gift sends no geometry bytes beyond nvfp4's")
for arm in rows:
    s = [{r["arm"]: r for r in g[x]["rows"]}[arm]["step_s"] for x in (1, 10, 100)]
    check(s[0] >= s[1] >= s[2] >= 0.010, f"{arm}: step at 1/10/100 Gbit/s {s}, not "
          "non-increasing or below the 10 ms compute")
v = json.load(open(f"{w}/val.json"))
arms = sorted(r["arm"] for r in v["rows"])
check(arms == ["ddp-allreduce", "nvfp4-gift-colo"], f"validate rows {arms}")
for r in v["rows"]:
    check(near(r["ratio"], r["predicted_step_s"] / r["measured_step_s"]),
          f"{r['arm']}: ratio {r['ratio']} != {r['predicted_step_s']} / {r['measured_step_s']}")
    check(r["predicted_paired_step_s"] is not None and r["predicted_paired_step_s"] >= r["paired_compute_s"],
          f"{r['arm']}: paired prediction {r['predicted_paired_step_s']} below its compute {r['paired_compute_s']}")
    check(r["delay_ms_used"] == 0, f"{r['arm']}: delay {r['delay_ms_used']} though netem was not applied")
ar = next(r for r in v["rows"] if r["arm"] == "ddp-allreduce")
# 83 Mbit/s, W = 2: 4 x 467584 bytes each way, no delay, + 80 ms compute
want = 0.08 + 4 * 467584 / (83e6 / 8)
check(abs(ar["predicted_paired_step_s"] - want) < 1e-6,
      f"ddp-allreduce paired prediction {ar['predicted_paired_step_s']}, want {want}")
# with the runs' CPU: (0.16 - W x 0.06) / 2 cores = 20 ms on the calibration's 70 ms compute
want = 0.07 + (0.16 - 2 * 0.06) / 2 + 4 * 467584 / (83e6 / 8)
check(ar["predicted_cpu_step_s"] is not None and abs(ar["predicted_cpu_step_s"] - want) < 1e-6,
      f"ddp-allreduce runs'-CPU prediction {ar['predicted_cpu_step_s']}, want {want}")
check(abs(ar["contention_s"] - 0.02) < 1e-9, f"ddp-allreduce contention {ar['contention_s']}, want 0.02")
# with the calibration's CPU: W x (0.07 - 0.06) / 2 cores = 10 ms on the seed's 80 ms compute
check(abs(v["calibration_extra_cpu_s"]["starved"] - 0.01) < 1e-9,
      f"calibration extra CPU {v['calibration_extra_cpu_s']}, want starved 0.01 (the 83 Mbit/s try)")
want = 0.08 + 0.01 + 4 * 467584 / (83e6 / 8)
check(ar["predicted_cal_step_s"] is not None and abs(ar["predicted_cal_step_s"] - want) < 1e-6
      and abs(ar["ratio_cal"] - want / 0.25) < 1e-6,
      f"ddp-allreduce calibration's-CPU prediction {ar['predicted_cal_step_s']} "
      f"(ratio {ar['ratio_cal']}), want {want} ({want / 0.25})")
colo = next(r for r in v["rows"] if r["arm"] == "nvfp4-gift-colo")
check(colo["calibration_contention_s"] is not None and colo["calibration_contention_s"] > 0.01 + 1e-5
      and colo["predicted_cal_step_s"] > colo["predicted_paired_step_s"],
      f"nvfp4-gift-colo: calibration's contention {colo['calibration_contention_s']} s "
      f"(want 10 ms + the model's shard CPU / 2), step {colo['predicted_cal_step_s']} s "
      f"against {colo['predicted_paired_step_s']} s without it")
check(v["within_15pct_calibration_cpu"][1] == 2,
      f"calibration's-CPU rows {v['within_15pct_calibration_cpu']}, want 2 (both arms)")
check(colo["ratio_cpu"] is None, f"nvfp4-gift-colo: runs'-CPU ratio {colo['ratio_cpu']} without a CPU figure")
check(v["compute_only_cpu_s"] == 0.06 and v["within_15pct_cpu"][1] == 1,
      f"compute-only CPU {v['compute_only_cpu_s']}, runs'-CPU rows {v['within_15pct_cpu']}")
p = json.load(open(f"{w}/paper.json"))
check(p["W"] == 64 and abs(p["params"] - 0.6e9) < 0.05e9, f"paper: W {p['W']}, params {p['params']}")
for r in p["rows"]:
    if r["arm"] in ("f32", "fp8-gift"):
        check(r["shard_hosts"] == 64, f"paper {r['arm']}: {r['shard_hosts']} shard hosts, want 64")
# 5. --cluster-json
cl = {r["arm"]: r for r in json.load(open(f"{w}/cl.json"))["rows"]}
base = {r["arm"]: r for r in g[10]["rows"]}
for arm, f, s_ns, w_ns in (("f32", 4.0, 2.0, 1.0), ("fp8", 8.25 / 8, 3.0, 1.5)):
    b = f * n  # push = pull bytes per worker
    want = W * 2 * b * s_ns * 1e-9
    got = cl[arm]["shard_cpu_total_s"]
    check(near(got, want), f"--cluster-json {arm}: shard CPU {got} s, want W x (push + pull) x "
          f"{s_ns} ns = {want} s (without the file: {base[arm]['shard_cpu_total_s']} s)")
    got = cl[arm]["cpu_worker_s"]
    check(near(got, 2 * b * w_ns * 1e-9), f"--cluster-json {arm}: worker CPU {got} s, "
          f"want {2 * b * w_ns * 1e-9} s")
    check(cl[arm]["shard_cost_source"] == "cluster-json" and cl[arm]["worker_cost_source"] == "cluster-json",
          f"--cluster-json {arm}: sources {cl[arm]['shard_cost_source']}, {cl[arm]['worker_cost_source']}")
    check(not near(base[arm]["shard_cpu_total_s"], want),
          f"{arm}: the fixture's shard CPU equals the model's ({want}); the test proves nothing")
fg = cl["fp8-gift"]
want = W * (fg["bytes_per_worker_tx"] + fg["bytes_per_worker_rx"]) * 3.0e-9
check(near(fg["shard_cpu_total_s"], want),
      f"--cluster-json fp8-gift: shard CPU {fg['shard_cpu_total_s']} s, want fp8's euclidean 3.0 ns/B: {want} s")
for arm in ("bf16", "nvfp4"):
    check(near(cl[arm]["shard_cpu_total_s"], base[arm]["shard_cpu_total_s"]) and
          cl[arm]["shard_cost_source"] == "model",
          f"--cluster-json {arm} (not in the file): shard CPU {cl[arm]['shard_cpu_total_s']} s "
          f"({cl[arm]['shard_cost_source']}), want the model's {base[arm]['shard_cpu_total_s']} s")
# 6. chunks: tok 4, wqkv 12, wo 4, w13 16, w2 8, head 4, the three norms fused in 1
c4 = {r["arm"]: r for r in json.load(open(f"{w}/c4.json"))["rows"]}
for arm in ("f32", "fp8", "nvfp4-gift"):
    check(near(c4[arm]["pieces"], 49 / 2), f"--chunk-kib 4 {arm}: {c4[arm]['pieces']} pieces, "
          "want 49 chunks / 2 shards = 24.5")
    check(near(rows[arm]["pieces"], 1), f"default chunk {arm}: {rows[arm]['pieces']} pieces, "
          "want 1 (2 chunks over 2 shards, 1 DDP bucket)")
    check(c4[arm]["step_s"] <= rows[arm]["step_s"],
          f"{arm}: step {c4[arm]['step_s']} s at 4 KiB chunks above {rows[arm]['step_s']} s at 4 MiB")
    check(c4[arm]["step_s"] < rows[arm]["step_s"] or arm != "f32",
          f"f32: 4 KiB chunks pipeline nothing ({c4[arm]['step_s']} s, as at 4 MiB)")
if bad:
    print("project_check: FAIL:\n  " + "\n  ".join(bad), file=sys.stderr)
    sys.exit(1)
EOF

# bad flags and inputs: exit 2 and a message naming the problem
expect2() { # pattern args...
    local pat=$1; shift
    local rc=0
    "$py" "$proj" "$@" >"$work/out.txt" 2>&1 || rc=$?
    [[ $rc == 2 ]] || { echo "project_check: FAIL: $* exited $rc, want 2" >&2; cat "$work/out.txt" >&2; exit 1; }
    grep -q -- "$pat" "$work/out.txt" ||
        { echo "project_check: FAIL: $*: no '$pat' in:" >&2; cat "$work/out.txt" >&2; exit 1; }
}
expect2 "overlap" --link-gbps 1 --compute-ms 10 --overlap 2
expect2 "workers" --link-gbps 1 --compute-ms 10 --workers 0
expect2 "chunk-kib" --link-gbps 1 --compute-ms 10 --chunk-kib -1
expect2 "chunk-kib" --link-gbps 1 --compute-ms 10 --chunk-kib 2000000
expect2 "link-gbps" --compute-ms 10
expect2 "unrecognized" --no-such-flag
expect2 "not a bench/netcluster" --validate "$work/nowhere"
expect2 "steps-ratio" --link-gbps 1 --compute-ms 10 --steps-ratio fp8
expect2 "codec-json" --codec-json "$work/costs.json" --link-gbps 1 --compute-ms 10
expect2 "cluster-json" --cluster-json "$work/costs.json" --link-gbps 1 --compute-ms 10
expect2 "cluster-json" --cluster-json "$work/nowhere.json" --link-gbps 1 --compute-ms 10
echo "project_check: OK"
