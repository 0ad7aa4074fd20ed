#!/usr/bin/env python3
"""A/B pairs of `gift-bench cluster`: two build trees, run alternately.

    bench/ab_cluster.py --a OLD_BUILD --b NEW_BUILD [--pairs 5] [--a-args "..."]
                        [--b-args "..."] [-- gift-bench cluster args]

Each pair runs A then B (B then A on odd pairs, so neither always goes
first), each with its own giftd (--giftd BUILD/server/giftd) and its own
libgiftclient (the gift-bench of that tree links it). Per codec x transform
row it prints the median over pairs of: step p50, wire GB/s over raw TCP
streaming measured in the same run, worker CPU ms/step, shard CPU ms/step, and
the median of the per-pair ratios B/A, with the spread of those ratios. A
machine that drifts between runs moves both sides of a pair alike; the ratio
of a pair is what says whether B changed anything. Writes --json FILE too.
--a-args / --b-args add arguments to one side only (split like a shell), so
one tree can be compared with itself under two settings, e.g.
--a build --b build --b-args "--codec-threads 1".
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile

FIELDS = [
    ("goodput_gbps", "goodput GB/s", lambda r, run: r.get("goodput_gbps")),
    ("step_p50_ms", "step p50 ms", lambda r, run: r.get("step_p50_ms")),
    ("wire_over_raw", "wire / raw TCP", lambda r, run: _ratio(r.get("wire_gbps"), run)),
    ("worker_cpu_ms", "worker CPU ms/step", lambda r, run: r.get("worker_cpu_ms_per_step")),
    ("shard_cpu_ms", "shard CPU ms/step", lambda r, run: r.get("shards_cpu_ms_per_step")),
]


def _ratio(wire, run):
    raw = (run.get("raw_tcp") or {}).get("stream_gbps")
    if wire is None or not raw:
        return None
    return wire / raw


def run_once(build, extra, out):
    exe = os.path.join(build, "bench", "gift-bench")
    giftd = os.path.join(build, "server", "giftd")
    cmd = [exe, "cluster", "--giftd", giftd, "--json", out] + extra
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-2000:])
        raise SystemExit(f"ab_cluster: {' '.join(cmd)} exited {p.returncode}")
    with open(out) as f:
        return json.load(f)


def rows_of(run):
    return {f"{r['codec']}/{r['transform']}": r for r in run.get("rows", [])}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--a", required=True, help="build tree A (the baseline)")
    ap.add_argument("--b", required=True, help="build tree B (the change)")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--a-args", default="", help="arguments for A's runs only")
    ap.add_argument("--b-args", default="", help="arguments for B's runs only")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("extra", nargs="*", help="arguments for gift-bench cluster (after --)")
    a = ap.parse_args()
    if a.pairs < 1 or a.pairs > 50:
        ap.error("--pairs must be 1..50")
    runs = {"a": [], "b": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.pairs):
            order = ("a", "b") if i % 2 == 0 else ("b", "a")
            for side in order:
                out = os.path.join(tmp, f"{side}{i}.json")
                own = shlex.split(getattr(a, side + "_args"))
                runs[side].append(run_once(getattr(a, side), a.extra + own, out))
                print(f"ab_cluster: pair {i + 1}/{a.pairs} {side} done", file=sys.stderr)
    result = {"a": a.a, "b": a.b, "pairs": a.pairs, "args": a.extra, "a_args": a.a_args,
              "b_args": a.b_args, "rows": {}}
    names = sorted(rows_of(runs["a"][0]))
    print(f"| row | figure | A median | B median | B/A median of pairs | B/A min..max |")
    print("|---|---|---:|---:|---:|---:|")
    for name in names:
        res = {}
        for key, label, get in FIELDS:
            va, vb, rat = [], [], []
            for ra, rb in zip(runs["a"], runs["b"]):
                x = get(rows_of(ra).get(name, {}), ra)
                y = get(rows_of(rb).get(name, {}), rb)
                if x is None or y is None:
                    continue
                va.append(x)
                vb.append(y)
                if x:
                    rat.append(y / x)
            if not rat:
                continue
            res[key] = {"a": va, "b": vb, "ratios": rat, "a_median": statistics.median(va),
                        "b_median": statistics.median(vb), "ratio_median": statistics.median(rat)}
            print(f"| {name} | {label} | {statistics.median(va):.3g} | {statistics.median(vb):.3g} | "
                  f"{statistics.median(rat):.3f} | {min(rat):.3f}..{max(rat):.3f} |")
        result["rows"][name] = res
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
