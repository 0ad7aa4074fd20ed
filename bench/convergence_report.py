#!/usr/bin/python3
"""
bench/convergence_report.py: the tables and the plot of bench/convergence.sh.

  convergence_report.py report --out DIR
      reads DIR/runs/<comm>-s<seed>/{log.csv,summary.json}; writes
      DIR/convergence.png (train loss, smoothed, and validation loss per
      comm, mean over seeds), DIR/convergence.md and DIR/convergence.json,
      and prints the markdown table (plus DIR/fidelity/fidelity.md if present).

  convergence_report.py fidelity --dump DIR --bench GIFT_BENCH --out DIR
      runs `gift-bench fidelity` on every dumped (step, layer): the workers'
      local gradients (--grad) and input covariances (--cov); the geometry is
      sketched from the covariances of the previous dumped step when there is
      one at most --max-lag steps earlier (--sketch-cov), as in training where the
      geometry lags the step it is used at; else from the step's own covariances
      ("same": optimistic, and the whitened metric then uses the very matrix the
      geometry was built from).
      --geometry-from grad-gram: the geometry is sketched instead from the Gram
      matrix of the previous dumped step's mean gradient, Gbar^T Gbar / rows
      (a worker that cannot see activations may sketch the averaged gradient
      instead; docs/ARCHITECTURE.md, "The transform"); every worker holds the same Gbar after its
      pull, so each worker's sketch file is that one matrix (needs numpy).
      Writes one JSON per (step, layer) and fidelity.md; for a step with three or
      more dumped layers also the errors of the whole dumped update (every
      layer in its own metric, model-wide.json).

  convergence_report.py decay --dump DIR --bench GIFT_BENCH --out DIR
                              [--refresh 20] [--steps 150,299] [--decays 0,0.5,0.8,0.9]
      the geometry as training builds it, with and without a running average
      of the covariance: for each measured step m, the sketches are the
      dumped covariances of every refresh step s < m (s a multiple of
      --refresh), in order, one round each, through gift_geometry_update_decay
      with each --decays value (gift-bench fidelity --sketch-cov ... x rounds
      --geometry-decay B); plus "same" (the step's own covariance) for
      reference. Writes decay.md, decay-summary.json and one JSON per run.
  convergence_report.py policy --dump DIR --bench GIFT_BENCH --out DIR
                               [--budgets 4.5,6] [--refresh 50] [--max-lag 25]
      the per-tensor chooser (codec/gift_policy.h) on every dumped step, whole
      model at once (`gift-bench policy`): the geometry sketched from the
      previous dumped step's covariances (as training lags it) and the
      chooser's gbar the previous step's mean gradient ("lag"), or the step's
      own mean gradient with the same geometry ("own gbar": what the lag of the
      gradient costs); a step with no previous dump within --max-lag uses its
      own covariances and gradient ("same"). Policies all / none / auto / hits,
      budget unset and each --budgets value; errors measured with the real
      codecs on the step's per-worker gradients, over Euclidean fp8. Writes
      policy.md, policy-summary.json and one JSON and table per run. --steps
      a,b measures only those dumped steps; --merge keeps the runs of earlier
      invocations into the same --out.
"""
import argparse
import csv
import glob
import json
import math
import os
import subprocess
import sys

ORDER = ["f32", "bf16", "fp8", "fp8-gift", "nvfp4", "nvfp4-gift"]


def _mean(xs):
    return sum(xs) / len(xs)


def _median(xs):
    xs = sorted(xs)
    n = len(xs)
    return (xs[n // 2] + xs[(n - 1) // 2]) / 2 if xs else float("nan")


def _std(xs):
    if len(xs) < 2:
        return float("nan")
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def load_runs(out):
    runs = {}
    for d in sorted(glob.glob(os.path.join(out, "runs", "*-s*"))):
        sp = os.path.join(d, "summary.json")
        if not os.path.exists(sp):
            continue
        s = json.load(open(sp))
        rows = list(csv.DictReader(open(os.path.join(d, "log.csv"))))
        s["log"] = rows
        srv = os.path.join(d, "server.json")
        s["geometry_decay"] = json.load(open(srv))["geometry_decay"] if os.path.exists(srv) \
            else 0.0
        runs.setdefault(s["comm"], {})[s["seed"]] = s
    return runs


def report(args):
    runs = load_runs(args.out)
    if not runs:
        sys.exit(f"convergence_report: no runs under {args.out}/runs")
    comms = [c for c in ORDER if c in runs] + sorted(c for c in runs if c not in ORDER)
    base = runs.get("f32", {})
    base_mean = _mean([r["final_val_loss"] for r in base.values()]) if base else None
    base_wire = _mean([r["wire_bytes_per_step"] for r in base.values()]) if base else None
    any_run = next(iter(next(iter(runs.values())).values()))
    a = any_run["args"]
    table, result = [], {"config": {k: a[k] for k in ("steps", "dim", "layers", "heads", "seq",
                                                      "batch", "optim", "refresh", "gift_min")},
                         "world": any_run["world"], "params": any_run["params"], "comms": {}}
    spread_f32 = _std([r["final_val_loss"] for r in base.values()]) if base else float("nan")
    hdr = ("| comm | seeds | final val loss (mean ± sd) | gap to f32 | paired Δ vs f32 per seed | "
           "wire MB/step/worker, mean | median | f32 / this (mean) | steps/s |")
    table.append(hdr)
    table.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    notes = []
    for c in comms:
        rs = runs[c]
        vl = [rs[s]["final_val_loss"] for s in sorted(rs)]
        m, sd = _mean(vl), _std(vl)
        wire = _mean([r["wire_bytes_per_step"] for r in rs.values()])
        med = _mean([_median([float(x["wire_bytes"]) for x in r["log"][1:]]) for r in rs.values()])
        sps = _mean([r["steps_per_s"] for r in rs.values()])
        gap = 100.0 * (m - base_mean) / base_mean if base_mean else float("nan")
        paired = [rs[s]["final_val_loss"] - base[s]["final_val_loss"] for s in sorted(rs)
                  if s in base]
        ptxt = "–" if c == "f32" or not paired else \
            ", ".join(f"{p:+.4f}" for p in paired)
        sdtxt = f" ± {sd:.4f}" if not math.isnan(sd) else ""
        table.append(f"| {c} | {len(vl)} | {m:.4f}{sdtxt} | "
                     f"{'–' if c == 'f32' else f'{gap:+.2f}%'} | {ptxt} | "
                     f"{wire / 1e6:.3f} | {med / 1e6:.3f} | "
                     f"{'–' if not base_wire or c == 'f32' else f'1/{base_wire / wire:.1f}'} | "
                     f"{sps:.2f} |")
        noise = max(x for x in (sd, spread_f32) if not math.isnan(x)) \
            if not (math.isnan(sd) and math.isnan(spread_f32)) else float("nan")
        if c != "f32" and base_mean is not None:
            if math.isnan(noise):
                verdict = "one seed: no spread to compare with"
            elif abs(m - base_mean) <= noise:
                verdict = f"within the seed spread (|Δ| {abs(m - base_mean):.4f} <= sd {noise:.4f})"
            else:
                verdict = (f"{'worse' if m > base_mean else 'better'} than f32 by more than the "
                           f"seed spread (|Δ| {abs(m - base_mean):.4f} > sd {noise:.4f})")
            notes.append(f"- {c}: {verdict}")
        result["comms"][c] = {"seeds": sorted(rs), "final_val_loss": vl, "mean": m, "sd": sd,
                              "gap_to_f32_pct": gap, "paired_delta": paired,
                              "wire_bytes_per_step": wire, "wire_bytes_median": med,
                              "steps_per_s": sps,
                              "geometry_decay": sorted({r["geometry_decay"] for r in rs.values()}),
                              "epochs_switched": [r["epochs_switched"] for r in rs.values()]}
    cfg = result["config"]
    decays = sorted({r["geometry_decay"] for c in comms if c.endswith("-gift")
                     for r in runs[c].values()})
    head = (f"{result['params'] / 1e6:.2f}M-parameter byte-level Llama (dim {cfg['dim']}, "
            f"{cfg['layers']} layers, {cfg['heads']} heads, seq {cfg['seq']}, batch "
            f"{cfg['batch']}/worker), {result['world']} workers, optimiser {cfg['optim']}, "
            f"{cfg['steps']} steps, GIFT refresh {cfg['refresh']}"
            f"{', geometry decay ' + '/'.join(f'{d:g}' for d in decays) if decays else ''}"
            f". Final val loss: after the "
            f"last step; sd: sample standard deviation over seeds; paired Δ: this comm's final "
            f"val loss minus f32's with the same seed (same init and data). Wire bytes: "
            f"this worker's push + pull bytes on the wire, headers included; the mean includes "
            f"the refresh steps' sketches and geometry epochs, the median is a typical step.")
    md = [head, "", *table, "", *notes]
    fid = os.path.join(args.out, "fidelity", "fidelity.md")
    text = "\n".join(md) + "\n"
    with open(os.path.join(args.out, "convergence.md"), "w") as fh:
        fh.write(text)
    with open(os.path.join(args.out, "convergence.json"), "w") as fh:
        json.dump(result, fh, indent=1)
    print(text)
    if os.path.exists(fid):
        print(open(fid).read())
    plot(runs, comms, os.path.join(args.out, "convergence.png"), head)


def plot(runs, comms, path, title):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("convergence_report: no matplotlib; no plot", file=sys.stderr)
        return
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.5))
    for c in comms:
        rs = runs[c]
        logs = [rs[s]["log"] for s in sorted(rs)]
        n = min(len(lg) for lg in logs)
        steps = [int(logs[0][i]["step"]) for i in range(n)]
        tl = [_mean([float(lg[i]["train_loss"]) for lg in logs]) for i in range(n)]
        ema, sm = None, []
        for v in tl:
            ema = v if ema is None else 0.9 * ema + 0.1 * v
            sm.append(ema)
        ax[0].plot(steps, sm, label=c, lw=1.2)
        vs = [(int(logs[0][i]["step"]), _mean([float(lg[i]["val_loss"]) for lg in logs]))
              for i in range(n) if logs[0][i]["val_loss"]]
        ax[1].plot([s for s, _ in vs], [v for _, v in vs], marker="o", ms=3, label=c, lw=1.2)
    ax[0].set_title("train loss (EMA 0.9, mean over seeds)")
    ax[1].set_title("validation loss (mean over seeds)")
    for a in ax:
        a.set_xlabel("step")
        a.grid(alpha=0.3)
        a.legend()
    lo = min(min(float(r["val_loss"]) for r in s["log"] if r["val_loss"])
             for rs in runs.values() for s in rs.values())
    ax[1].set_ylim(lo - 0.05, lo + 1.0)
    ax[0].set_ylim(lo - 0.1, lo + 1.5)
    import textwrap
    fig.suptitle("\n".join(textwrap.wrap(title.split(" Final val")[0], 160)), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def fidelity(args):
    os.makedirs(args.out, exist_ok=True)
    steps = sorted(int(os.path.basename(d)[4:]) for d in glob.glob(os.path.join(args.dump,
                                                                                "step*")))
    lines, summary = [], []
    prev = None
    for s in steps:
        d = os.path.join(args.dump, f"step{s}")
        shapes = json.load(open(os.path.join(d, "shapes.json")))
        for layer in sorted({k.rsplit(".", 1)[0] for k in shapes}):
            rows, cols = shapes[layer + ".grad"]
            grads = sorted(glob.glob(os.path.join(d, f"{layer}.grad.rank*.f32")))
            covs = sorted(glob.glob(os.path.join(d, f"{layer}.cov.rank*.f32")))
            cmd = [args.bench, "fidelity", "--rows", str(rows), "--cols", str(cols)]
            if args.damping is not None:
                cmd += ["--damping", str(args.damping)]
            for g in grads:
                cmd += ["--grad", g]
            for c in covs:
                cmd += ["--cov", c]
            sk = None
            if prev is not None and s - prev <= args.max_lag:
                if args.geometry_from == "grad-gram":
                    pcovs = [grad_gram(args, prev, layer, rows, cols)] * len(covs)
                else:
                    pcovs = sorted(glob.glob(os.path.join(args.dump, f"step{prev}",
                                                          f"{layer}.cov.rank*.f32")))
                if len(pcovs) == len(covs):
                    sk = prev
                    for c in pcovs:
                        cmd += ["--sketch-cov", c]
            js = os.path.join(args.out, f"step{s}-{layer}.json")
            summary.append(summarise(run_fidelity(cmd, js), s, layer, sk, rows, cols))
        prev = s
    md = fidelity_md(summary)
    wide, wide_rows = model_wide(summary)
    if wide:
        md += "\n" + wide
        with open(os.path.join(args.out, "model-wide.json"), "w") as fh:
            json.dump(wide_rows, fh, indent=1)
    with open(os.path.join(args.out, "fidelity.md"), "w") as fh:
        fh.write(md)
    with open(os.path.join(args.out, "fidelity-summary.json"), "w") as fh:
        json.dump(summary, fh, indent=1)
    print(md)


def model_wide(summary):
    """The errors of the whole dumped update, per step with more than two
    layers: each layer's relative errors weighted by its own size in the
    metric (||NS5(Gbar)|| for Muon, ||Gbar L|| for the whitened metric, both
    from gift-bench's true_norms), i.e. ||concat(errors)|| / ||concat(true)||;
    and the Muon update as train_llama's Muon applies it: the blocks' matrices
    only (the head is AdamW's), each scaled by sqrt(max(1, rows/cols)).
    Returns (markdown, rows); ('', []) without such a step."""
    out, data = [], []
    for step in sorted({s["step"] for s in summary}):
        rows = [s for s in summary if s["step"] == step]
        if len(rows) < 3 or any(s["true_norms"] is None for s in rows):
            continue
        wm = [s["true_norms"]["muon"] for s in rows]
        ww = [s["true_norms"]["whitened"] for s in rows]
        # Muon as applied: train_llama's Muon takes the blocks' 2-D weights and
        # scales each update by sqrt(max(1, rows/cols)); the head is AdamW's.
        wa = [m * max(1.0, s["shape"][0] / s["shape"][1]) ** 0.5
              if s["layer"].startswith("blocks.") else 0.0 for m, s in zip(wm, rows)]

        def agg(key, w):
            num = sum((s[key] * x) ** 2 for s, x in zip(rows, w))
            return math.sqrt(num / sum(x * x for x in w))

        e8w, e8m = agg("e8_whitened", ww), agg("e8_muon", wm)
        e8a = agg("e8_muon", wa) if any(wa) else None
        sk = rows[0]["sketch_step"]
        r = {"step": step, "sketch_step": sk, "layers": [s["layer"] for s in rows],
             "weight_muon": wm, "weight_whitened": ww, "weight_muon_applied": wa,
             "g8_whitened_ratio": agg("g8_whitened", ww) / e8w,
             "g8_muon_ratio": agg("g8_muon", wm) / e8m,
             "g4_full_whitened_ratio": agg("g4_full_whitened", ww) / e8w,
             "g4_full_muon_ratio": agg("g4_full_muon", wm) / e8m,
             "g4_default_whitened_ratio": agg("g4_default_whitened", ww) / e8w,
             "e4_whitened_ratio": agg("e4_whitened", ww) / e8w,
             "e4_muon_ratio": agg("e4_muon", wm) / e8m,
             "g8_muon_applied_ratio": agg("g8_muon", wa) / e8a if e8a else None,
             "g4_full_muon_applied_ratio": agg("g4_full_muon", wa) / e8a if e8a else None}
        data.append(r)
        cells = [_x(r[k]) for k in ("g8_whitened_ratio", "g8_muon_ratio", "g4_full_whitened_ratio",
                                    "g4_full_muon_ratio", "g4_default_whitened_ratio",
                                    "e4_whitened_ratio", "e4_muon_ratio", "g8_muon_applied_ratio",
                                    "g4_full_muon_applied_ratio")]
        meeting = (f"{sum(s['g8_whitened_ratio'] <= 0.4 for s in rows)} / "
                   f"{sum(s['g8_muon_ratio'] <= 0.5 for s in rows)} / "
                   f"{sum(s['nvfp4_curve'][-1][1] < 1.0 for s in rows)}")
        out.append(f"| {step} | {sk if sk is not None else 'same'} | {len(rows)} | "
                   + " | ".join(cells) + f" | {meeting} |")
    if not out:
        return "", []
    return "\n".join([
        "The whole dumped update (every layer above at a step): ||concat(errors)|| / "
        "||concat(true)||, each layer in its own metric (the Muon update NS5(Gbar); the "
        "whitened Gbar L), over Euclidean fp8's; GIFT fp8 at the default k; 'as applied': the "
        "Muon update as train_llama's Muon applies it (the blocks' matrices, each scaled by "
        "sqrt(max(1, rows/cols)); the head is AdamW's); last column: layers "
        "meeting GIFT fp8 whitened <= 0.4x / Muon <= 0.5x / GIFT nvfp4 full-rank whitened < 1x:",
        "",
        "| step | sketched at | layers | GIFT fp8 whitened | GIFT fp8 Muon | GIFT nvfp4 full k "
        "whitened | GIFT nvfp4 full k Muon | GIFT nvfp4 default k whitened | Eucl. nvfp4 whitened "
        "| Eucl. nvfp4 Muon | GIFT fp8 Muon, as applied | GIFT nvfp4 full k Muon, as applied "
        "| layers meeting |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"] + out) + "\n", data


def grad_gram(args, step, layer, rows, cols):
    """Writes Gbar^T Gbar / rows of the workers' mean gradient at a dumped step
    (f32, cols x cols) into args.out; returns its path."""
    import numpy as np
    gs = sorted(glob.glob(os.path.join(args.dump, f"step{step}", f"{layer}.grad.rank*.f32")))
    g = sum(np.fromfile(f, dtype=np.float32).astype(np.float64).reshape(rows, cols)
            for f in gs) / len(gs)
    path = os.path.join(args.out, f"step{step}-{layer}.gradgram.f32")
    (g.T @ g / rows).astype(np.float32).tofile(path)
    return path


def run_fidelity(cmd, js):
    """Runs gift-bench fidelity (cmd) writing JSON to js and its table beside it
    (.txt, the command first); exits on failure. Returns the parsed JSON."""
    cmd = cmd + ["--json", js]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout, r.stderr, file=sys.stderr)
        sys.exit(f"convergence_report: {' '.join(cmd)} failed")
    with open(js.replace(".json", ".txt"), "w") as fh:
        fh.write(" ".join(cmd) + "\n\n" + r.stdout)
    with open(js) as fh:
        return json.load(fh)


def summarise(j, step, layer, sketch_step, nrows, ncols):
    rows = j["rows"]  # the result rows

    def pick(fmt, transform, pred=lambda r: True):
        return [r for r in rows if r["format"] == fmt and r["transform"] == transform and pred(r)]

    e8 = pick("fp8-e4m3", "euclidean")[0]
    e4 = pick("nvfp4", "euclidean")[0]
    g8 = pick("fp8-e4m3", "gift", lambda r: r.get("k_default"))[0]
    g4d = pick("nvfp4", "gift", lambda r: r.get("k_default"))[0]
    g4f = pick("nvfp4", "gift", lambda r: r.get("k_full"))[0]
    curve = sorted(((r["k"], r["whitened"] / e8["whitened"], r["muon"] / e8["muon"])
                    for r in pick("nvfp4", "gift")), key=lambda t: t[0])
    first = next((k for k, w, _ in curve if w < 1.0), None)
    curve8 = sorted(((r["k"], r["whitened"] / e8["whitened"], r["muon"] / e8["muon"])
                     for r in pick("fp8-e4m3", "gift")), key=lambda t: t[0])
    return {"step": step, "layer": layer, "shape": [nrows, ncols],
            "k_default": j["k_default"], "sketch_step": sketch_step,
            "e8_whitened": e8["whitened"], "e8_muon": e8["muon"],
            "g8_oracle_whitened_ratio": j.get("fp8_oracle_whitened_ratio"),
            "true_norms": j.get("true_norms"),
            "e4_whitened": e4["whitened"], "e4_muon": e4["muon"],
            "g8_whitened": g8["whitened"], "g8_muon": g8["muon"],
            "g4_default_whitened": g4d["whitened"], "g4_default_muon": g4d["muon"],
            "g4_full_whitened": g4f["whitened"], "g4_full_muon": g4f["muon"],
            "g8_whitened_ratio": g8["whitened"] / e8["whitened"],
            "g8_muon_ratio": g8["muon"] / e8["muon"],
            "g8_rel_l2_ratio": g8["rel_l2"] / e8["rel_l2"],
            "e4_whitened_ratio": e4["whitened"] / e8["whitened"],
            "e4_muon_ratio": e4["muon"] / e8["muon"],
            "g4_default_whitened_ratio": g4d["whitened"] / e8["whitened"],
            "nvfp4_curve": curve, "nvfp4_first_k_below_e8": first, "fp8_curve": curve8}


def _x(v):
    return f"{v:.2f}x" if v is not None else "–"


def fidelity_md(summary):
    out = ["Real gradients (local gradients of both workers, their input covariances; "
           "ratios are against Euclidean fp8-e4m3 on the same data; geometry sketched from the "
           "covariances of the step named in 'sketched at', at the default rank k unless "
           "stated; 'own-step prediction': GIFT fp8's whitened ratio with the measured step's "
           "own covariance as geometry, as fp8's relative error predicts it from the data "
           "(gift-bench fidelity's fp8_oracle_whitened_ratio)):", "",
           "| layer | step | sketched at | k | GIFT fp8 muon | GIFT fp8 whitened | "
           "own-step prediction | GIFT fp8 RelL2 | "
           "Eucl. nvfp4 whitened | Eucl. nvfp4 muon | GIFT nvfp4 whitened (k) | "
           "nvfp4 < fp8 from k |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in summary:
        out.append(
            f"| {s['layer']} {s['shape'][0]}x{s['shape'][1]} | {s['step']} | {s['sketch_step'] if s['sketch_step'] is not None else 'same'}"
            f" | {s['k_default']} | {s['g8_muon_ratio']:.2f}x | {s['g8_whitened_ratio']:.2f}x | "
            f"{_x(s['g8_oracle_whitened_ratio'])} | {s['g8_rel_l2_ratio']:.2f}x | {s['e4_whitened_ratio']:.2f}x | "
            f"{s['e4_muon_ratio']:.2f}x | {s['g4_default_whitened_ratio']:.2f}x | "
            f"{s['nvfp4_first_k_below_e8'] if s['nvfp4_first_k_below_e8'] else 'never'} |")
    for key, what, idx in (("nvfp4_curve", "GIFT nvfp4 whitened error", 1),
                           ("nvfp4_curve", "GIFT nvfp4 Muon-update error", 2),
                           ("fp8_curve", "GIFT fp8 whitened error", 1),
                           ("fp8_curve", "GIFT fp8 Muon-update error", 2)):
        out += ["", f"{what} / Euclidean fp8's, by rank k:", ""]
        ks = sorted({t[0] for s in summary for t in s[key]})
        out.append("| layer | step | sketched at | " + " | ".join(f"k={k}" for k in ks) + " |")
        out.append("|---|---:|---:|" + "---:|" * len(ks))
        for s in summary:
            cur = {t[0]: t[idx] for t in s[key]}
            sk = s["sketch_step"] if s["sketch_step"] is not None else "same"
            out.append(f"| {s['layer']} | {s['step']} | {sk} | " +
                       " | ".join(f"{cur[k]:.2f}" if k in cur else "" for k in ks) + " |")
    return "\n".join(out) + "\n"


def decay(args):
    """The lag table with and without the running average (see the module doc)."""
    os.makedirs(args.out, exist_ok=True)
    dumped = sorted(int(os.path.basename(d)[4:]) for d in glob.glob(os.path.join(args.dump,
                                                                                 "step*")))
    measured = [int(x) for x in args.steps.split(",")]
    decays = [(float(x.rstrip("p")), x.endswith("p")) for x in args.decays.split(",")]
    summary = []
    for m in measured:
        d = os.path.join(args.dump, f"step{m}")
        shapes = json.load(open(os.path.join(d, "shapes.json")))
        rounds = [s for s in dumped if s % args.refresh == 0 and s < m]
        if not rounds:
            sys.exit(f"convergence_report: no dumped refresh step (a multiple of {args.refresh}) "
                     f"before step {m}; dump them with --dump-steps")
        for layer in sorted({k.rsplit(".", 1)[0] for k in shapes}):
            rows, cols = shapes[layer + ".grad"]
            base = [args.bench, "fidelity", "--rows", str(rows), "--cols", str(cols)]
            for g in sorted(glob.glob(os.path.join(d, f"{layer}.grad.rank*.f32"))):
                base += ["--grad", g]
            covs = sorted(glob.glob(os.path.join(d, f"{layer}.cov.rank*.f32")))
            for c in covs:
                base += ["--cov", c]
            runs = [("same", None, [])]
            sk = []
            for s in rounds:
                pc = sorted(glob.glob(os.path.join(args.dump, f"step{s}",
                                                   f"{layer}.cov.rank*.f32")))
                if len(pc) != len(covs):
                    sys.exit(f"convergence_report: step {s} has {len(pc)} covariances of "
                             f"{layer}, step {m} has {len(covs)}")
                for c in pc:
                    sk += ["--sketch-cov", c]
            for b, plain in decays:
                runs.append((f"decay {b:g}{' plain' if plain else ''}", b,
                             sk + ["--geometry-decay", repr(b)] +
                             (["--geometry-decay-plain"] if plain else [])))
            for name, b, extra in runs:
                js = os.path.join(args.out, f"step{m}-{layer}-{name.replace(' ', '')}.json")
                sm = summarise(run_fidelity(base + extra, js), m, layer,
                               None if b is None else rounds[-1], rows, cols)
                sm["geometry"] = name
                sm["decay"] = b
                sm["rounds"] = [] if b is None else rounds
                full = {t[0]: t[1] for t in sm["nvfp4_curve"]}
                sm["g4_full_whitened_ratio"] = full.get(cols)
                summary.append(sm)
                print(f"{layer} step {m} {name}: fp8 muon {sm['g8_muon_ratio']:.2f}x "
                      f"whitened {sm['g8_whitened_ratio']:.2f}x, nvfp4 full "
                      f"{sm['g4_full_whitened_ratio']:.2f}x", file=sys.stderr)
    out = [f"GIFT on real gradients with the geometry training builds: sketches of every "
           f"refresh step (every {args.refresh}) before the measured step, one round each, "
           f"averaged with geometry decay B (0: the latest round only, as before; weights "
           f"B^age normalised over the rounds seen, as giftd does, or 'plain': B every round, "
           f"which leaves weight B^(n-1) on the first round); 'same': "
           f"the measured step's own covariance (optimistic). Ratios against Euclidean "
           f"fp8-e4m3 on the same data; 2 workers; default rank (full here).", "",
           "| layer | step | geometry | last sketch | GIFT fp8 Muon err | GIFT fp8 whitened | "
           "GIFT nvfp4 whitened (full k) | nvfp4 < Eucl. fp8 from k |",
           "|---|---:|---|---:|---:|---:|---:|---:|"]
    for s in summary:
        first = s["nvfp4_first_k_below_e8"]
        out.append(f"| {s['layer']} {s['shape'][0]}x{s['shape'][1]} | {s['step']} | "
                   f"{s['geometry']} | {s['sketch_step'] if s['sketch_step'] is not None else '–'}"
                   f" | {s['g8_muon_ratio']:.2f}x | {s['g8_whitened_ratio']:.2f}x | "
                   f"{s['g4_full_whitened_ratio']:.2f}x | {first if first else 'never'} |")
    md = "\n".join(out) + "\n"
    with open(os.path.join(args.out, "decay.md"), "w") as fh:
        fh.write(md)
    with open(os.path.join(args.out, "decay-summary.json"), "w") as fh:
        json.dump(summary, fh, indent=1)
    print(md)


def policy(args):
    os.makedirs(args.out, exist_ok=True)
    steps = sorted(int(os.path.basename(d)[4:]) for d in glob.glob(os.path.join(args.dump,
                                                                                "step*")))
    budgets = [b for b in args.budgets.split(",") if b]
    runs = []
    prev = None
    only = {int(x) for x in args.steps.split(",") if x} if args.steps else None
    for s in steps:
        if only is not None and s not in only:
            prev = s
            continue
        d = os.path.join(args.dump, f"step{s}")
        shapes = json.load(open(os.path.join(d, "shapes.json")))
        layers = sorted({k.rsplit(".", 1)[0] for k in shapes})
        lagged = prev is not None and s - prev <= args.max_lag
        variants = [("lag", prev, prev), ("own", prev, s)] if lagged else [("same", s, s)]
        for name, geo_step, gbar_step in variants:
            man = os.path.join(args.out, f"step{s}-{name}.manifest")
            with open(man, "w") as fh:
                for layer in layers:
                    rows, cols = shapes[layer + ".grad"]
                    fh.write(f"tensor {layer} {rows} {cols}\n")
                    for kind, st, what in (("grad", s, "grad"), ("cov", s, "cov"),
                                           ("scov", geo_step, "cov"), ("gbar", gbar_step, "grad")):
                        for f in sorted(glob.glob(os.path.join(args.dump, f"step{st}",
                                                               f"{layer}.{what}.rank*.f32"))):
                            fh.write(f"{kind} {f}\n")
            js = os.path.join(args.out, f"step{s}-{name}.json")
            cmd = [args.bench, "policy", "--manifest", man, "--json", js, "--refresh",
                   str(args.refresh), "--label", f"step {s} ({name})"]
            for b in budgets:
                cmd += ["--budget", b]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                print(r.stdout, r.stderr, file=sys.stderr)
                sys.exit(f"convergence_report: {' '.join(cmd)} failed")
            with open(js.replace(".json", ".txt"), "w") as fh:
                fh.write(" ".join(cmd) + "\n\n" + r.stdout)
            j = json.load(open(js))
            runs.append({"step": s, "variant": name, "geometry_step": geo_step,
                         "gbar_step": gbar_step, "json": j})
            print(f"policy: step {s} ({name}) done", file=sys.stderr)
        prev = s
    if args.merge:  # runs of earlier invocations into the same --out (other --steps)
        old = os.path.join(args.out, "policy-runs.json")
        if os.path.exists(old):
            done = {(r["step"], r["variant"]) for r in runs}
            runs = [r for r in json.load(open(old)) if (r["step"], r["variant"]) not in done] + runs
            runs.sort(key=lambda r: (r["step"], r["variant"] != "lag"))
    with open(os.path.join(args.out, "policy-runs.json"), "w") as fh:
        json.dump(runs, fh)
    md = policy_md(runs, budgets)
    with open(os.path.join(args.out, "policy.md"), "w") as fh:
        fh.write(md)
    summary = [{"step": r["step"], "variant": r["variant"], "geometry_step": r["geometry_step"],
                "gbar_step": r["gbar_step"],
                "results": [{k: v for k, v in x.items() if k != "choices"}
                            for x in r["json"]["results"]]} for r in runs]
    with open(os.path.join(args.out, "policy-summary.json"), "w") as fh:
        json.dump(summary, fh, indent=1)
    print(md)


def _pick(j, policy, budget):
    for x in j["results"]:
        b = x["budget_bits"]
        if x["policy"] == policy and ((budget is None and b is None) or
                                      (budget is not None and b is not None and
                                       abs(b - float(budget)) < 1e-9)):
            return x
    return None


def policy_md(runs, budgets):
    """Tables of `policy`: per run, the whole update's ratios to Euclidean fp8
    for each policy and budget, with bits (geometry included) and GFLOP."""
    def cell(x):
        if x is None:
            return "–"
        flag = " (infeasible)" if x["infeasible"] else ""
        return (f"{x['whitened_ratio']:.2f} / {x['muon_ratio']:.2f} / "
                f"{x['muon_applied_ratio']:.2f} / {x['bits']:.2f} / {x['gflops']:.3f}{flag}")
    cols = [(p, None) for p in ("all", "none", "auto", "hits")] + \
        [(p, b) for b in budgets for p in ("all", "none", "auto")]
    out = ["Whole update (each layer in its own metric), over Euclidean fp8-e4m3: "
           "whitened / Muon / Muon as applied / bits per element incl. geometry / "
           "transform GFLOP per step per worker. 'lag': geometry of the previous dump, gbar "
           "its mean gradient; 'own': same geometry, gbar the step's own; 'same': the step's "
           "own covariance and gradient.", "",
           "| step | variant | geometry of | gbar of | " +
           " | ".join(f"{p} {'fp8' if b is None else b + ' bits'}" for p, b in cols) + " |",
           "|---:|---|---:|---:|" + "---:|" * len(cols)]
    for r in runs:
        out.append(f"| {r['step']} | {r['variant']} | {r['geometry_step']} | {r['gbar_step']} | "
                   + " | ".join(cell(_pick(r["json"], p, b)) for p, b in cols) + " |")
    out += ["", "Targets (issue 24), per run: auto <= min(all, none) measured (whitened, "
            "Muon as applied) at fp8 and at each budget ('ok (+x%)': above by at most 0.1%, "
            "a rank the chooser lowered within its hysteresis); fp8 auto whitened <= 0.3x and Muon "
            "as applied <= 0.45x; budget 4.5 whitened < 1x; budget 6 whitened <= 0.5x.", "",
            "| step | variant | fp8: auto vs min(all, none), whitened | as applied | "
            "fp8 auto <= 0.3 / 0.45 | " +
            " | ".join(f"{b} bits: auto vs min(all, none), whitened" for b in budgets) +
            " | 4.5 bits whitened < 1 | 5 bits whitened < 1 (4.5 is infeasible with geometry) "
            "| 6 bits whitened <= 0.5 |",
            "|---:|---|---|---|---|" + "---|" * len(budgets) + "---|---|---|"]
    for r in runs:
        j = r["json"]

        def cmp(b, key):
            a = _pick(j, "auto", b)
            m = min(_pick(j, "all", b)[key], _pick(j, "none", b)[key])
            d = 100.0 * (a[key] / m - 1.0)
            verdict = "ok" if d <= 0.0 else ("ok (+%.2f%%)" % d if d <= 0.1 else
                                             "WORSE (+%.2f%%)" % d)
            return f"{a[key]:.3f} vs {m:.3f} {verdict}"
        a8 = _pick(j, "auto", None)
        t8 = f"{a8['whitened_ratio']:.2f} / {a8['muon_applied_ratio']:.2f} " + \
            ("met" if a8["whitened_ratio"] <= 0.3 and a8["muon_applied_ratio"] <= 0.45
             else "not met")
        a45 = _pick(j, "auto", "4.5") if "4.5" in budgets else None
        a6 = _pick(j, "auto", "6") if "6" in budgets else None
        t45 = "–" if a45 is None else f"{a45['whitened_ratio']:.2f} " + \
            ("met" if a45["whitened_ratio"] < 1 and not a45["infeasible"] else "not met") + \
            (" (infeasible)" if a45["infeasible"] else "")
        a5 = _pick(j, "auto", "5") if "5" in budgets else None
        t5 = "–" if a5 is None else f"{a5['whitened_ratio']:.2f} " + \
            ("met" if a5["whitened_ratio"] < 1 and not a5["infeasible"] else "not met")
        t6 = "–" if a6 is None else f"{a6['whitened_ratio']:.2f} " + \
            ("met" if a6["whitened_ratio"] <= 0.5 and not a6["infeasible"] else "not met")
        out.append(f"| {r['step']} | {r['variant']} | {cmp(None, 'whitened_ratio')} | "
                   f"{cmp(None, 'muon_applied_ratio')} | {t8} | " +
                   " | ".join(cmp(b, "whitened_ratio") for b in budgets) +
                   f" | {t45} | {t5} | {t6} |")
    return "\n".join(out) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("report")
    r.add_argument("--out", required=True)
    f = sub.add_parser("fidelity")
    f.add_argument("--dump", required=True)
    f.add_argument("--bench", required=True)
    f.add_argument("--out", required=True)
    f.add_argument("--max-lag", type=int, default=25,
                   help="sketch from the previous dumped step only when it is at most this "
                        "many steps earlier (else from the step's own covariance)")
    f.add_argument("--geometry-from", choices=("cov", "grad-gram"), default="cov",
                   help="what the lagged geometry is sketched from: the input covariances "
                        "(as training does) or the previous step's mean gradient's Gram matrix")
    f.add_argument("--damping", type=float, default=None,
                   help="the geometry's damping (gift-bench fidelity --damping; default "
                        "giftd's); the whitened metric keeps giftd's default")
    dc = sub.add_parser("decay")
    dc.add_argument("--dump", required=True)
    dc.add_argument("--bench", required=True)
    dc.add_argument("--out", required=True)
    dc.add_argument("--refresh", type=int, default=20, help="training's sketch interval")
    dc.add_argument("--steps", default="150,299", help="measured steps (dumped)")
    dc.add_argument("--decays", default="0,0.5,0.8,0.9",
                    help="geometry decays to compare; a trailing 'p' (0.9p): the plain "
                         "running average (the same decay every round)")
    po = sub.add_parser("policy")
    po.add_argument("--dump", required=True)
    po.add_argument("--bench", required=True)
    po.add_argument("--out", required=True)
    po.add_argument("--budgets", default="4.5,6", help="bit budgets besides the unset one")
    po.add_argument("--refresh", type=int, default=50,
                    help="steps per epoch: the geometry bytes' amortisation")
    po.add_argument("--max-lag", type=int, default=25,
                    help="the previous dumped step is the lagged one when at most this many "
                         "steps earlier (else: 'same')")
    po.add_argument("--steps", default=None, help="measure only these dumped steps (a,b,...)")
    po.add_argument("--merge", action="store_true",
                    help="keep the runs of earlier invocations into --out (policy-runs.json)")
    args = p.parse_args()
    {"report": report, "fidelity": fidelity, "decay": decay, "policy": policy}[args.cmd](args)


if __name__ == "__main__":
    main()
