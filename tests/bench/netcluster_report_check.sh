#!/usr/bin/env bash
# netcluster_report_check.sh REPO: bench/netcluster's arithmetic, without a
# cluster.
#
#  1. run.sh's cal_next (the calibration's next rate): one try 19% short of
#     the wanted communication share scales the rate by the shortfall and is
#     not within 7.5%; a try within 7.5% is, and its rate is the nearest; with
#     three tries on comm/compute = a + b / rate exactly, the least-squares
#     fit gives the rate that solves it for the wanted share; the share is
#     each try's own (step - compute) / compute, not one compute step's.
#  2. report.py on a synthetic folder (paper link, seeds 1 and 2; none,
#     ddp-allreduce and nvfp4-gift at known step times and validation
#     curves): ddp-allreduce's measured communication share is the mean over
#     seeds of 1 - none's step / its step and is printed beside the wanted
#     third; times to target and the x ddp-allreduce ratio follow the curves;
#     a link whose calibration entry has its own date and compute step (one
#     calibrated apart from the other) prints them.
#  3. a communicating arm faster than the compute-only arm of its seed (a
#     negative wait) flags the table, withdraws its limits and names the
#     none piece in report/rerun.txt, which run.sh runs again.
# Exit 77 (skipped) without /usr/bin/python3.
set -euo pipefail

repo=${1:?usage: netcluster_report_check.sh REPO}
py=/usr/bin/python3
[[ -x $py ]] || { echo "skip: no $py"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# 1. cal_next, taken from run.sh as it stands.
eval "$(sed -n '/^cal_next() {$/,/^}$/p' "$repo/bench/netcluster/run.sh")"
declare -F cal_next >/dev/null || fail "no cal_next() in run.sh"
# 437 Mbit/s: step 92.6 ms on a 65.8 ms compute step: comm 0.407x, wanted 0.5x.
got=$(cal_next 0.5 437:0.0926:0.0658)
[[ $got == "356 437 0" ]] || fail "one short try: want '356 437 0', got '$got'"
# The same step against a 61.9 ms compute step of its own pair: 0.496x, within.
got=$(cal_next 0.5 437:0.0926:0.0619)
[[ $got == *" 437 1" ]] || fail "try within 7.5%: want '* 437 1', got '$got'"
# comm/compute = 0.1 + 100 / rate at 200, 400, 800 Mbit/s (compute 0.1 s):
# 0.6x, 0.35x, 0.225x; 0.5x wanted solves at 250 Mbit/s; 0.6x is 20% off.
got=$(cal_next 0.5 200:0.16:0.1 400:0.135:0.1 800:0.1225:0.1)
[[ $got == "250 200 0" ]] || fail "least squares: want '250 200 0', got '$got'"

# 2. report.py on a synthetic paper link.
nc=$work/nc
cat >"$nc.calibration.json" <<'EOF'
{"compute_step_s": 0.066, "params": 1000, "f32_allreduce_bytes_per_worker": 4000,
 "workers": 2, "delay_ms": 0.25, "date": "2026-12-05T00:00:00Z", "nproc": 2, "cpu": "test",
 "paper": {"comm_x_compute_wanted": 0.5, "rate_first_mbit": 400,
           "ddp_allreduce_step_s_at_first": 0.1, "rate_mbit": 380, "tries": [[400, 0.1, 0.066]],
           "compute_step_s": 0.064, "date": "2026-12-04T00:00:00Z"}}
EOF
mkdir -p "$nc" && mv "$nc.calibration.json" "$nc/calibration.json"
"$py" - "$nc" <<'PY' || fail "writing the synthetic folder"
import json, os, sys
nc = sys.argv[1]
# arm: (step s by seed, loss falls by this much per 10 steps, from 3.0)
arms = {"none": ({1: 0.060, 2: 0.066}, 0.05), "ddp-allreduce": ({1: 0.090, 2: 0.099}, 0.05),
        "nvfp4-gift": ({1: 0.072, 2: 0.075}, 0.05)}
for arm, (steps, fall) in arms.items():
    for seed, st in steps.items():
        d = os.path.join(nc, "paper", arm, f"s{seed}")
        os.makedirs(d)
        with open(os.path.join(d, "log.csv"), "w") as fh:
            fh.write("step,train_loss,val_loss,wire_bytes,step_s,lr_factor,cpu_s,"
                     "netdev_bytes,train_s\n")
            for s in range(1, 101):
                val = f"{3.0 - fall * s / 10:.6f}" if s % 10 == 0 else ""
                fh.write(f"{s},1.0,{val},1000,{st},1.0,{st},1010,{s * st:.6f}\n")
        json.dump({"seed": seed, "params": 1000, "final_val_loss": 3.0 - fall * 10,
                   "cpu_s_per_step": st}, open(os.path.join(d, "summary.json"), "w"))
        json.dump({"workers": 2, "servers": 0 if arm != "nvfp4-gift" else 2, "colocated": False,
                   "rate_mbit": 380, "egress": "fair", "shard_cpu_s": []},
                  open(os.path.join(d, "cluster.json"), "w"))
PY
"$py" "$repo/bench/netcluster/report.py" --out "$nc" --quiet 2>"$work/report.err" \
    || { cat "$work/report.err" >&2; fail "report.py"; }
"$py" - "$nc/report" <<'PY' || fail "report.py's figures (above)"
import json, sys
rep = json.load(open(sys.argv[1] + "/report.json"))
lk = rep["links"]["paper"]
want = ((1 - 0.060 / 0.090) + (1 - 0.066 / 0.099)) / 2
got = lk["ddp_allreduce_comm_share"]
assert abs(got - want) < 1e-9, f"comm share {got!r}, want {want!r}"
assert abs(lk["comm_share_wanted"] - 1 / 3) < 1e-12, lk["comm_share_wanted"]
# Every arm falls alike: the target (ddp-allreduce's final 2.5 + 1%) is first
# met at step 100 by all, so time to target is 100 steps of each arm's step.
g = lk["arms"]["nvfp4-gift"]
assert g["ttt_x_ddp_allreduce"] is not None, g
x = ((0.072 / 0.090) + (0.075 / 0.099)) / 2
assert abs(g["ttt_x_ddp_allreduce"] - x) < 1e-6, f"x ddp-allreduce {g['ttt_x_ddp_allreduce']!r}, want {x!r}"
md = open(sys.argv[1] + "/table.md").read()
line = "ddp-allreduce waited for communication 33% of its step"
assert line in md and "the setting wants 33%" in md, md[:2000]
# A link calibrated apart from the others says when and against what.
assert "calibrated 2026-12-04T00:00:00Z against a 64.0 ms compute step" in md, md[:800]
PY
# 3. A baseline that ran slower than it can: nvfp4-gift's seed 2 steps in
# 60 ms, below none's 66 ms (a negative communication wait). The table is
# flagged, its limits withdrawn, and rerun.txt names paper/none/s2; once the
# none piece is faster again, the flag and rerun.txt are gone.
sed -i 's/^\([0-9]*\),1.0,\([0-9.]*\),1000,0.075,/\1,1.0,\2,1000,0.060,/' "$nc/paper/nvfp4-gift/s2/log.csv"
"$py" "$repo/bench/netcluster/report.py" --out "$nc" --quiet 2>"$work/report.err" \
    || { cat "$work/report.err" >&2; fail "report.py on a flagged table"; }
grep -q "FLAGGED, do not report.*nvfp4-gift seed 2 stepped in 60.0 ms, below the compute-only step 66.0 ms" \
    "$nc/report/table.md" || fail "no flag in the table: $(head -c 1500 "$nc/report/table.md")"
[[ $(cat "$nc/report/rerun.txt") == "paper/none/s2" ]] ||
    fail "rerun.txt: '$(cat "$nc/report/rerun.txt" 2>/dev/null)', want paper/none/s2"
"$py" - "$nc/report" <<'PY' || fail "the flagged report (above)"
import json, sys
lk = json.load(open(sys.argv[1] + "/report.json"))["links"]["paper"]
assert lk["negative_comm_wait"] == [{"seed": 2, "arm": "nvfp4-gift", "step_median_s": 0.06,
                                     "compute_s": 0.066}], lk["negative_comm_wait"]
assert lk["limit_s"] is None and all(a["ttt_x_limit"] is None for a in lk["arms"].values()), lk
PY
sed -i 's/^\([0-9]*\),1.0,\([0-9.]*\),1000,0.066,/\1,1.0,\2,1000,0.055,/' "$nc/paper/none/s2/log.csv"
"$py" "$repo/bench/netcluster/report.py" --out "$nc" --quiet 2>"$work/report.err" \
    || { cat "$work/report.err" >&2; fail "report.py after the rerun"; }
[[ ! -e $nc/report/rerun.txt ]] || fail "rerun.txt left after the none piece ran faster"
grep -q FLAGGED "$nc/report/table.md" && fail "the table is still flagged"
echo "netcluster report: ok"
