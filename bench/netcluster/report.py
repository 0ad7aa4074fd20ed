#!/usr/bin/python3
"""
bench/netcluster/report.py: assemble whatever pieces of bench/netcluster/run.sh
exist into per-arm JSON and CSV, one PNG of validation loss against wall
time per link setting, a markdown table and the issue's targets.

    report.py [--out DIR] [--seeds "1 2"] [--quiet]

Reads DIR/calibration.json and DIR/<link>/<arm>/s<seed>/{log.csv,
summary.json,cluster.json}; writes DIR/report/: <link>/<arm>.json (the
arm's figures, per seed and over seeds), <link>/<arm>.csv (validation loss
per seed against step and wall time), <link>.png, table.md (printed too)
and report.json.

Definitions. Wall time is the time spent in training steps (validation is
left out). A step's compute is the median step of the `none` arm (DDP with
no communication) at the same link and seed, else the calibration's; the
rest of the median step is waiting for communication. Wire bytes per step
per worker: giftd's own accounting (libgiftclient's bytes out + in, rank 0)
and eth0's tx + rx counters in rank 0's namespace, both over the training
steps only. The target is per seed: the final validation loss of
ddp-allreduce (the f32 allreduce arm) at that link and seed plus 1% (the
table prints their mean); time to target is the first wall time at which an
arm's validation loss of that seed is at or below it, and an arm's time is
the mean over its seeds only when every seed reached it. The limit is
ddp-allreduce's steps to target times the compute-only step. The pooled
target is the other reading of "the f32 allreduce arm's final loss + 1%":
ddp-allreduce's final loss averaged over its seeds, + 1%, one target for
every seed (it removes the reference's own seed noise from each seed's
target); its times and ratios are of the means over seeds, again only when
every seed reached it. CPU seconds per step count every worker and shard
process.
"""
import argparse
import csv
import json
import math
import os
import statistics
import sys

GIFTD_ARMS = ("f32", "bf16", "fp8", "fp8-gift", "nvfp4", "nvfp4-gift", "nvfp4-gift-colo")
DDP_ARMS = ("ddp-allreduce", "ddp-fp16", "ddp-powersgd", "ddp-powersgd-match")
ORDER = ("ddp-allreduce", "ddp-fp16", "ddp-powersgd", "ddp-powersgd-match") + GIFTD_ARMS + ("none",)
LINKS = ("starved", "paper")
SKIP = 5  # first steps left out of step-time statistics (start-up)


def pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return None
    k = (len(xs) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def load_piece(d):
    try:
        with open(os.path.join(d, "summary.json")) as fh:
            summ = json.load(fh)
        with open(os.path.join(d, "cluster.json")) as fh:
            clus = json.load(fh)
        with open(os.path.join(d, "log.csv")) as fh:
            rows = list(csv.DictReader(fh))
    except (OSError, ValueError):
        return None
    if not rows:
        return None
    steps = [float(r["step_s"]) for r in rows]
    body = steps[SKIP:] or steps
    curve = [(int(r["step"]), float(r["train_s"]), float(r["val_loss"]))
             for r in rows if r["val_loss"]]
    nd = [int(r["netdev_bytes"]) for r in rows[1:] if r.get("netdev_bytes")]
    wire = [int(r["wire_bytes"]) for r in rows[1:] if r.get("wire_bytes")]
    n = len(rows)
    shard_cpu = [c for c in clus.get("shard_cpu_s", []) if c is not None]
    return {
        "dir": d, "seed": summ["seed"], "steps": n, "params": summ["params"],
        "step_median_s": statistics.median(body), "step_p90_s": pct(body, 0.9),
        "curve": curve, "final_val_loss": summ["final_val_loss"],
        "giftd_bytes_per_step": statistics.mean(wire) if wire else None,
        "netdev_bytes_per_step": statistics.mean(nd) if nd else None,
        "worker_cpu_s_per_step": summ["cpu_s_per_step"],
        "cpu_s_per_step": summ["cpu_s_per_step"] * clus["workers"] + sum(shard_cpu) / n,
        "train_s": float(rows[-1]["train_s"]),
        "rate_mbit": clus["rate_mbit"], "delay_ms_applied": clus.get("delay_ms_applied"),
        "egress": clus.get("egress", "fifo"),  # pieces before --egress were one FIFO
        "workers": clus["workers"], "servers": clus["servers"], "colocated": clus["colocated"],
        "powersgd_rank": summ.get("powersgd_rank"), "date": clus.get("date"),
        "chunk_kib": (summ.get("args") or {}).get("chunk_kib"),
    }


def time_to(curve, target):
    for step, t, v in curve:
        if v <= target:
            return step, t
    return None, None


def mean_spread(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None, None
    return statistics.mean(xs), (max(xs) - min(xs)) / 2 if len(xs) > 1 else 0.0


def ms(x):
    return "–" if x is None else f"{x * 1e3:.0f}"


def fmt(x, f="{:.3f}", none="–"):
    return none if x is None else f.format(x)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench/out/netcluster")
    ap.add_argument("--quiet", action="store_true", help="write the files, print nothing")
    ap.add_argument("--seeds", help="only these seeds (e.g. \"1\"); the files go to "
                                    "DIR/report-s<seeds> instead of DIR/report")
    args = ap.parse_args(argv)
    only = {int(x) for x in args.seeds.replace(",", " ").split()} if args.seeds else None
    calib = {}
    try:
        with open(os.path.join(args.out, "calibration.json")) as fh:
            calib = json.load(fh)
    except (OSError, ValueError):
        pass
    rep_dir = os.path.join(args.out, "report" + (
        "-s" + "".join(str(x) for x in sorted(only)) if only else ""))
    os.makedirs(rep_dir, exist_ok=True)
    report = {"calibration": calib, "links": {}}
    md = []
    if calib:
        md.append(f"Calibration ({calib.get('date')}, {calib.get('nproc')} cores, {calib.get('cpu')}): "
                  f"compute-only step {calib['compute_step_s'] * 1e3:.1f} ms "
                  f"({calib['params'] / 1e6:.2f}M parameters, {calib['workers']} workers); "
                  f"an f32 ring allreduce moves {calib['f32_allreduce_bytes_per_worker'] / 1e6:.2f} MB "
                  f"per worker per step. " + "; ".join(
                      f"{link}: {calib[link]['rate_mbit']} Mbit/s per host (wanted: f32 allreduce "
                      f"{calib[link]['comm_x_compute_wanted']}x the compute; at the first rate, "
                      f"{calib[link]['rate_first_mbit']} Mbit/s, its step took "
                      f"{calib[link]['ddp_allreduce_step_s_at_first'] * 1e3:.0f} ms"
                      + (f"; calibrated {calib[link]['date']} against a "
                         f"{calib[link]['compute_step_s'] * 1e3:.1f} ms compute step"
                         if "compute_step_s" in calib[link] and "date" in calib[link] else "")
                      + ")" for link in LINKS if link in calib) + ".")
        md.append("")
    for link in LINKS:
        ldir = os.path.join(args.out, link)
        if not os.path.isdir(ldir):
            continue
        arms = {}
        for arm in sorted(os.listdir(ldir)):
            adir = os.path.join(ldir, arm)
            if not os.path.isdir(adir):
                continue
            pieces = [p for p in (load_piece(os.path.join(adir, s)) for s in sorted(os.listdir(adir))
                                  if s.startswith("s") and os.path.isdir(os.path.join(adir, s)))
                      if p and (only is None or p["seed"] in only)]
            if pieces:
                arms[arm] = pieces
        if not arms:
            continue
        # Targets are per seed: ddp-allreduce's final loss of the same seed + 1%.
        ref = {p["seed"]: p for p in arms.get("ddp-allreduce", [])}
        targets_by_seed = {s: p["final_val_loss"] * 1.01 for s, p in ref.items()}
        target = statistics.mean(targets_by_seed.values()) if targets_by_seed else None
        # Compute-only step per seed: the none arm, else the calibration's.
        comp = {p["seed"]: p["step_median_s"] for p in arms.get("none", [])}

        def compute_of(seed):
            return comp.get(seed, calib.get("compute_step_s"))

        limits = {}
        for seed, p in ref.items():
            s, _ = time_to(p["curve"], targets_by_seed[seed])
            if s is not None and compute_of(seed) is not None:
                limits[seed] = s * compute_of(seed)
        limit = statistics.mean(limits.values()) if limits else None
        # The pooled target: one for every seed, the mean above.
        pooled = {}
        for seed, p in ref.items():
            s, t = time_to(p["curve"], target)
            pooled[seed] = (s, t)
        pooled_ok = bool(pooled) and all(t is not None for _, t in pooled.values())
        ref_pooled_t = statistics.mean(t for _, t in pooled.values()) if pooled_ok else None
        limit_pooled = (statistics.mean(s * compute_of(seed) for seed, (s, _) in pooled.items())
                        if pooled_ok and all(compute_of(x) is not None for x in pooled) else None)
        lrep = {"target_val_loss": target, "targets_by_seed": targets_by_seed,
                "limit_s": limit, "limit_by_seed": limits,
                "pooled_limit_s": limit_pooled, "arms": {}}
        for arm in [a for a in ORDER if a in arms] + [a for a in arms if a not in ORDER]:
            ps = arms[arm]
            for p in ps:
                p["compute_s"] = compute_of(p["seed"])
                p["comm_wait_s"] = (p["step_median_s"] - p["compute_s"]
                                    if p["compute_s"] is not None else None)
                tg = targets_by_seed.get(p["seed"])
                p["target_val_loss"] = tg
                p["steps_to_target"], p["time_to_target_s"] = \
                    time_to(p["curve"], tg) if tg is not None else (None, None)
                r = ref.get(p["seed"])
                rt = r["time_to_target_s"] if r is not None and "time_to_target_s" in r else None
                p["ttt_x_ddp_allreduce"] = (p["time_to_target_s"] / rt
                                            if p["time_to_target_s"] is not None and rt else None)
                p["ttt_x_limit"] = (p["time_to_target_s"] / limits[p["seed"]]
                                    if p["time_to_target_s"] is not None and p["seed"] in limits
                                    else None)
                p["step_x_ddp_allreduce"] = (p["step_median_s"] / r["step_median_s"]
                                             if r is not None else None)
                p["steps_to_pooled_target"], p["time_to_pooled_target_s"] = \
                    time_to(p["curve"], target) if target is not None else (None, None)
            fin_m, fin_sp = mean_spread([p["final_val_loss"] for p in ps])
            paired = [p for p in ps if p["target_val_loss"] is not None]
            ttts = [p["time_to_target_s"] for p in paired]

            def all_or_none(key):
                xs = [p[key] for p in paired]
                return statistics.mean(xs) if xs and all(x is not None for x in xs) else None

            a = {
                "arm": arm, "link": link, "seeds": [p["seed"] for p in ps],
                "steps": ps[0]["steps"], "rate_mbit": ps[0]["rate_mbit"],
                "egress": "/".join(sorted({p["egress"] for p in ps})),
                "workers": ps[0]["workers"], "servers": ps[0]["servers"],
                "colocated": ps[0]["colocated"], "powersgd_rank": ps[0]["powersgd_rank"],
                "step_median_s": statistics.median(p["step_median_s"] for p in ps),
                "step_p90_s": statistics.median(p["step_p90_s"] for p in ps),
                "step_x_ddp_allreduce": mean_spread([p["step_x_ddp_allreduce"] for p in ps])[0],
                "compute_s": mean_spread([p["compute_s"] for p in ps])[0],
                "comm_wait_s": mean_spread([p["comm_wait_s"] for p in ps])[0],
                "giftd_bytes_per_step": mean_spread([p["giftd_bytes_per_step"] for p in ps])[0],
                "netdev_bytes_per_step": mean_spread([p["netdev_bytes_per_step"] for p in ps])[0],
                "final_val_loss_mean": fin_m, "final_val_loss_spread": fin_sp,
                "final_val_loss_by_seed": {p["seed"]: p["final_val_loss"] for p in ps},
                # Over the seeds with a ddp-allreduce run; None unless every one reached it.
                "time_to_target_s": all_or_none("time_to_target_s"),
                "ttt_x_ddp_allreduce": all_or_none("ttt_x_ddp_allreduce"),
                "ttt_x_limit": all_or_none("ttt_x_limit"),
                "time_to_pooled_target_s": None, "pooled_x_ddp_allreduce": None,
                "pooled_x_limit": None,
                "reached_pooled_target": sum(p["time_to_pooled_target_s"] is not None for p in ps),
                "paired_seeds": len(paired),
                "reached_target": sum(t is not None for t in ttts),
                "cpu_s_per_step": mean_spread([p["cpu_s_per_step"] for p in ps])[0],
                "per_seed": [{k: v for k, v in p.items() if k != "curve"} for p in ps],
            }
            tp = [p["time_to_pooled_target_s"] for p in ps]
            if target is not None and all(t is not None for t in tp):
                a["time_to_pooled_target_s"] = statistics.mean(tp)
                if ref_pooled_t:
                    a["pooled_x_ddp_allreduce"] = a["time_to_pooled_target_s"] / ref_pooled_t
                if limit_pooled:
                    a["pooled_x_limit"] = a["time_to_pooled_target_s"] / limit_pooled
            if a["giftd_bytes_per_step"] and a["netdev_bytes_per_step"]:
                a["netdev_over_giftd"] = a["netdev_bytes_per_step"] / a["giftd_bytes_per_step"]
            lrep["arms"][arm] = a
            os.makedirs(os.path.join(rep_dir, link), exist_ok=True)
            with open(os.path.join(rep_dir, link, arm + ".json"), "w") as fh:
                json.dump(a, fh, indent=1)
            with open(os.path.join(rep_dir, link, arm + ".csv"), "w") as fh:
                fh.write("seed,step,wall_s,val_loss\n")
                for p in ps:
                    for s, t, v in p["curve"]:
                        fh.write(f"{p['seed']},{s},{t:.4f},{v:.6f}\n")
        # A baseline that ran slower than it can: a communicating arm whose step
        # is shorter than the compute-only step of its seed (a negative wait for
        # communication) means the none arm ran on a busier machine. Its limit
        # ratios would flatter every arm, so they are withdrawn, the table says
        # so, and rerun.txt names the none pieces to run again (run.sh does).
        bad = sorted({(p["seed"], arm, p["step_median_s"], p["compute_s"])
                      for arm, ps in arms.items() if arm != "none" for p in ps
                      if p.get("comm_wait_s") is not None and p["comm_wait_s"] < 0})
        if bad:
            lrep["negative_comm_wait"] = [
                {"seed": s, "arm": a, "step_median_s": st, "compute_s": c} for s, a, st, c in bad]
            lrep["limit_s"] = lrep["pooled_limit_s"] = None
            for a in lrep["arms"].values():
                a["ttt_x_limit"] = a["pooled_x_limit"] = None
            report.setdefault("rerun", []).extend(
                sorted({f"{link}/none/s{s}" for s, _, _, _ in bad}))
        # The regime this table measured: ddp-allreduce's wait for communication
        # as a share of its step (the none arm's step of the same seed as its
        # compute; the mean over seeds), beside the share the calibration
        # wanted (a third on the paper link, three quarters starved).
        dr = [p for p in arms.get("ddp-allreduce", []) if p["seed"] in comp]
        if dr:
            lrep["ddp_allreduce_comm_share"] = statistics.mean(
                p["comm_wait_s"] / p["step_median_s"] for p in dr)
        if link in calib:
            w = calib[link]["comm_x_compute_wanted"]
            lrep["comm_share_wanted"] = w / (1 + w)
        report["links"][link] = lrep
        plot(link, arms, target, os.path.join(rep_dir, link + ".png"))
        md += table(link, lrep)
    md += targets(report)
    rerun = os.path.join(rep_dir, "rerun.txt")
    if report.get("rerun"):
        with open(rerun, "w") as fh:
            fh.write("\n".join(report["rerun"]) + "\n")
    elif os.path.exists(rerun):
        os.remove(rerun)
    with open(os.path.join(rep_dir, "report.json"), "w") as fh:
        json.dump(report, fh, indent=1)
    with open(os.path.join(rep_dir, "table.md"), "w") as fh:
        fh.write("\n".join(md) + "\n")
    if not args.quiet:
        print("\n".join(md))
        for link in report["links"]:
            print(f"plot: {os.path.join(rep_dir, link + '.png')}")
    return 0


def table(link, lrep):
    arms = lrep["arms"]
    rate = next(iter(arms.values()))["rate_mbit"]
    egress = "/".join(sorted({a["egress"] for a in arms.values()}))
    out = [f"### {link} link ({rate} Mbit/s per host, {egress} egress)", "",
           f"target: val loss <= ddp-allreduce's final of the same seed + 1% (mean "
           f"{fmt(lrep['target_val_loss'], '{:.4f}')}); limit (ddp-allreduce's steps to target x "
           f"the compute-only step): {fmt(lrep['limit_s'], '{:.1f} s')}; pooled target: the "
           f"mean itself for every seed (limit {fmt(lrep['pooled_limit_s'], '{:.1f} s')})"
           + (f"; ddp-allreduce waited for communication {lrep['ddp_allreduce_comm_share']:.0%} "
              f"of its step (the none arm's step as its compute, same seeds; the setting wants "
              f"{fmt(lrep.get('comm_share_wanted'), '{:.0%}')})"
              if lrep.get("ddp_allreduce_comm_share") is not None else ""), "",
           "| arm | seeds | step ms median / p90 | compute / comm wait ms | MB/step/worker "
           "(eth0; giftd) | final val loss | time to target s | x ddp-allreduce | "
           "time to pooled target s (x ddp-allreduce) | CPU s/step |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for b in lrep.get("negative_comm_wait", []):
        out.insert(2, f"**FLAGGED, do not report**: {b['arm']} seed {b['seed']} stepped in "
                   f"{b['step_median_s'] * 1e3:.1f} ms, below the compute-only step "
                   f"{b['compute_s'] * 1e3:.1f} ms (a negative communication wait: the none arm "
                   f"ran slower than it can); the limits and ratios to them are withdrawn; rerun "
                   f"the none arm of that seed (run.sh does, report/rerun.txt).")
        out.insert(3, "")
    for name, a in arms.items():
        ttt, rel = a["time_to_target_s"], a["ttt_x_ddp_allreduce"]
        reached = ("(compute only)" if name == "none" else
                   f"{fmt(ttt, '{:.1f}')}" if ttt is not None else
                   "no ddp-allreduce seed" if not a["paired_seeds"] else
                   f"reached {a['reached_target']}/{a['paired_seeds']}")
        label = name + (f" (rank {a['powersgd_rank']})" if a["powersgd_rank"] else "")
        tp = a["time_to_pooled_target_s"]
        pooled = ("–" if name == "none" else
                  f"{tp:.1f} ({fmt(a['pooled_x_ddp_allreduce'], '{:.2f}x')})" if tp is not None else
                  f"reached {a['reached_pooled_target']}/{len(a['seeds'])}")
        out.append(
            f"| {label} | {len(a['seeds'])} | {a['step_median_s'] * 1e3:.0f} / "
            f"{a['step_p90_s'] * 1e3:.0f} | {ms(a['compute_s'])} / {ms(a['comm_wait_s'])} | "
            f"{fmt(a['netdev_bytes_per_step'] and a['netdev_bytes_per_step'] / 1e6, '{:.3f}')}; "
            f"{fmt(a['giftd_bytes_per_step'] and a['giftd_bytes_per_step'] / 1e6, '{:.3f}')} | "
            f"{a['final_val_loss_mean']:.4f} ± {a['final_val_loss_spread']:.4f} | {reached} | "
            f"{fmt(rel, '{:.2f}x')} | {pooled} | {a['cpu_s_per_step']:.3f} |")
    out.append("")
    return out


def targets(report):
    """The issue's figures: met, not met, or not measured."""
    rows = []

    def a(link, arm, key):
        return report["links"].get(link, {}).get("arms", {}).get(arm, {}).get(key)

    def unreached(link, arm):
        x = report["links"].get(link, {}).get("arms", {}).get(arm)
        if x is None or not x["paired_seeds"]:
            return "–"
        return f"target reached on {x['reached_target']} of {x['paired_seeds']} seeds"

    def verdict(v, bound, at_most=True, arm=None):
        if v is None:
            # Measured, but the target was not reached on every seed.
            if arm and unreached(*arm) != "–":
                return "not met"
            return "not measured"
        return "met" if (v <= bound if at_most else v >= bound) else "not met"

    def ratio(x, y):
        return x / y if x is not None and y else None

    present = [link for link in LINKS if link in report["links"]]
    for link, bound in [(lk, b) for lk, b in (("starved", 0.4), ("paper", 0.8)) if lk in present]:
        r = a(link, "nvfp4-gift", "ttt_x_ddp_allreduce")
        rows.append((f"{link}: nvfp4-gift time to target / ddp-allreduce's",
                     fmt(r, "{:.2f}x", unreached(link, "nvfp4-gift")), f"<= {bound}x",
                     verdict(r, bound, arm=(link, "nvfp4-gift"))))
    if "starved" in present:
        r = a("starved", "nvfp4-gift", "ttt_x_limit")
        rows.append(("starved: nvfp4-gift time to target / compute-only limit",
                     fmt(r, "{:.2f}x", unreached("starved", "nvfp4-gift")), "<= 1.3x",
                     verdict(r, 1.3, arm=("starved", "nvfp4-gift"))))

    def pooled_unreached(link, arm):
        x = report["links"].get(link, {}).get("arms", {}).get(arm)
        if x is None or report["links"][link]["target_val_loss"] is None:
            return "–"
        return f"pooled target reached on {x['reached_pooled_target']} of {len(x['seeds'])} seeds"

    for link, key, bound, what in [(lk, k, b, w) for lk, k, b, w in (
            ("starved", "pooled_x_ddp_allreduce", 0.4, "/ ddp-allreduce's"),
            ("starved", "pooled_x_limit", 1.3, "/ compute-only limit"),
            ("paper", "pooled_x_ddp_allreduce", 0.8, "/ ddp-allreduce's")) if lk in present]:
        r = a(link, "nvfp4-gift", key)
        shown = fmt(r, "{:.2f}x", pooled_unreached(link, "nvfp4-gift"))
        ref = report["links"].get(link, {}).get("arms", {}).get("ddp-allreduce")
        x = report["links"].get(link, {}).get("arms", {}).get("nvfp4-gift")
        if r is not None or shown == "–":
            v = verdict(r, bound)
        elif (x and ref
              and x["reached_pooled_target"] == len(x["seeds"])
              and ref["reached_pooled_target"] < len(ref["seeds"])):
            # nvfp4-gift got there on every seed, the reference did not: no ratio.
            shown = (f"nvfp4-gift {x['time_to_pooled_target_s']:.1f} s on every seed; "
                     f"ddp-allreduce reached it on {ref['reached_pooled_target']} of "
                     f"{len(ref['seeds'])}")
            v = "no ratio"
        else:
            v = "not met"
        rows.append((f"{link}: nvfp4-gift time to pooled target {what}", shown, f"<= {bound}x", v))
    for link in present:
        best = None
        for g in GIFTD_ARMS:
            t = a(link, g, "time_to_target_s")
            if t is not None and (best is None or t < best[1]):
                best = (g, t)
        for base in ("ddp-fp16", "ddp-powersgd", "ddp-powersgd-match"):
            tb = a(link, base, "time_to_target_s")
            have_base = link in report["links"] and base in report["links"][link]["arms"]
            have_gift = any(g in report["links"][link]["arms"] for g in GIFTD_ARMS)
            if not have_base or not have_gift:
                v = "not measured"
                shown = "–"
            elif best is None:
                v = "not met" if tb is not None else "neither reached it on every seed"
                shown = f"no giftd arm reached it on every seed; {base} {fmt(tb, '{:.1f} s')}"
            elif tb is None:
                v, shown = "met", f"{best[0]} {best[1]:.1f} s; {base} did not reach it"
            else:
                v = "met" if best[1] < tb else "not met"
                shown = f"{best[0]} {best[1]:.1f} s vs {tb:.1f} s"
            rows.append((f"{link}: giftd's best arm sooner than {base}", shown, "sooner", v))
    for link in present:
        r = a(link, "f32", "step_x_ddp_allreduce")
        rows.append((f"{link}: giftd f32 step / ddp-allreduce step", fmt(r, "{:.2f}x"), "<= 1.10x",
                     verdict(r, 1.10)))
    for link in present:
        for arm, bound in (("nvfp4-gift", 0.01), ("fp8-gift", 0.005)):
            f, g = a(link, arm, "final_val_loss_by_seed") or {}, a(link, "f32", "final_val_loss_by_seed") or {}
            common = [s for s in f if s in g]
            r = statistics.mean(f[s] / g[s] - 1 for s in common) if common else None
            rows.append((f"{link}: {arm} final val loss vs giftd f32", fmt(r, "{:+.2%}"),
                         f"<= +{bound:.1%}", verdict(r, bound)))
    for link in present:
        for arm, x in report["links"].get(link, {}).get("arms", {}).items():
            if "netdev_over_giftd" in x:
                r = abs(x["netdev_over_giftd"] - 1)
                rows.append((f"{link}: {arm} eth0 bytes vs giftd accounting",
                             f"{x['netdev_over_giftd'] - 1:+.2%}", "within 5%", verdict(r, 0.05)))
    out = ["### Targets", "", "| figure | measured | needed | verdict |", "|---|---|---|---|"]
    out += [f"| {f} | {m} | {n} | {v} |" for f, m, n, v in rows if v != "not measured"]
    missing = [f for f, _, _, v in rows if v == "not measured"]
    if missing:
        out += ["", f"not measured (an arm they need was not run): {'; '.join(missing)}"]
    return out + [""]


def plot(link, arms, target, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("report.py: no matplotlib; no plot", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(9, 5.5))
    cmap = plt.get_cmap("tab10")
    for arm in (a for a in ORDER if a != "none"):
        if arm not in arms:
            continue
        group = DDP_ARMS if arm in DDP_ARMS else GIFTD_ARMS
        k = group.index(arm)
        # PyTorch's arms dashed, giftd's solid; later seeds fainter.
        for i, p in enumerate(arms[arm]):
            xs = [t for _, t, _ in p["curve"]]
            ys = [v for _, _, v in p["curve"]]
            ax.plot(xs, ys, lw=1.4 if i == 0 else 0.8, ls="--" if arm in DDP_ARMS else "-",
                    color=cmap(k), label=arm if i == 0 else None, alpha=1 if i == 0 else 0.6)
    if target is not None:
        ax.axhline(target, color="k", ls=":", lw=1,
                   label="target (ddp-allreduce final + 1%, mean over seeds)")
    ax.set_xlabel("wall time in training steps (s)")
    ax.set_ylabel("validation loss")
    ax.set_title(f"{link} link: validation loss against wall time")
    ys = [v for ps in arms.values() for p in ps for _, _, v in p["curve"]]
    if ys and target:
        ax.set_ylim(min(ys) - 0.02, min(max(ys), target + 0.6))
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
