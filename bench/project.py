#!/usr/bin/python3
"""bench/project.py: a projection model of step time and time to target for
DDP's allreduce (plain, fp16 hook, PowerSGD hook) and giftd's formats.

  project.py [model and cluster flags]        one setting, every arm
  project.py --validate DIR                   predicted vs measured, for the
                                              output folder of
                                              bench/netcluster/run.sh
  project.py --project paper|7b               the GIFT paper's setting, or a
                                              7B model on 256 GPUs

Inputs. Per-byte CPU costs come from `gift-bench codec --json FILE`
(--codec-json; without it, the built-in figures below, measured with
`gift-bench codec --mib 8 --repeats 3` on a 2-core AMD EPYC, AVX-512), and any
of them can be overridden by --costs FILE, a JSON object
{"encode_ns_per_elem": {"fp8": 0.4, ...}, "decode_ns_per_elem": {...},
 "transform_ns_per_elem_k32": 2.9}.

Measured per-byte costs (--cluster-json FILE, a `gift-bench cluster --json`
output): per codec, from its euclidean rows, the shards' CPU ns per payload
byte (whole process: codec, accumulation, TCP, all in one figure) and the
worker I/O thread's CPU ns per payload byte. Where the file has a codec's
figure it replaces the model's per-byte constants for that codec: shard CPU =
W x (push + pull) x shard ns/B (instead of the codec's decode/encode per
element plus TCP at --core-wire-gbps); the worker's encode + decode stages
(CPU worker) or its I/O threads' TCP (GPU worker, --project) = payload bytes x
worker ns/B (instead of the codec per element, or --core-wire-gbps). The
GIFT transform keeps its codec cost. The output names every figure taken from
the file and every codec left on the constants.

The model (every figure per training step):

  payload bytes per direction per worker: sum over tensors of elements x
  bits/8 (f32 32, bf16 16, fp8 8.25, nvfp4 4.5 bits per element, block
  scales included), plus, for GIFT tensors, the geometry amortised over
  --refresh steps: pushed sketches din x (k + 8) f32 + a trace, pulled
  U (din x k f32) + lambda (k f32). k is gift_rank_default(rows, din).

  giftd (parameter server): each worker sends its gradient once and receives
  the mean once. S shard hosts: a shard host's link carries W x B / S each
  way. Co-located (--colocated): S shards on S of the W worker hosts; a host
  carries its worker's off-host bytes B (S-1)/S plus its shard's (W-1) B / S.
  (--cluster-json: measured figures instead, see Inputs.)
  Stages: worker encode (+ T), push wire, shard decode-accumulate of W pushes
  and encode of the mean (per shard core), pull wire, worker decode (+ T^-1).
  They pipeline over pieces: comm = max(stage) + (sum(stages) - max(stage)) /
  pieces + one round trip. A shard answers a chunk once every worker's push
  of it is in, and each shard's chunks travel side by side with the others'
  (the host's egress shared among its peers), so pieces = the step's chunks
  per shard (libgiftclient's chunking at --chunk-kib: tensors under 64 KiB
  fused, larger ones cut into row blocks of at most the chunk), and at least
  DDP's buckets (1 MiB, then 25 MiB of f32), which the hook hands over one
  by one. --validate reads each arm's --chunk-kib from its runs.

  ring allreduce: 2 (W-1)/W x B sent and received per worker, both at once;
  2 (W-1) one-way delays per allreduce (buckets pipeline). fp16 hook: B halved. PowerSGD rank r:
  (rows + cols) x r f32 per 2-D matrix in two allreduces (torch's hook
  leaves a matrix uncompressed where that is not 2x smaller), 1-D tensors
  uncompressed.

  step = compute + comm - hidden, hidden = overlap x min(comm, compute)
  (--overlap, default 0: communication after the backward pass).
  time to target = steps to target x step; steps to target default to the
  f32 arm's (--steps-ratio ARM=X,... scales them).

  --validate also gives a third prediction, with the runs' CPU: in the
  shaped-network benchmark every process shares one machine's cores, and
  where the workers' computing threads fill them (W >= cores) the CPU a step
  spends beyond the compute (the workers' communication, gloo's or
  libgiftclient's, and the shards') delays the compute by that CPU / cores.
  It takes each arm's measured CPU per step, so it is a diagnostic of that
  term, not a blind prediction; the model itself has no such term (a GPU
  worker computes on the GPU). A fourth prediction is blind: the same term
  from the calibration instead of the validated runs, W x the CPU a
  ddp-allreduce worker spent per step in the calibration's tries at the link's
  rate beyond the compute-only run's, taken as the same for every arm, plus
  the model's shard CPU, over the cores, on the seed-paired compute-only step
  (the calibration's where the seeds have none).

Output: a table on stdout; --json FILE and --md FILE write the same rows.
Exit 2 with a message on a bad flag or input.
"""

import argparse
import glob
import json
import math
import os
import statistics
import sys

BITS = {"f32": 32.0, "bf16": 16.0, "fp8": 8.25, "nvfp4": 4.5}
GIFTD_ARMS = ["f32", "bf16", "fp8", "fp8-gift", "nvfp4", "nvfp4-gift"]
OVERSAMPLE = 8  # GIFT_OVERSAMPLE_DEFAULT
FIRST_BUCKET = 1 << 20  # DDP: the first bucket is 1 MiB
BUCKET = 25 << 20  # then bucket_cap_mb 25

# gift-bench codec --mib 8 --repeats 3, 2026-12-02, AMD EPYC, 2 cores (loaded),
# avx512: GB/s of fp32 data -> ns per element = 4 / GB/s.
DEFAULT_GBPS = {
    "encode": {"f32": 12.86, "bf16": 14.94, "fp8": 11.08, "nvfp4": 5.86},
    "decode": {"f32": 9.66, "bf16": 7.19, "fp8": 14.54, "nvfp4": 15.10},
    "transform_k32": 1.39,
}

PRESETS = {
    # Llama shapes: (dim, layers, ffn, vocab); tok embedding and head untied.
    "netcluster": (128, 2, 352, 256),  # train_llama.py --dim 128 --layers 2: 467584 params
    "600m": (1536, 18, 4096, 32000),  # 0.61e9 params, assumed shape of the paper's Llama-600M
    "7b": (4096, 32, 11008, 32000),  # Llama-2-7B shape, 6.74e9 params
}


def die(msg):
    print(f"project.py: {msg}", file=sys.stderr)
    sys.exit(2)


# ----------------------------------------------------------------- model shapes

def llama_tensors(dim, layers, ffn, vocab):
    """(name, rows, cols, gift-eligible) of train_llama.py's Llama."""
    t = [("tok", vocab, dim, False)]
    for i in range(layers):
        t += [(f"b{i}.attn_norm", 1, dim, False), (f"b{i}.wqkv", 3 * dim, dim, True),
              (f"b{i}.wo", dim, dim, True), (f"b{i}.mlp_norm", 1, dim, False),
              (f"b{i}.w13", 2 * ffn, dim, True), (f"b{i}.w2", dim, ffn, True)]
    t += [("norm", 1, dim, False), ("head", vocab, dim, True)]
    # python/gift/torch.py Policy: geometry on nn.Linear weights, cols >= 64, numel >= 16384
    return [(n, r, c, g and c >= 64 and r * c >= 16384) for n, r, c, g in t]


def rank_default(rows, din):
    """codec/geometry.c gift_rank_default."""
    if din <= 256:
        return din
    k = -(-din // 4)
    k = (k + 15) // 16 * 16
    return min(max(k, 64), 512, din)


def n_params(tensors):
    return sum(r * c for _, r, c, _ in tensors)


FUSE_BYTES = 64 << 10  # client/giftclient_internal.h GIFT__FUSE_BYTES
CHUNK_DEFAULT = 4 << 20  # GIFT__CHUNK_DEFAULT


def n_chunks(tensors, chunk_bytes):
    """Chunks of one step as libgiftclient cuts them (client.c's declare,
    placement.c): Euclidean tensors under FUSE_BYTES (and a chunk) fused into
    buckets of at most a chunk; a Euclidean tensor whose row is wider than a
    chunk re-cut into rows of the largest divisor of its length up to
    chunk / 32 elements; then every tensor in blocks of chunk / (4 cols)
    rows, at least one row."""
    n, fused = 0, None
    for _, rows, cols, gift in tensors:
        nel = rows * cols
        if not gift and nel * 4 < FUSE_BYTES and nel * 4 <= chunk_bytes:
            if fused is None or (fused + nel) * 4 > chunk_bytes:
                n += 1
                fused = 0
            fused += nel
            continue
        if not gift and cols * 4 > chunk_bytes:
            cc = min(max(1, chunk_bytes // 32), nel)
            while cc > 1 and nel % cc:
                cc -= 1
            rows, cols = nel // cc, cc
        per = max(1, chunk_bytes // (4 * cols))
        n += -(-rows // per)
    return n


# ----------------------------------------------------------------- costs

def load_costs(codec_json, costs_file):
    gb = json.loads(json.dumps(DEFAULT_GBPS))
    src = "built-in (gift-bench codec --mib 8 --repeats 3, 2-core AMD EPYC, loaded)"
    if codec_json:
        try:
            d = json.load(open(codec_json))
            for r in d["rows"]:
                f = {"f32": "f32", "bf16": "bf16", "fp8-e4m3": "fp8", "nvfp4": "nvfp4"}.get(r["format"])
                if f and r["transform"] == "euclidean":
                    gb["encode"][f] = float(r["encode_gbps"])
                    gb["decode"][f] = float(r["decode_gbps"])
            gk = d["gift"]["k"]
            gb["transform_k32"] = 0.5 * (d["gift"]["transform_gbps"] + d["gift"]["inverse_gbps"]) * gk / 32
        except (OSError, ValueError, KeyError, TypeError) as e:
            die(f"--codec-json {codec_json}: not gift-bench codec JSON ({e})")
        src = f"{codec_json} ({d.get('date')}, {d.get('cpu')}, {d.get('cores')} cores, {d.get('simd')})"
    c = {"encode": {f: 4.0 / v for f, v in gb["encode"].items()},
         "decode": {f: 4.0 / v for f, v in gb["decode"].items()},
         "transform_k32": 4.0 / gb["transform_k32"], "source": src}
    if costs_file:
        try:
            o = json.load(open(costs_file))
            for side in ("encode", "decode"):
                for f, v in o.get(f"{side}_ns_per_elem", {}).items():
                    if f not in BITS:
                        die(f"--costs: unknown format {f!r}")
                    c[side][f] = float(v)
            if "transform_ns_per_elem_k32" in o:
                c["transform_k32"] = float(o["transform_ns_per_elem_k32"])
        except (OSError, ValueError, AttributeError) as e:
            die(f"--costs {costs_file}: {e}")
        c["source"] += f", overridden by {costs_file}"
    return c


CLUSTER_FMT = {"f32": "f32", "bf16": "bf16", "fp8-e4m3": "fp8", "nvfp4": "nvfp4"}


def load_cluster(path, costs):
    """Adds costs["cluster"] = {"shard": {fmt: ns/B}, "worker_io": {fmt: ns/B}}
    from a gift-bench cluster --json output, and costs["cluster_note"]."""
    try:
        d = json.load(open(path))
        if d.get("benchmark") != "cluster":
            raise KeyError("benchmark is not 'cluster'")
        shard, wio = {}, {}
        for r in d["rows"]:
            f = CLUSTER_FMT.get(r["codec"])
            if f is None or r["transform"] != "euclidean":
                continue
            if "worker_io_ns_per_payload_byte" not in r:
                raise KeyError("no per-byte costs in its rows (a gift-bench older than issue 25)")
            for key, into in (("shard_ns_per_payload_byte", shard),
                              ("worker_io_ns_per_payload_byte", wio)):
                v = r.get(key)
                if isinstance(v, (int, float)) and math.isfinite(v) and v > 0 and f not in into:
                    into[f] = float(v)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        die(f"--cluster-json {path}: not gift-bench cluster JSON with per-byte costs ({e})")
    if not shard and not wio:
        die(f"--cluster-json {path}: no euclidean row of f32, bf16, fp8-e4m3 or nvfp4 "
            "with a per-byte cost")
    costs["cluster"] = {"shard": shard, "worker_io": wio, "file": path}
    def figs(m):
        return ", ".join(f"{f} {m[f]:.3g}" for f in BITS if f in m) or "none"
    kept = lambda m: [f for f in BITS if f not in m]
    note = (f"from {path} ({d.get('date')}, {d.get('cpu')}, {d.get('cores')} cores, "
            f"W = {d.get('workers')}, S = {d.get('shards')}): shard CPU ns per payload byte "
            f"{figs(shard)} (replaces codec decode/encode + TCP at --core-wire-gbps on the shards)"
            f"; worker I/O thread CPU ns per payload byte {figs(wio)} (replaces the worker's "
            f"codec per element / TCP at --core-wire-gbps)")
    ks, kw = kept(shard), kept(wio)
    if ks or kw:
        note += (f"; not in the file, on the constants: shard {', '.join(ks) or 'none'}, "
                 f"worker {', '.join(kw) or 'none'}")
    if d.get("external_cluster"):
        note += "; the file ran on external shards (--servers): no shard figures"
    costs["cluster_note"] = note
    costs["source"] += "; per-byte CPU " + note


# ----------------------------------------------------------------- arms

def buckets(nbytes_f32):
    return 1 + max(0, math.ceil((nbytes_f32 - FIRST_BUCKET) / BUCKET))


def ring_allreduce_bytes(b, w):
    """Bytes a worker sends (and receives) in a ring allreduce of b bytes."""
    return 2.0 * (w - 1) / w * b if w > 1 else 0.0


def powersgd_elems(tensors, r):
    e = 0
    for _, rows, cols, _ in tensors:
        if rows > 1 and (rows + cols) * r * 2 <= rows * cols:
            e += (rows + cols) * r
        else:
            e += rows * cols
    return e


def match_rank(tensors, target_bytes):
    """Smallest PowerSGD rank whose bytes reach target_bytes."""
    for r in range(1, 4097):
        if powersgd_elems(tensors, r) * 4 >= target_bytes:
            return r
    return 4096


def cost_rank(din, k):
    """The thin rank whose flops T costs: libgiftclient applies T as one
    product with a din x din matrix (2 rows din^2 flops, as the thin form's
    4 rows din k at k = din / 2) where 2 k >= din and din <= 1024
    (gift_geometry_dense_floats)."""
    return din / 2 if 2 * k >= din and din <= 1024 else k


def giftd_bytes(tensors, fmt, gift, refresh):
    """(push bytes, pull bytes, elements under GIFT, mean cost rank) per worker
    per step."""
    n = n_params(tensors)
    b = n * BITS[fmt] / 8
    push = pull = b
    ge = 0
    ksum = 0
    if gift:
        for _, rows, din, g in tensors:
            if not g:
                continue
            k = rank_default(rows, din)
            ks = min(k + OVERSAMPLE, din)
            push += (din * ks + 1) * 4.0 / refresh
            pull += (din * k + k) * 4.0 / refresh
            ge += rows * din
            ksum += rows * din * cost_rank(din, k)
    return push, pull, ge, (ksum / ge if ge else 0)


def predict(a):
    """a: dict with arm, tensors, W, S, colocated, rate_bps (bytes/s), delay_s,
    compute_s, overlap, costs, refresh, shard_cores, transform_cpu, powersgd_rank.
    Returns a dict of the prediction and its parts."""
    arm, t, w = a["arm"], a["tensors"], a["W"]
    n = n_params(t)
    rate, d = a["rate_Bps"], a["delay_s"]
    nb = buckets(4 * n)
    out = {"arm": arm, "buckets": nb}
    if arm.startswith("ddp-"):
        if arm == "ddp-allreduce":
            b = 4.0 * n
        elif arm == "ddp-fp16":
            b = 2.0 * n
        elif arm.startswith("ddp-powersgd"):
            r = a["powersgd_rank"]
            b = 4.0 * powersgd_elems(t, r)
            out["powersgd_rank"] = r
        else:
            die(f"unknown arm {arm!r}")
        sent = ring_allreduce_bytes(b, w)
        # 2 (W-1) one-way hops per allreduce; the buckets' allreduces pipeline,
        # so one step pays them once (PowerSGD: two allreduces, P then Q)
        hops = 2 * (w - 1) * (2 if arm.startswith("ddp-powersgd") else 1)
        wire = sent / rate
        comm = wire + hops * d
        out.update(bytes_per_worker_tx=sent, wire_s=wire, latency_s=hops * d, cpu_s=0.0)
    else:
        gift = arm.endswith("-gift")
        fmt = arm[:-5] if gift else arm
        if fmt not in BITS:
            die(f"unknown arm {arm!r}")
        s = a["S"]
        push, pull, ge, kmean = giftd_bytes(t, fmt, gift, a["refresh"])
        c = a["costs"]
        if a["colocated"]:
            s = min(s, w)
            tx = push * (s - 1) / s + pull * (w - 1) / s
            rx = pull * (s - 1) / s + push * (w - 1) / s
            host_tx, host_rx = max(tx, push), max(rx, pull)
        else:
            host_tx = max(push, w * pull / s)
            host_rx = max(pull, w * push / s)
        core_wire = a.get("core_wire_Bps")
        cl = c.get("cluster") or {}
        w_ns = cl.get("worker_io", {}).get(fmt)  # measured worker I/O ns per payload byte
        s_ns = cl.get("shard", {}).get(fmt)  # measured shard ns per payload byte
        if a["transform_cpu"]:  # a CPU worker: codec and T on the I/O thread
            tr = ge * c["transform_k32"] * kmean / 32 * 1e-9 if gift else 0.0
            if w_ns is not None:
                enc_w = push * w_ns * 1e-9 + tr
                dec_w = pull * w_ns * 1e-9 + tr
            else:
                enc_w = n * c["encode"][fmt] * 1e-9 + tr
                dec_w = n * c["decode"][fmt] * 1e-9 + tr
            io = 1
        else:  # a GPU worker: codec and T on the GPU, TCP on `io` I/O threads
            enc_w = dec_w = 4.0 * n / a["gpu_codec_Bps"]
            per_b = w_ns * 1e-9 if w_ns is not None else 1.0 / core_wire
            tcp_w = (push + pull) * per_b
            io = max(1, math.ceil(tcp_w / (max(push, pull) / rate)))
            enc_w += push * per_b / io
            dec_w += pull * per_b / io
        out["worker_io_threads"] = io
        out["worker_cost_source"] = "cluster-json" if w_ns is not None else "model"
        if s_ns is not None:  # measured: the whole shard process per payload byte in + out
            shard_cpu = w * (push + pull) * s_ns * 1e-9
        else:
            shard_cpu = (w * n * c["decode"][fmt] + n * c["encode"][fmt]) * 1e-9
            if core_wire:  # TCP in and out of the shards
                shard_cpu += w * (push + pull) / core_wire
        out["shard_cost_source"] = "cluster-json" if s_ns is not None else "model"
        shard = shard_cpu / (s * a["shard_cores"])
        stages = [enc_w, host_tx / rate, shard, host_rx / rate, dec_w]
        pieces = max(nb, n_chunks(t, a.get("chunk_bytes") or CHUNK_DEFAULT) / s)
        comm = max(stages) + (sum(stages) - max(stages)) / pieces + 2 * d
        out["pieces"] = pieces
        out.update(bytes_per_worker_tx=push, bytes_per_worker_rx=pull,
                   host_bytes_max=max(host_tx, host_rx), wire_s=max(host_tx, host_rx) / rate,
                   cpu_worker_s=enc_w + dec_w, cpu_shard_s=shard, latency_s=2 * d,
                   shard_cpu_total_s=shard_cpu)
    hidden = a["overlap"] * min(comm, a["compute_s"])
    out["comm_s"] = comm
    out["step_s"] = a["compute_s"] + comm - hidden
    return out


# ----------------------------------------------------------------- helpers

def parse_ratios(s):
    r = {}
    if not s:
        return r
    for kv in s.split(","):
        if "=" not in kv:
            die(f"--steps-ratio: {kv!r} is not ARM=X")
        k, v = kv.split("=", 1)
        try:
            r[k] = float(v)
        except ValueError:
            die(f"--steps-ratio: {v!r} is not a number")
        if r[k] <= 0:
            die(f"--steps-ratio: {k} must be > 0")
    return r


def model_tensors(args):
    dim, layers, ffn, vocab = PRESETS[args.model]
    dim = args.dim or dim
    layers = args.layers or layers
    ffn = args.ffn or (ffn if not args.dim else 32 * round(8 * dim / 3 / 32))
    vocab = args.vocab or vocab
    return llama_tensors(dim, layers, ffn, vocab), (dim, layers, ffn, vocab)


def write_out(args, obj, md):
    print(md)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(obj, f, indent=1)
            f.write("\n")
    if args.md:
        with open(args.md, "w") as f:
            f.write(md + "\n")


def ms(x):
    return "–" if x is None else f"{x * 1e3:.1f}"


# ----------------------------------------------------------------- validate

def median_step(dirpath):
    import csv
    v = []
    try:
        with open(os.path.join(dirpath, "log.csv")) as f:
            for row in csv.DictReader(f):
                v.append(float(row["step_s"]))
    except (OSError, KeyError, ValueError):
        return None
    return statistics.median(v) if v else None


def read_measured(root):
    """{link: {arm: {...}}} from report/report.json, else from the per-seed dirs."""
    rep = os.path.join(root, "report", "report.json")
    if os.path.exists(rep):
        d = json.load(open(rep))
        return {link: d["links"][link]["arms"] for link in d["links"]}, "report/report.json"
    links = {}
    for link in sorted(os.listdir(root)):
        lp = os.path.join(root, link)
        if link in ("calibration", "report") or not os.path.isdir(lp):
            continue
        for arm in sorted(os.listdir(lp)):
            ap = os.path.join(lp, arm)
            if not os.path.isdir(ap):
                continue
            meds, cj = [], None
            for sd in sorted(os.listdir(ap)):
                m = median_step(os.path.join(ap, sd))
                if m is not None:
                    meds.append(m)
                    try:
                        cj = json.load(open(os.path.join(ap, sd, "cluster.json")))
                    except (OSError, ValueError):
                        pass
            if meds and cj:
                links.setdefault(link, {})[arm] = {
                    "step_median_s": statistics.median(meds), "seeds": list(range(len(meds))),
                    "rate_mbit": cj.get("rate_mbit"), "workers": cj.get("workers"),
                    "servers": cj.get("servers"), "colocated": cj.get("colocated"),
                    "compute_s": None, "powersgd_rank": None, "per_seed": []}
    return links, "per-seed log.csv"


def arm_chunk_bytes(per_seed):
    """The giftd arm's chunk (train_llama.py --chunk-kib, in report.json or
    each piece's summary.json); None: the library's default."""
    for p in per_seed:
        kib = p.get("chunk_kib")
        if kib is None and p.get("dir"):
            try:
                kib = json.load(open(os.path.join(p["dir"], "summary.json")))["args"].get("chunk_kib")
            except (OSError, ValueError, KeyError):
                kib = None
        if kib:
            return kib * 1024
    return None


def calibration_cpu(root, calib, cpu0):
    """{link: CPU s per step a ddp-allreduce worker spent beyond the
    compute-only run's cpu0}, from DIR/calibration/<link>.<try>/: the tries
    at the rate the calibration kept (all the link's tries if none matches);
    None for a link without a try that recorded its CPU."""
    out = {}
    cdir = os.path.join(root, "calibration")
    for link in ("starved", "paper"):
        if link not in calib:
            continue
        kept, every = [], []
        for d in sorted(glob.glob(os.path.join(glob.escape(cdir), link + ".*"))):
            try:
                cpu = float(json.load(open(os.path.join(d, "summary.json")))["cpu_s_per_step"])
                rate = json.load(open(os.path.join(d, "cluster.json"))).get("rate_mbit")
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue
            every.append(cpu)
            if rate == calib[link].get("rate_mbit"):
                kept.append(cpu)
        v = kept or every
        out[link] = max(0.0, statistics.mean(v) - cpu0) if v else None
    return out


def validate(args, costs):
    root = args.validate
    try:
        calib = json.load(open(os.path.join(root, "calibration.json")))
        measured, src = read_measured(root)
    except (OSError, ValueError, KeyError) as e:
        die(f"--validate {root}: not a bench/netcluster output folder ({e})")
    # The compute-only run's CPU per worker step (its process, all threads),
    # for the runs'-CPU prediction below; else its step.
    try:
        cpu0 = float(json.load(open(os.path.join(root, "calibration", "compute", "summary.json")))
                     ["cpu_s_per_step"])
        cpu0_src = "calibration/compute/summary.json"
    except (OSError, ValueError, KeyError, TypeError):
        cpu0, cpu0_src = calib["compute_step_s"], "the compute-only step"
    cores = calib.get("nproc") or 0
    cal_extra = calibration_cpu(root, calib, cpu0)
    tensors, shape = model_tensors(args)
    if n_params(tensors) != calib.get("params"):
        print(f"project.py: warning: model {shape} has {n_params(tensors)} parameters, "
              f"the calibration {calib.get('params')}", file=sys.stderr)
    rows = []
    for link, arms in measured.items():
        for arm, m in arms.items():
            if arm == "none":
                continue
            base = arm[:-5] if arm.endswith("-colo") else arm
            if base.startswith("ddp-powersgd"):
                r = m.get("powersgd_rank")
                if r is None:
                    for p in m.get("per_seed", []):
                        r = r or p.get("powersgd_rank")
                if r is None:
                    r = 1
            delay = calib.get("delay_ms", 0.25) * 1e-3
            ps = m.get("per_seed") or []
            if ps and all(p.get("delay_ms_applied") == 0 for p in ps):
                delay = 0.0  # the kernel had no sch_netem: rate only
            rate = (m.get("rate_mbit") or calib[link]["rate_mbit"]) * 1e6 / 8
            chunk = args.chunk_kib * 1024 or arm_chunk_bytes(ps)

            def pred(comp):
                return predict({"arm": "ddp-powersgd" if base.startswith("ddp-powersgd") else base,
                                "tensors": tensors, "W": m.get("workers") or calib["workers"],
                                "S": m.get("servers") or 1, "colocated": bool(m.get("colocated")),
                                "rate_Bps": rate, "delay_s": delay, "compute_s": comp,
                                "overlap": args.overlap, "costs": costs, "refresh": args.refresh,
                                "shard_cores": 1, "transform_cpu": True, "chunk_bytes": chunk,
                                "powersgd_rank": r if base.startswith("ddp-powersgd") else None})
            pc = pred(calib["compute_step_s"])
            # paired: each seed's prediction from the compute-only step of the
            # same seed (the load of that hour), against that seed's median
            paired = [q for q in ps if q.get("compute_s") is not None and q.get("step_median_s")]
            pairs = [(pred(q["compute_s"])["step_s"], q["step_median_s"]) for q in paired]
            pp = {"step_s": statistics.median(x for x, _ in pairs)} if pairs else None
            meas = m["step_median_s"]
            # With the runs' CPU (a diagnostic, not a blind prediction): every
            # process shares the machine's cores, so where the workers'
            # computing threads fill them (W >= cores) the CPU a step spends
            # beyond the compute (workers' communication, shards) delays the
            # compute by that CPU / cores. From each seed's measured CPU per
            # step (workers x rank 0's + shards') less W x the compute-only's.
            wk = m.get("workers") or calib["workers"]
            cpus = [q["cpu_s_per_step"] for q in ps if q.get("cpu_s_per_step") is not None]
            pcpu = None
            if cpus and cores and wk >= cores:
                extra = max(0.0, statistics.mean(cpus) - wk * cpu0) / cores
                pcpu = {"step_s": pred(calib["compute_step_s"] + extra)["step_s"],
                        "contention_s": extra}
            # With the calibration's CPU (blind: nothing from the validated
            # arm's runs): a communicating worker's CPU per step beyond the
            # compute-only run's, from the calibration's ddp-allreduce tries
            # at this link's rate, taken as the same for every arm (in nc7 the
            # runs' figure was 12-25 ms whatever the arm's bytes), plus the
            # model's shard CPU, over the cores; only where W >= cores, as
            # above. The compute step is each seed's compute-only run where the
            # seeds have one (median of the per-seed ratios), else the
            # calibration's.
            pcal = None
            if cal_extra.get(link) is not None and cores and wk >= cores:
                e = (wk * cal_extra[link] + pc.get("shard_cpu_total_s", 0.0)) / cores
                if pairs:
                    cal_pairs = [(pred(q["compute_s"] + e)["step_s"], q["step_median_s"])
                                 for q in paired]
                    pcal = {"step_s": statistics.median(x for x, _ in cal_pairs),
                            "ratio": statistics.median(x / y for x, y in cal_pairs)}
                else:
                    x = pred(calib["compute_step_s"] + e)["step_s"]
                    pcal = {"step_s": x, "ratio": x / meas}
                pcal["contention_s"] = e
            # time to target from the measured steps to target of the seeds that got there
            stt = [q["steps_to_target"] for q in ps if q.get("steps_to_target")]
            ttt_pred = statistics.median(stt) * pc["step_s"] if stt else None
            rows.append({"link": link, "arm": arm, "rate_mbit": m.get("rate_mbit"),
                         "seeds": len(m.get("seeds") or []), "measured_step_s": meas,
                         "paired_compute_s": m.get("compute_s"),
                         "predicted_step_s": pc["step_s"], "ratio": pc["step_s"] / meas,
                         "predicted_paired_step_s": pp["step_s"] if pp else None,
                         "ratio_paired": (statistics.median(x / y for x, y in pairs)
                                          if pp else None),
                         "ratio_paired_per_seed": [round(x / y, 3) for x, y in pairs],
                         "contention_s": pcpu["contention_s"] if pcpu else None,
                         "predicted_cpu_step_s": pcpu["step_s"] if pcpu else None,
                         "ratio_cpu": pcpu["step_s"] / meas if pcpu else None,
                         "calibration_contention_s": pcal["contention_s"] if pcal else None,
                         "predicted_cal_step_s": pcal["step_s"] if pcal else None,
                         "ratio_cal": pcal["ratio"] if pcal else None,
                         "predicted_comm_s": pc["comm_s"], "delay_ms_used": delay * 1e3,
                         "steps_to_target_measured": statistics.median(stt) if stt else None,
                         "time_to_target_measured_s": m.get("time_to_target_s"),
                         "time_to_target_predicted_s": ttt_pred})
    def within(key):
        v = [r[key] for r in rows if r[key] is not None]
        return sum(1 for x in v if abs(x - 1) <= 0.15), len(v)
    w1, n1 = within("ratio")
    w2, n2 = within("ratio_paired")
    w3, n3 = within("ratio_cpu")
    w4, n4 = within("ratio_cal")
    lines = [f"Validation against {root} ({src}; calibration {calib.get('date')}, "
             f"{calib.get('nproc')} cores, {calib.get('cpu')}): compute-only step "
             f"{calib['compute_step_s'] * 1e3:.1f} ms, {calib.get('params')} parameters, "
             f"W = {calib.get('workers')}, overlap {args.overlap}; costs {costs['source']}.",
             "",
             "| link | arm | Mbit/s | seeds | measured ms | predicted ms (calib. compute) | ratio "
             "| paired compute ms (seed mean) | predicted ms (paired) | ratio "
             "| + calibration's CPU ms | predicted ms (calibration's CPU) | ratio "
             "| + runs' CPU ms | predicted ms (runs' CPU) | ratio | steps to target "
             "| time to target s measured / predicted |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        rp = "–" if r["ratio_paired"] is None else f"{r['ratio_paired']:.2f}"
        rc = "–" if r["ratio_cpu"] is None else f"{r['ratio_cpu']:.2f}"
        rk = "–" if r["ratio_cal"] is None else f"{r['ratio_cal']:.2f}"
        lines.append(f"| {r['link']} | {r['arm']} | {r['rate_mbit']} | {r['seeds']} | "
                     f"{ms(r['measured_step_s'])} | {ms(r['predicted_step_s'])} | {r['ratio']:.2f} | "
                     f"{ms(r['paired_compute_s'])} | {ms(r['predicted_paired_step_s'])} | {rp} | "
                     f"{ms(r['calibration_contention_s'])} | {ms(r['predicted_cal_step_s'])} | {rk} | "
                     f"{ms(r['contention_s'])} | {ms(r['predicted_cpu_step_s'])} | {rc} | "
                     f"{r['steps_to_target_measured'] or '–'} | "
                     + (f"{r['time_to_target_measured_s']:.1f}" if r["time_to_target_measured_s"] else "–")
                     + " / " + (f"{r['time_to_target_predicted_s']:.1f}" if r["time_to_target_predicted_s"] else "–")
                     + " |")
    lines += ["", f"within 15%: {w1}/{n1} arms with the calibration's compute step, "
              f"{w2}/{n2} with the seed-paired compute-only step (each seed's prediction from the "
              f"compute-only step of the same seed, median of the per-seed ratios), "
              f"{w4}/{n4} with the calibration's CPU (blind: the seed-paired compute-only step, "
              f"or the calibration's where the seeds have none, plus W x the CPU a "
              f"ddp-allreduce worker spent per step in the calibration's tries beyond the "
              f"compute-only run's ("
              + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in sorted(cal_extra.items())
                          if v is not None) +
              f"), the same for every arm, plus the model's shard CPU, over the cores), "
              f"{w3}/{n3} with the runs' CPU (a diagnostic: the calibration's compute step plus "
              f"the CPU each arm's runs spent per step beyond W x the compute-only run's "
              f"({cpu0 * 1e3:.1f} ms a worker, {cpu0_src}), over the {cores} cores every "
              f"process shares; only where W >= cores). Time to "
              f"target predicted = the median measured steps to target x the predicted step "
              f"(calibration compute)."]
    obj = {"validate": root, "source": src, "calibration": calib, "costs": costs,
           "overlap": args.overlap, "rows": rows, "within_15pct": [w1, n1],
           "within_15pct_paired": [w2, n2], "within_15pct_cpu": [w3, n3],
           "within_15pct_calibration_cpu": [w4, n4], "calibration_extra_cpu_s": cal_extra,
           "compute_only_cpu_s": cpu0}
    write_out(args, obj, "\n".join(lines))


# ----------------------------------------------------------------- project

PROJECTS = {
    # model preset, workers, link Gbit/s, tokens per GPU per step
    "paper": ("600m", 64, 200.0, 8192),
    "7b": ("7b", 256, 200.0, 8192),
}
PAPER = ("GIFT paper (Llama-600M, 64 GH200): pretraining 7.6% shorter with GIFT-FP8 and "
         "10.8% shorter with Euclidean FP8 than the BF16 baseline.")


def shards_needed(p, a):
    """Shard hosts so that no shard link is slower than a worker's, and cores
    so that shard CPU (codec per byte + TCP at --core-wire-gbps) keeps up."""
    w = a["W"]
    hosts = math.ceil(w * a["rate_Bps"] / a["server_rate_Bps"])
    t_wire = max(p["bytes_per_worker_tx"], p["bytes_per_worker_rx"]) / a["rate_Bps"]
    cores = math.ceil(p["shard_cpu_total_s"] / t_wire) if t_wire > 0 else 0
    return hosts, cores


def project(args, costs):
    preset, w, gbps, tok = PROJECTS[args.project]
    if args.model == "netcluster":
        args.model = preset
    tensors, shape = model_tensors(args)
    w = args.workers or w
    gbps = args.link_gbps or gbps
    n = n_params(tensors)
    tok = args.tokens_per_gpu or tok
    compute = args.compute_ms * 1e-3 if args.compute_ms else 6.0 * n * tok / (args.tflops * 1e12)
    rate = gbps * 1e9 / 8
    srate = (args.server_link_gbps or gbps) * 1e9 / 8
    nvg = giftd_bytes(tensors, "nvfp4", True, args.refresh)[0]
    ranks = args.powersgd_ranks or [4, match_rank(tensors, nvg)]
    base = {"tensors": tensors, "W": w, "rate_Bps": rate, "server_rate_Bps": srate,
            "core_wire_Bps": args.core_wire_gbps * 1e9 / 8, "delay_s": args.delay_ms * 1e-3,
            "compute_s": compute, "overlap": args.overlap, "costs": costs,
            "refresh": args.refresh, "transform_cpu": False,
            "gpu_codec_Bps": args.gpu_codec_gbps * 1e9}
    ratio = parse_ratios(args.steps_ratio)
    rows = []
    for arm in ["ddp-allreduce", "ddp-fp16"] + [f"ddp-powersgd-r{r}" for r in ranks]:
        a = dict(base, arm=arm if not arm.startswith("ddp-powersgd") else "ddp-powersgd",
                 S=0, colocated=False, shard_cores=1,
                 powersgd_rank=int(arm.rsplit("r", 1)[1]) if "powersgd" in arm else None)
        p = predict(a)
        rows.append({"arm": arm, "hosts": w, "shard_hosts": 0, "cores_per_shard_host": 0,
                     **{k: p[k] for k in ("step_s", "comm_s", "bytes_per_worker_tx")}})
    for arm in GIFTD_ARMS:
        for colo in (False, True):
            a = dict(base, arm=arm, S=w, colocated=colo, shard_cores=1)
            p0 = predict(a)
            hosts, cores = shards_needed(p0, a)
            s = w if colo else max(hosts, 1)
            # each shard host runs `cores` shard processes (one core each)
            per_host = max(1, math.ceil(cores / s))
            a.update(S=s, shard_cores=per_host)
            p = predict(a)
            rows.append({"arm": arm + ("-colo" if colo else ""), "hosts": w + (0 if colo else s),
                         "shard_hosts": s, "shard_cores_total": cores,
                         "worker_io_threads": p["worker_io_threads"],
                         "cores_per_shard_host": per_host,
                         **{k: p[k] for k in ("step_s", "comm_s", "bytes_per_worker_tx")}})
    f32 = next(r for r in rows if r["arm"] == "f32")["step_s"]
    bl = next(r for r in rows if r["arm"] == "ddp-fp16")["step_s"]
    gb = {r["arm"]: r["step_s"] for r in rows if r["arm"] in ("bf16", "bf16-colo")}
    steps = args.steps
    for r in rows:
        k = ratio.get(r["arm"], ratio.get(r["arm"].replace("-colo", ""), 1.0))
        r["steps_to_target"] = steps * k
        r["time_to_target_h"] = steps * k * r["step_s"] / 3600
        r["saved_vs_bf16_ring"] = 1 - (steps * k * r["step_s"]) / (steps * bl)
        same = "bf16-colo" if r["arm"].endswith("-colo") else "bf16"
        r["saved_vs_giftd_bf16"] = (1 - (steps * k * r["step_s"]) / (steps * gb[same])
                                    if not r["arm"].startswith("ddp-") else None)
        r["x_giftd_f32"] = r["step_s"] / f32
    assume = (f"{args.project}: Llama {shape} (dim, layers, ffn, vocab) = {n / 1e9:.2f}e9 "
              f"parameters; W = {w} GPUs; {gbps:g} Gbit/s per host, shard hosts "
              f"{(args.server_link_gbps or gbps):g} Gbit/s; one-way delay {args.delay_ms} ms; "
              f"compute step {compute * 1e3:.1f} ms ("
              + (f"--compute-ms" if args.compute_ms else
                 f"6 x params x {tok} tokens per GPU / {args.tflops:g} TFLOP/s effective") +
              f"); overlap {args.overlap}; steps to target {steps} for every arm"
              + (f" scaled by {args.steps_ratio}" if ratio else "") +
              f"; codec and GIFT transform on the GPU at {args.gpu_codec_gbps:g} GB/s of f32 "
              f"(--gpu-codec-gbps); shard cores sized so the shards keep up with the worker "
              f"links; TCP at {args.core_wire_gbps:g} "
              f"Gbit/s per shard core"
              + (" where no per-byte CPU figure from --cluster-json replaces it"
                 if costs.get("cluster") else "") +
              f"; codec costs {costs['source']}.")
    lines = [assume, "", "| arm | hosts | shard hosts | shard cores (per host) | MB sent per worker "
             "| worker I/O threads | comm ms | step ms | x giftd f32 | time to target h "
             "| saved vs BF16 ring (ddp-fp16) | saved vs giftd bf16 |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        sc = "–" if not r["shard_hosts"] else f"{r['shard_cores_total']} ({r['cores_per_shard_host']})"
        lines.append(f"| {r['arm']} | {r['hosts']} | {r['shard_hosts'] or '–'} | {sc} | "
                     f"{r['bytes_per_worker_tx'] / 1e6:.1f} | {r.get('worker_io_threads', '–')} | "
                     f"{ms(r['comm_s'])} | {ms(r['step_s'])} | "
                     f"{r['x_giftd_f32']:.2f} | {r['time_to_target_h']:.2f} | "
                     f"{r['saved_vs_bf16_ring'] * 100:+.1f}% | "
                     + ("–" if r["saved_vs_giftd_bf16"] is None else f"{r['saved_vs_giftd_bf16'] * 100:+.1f}%")
                     + " |")
    if args.project == "paper":
        lines += ["", "Beside it: " + PAPER]
    obj = {"project": args.project, "assumptions": assume, "params": n, "shape": shape,
           "W": w, "link_gbps": gbps, "compute_s": compute, "rows": rows,
           "paper_reported": PAPER if args.project == "paper" else None}
    write_out(args, obj, "\n".join(lines))


# ----------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--validate", metavar="DIR", help="bench/netcluster output folder")
    ap.add_argument("--project", choices=sorted(PROJECTS), help="a projection preset")
    ap.add_argument("--codec-json", metavar="FILE", help="gift-bench codec --json output")
    ap.add_argument("--costs", metavar="FILE", help="JSON overrides of per-element costs")
    ap.add_argument("--cluster-json", metavar="FILE",
                    help="gift-bench cluster --json output: its measured shard and worker I/O "
                         "CPU ns per payload byte, per codec, replace the per-byte constants "
                         "(codec per element, --core-wire-gbps) for the codecs it has")
    ap.add_argument("--model", choices=sorted(PRESETS), default="netcluster",
                    help="Llama shape preset (default netcluster; --project uses its own)")
    ap.add_argument("--dim", type=int)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--ffn", type=int)
    ap.add_argument("--vocab", type=int)
    ap.add_argument("--workers", type=int, help="W (default 2, or the preset's)")
    ap.add_argument("--servers", type=int, default=2, help="S shard hosts (default 2)")
    ap.add_argument("--colocated", action="store_true", help="shards on the worker hosts")
    ap.add_argument("--link-gbps", type=float, help="link rate per host, Gbit/s")
    ap.add_argument("--server-link-gbps", type=float, help="shard hosts' link rate (default: the same)")
    ap.add_argument("--delay-ms", type=float, default=0.01, help="one-way delay (default 0.01)")
    ap.add_argument("--compute-ms", type=float, help="compute-only step, ms")
    ap.add_argument("--tokens-per-gpu", type=int, help="--project: tokens per GPU per step (8192)")
    ap.add_argument("--tflops", type=float, default=400.0,
                    help="--project: effective TFLOP/s per GPU (default 400: GH200 bf16 at ~40%% MFU)")
    ap.add_argument("--overlap", type=float, default=0.0, help="fraction of comm hidden under compute")
    ap.add_argument("--refresh", type=int, default=50, help="geometry refresh interval, steps")
    ap.add_argument("--chunk-kib", type=int, default=0,
                    help="libgiftclient's largest chunk, KiB of f32 (0: --validate reads each "
                         "arm's from its runs, otherwise the library's 4096)")
    ap.add_argument("--core-wire-gbps", type=float, default=22.2,
                    help="TCP bytes one shard core moves, Gbit/s (default 22.2: 2.77 GB/s loopback)")
    ap.add_argument("--gpu-codec-gbps", type=float, default=1000.0,
                    help="--project: GPU encode/decode (+T) rate, GB/s of f32 (default 1000)")
    ap.add_argument("--powersgd-ranks", type=lambda s: [int(x) for x in s.split(",")],
                    help="--project: PowerSGD ranks (default 4 and the rank matching nvfp4-gift's bytes)")
    ap.add_argument("--steps", type=int, default=10000, help="f32 arm's steps to target")
    ap.add_argument("--steps-ratio", help="ARM=X,...: steps to target relative to f32's")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--md", metavar="FILE")
    args = ap.parse_args()
    for k in ("workers", "servers", "refresh", "steps", "dim", "layers", "ffn", "vocab"):
        v = getattr(args, k)
        if v is not None and v < 1:
            die(f"--{k.replace('_', '-')} must be >= 1")
    for k in ("link_gbps", "server_link_gbps", "compute_ms", "tflops", "core_wire_gbps",
              "gpu_codec_gbps"):
        v = getattr(args, k)
        if v is not None and v <= 0:
            die(f"--{k.replace('_', '-')} must be > 0")
    if args.delay_ms < 0:
        die("--delay-ms must be >= 0")
    if not 0 <= args.chunk_kib <= 1 << 20:
        die("--chunk-kib must be in 0..1048576")
    if not 0 <= args.overlap <= 1:
        die("--overlap must be in [0, 1]")
    if args.validate and args.project:
        die("--validate and --project exclude each other")
    costs = load_costs(args.codec_json, args.costs)
    if args.cluster_json:
        load_cluster(args.cluster_json, costs)
    if args.validate:
        return validate(args, costs)
    if args.project:
        return project(args, costs)
    # one setting: every arm
    if args.link_gbps is None or args.compute_ms is None:
        die("give --link-gbps and --compute-ms (or --validate DIR, or --project paper|7b)")
    tensors, shape = model_tensors(args)
    w = args.workers or 2
    base = {"tensors": tensors, "W": w, "rate_Bps": args.link_gbps * 1e9 / 8,
            "delay_s": args.delay_ms * 1e-3, "compute_s": args.compute_ms * 1e-3,
            "overlap": args.overlap, "costs": costs, "refresh": args.refresh,
            "transform_cpu": True, "S": args.servers, "colocated": args.colocated,
            "shard_cores": 1, "chunk_bytes": args.chunk_kib * 1024 or None}
    ranks = args.powersgd_ranks or [1]
    arms = ["ddp-allreduce", "ddp-fp16"] + [f"ddp-powersgd-r{r}" for r in ranks] + GIFTD_ARMS
    ratio = parse_ratios(args.steps_ratio)
    rows = []
    for arm in arms:
        ps = "powersgd" in arm
        p = predict(dict(base, arm="ddp-powersgd" if ps else arm,
                         powersgd_rank=int(arm.rsplit("r", 1)[1]) if ps else None))
        k = ratio.get(arm, 1.0)
        p.update(arm=arm, steps_to_target=args.steps * k, time_to_target_s=args.steps * k * p["step_s"])
        rows.append(p)
    lines = [f"Llama {shape}: {n_params(tensors)} parameters, W = {w}, S = {args.servers}"
             f"{' co-located' if args.colocated else ''}, {args.link_gbps:g} Gbit/s, "
             f"{args.delay_ms} ms, compute {args.compute_ms} ms, overlap {args.overlap}; "
             f"costs {costs['source']}", "",
             "| arm | bytes sent per worker | comm ms | step ms | time to target s |",
             "|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['arm']} | {r['bytes_per_worker_tx']:.0f} | {ms(r['comm_s'])} | "
                     f"{ms(r['step_s'])} | {r['time_to_target_s']:.1f} |")
    write_out(args, {"params": n_params(tensors), "rows": rows, "costs": costs}, "\n".join(lines))


if __name__ == "__main__":
    main()
