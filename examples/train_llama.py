#!/usr/bin/python3
"""
train_llama.py: train a small byte-level Llama through giftd.

A Llama-style decoder (RMSNorm, rotary position embeddings, SwiGLU MLP,
causal multi-head attention; no biases) over bytes, trained on text every
Debian machine has: /usr/lib/python3.11/*.py and /usr/share/common-licenses/*
(every tenth file, in sorted order, is held out for validation). Each
worker samples windows from its own contiguous shard of the training bytes.

Optimiser: Muon (momentum + Newton-Schulz orthogonalisation) for the 2-D
weights of the transformer blocks, AdamW for embeddings, the output head and
the norms; `--optim adamw` uses AdamW for all. Linear warm-up, then cosine
decay to --lr-floor of the peak (default a tenth; 0 anneals to zero).

Gradients are averaged through a giftd cluster by gift.torch's DDP
communication hook (DDP itself runs on a gloo process group, which it only
uses to broadcast the initial weights): --comm picks the wire format,
f32 | bf16 | fp8 | fp8-gift | fp8-hadamard | nvfp4 | nvfp4-gift | nvfp4-hadamard
("-gift": the GIFT geometry on every nn.Linear weight with at least 64 inputs
and --gift-min elements; "-hadamard": those same weights rotated by random
signs and an orthonormal Walsh-Hadamard transform along their inputs instead,
issue 42; all other tensors Euclidean, in the same format).

--comm auto-8, auto-6, auto-5 and auto-4.5 declare the tensors as fp8-gift and
need shards running the geometry owner's policy (giftd(8), POLICY): auto-8
`--policy auto`, auto-B `--policy auto --budget-bits B`, which then chooses per
tensor and epoch GIFT or Euclidean, the rank and the format. The worker cannot
set the shards' policy; start them with it, e.g.

    build/tools/giftrun --workers 2 --shards 1 --giftd-arg=--policy=auto \
        --giftd-arg=--budget-bits=4.5 -- \
        /usr/bin/python3 examples/train_llama.py --comm auto-4.5 --steps 300

--policy and --budget-bits name other combinations (e.g. --comm fp8-gift
--policy none). The run checks them against the shards' /metrics when it can
read it (the HTTP port next to each protocol port, or --http) and stops on a
mismatch; summary.json records them and, from rank 0, the shards' final
per-tensor decisions (gift.policy_table).

The baselines a user already has run from the same script, on the same
model, data and schedule, without giftd (no GIFT_SERVERS needed):
ddp-allreduce (DDP on gloo without a hook: PyTorch's default), ddp-fp16
(PyTorch's fp16_compress_hook) and ddp-powersgd (PyTorch's PowerSGD hook,
rank --powersgd-rank; "match-nvfp4" picks the rank whose bytes per step are
nearest nvfp4's through giftd). --comm none sends nothing (each worker
trains on its own gradient): it measures the compute-only step.

Run it with giftrun, which starts the shards and the workers together and
sets every variable (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
GIFT_SERVERS):

    build/tools/giftrun --workers 2 --shards 2 -- \
        /usr/bin/python3 examples/train_llama.py --comm fp8-gift --steps 300

or set those variables yourself against running shards. torchrun from
Debian's torch 1.13 fails on Python 3.11 before starting any worker
(AttributeError: 'NoneType' object has no attribute 'get'; docs/TROUBLESHOOTING.md,
"torchrun"); `torchrun --redirects 1 --tee 1 ...` avoids that bug.
--timeout-ms bounds each push and pull (libgiftclient's default: 60 s);
--chunk-kib sets the largest chunk (default 4096 KiB; on a slow link a
smaller one lets the shards reply sooner, see libgiftclient(3)).

Rank 0 prints progress and, with --out DIR, writes DIR/log.csv (per step:
train loss averaged over the workers, validation loss every --val-every
steps, wire bytes of this worker, step time, the worker's CPU seconds and,
with --netdev IF, the bytes IF sent and received during the step) and
DIR/summary.json. --dump
writes, at --dump-steps, each worker's local gradient and the input
covariance X^T X / n of the --dump-layers (default: every nn.Linear) as raw
float32 files for `gift-bench fidelity --grad ... --cov ...`.

--checkpoint DIR makes a run resumable (examples/slurm/README.md, a Slurm job
stopped and resubmitted): each worker saves DIR/worker-RANK.pt (model and
optimiser state_dicts, the steps done, its sampler's and torch's RNG states;
the LR schedule is a function of the step) after every --checkpoint-every N
steps (default 1) and at the end, atomically (a temporary file, fsynced,
os.replace); about 13 ms a save for the tiny model of the tests on a local
disk, mostly the fsyncs. On SIGTERM a worker saves its last completed step
and exits 143 at once, also in the middle of a step that the draining shards
will not finish. When the files exist, the workers load them, print
"resumed from step N" and continue at step N + 1, pushing with the shards'
step numbers (gift.torch.GiftState start_step=N). The arguments that shape
the run (--steps, --seed, the model, the schedule, --comm) must be the same;
a different one stops the start. The shards, restored from their own
checkpoints (giftd --checkpoint-steps, the same GIFT_RUN_ID and data_dir),
hold every step a worker finished and keep the mean of their last two
finished steps: a worker that saved step N has pulled it, and none can have
finished N + 2 (every worker pushes N + 2 only after finishing N + 1), so a
re-push of N + 1 is acknowledged as a duplicate and its pull answered with
the kept mean. The workers agree on the step first: one a step behind the
others (stopped after it pushed, before its pull came back) replays that step
alone from the shards' kept mean. With N > 1 a worker killed without SIGTERM
(SIGKILL, a lost node) loses up to N - 1 steps, further back than the shards
keep: its resume is refused ("only steps ... are kept"). Resume is exact
with --comm f32 (tested: the same losses as a run without the stop) or bf16,
and with fp8/nvfp4 only with --no-ef --no-pull-ef: the error-feedback
residuals (the worker's in libgiftclient, the shards' of the pulled mean) are
not saved, so a resumed worker starts them at zero; the run then continues,
not bit-for-bit. The GIFT geometry arms (-gift, auto-*) are not tested
resuming; a worker restart needs a step that is not a sketch refresh step
(docs/TROUBLESHOOTING.md, "Restarting one worker").
"""
import argparse
import glob
import json
import math
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import gift.torch  # noqa: E402

# --comm names that do not go through giftd: PyTorch's own DDP communication.
DDP_COMMS = ("ddp-allreduce", "ddp-fp16", "ddp-powersgd", "none")
# --comm arms of the geometry owner's policy (giftd(8), POLICY): the tensors are
# declared as fp8-gift, and the shards must run this policy and budget.
POLICY_COMMS = {"auto-8": ("fp8-gift", "auto", 0.0), "auto-6": ("fp8-gift", "auto", 6.0),
                "auto-5": ("fp8-gift", "auto", 5.0), "auto-4.5": ("fp8-gift", "auto", 4.5)}


# --------------------------------------------------------------------- model

class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(seq, hd, base=10000.0):
    inv = 1.0 / base ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd)
    ang = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
    return ang.cos(), ang.sin()


def apply_rope(x, cos, sin):
    # x: B, H, T, hd; rotate pairs (even, odd)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, dim, heads, ffn):
        super().__init__()
        self.heads = heads
        self.attn_norm = RMSNorm(dim)
        self.wqkv = nn.Linear(dim, 3 * dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.mlp_norm = RMSNorm(dim)
        self.w13 = nn.Linear(dim, 2 * ffn, bias=False)  # gate and up, fused
        self.w2 = nn.Linear(ffn, dim, bias=False)

    def forward(self, x, cos, sin, mask):
        B, T, D = x.shape
        hd = D // self.heads
        q, k, v = self.wqkv(self.attn_norm(x)).split(D, dim=-1)
        q, k, v = (t.view(B, T, self.heads, hd).transpose(1, 2) for t in (q, k, v))
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        x = x + self.wo((att @ v).transpose(1, 2).reshape(B, T, D))
        g, u = self.w13(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.w2(F.silu(g) * u)


class Llama(nn.Module):
    def __init__(self, dim=128, layers=4, heads=4, ffn=None, seq=128, vocab=256):
        super().__init__()
        ffn = ffn or 32 * round(8 * dim / 3 / 32)
        self.tok = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, ffn) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        # Constants, not buffers: DDP need not broadcast them.
        self.cos, self.sin = rope_tables(seq, dim // heads)
        self.mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("wo.weight", "w2.weight")) \
                    else 0.02
                nn.init.normal_(p, std=std)

    def forward(self, idx):
        T = idx.shape[1]
        x = self.tok(idx)
        cos, sin, mask = self.cos[:T], self.sin[:T], self.mask[:T, :T]
        for b in self.blocks:
            x = b(x, cos, sin, mask)
        return self.head(self.norm(x))


# ----------------------------------------------------------------- optimiser

def newton_schulz5(G, steps=5, eps=1e-7):
    """The orthogonal factor of G, approximately (Muon's quintic iteration)."""
    a, b, c = 3.4445, -4.7750, 2.0315
    X = G / (G.norm() + eps)
    tall = X.shape[0] > X.shape[1]
    if tall:
        X = X.T
    for _ in range(steps):
        A = X @ X.T
        X = a * X + (b * A + c * A @ A) @ X
    return X.T if tall else X


class Muon(torch.optim.Optimizer):
    """Muon: SGD-momentum (Nesterov) whose update is orthogonalised by
    Newton-Schulz, scaled by sqrt(max(1, rows/cols))."""

    def __init__(self, params, lr=0.02, momentum=0.95, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for grp in self.param_groups:
            for p in grp["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                buf = st.setdefault("m", torch.zeros_like(p))
                buf.mul_(grp["momentum"]).add_(p.grad)
                g = p.grad.add(buf, alpha=grp["momentum"])
                u = newton_schulz5(g.reshape(g.shape[0], -1)).view_as(p)
                if grp["weight_decay"]:
                    p.mul_(1 - grp["lr"] * grp["weight_decay"])
                p.add_(u, alpha=-grp["lr"] * max(1.0, p.shape[0] / p[0].numel()) ** 0.5)


def make_optimizers(model, args):
    muon, adam = [], []
    for name, p in model.named_parameters():
        if args.optim == "muon" and p.dim() == 2 and name.startswith("blocks."):
            muon.append(p)
        else:
            adam.append(p)
    opts = [torch.optim.AdamW(adam, lr=args.lr, betas=(0.9, 0.95), weight_decay=args.wd)]
    if muon:
        opts.append(Muon(muon, lr=args.muon_lr))
    for o in opts:
        for g in o.param_groups:
            g["peak_lr"] = g["lr"]
    return opts


def lr_factor(step, args):
    if step < args.warmup:
        return (step + 1) / args.warmup
    t = (step - args.warmup) / max(1, args.steps - args.warmup)
    lo = args.lr_floor
    return lo + (1 - lo) * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))


# ---------------------------------------------------------------------- data

def load_corpus():
    files = sorted(glob.glob("/usr/lib/python3.11/*.py")) + \
        sorted(glob.glob("/usr/share/common-licenses/*"))
    train, val = bytearray(), bytearray()
    for i, f in enumerate(files):
        if not os.path.isfile(f):
            continue
        with open(f, "rb") as fh:
            (val if i % 10 == 9 else train).extend(fh.read())
    if not train or not val:
        sys.exit("train_llama: no corpus under /usr/lib/python3.11 or /usr/share/common-licenses")
    return (torch.frombuffer(train, dtype=torch.uint8).long(),
            torch.frombuffer(val, dtype=torch.uint8).long())


def batch(data, starts, seq):
    idx = starts[:, None] + torch.arange(seq + 1)
    w = data[idx]
    return w[:, :-1], w[:, 1:]


# ------------------------------------------------------------ communication

def powersgd_match_rank(model, nvfp4_bits=4.5):
    """The PowerSGD rank whose bytes per step are nearest nvfp4's through
    giftd: PowerSGD sends r * (rows + cols) f32 values per compressed matrix
    (P and Q) and every other tensor in f32; nvfp4 sends every element in
    about nvfp4_bits bits each way."""
    mats, other, total = [], 0, 0
    for p in model.parameters():
        total += p.numel()
        if p.dim() >= 2:
            mats.append((p.shape[0], p.numel() // p.shape[0]))
        else:
            other += p.numel()
    target = total * nvfp4_bits / 8
    best, best_err = 1, None
    for r in range(1, 257):
        # PowerSGD keeps a matrix uncompressed when compression would save < 2x.
        b = 4 * (other + sum(r * (m + n) if m * n >= 2 * r * (m + n) else m * n
                             for m, n in mats))
        err = abs(b - target)
        if best_err is None or err < best_err:
            best, best_err = r, err
    return best


def _no_comm_hook(state, bucket):
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def setup_ddp_comm(ddp, model, args):
    """Registers PyTorch's hook for a DDP_COMMS arm; returns its description."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    if args.comm == "ddp-allreduce":
        return "DDP allreduce on gloo (no hook)"
    if args.comm == "ddp-fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        return "DDP fp16_compress_hook"
    if args.comm == "none":
        ddp.register_comm_hook(None, _no_comm_hook)
        return "no communication (compute-only step)"
    r = powersgd_match_rank(model) if args.powersgd_rank == "match-nvfp4" \
        else int(args.powersgd_rank)
    args.powersgd_rank_used = r
    st = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=r,
                                     start_powerSGD_iter=args.powersgd_start,
                                     random_seed=args.seed)
    ddp.register_comm_hook(st, powerSGD_hook.powerSGD_hook)
    return f"DDP powerSGD_hook rank {r}, plain allreduce for the first {args.powersgd_start} steps"


def netdev_bytes(dev):
    """tx + rx bytes of interface dev so far (None without dev)."""
    if not dev:
        return None
    tot = 0
    for k in ("tx_bytes", "rx_bytes"):
        with open(f"/sys/class/net/{dev}/statistics/{k}") as fh:
            tot += int(fh.read())
    return tot


# ---------------------------------------------------------------- checkpoint

# What a worker's checkpoint must share with the run that resumes from it:
# another schedule, model, data order or wire format would not continue it.
CKPT_ARGS = ("steps", "warmup", "lr", "muon_lr", "lr_floor", "wd", "optim", "batch", "seq",
             "dim", "layers", "heads", "seed", "comm", "no_ef", "no_pull_ef", "pull_codec")


def save_checkpoint(path, done, model, opts, gen_state, world, args):
    """This worker's state after `done` completed steps, written atomically to
    path: a temporary file, fsynced, renamed over the old one, the folder
    fsynced (a kill or a crash leaves the old file or the new one)."""
    ck = {"format": 1, "step": done, "world": world,
          "args": {k: getattr(args, k) for k in CKPT_ARGS},
          "model": model.state_dict(), "opts": [o.state_dict() for o in opts],
          "gen": gen_state, "torch_rng": torch.get_rng_state()}
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as fh:
        torch.save(ck, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_checkpoint(path, world, args):
    """The checkpoint at path (a dict), or None when there is none; exits when
    it belongs to another run (world size or a CKPT_ARGS argument differs)."""
    if not os.path.exists(path):
        return None
    ck = torch.load(path, map_location="cpu")
    if not isinstance(ck, dict) or ck.get("format") != 1:
        sys.exit(f"train_llama: {path} is not a train_llama checkpoint (format 1)")
    diff = [f"{ck['world']} workers, not {world}"] if ck["world"] != world else []
    diff += [f"--{k.replace('_', '-')} {ck['args'].get(k)!r}, not {getattr(args, k)!r}"
             for k in CKPT_ARGS if ck["args"].get(k) != getattr(args, k)]
    if diff:
        sys.exit(f"train_llama: {path} is from another run ({'; '.join(diff)}): resume with "
                 "the arguments it was saved with, or give another --checkpoint folder")
    return ck


def replay_comm(state):
    """The communication of a step that the other workers finished before the
    stop (see main): every gradient push_pulled outside DDP at state.step.
    The shards count the pushes as duplicates and answer the pulls with the
    step's mean they kept, the one the other workers applied."""
    step = state.step
    ops = []
    for tid, p in enumerate(state.params):
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        ops.append(state.client.push_pull(tid, step, p.grad))
    for op in ops:
        op.wait()
    state.end_step()


class TermWatch:
    """SIGTERM with --checkpoint: the worker saves the state of its last
    completed step (unless saved already) and exits 143, at once, from a
    thread of its own: also while the main thread waits in a step that will
    never finish (the shards drain on the same SIGTERM and stop reading, so
    a step some worker had not pushed stays unfinished). The main thread
    holds `lock` while it changes the model or the optimisers and while it
    saves; outside it they hold the state after the last completed step
    (a step in progress has only computed gradients). `save`, once set, is
    a callable that saves and says what it did."""

    def __init__(self, rank):
        self.rank = rank
        self.lock = threading.Lock()
        self.save = None
        r, w = os.pipe()
        os.set_blocking(w, False)
        # Python's C-level handler writes the signal's number to w at once,
        # whatever the main thread is doing; the Python handler does nothing.
        signal.set_wakeup_fd(w)
        signal.signal(signal.SIGTERM, lambda signum, frame: None)
        threading.Thread(target=self._run, args=(r,), name="sigterm", daemon=True).start()

    def _run(self, r):
        while int(signal.SIGTERM) not in os.read(r, 64):
            pass
        with self.lock:
            what = self.save() if self.save else "no step to save yet"
            print(f"train_llama: rank {self.rank}: SIGTERM: {what}; exiting", flush=True)
            sys.stderr.flush()
            os._exit(143)


# ---------------------------------------------------------------------- main

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--comm", default="f32",
                   choices=list(gift.torch.COMMS) + list(POLICY_COMMS) + list(DDP_COMMS))
    p.add_argument("--policy", choices=["all", "none", "auto", "hits"],
                   help="the policy the shards run (giftd --policy); default: the --comm "
                        "arm's (auto-*: auto), else all. Checked against the shards' /metrics "
                        "when their HTTP port is reachable (port + 1, or --http)")
    p.add_argument("--budget-bits", type=float, default=None,
                   help="the shards' budget_bits (giftd --budget-bits); default: the arm's "
                        "(auto-4.5: 4.5), else unset")
    p.add_argument("--http", help="host:port,... of the shards' HTTP ports, for the policy "
                                  "check and table (default: each of GIFT_SERVERS's ports + 1)")
    p.add_argument("--powersgd-rank", default="1",
                   help="ddp-powersgd: matrix approximation rank (PyTorch's default 1), or "
                        "match-nvfp4")
    p.add_argument("--powersgd-start", type=int, default=10,
                   help="ddp-powersgd: steps of plain allreduce before compressing")
    p.add_argument("--netdev", help="count this interface's tx+rx bytes per step "
                                    "(/sys/class/net/IF/statistics)")
    p.add_argument("--time-limit", type=float, default=0,
                   help="stop after this many seconds of training (0: no limit)")
    p.add_argument("--optim", default="muon", choices=["muon", "adamw"])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--lr", type=float, default=3e-3, help="AdamW peak learning rate")
    p.add_argument("--muon-lr", type=float, default=0.02, help="Muon peak learning rate")
    p.add_argument("--lr-floor", type=float, default=0.1, metavar="F",
                   help="the cosine decays to F times the peak by the end of the run (0..1; "
                        "default 0.1, 0 anneals to zero)")
    p.add_argument("--wd", type=float, default=0.0, help="AdamW weight decay")
    p.add_argument("--batch", type=int, default=16, help="sequences per worker per step")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seed", type=int, default=1, help="model init and data order")
    p.add_argument("--val-every", type=int, default=25)
    p.add_argument("--val-batches", type=int, default=8, help="validation batches (all ranks)")
    p.add_argument("--refresh", type=int, default=20, help="GIFT sketch interval in steps")
    p.add_argument("--gift-rank", type=int, default=0, help="GIFT rank k; 0: default policy")
    p.add_argument("--gift-min", type=int, default=4096,
                   help="GIFT only on nn.Linear weights of at least this many elements")
    p.add_argument("--no-ef", action="store_true", help="no error feedback on fp8/nvfp4 pushes")
    p.add_argument("--no-pull-ef", action="store_true",
                   help="no error feedback on the pulled fp8/nvfp4 mean (the shards' residual)")
    p.add_argument("--pull-codec", choices=["f32", "bf16", "fp8-e4m3", "fp8-e5m2", "nvfp4"],
                   help="codec of the pulled mean for every tensor (default: --comm's codec)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--out", help="folder for log.csv and summary.json (rank 0)")
    p.add_argument("--checkpoint", metavar="DIR",
                   help="resume from and save to DIR/worker-RANK.pt (model, optimisers, step, "
                        "data order); on SIGTERM save and exit 143 (train_llama.py's "
                        "docstring says when a resume is exact)")
    p.add_argument("--checkpoint-every", type=int, default=1, metavar="N",
                   help="with --checkpoint, save after every N-th step (default 1: every "
                        "step, which a resume after a SIGKILL needs) and at the end")
    p.add_argument("--dump", help="folder for gradient/covariance dumps")
    p.add_argument("--dump-steps", default="", help="comma-separated steps to dump at")
    p.add_argument("--dump-layers", default="all",
                   help="comma-separated nn.Linear modules whose weight gradient and inputs "
                        "are dumped, or 'all' (every nn.Linear: the blocks' and the head)")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--timeout-ms", type=int, default=0,
                   help="fail a push or pull not done in this many ms (0: the library's 60 s)")
    p.add_argument("--chunk-kib", type=int, default=0, metavar="KIB",
                   help="largest chunk in KiB of fp32 (0: GIFT_CHUNK_BYTES, else the "
                        "library's 4096)")
    args = p.parse_args(argv)
    if not 0 <= args.lr_floor <= 1:
        p.error(f"--lr-floor {args.lr_floor}: a fraction of the peak, 0..1")
    if not 0 <= args.chunk_kib <= 1 << 20:
        p.error(f"--chunk-kib {args.chunk_kib}: 0 (the default) or 1..1048576 KiB")
    if args.checkpoint_every < 1:
        p.error(f"--checkpoint-every {args.checkpoint_every}: 1 or more")
    return args


def shard_policy_table(args, log):
    """The shards' per-tensor decisions (gift.policy_table), or None when
    their /metrics cannot be read."""
    try:
        return gift.policy_table(os.environ.get("GIFT_SERVERS"), args.http, timeout=2.0)
    except (OSError, ValueError) as e:
        log(f"train_llama: the shards' policy table cannot be read ({e}); pass --http")
        return None


def check_shard_policy(args, log):
    """The policy and budget this run needs (--policy, --budget-bits, or the
    --comm arm's), checked against what the shards report. The worker cannot
    set them: the giftd it runs against must be started with them (giftrun
    --giftd-arg=--policy=auto --giftd-arg=--budget-bits=4.5). A mismatch
    stops the run, so a table is never labelled with a policy it did not
    run; shards whose /metrics cannot be read are trusted, with a warning."""
    arm = POLICY_COMMS.get(args.comm)
    want = args.policy or (arm[1] if arm else "all")
    budget = args.budget_bits if args.budget_bits is not None else (arm[2] if arm else 0.0)
    args.policy_seen, args.budget_bits_seen = want, budget
    try:
        shards = gift.policy.shard_policies(os.environ.get("GIFT_SERVERS"), args.http, 2.0)
    except (OSError, ValueError) as e:
        log(f"train_llama: cannot read the shards' policy ({e}); assuming policy {want}, "
            f"budget_bits {budget:g}")
        return
    for i, sh in enumerate(shards):
        if sh["policy"] is not None and (sh["policy"] != want or sh["budget_bits"] != budget):
            sys.exit(f"train_llama: --comm {args.comm} needs shards with policy {want} and "
                     f"budget_bits {budget:g}; shard {i} runs policy {sh['policy']}, "
                     f"budget_bits {sh['budget_bits']:g} (start giftd with --policy {want}"
                     + (f" --budget-bits {budget:g}" if budget else "") + ")")


def main(argv=None):
    args = parse_args(argv)
    # --checkpoint: a SIGTERM from here on saves (once there is a step to
    # save) and exits 143 (TermWatch). `lock` guards the model and optimisers.
    term = TermWatch(os.environ.get("RANK", "0")) if args.checkpoint else None
    lock = term.lock if term else threading.Lock()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    log = (lambda *a: print(*a, flush=True)) if rank == 0 and not args.quiet else \
        (lambda *a: None)

    train, val = load_corpus()
    torch.manual_seed(args.seed)
    model = Llama(args.dim, args.layers, args.heads, seq=args.seq)
    nparams = sum(p.numel() for p in model.parameters())

    args.powersgd_rank_used = None
    args.policy_seen = args.budget_bits_seen = None
    if args.comm == "ddp-powersgd":
        # One bucket: PowerSGD chains a second allreduce (Q) onto each bucket's
        # first (P) from gloo's own threads, so with two buckets in flight the
        # ranks can issue their collectives in different orders (measured: a
        # gloo size mismatch at the first compressed step).
        dist._DEFAULT_FIRST_BUCKET_BYTES = 1 << 30
        ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1024)
    else:
        ddp = nn.parallel.DistributedDataParallel(model)
    # Resume: this worker's checkpoint, loaded after DDP's broadcast of rank
    # 0's initial weights (which would overwrite it). The workers stopped
    # together (one SIGTERM) are at most one step apart: a worker finishes
    # step n only once every worker has pushed it, which each does only after
    # finishing (and saving) step n - 1. A worker one step behind replays that
    # step alone (replay_comm): the shards keep the mean of their last two
    # finished steps and answer it again.
    ck, start, hi, ck_path = None, 0, 0, None
    if args.checkpoint:
        if term is not None:
            term.rank = rank
        os.makedirs(args.checkpoint, exist_ok=True)
        ck_path = os.path.join(args.checkpoint, f"worker-{rank}.pt")
        ck = load_checkpoint(ck_path, world, args)
        mine = ck["step"] if ck else -1
        t = torch.tensor([mine, -mine])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        hi, least = int(t[0]), -int(t[1])
        if least < 0 < hi or hi - least > 1:
            sys.exit(f"train_llama: the workers' checkpoints in {args.checkpoint} are at steps "
                     f"{least if least >= 0 else 'none'}..{hi} (this rank: "
                     f"{mine if ck else 'none'}): not one stop of one run, cannot resume")
        if least < hi and args.comm in DDP_COMMS:
            sys.exit(f"train_llama: the workers' checkpoints are at steps {least} and {hi}: "
                     f"--comm {args.comm} keeps no mean to replay step {least + 1} from")
        if ck is not None:
            model.load_state_dict(ck["model"])
            start = mine
        hi = max(hi, 0)
    if args.comm in DDP_COMMS:
        state = None
        how = setup_ddp_comm(ddp, model, args)
    else:
        check_shard_policy(args, log)
        policy = gift.torch.Policy.from_comm(POLICY_COMMS.get(args.comm, (args.comm,))[0],
                                             refresh=args.refresh,
                                             rank=args.gift_rank, min_numel=args.gift_min,
                                             error_feedback=False if args.no_ef else None,
                                             pull_error_feedback=False if args.no_pull_ef
                                             else None,
                                             overrides={"*": {"pull_codec": args.pull_codec}}
                                             if args.pull_codec else None)
        state = gift.torch.GiftState(model, policy=policy, seed=args.seed, start_step=start,
                                    timeout_ms=args.timeout_ms,
                                    chunk_bytes=args.chunk_kib * 1024)
        ddp.register_comm_hook(state, gift.torch.comm_hook)
        how = f"giftd, libgiftclient {gift.version()}"
    opts = make_optimizers(model, args)
    if ck is not None:
        for o, sd in zip(opts, ck["opts"]):
            o.load_state_dict(sd)
    log(f"train_llama: {nparams / 1e6:.2f}M parameters, {world} workers, comm {args.comm}, "
        f"optim {args.optim}, {len(train) / 1e6:.1f} MB train / {len(val) / 1e6:.2f} MB val, "
        f"{how}")
    if state is not None and not args.quiet:
        log(state.describe())

    # This worker's shard of the training bytes, and its own sampler.
    shard = len(train) // world
    lo = rank * shard
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    if ck is not None:
        gen.set_state(ck["gen"])
        torch.set_rng_state(ck["torch_rng"])
        if not args.quiet:
            print(f"train_llama: rank {rank} resumed from step {start} ({ck_path})"
                  + (f"; replaying step {start + 1}, which the other workers finished"
                     if start < hi else ""), flush=True)
    # Validation: fixed windows (the same for every seed), split over the ranks.
    vgen = torch.Generator().manual_seed(12345)
    vstarts = torch.randint(0, len(val) - args.seq - 1, (args.val_batches * args.batch,),
                            generator=vgen)[rank::world]

    if args.dump and state is None:
        sys.exit(f"train_llama: --dump needs a giftd --comm, not {args.comm}")
    dump_steps = {int(s) for s in args.dump_steps.split(",") if s}
    dump_layers = [s for s in args.dump_layers.split(",") if s] if args.dump else []
    captured = {}
    if dump_layers:
        mods = dict(model.named_modules())
        if dump_layers == ["all"]:
            dump_layers = [n for n, m in mods.items() if isinstance(m, nn.Linear)]
        bad = [n for n in dump_layers if not isinstance(mods.get(n), nn.Linear)]
        if bad:
            sys.exit(f"train_llama: --dump-layers: not an nn.Linear of this model: {', '.join(bad)}")

        def cov_hook(name):
            def hook(mod, inputs, output):
                if state.step in dump_steps and mod.training:
                    X = inputs[0].detach().reshape(-1, mod.in_features).double()
                    captured[name + ".cov"] = (X.T @ X / X.shape[0]).float()
            return hook

        for n in dump_layers:
            mods[n].register_forward_hook(cov_hook(n))

        def tap(name, g, step):
            if step in dump_steps and name[: -len(".weight")] in dump_layers:
                captured[name[: -len(".weight")] + ".grad"] = g.detach().clone()
        state.grad_tap = tap

    @torch.no_grad()
    def evaluate():
        model.eval()
        tot = torch.zeros(2)
        for i in range(0, len(vstarts), args.batch):
            x, y = batch(val, vstarts[i:i + args.batch], args.seq)
            tot[0] += F.cross_entropy(model(x).flatten(0, 1), y.flatten(), reduction="sum")
            tot[1] += y.numel()
        dist.all_reduce(tot)
        model.train()
        return (tot[0] / tot[1]).item()

    rows, t_start = [], time.perf_counter()
    csv = None
    if args.out and rank == 0:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, "log.csv")
        again = start > 0 and os.path.exists(path)  # a resumed run adds its rows
        csv = open(path, "a" if again else "w", buffering=1)  # line-buffered
        if not again:
            csv.write("step,train_loss,val_loss,wire_bytes,step_s,lr_factor,cpu_s,netdev_bytes,"
                      "train_s\n")
    val_loss = None
    train_s = 0.0  # wall time in training steps (validation excluded)
    # --checkpoint: `done` steps completed, ck_gen the sampler's state after
    # them, `saved` the step of the file (TermWatch saves through save_now).
    done, saved, ck_gen = start, (start if ck is not None else None), gen.get_state()

    def save_now():
        nonlocal saved
        if saved == done:
            return f"step {done} is saved in {ck_path}"
        save_checkpoint(ck_path, done, model, opts, ck_gen, world, args)
        saved = done
        return f"saved step {done} to {ck_path}"

    if term is not None:
        term.save = save_now
    for step in range(start, args.steps):
        t0 = time.perf_counter()
        c0 = time.process_time()
        n0 = netdev_bytes(args.netdev)
        b0 = state.wire_bytes() if state else 0
        f = lr_factor(step, args)
        for o in opts:
            for g in o.param_groups:
                g["lr"] = g["peak_lr"] * f
        starts = lo + torch.randint(0, shard - args.seq - 1, (args.batch,), generator=gen)
        x, y = batch(train, starts, args.seq)
        if step < hi:
            # A step the other workers finished before the stop (see the
            # resume above): its mean from the shards, without DDP, whose
            # collectives they would not join.
            with ddp.no_sync():
                loss = F.cross_entropy(ddp(x).flatten(0, 1), y.flatten())
                for o in opts:
                    o.zero_grad(set_to_none=True)
                loss.backward()
            replay_comm(state)
        else:
            loss = F.cross_entropy(ddp(x).flatten(0, 1), y.flatten())
            for o in opts:
                o.zero_grad(set_to_none=True)
            loss.backward()
        with lock:
            for o in opts:
                o.step()
            done, ck_gen = step + 1, gen.get_state() if args.checkpoint else None
            if args.checkpoint and (done % args.checkpoint_every == 0 or done == args.steps):
                save_now()
        if step < hi:
            continue
        wire = state.wire_bytes() - b0 if state else None
        # Read before the loss all_reduce below: only the gradients' traffic.
        nd = netdev_bytes(args.netdev) - n0 if args.netdev else None
        if captured and step in dump_steps:
            d = os.path.join(args.dump, f"step{step}")
            os.makedirs(d, exist_ok=True)
            meta = {}
            for k, v in sorted(captured.items()):
                v.contiguous().numpy().tofile(os.path.join(d, f"{k}.rank{rank}.f32"))
                meta[k] = list(v.shape)
            if rank == 0:
                with open(os.path.join(d, "shapes.json"), "w") as fh:
                    json.dump(meta, fh)
            captured.clear()
        lt = loss.detach().clone()
        dist.all_reduce(lt)
        train_loss = lt.item() / world
        dt = time.perf_counter() - t0
        cpu = time.process_time() - c0
        train_s += dt
        # Every rank decides to stop together (rank 0's clock).
        stop = torch.tensor([1 if args.time_limit and train_s >= args.time_limit else 0])
        if args.time_limit:
            dist.broadcast(stop, 0)
        vl = None
        if (step + 1) % args.val_every == 0 or step + 1 == args.steps or stop.item():
            vl = val_loss = evaluate()
            shown = nd if wire is None else wire
            log(f"step {step + 1:5d}  train {train_loss:.4f}  val {vl:.4f}  "
                f"wire {(shown or 0) / 1e6:.2f} MB/step  {dt * 1e3:.0f} ms/step")
        if not math.isfinite(train_loss):
            sys.exit(f"train_llama: loss is {train_loss} at step {step}")
        rows.append((train_loss, wire or 0, dt, cpu, nd))
        if csv:
            csv.write(f"{step + 1},{train_loss:.6f},{'' if vl is None else f'{vl:.6f}'},"
                      f"{'' if wire is None else wire},{dt:.4f},{f:.4f},{cpu:.4f},"
                      f"{'' if nd is None else nd},{train_s:.4f}\n")
        if stop.item():
            log(f"train_llama: --time-limit {args.time_limit} s reached at step {step + 1}")
            if args.checkpoint:
                with lock:
                    save_now()
            break
    elapsed = time.perf_counter() - t_start
    if val_loss is None:  # no step run here: resumed from the last step's checkpoint
        val_loss = evaluate()
    stats = state.stats() if state else {"epochs_switched": 0}
    summary = {
        "comm": args.comm, "pull_codec": args.pull_codec,
        "pull_ef": not args.no_pull_ef, "optim": args.optim, "seed": args.seed, "steps": args.steps,
        "world": world, "params": nparams, "final_val_loss": val_loss,
        "final_train_loss": sum(r[0] for r in rows[-10:]) / min(10, len(rows))
        if rows else None,
        "wire_bytes_per_step": sum(r[1] for r in rows[1:]) / max(1, len(rows) - 1)
        if state else None,
        "netdev_bytes_per_step": sum(r[4] for r in rows[1:]) / max(1, len(rows) - 1)
        if args.netdev else None,
        "cpu_s_per_step": sum(r[3] for r in rows[1:]) / max(1, len(rows) - 1),
        "steps_done": len(rows), "start_step": start, "train_s": train_s,
        "steps_per_s": len(rows) / elapsed, "epochs_switched": stats["epochs_switched"],
        "geometry_tensors": [t.name for t in state.tensors if t.geometry] if state else [],
        "hadamard_tensors": [t.name for t in state.tensors if t.hadamard] if state else [],
        "powersgd_rank": args.powersgd_rank_used,
        "policy": args.policy_seen, "budget_bits": args.budget_bits_seen,
        "policy_table": shard_policy_table(args, log) if state and rank == 0 else None,
        "args": vars(args),
    }
    if csv:
        csv.close()
        with open(os.path.join(args.out, "summary.json"), "w") as fh:
            json.dump(summary, fh, indent=1)
    per = summary["wire_bytes_per_step"] if state else summary["netdev_bytes_per_step"]
    log(f"done: val {val_loss:.4f}, "
        f"{'n/a' if per is None else f'{per / 1e6:.3f}'} MB/step/worker, "
        f"{summary['steps_per_s']:.2f} steps/s")
    if state:
        state.close()
    dist.destroy_process_group()
    # Leave now, before main's locals go: freeing DDP's reducer drops its
    # gloo group, whose destructor joins a gloo thread that may be waiting
    # for the GIL this thread holds (seen: a worker hung after its last step).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
