#!/usr/bin/python3
"""
bench/explore_transforms.py: would another transform beat GIFT's T = L' on the
dumped real gradients? A numpy simulation, for the planners; not a benchmark
of our code (gift-bench fidelity is that) and not run by the tests.

  explore_transforms.py --dump DIR --step S --lag P

DIR is a `train_llama.py --dump-dir` folder (stepN/<layer>.{grad,cov}.rank*.f32
and stepN/shapes.json). For every dumped layer it encodes each worker's
gradient G_w at step S through a transform T (G_w T, then decoded as
Q(G_w T) T^-1) and prints the whitened error of the workers' mean,
||(Ghat - G) L|| with L = (A + delta I)^-1/2 of step S's mean covariance A
(delta = 0.01 tr A / din, as gift_metric_whitened), over Euclidean fp8's.
The geometry is built from step P's covariance A' = U' diag(lambda') U'^T
(full rank, damped the same way), as in training where it lags.

Formats, simulated: fp8 E4M3 with one scale per 128 elements (amax -> 448,
round to nearest), and NVFP4 (E2M1, one E4M3 scale per 16 elements under one
f32 scale). The simulation gives gift-bench's measured ratios for GIFT fp8 and
GIFT/Euclidean nvfp4 at full rank (checked on blocks.0.wo, step 150 of the
batch-64 dumps: 0.225, 0.840, 3.744).

Transforms: GIFT, T = L' = U' diag(lambda'^-1/2) U'^T; "mix": T = U' D Q with Q
a random orthogonal matrix (incoherence mixing) and d_k^2 proportional to
1 / (||G u_k|| sqrt(lambda'_k)), the optimum for an error proportional to each
element when Q spreads every direction over all coordinates, with ||G u_k||
from step P's mean gradient (realisable) or step S's own (an oracle); and for
NVFP4, L' Q and Euclidean Q.
"""
import argparse
import json
import os

import numpy as np

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def e4m3(x):
    """Rounds x (already scaled) to the nearest E4M3 value (bias 7, max 448)."""
    e = np.maximum(np.floor(np.log2(np.maximum(np.abs(x), 1e-30))), -6)
    q = 2.0 ** (e - 3)
    return np.clip(np.round(x / q) * q, -448, 448)


def fp8(x, blk=128):
    f = x.reshape(-1, blk)
    m = np.abs(f).max(1, keepdims=True)
    m[m == 0] = 448.0  # an all-zero block: scale 1
    return (e4m3(f * 448.0 / m) * m / 448.0).reshape(x.shape)


def nvfp4(x, blk=16):
    f = x.reshape(-1, blk)
    gs = np.abs(f).max() / (448 * 6)
    bs = e4m3(np.abs(f).max(1) / 6 / gs) * gs
    bs[bs == 0] = 1
    v = f / bs[:, None]
    idx = np.abs(np.abs(v)[..., None] - E2M1).argmin(-1)
    return (np.sign(v) * E2M1[idx] * bs[:, None]).reshape(x.shape)


def damped_eig(A, damping=0.01):
    A = (A + A.T) / 2
    w, V = np.linalg.eigh(A)
    return w + damping * np.trace(A) / A.shape[0], V


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dump", required=True)
    ap.add_argument("--step", required=True, type=int)
    ap.add_argument("--lag", required=True, type=int, help="the dumped step the geometry is built from")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random rotation Q")
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    sp = os.path.join(a.dump, f"step{a.step}", "shapes.json")
    if not os.path.isfile(sp):
        raise SystemExit(f"explore_transforms: {sp} not found (a train_llama.py --dump-dir folder?)")
    with open(sp) as f:
        shapes = json.load(f)

    def load(step, name, kind, shape):
        d = os.path.join(a.dump, f"step{step}")
        fs = sorted(p for p in (os.listdir(d) if os.path.isdir(d) else [])
                    if p.startswith(f"{name}.{kind}.rank") and p.endswith(".f32"))
        if not fs:
            raise SystemExit(f"explore_transforms: no {name}.{kind} at step {step}")
        return [np.fromfile(os.path.join(a.dump, f"step{step}", p), dtype=np.float32)
                .astype(np.float64).reshape(shape) for p in fs]

    print(f"step {a.step}, geometry from step {a.lag}; whitened error over Euclidean fp8's")
    print()
    print("| layer | GIFT fp8 | mix fp8, D from step P | mix fp8, D from step S (oracle) "
          "| GIFT nvfp4 | GIFT nvfp4, L'Q | Eucl. nvfp4 | Eucl. nvfp4, Q |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in sorted({k.rsplit(".", 1)[0] for k in shapes}):
        rows, din = shapes[name + ".grad"]
        Gs = load(a.step, name, "grad", (rows, din))
        Gt = sum(Gs) / len(Gs)
        w, V = damped_eig(sum(load(a.step, name, "cov", (din, din))) / len(Gs))
        L = V @ np.diag(w ** -0.5) @ V.T
        cl = load(a.lag, name, "cov", (din, din))
        wl, Vl = damped_eig(sum(cl) / len(cl))
        gl = load(a.lag, name, "grad", (rows, din))
        Gl = sum(gl) / len(gl)
        Q, _ = np.linalg.qr(rng.standard_normal((din, din)))
        I = np.eye(din)

        def err(q, T, Ti):
            Gh = sum(q(G @ T) @ Ti for G in Gs) / len(Gs)
            return np.linalg.norm((Gh - Gt) @ L)

        def mix(G):
            g = np.linalg.norm(G @ Vl, axis=0) + 1e-12 * np.linalg.norm(G)
            d = (g * np.sqrt(wl)) ** -0.5
            return err(fp8, Vl @ np.diag(d) @ Q, Q.T @ np.diag(1 / d) @ Vl.T)

        T = Vl @ np.diag(wl ** -0.5) @ Vl.T
        Ti = Vl @ np.diag(wl ** 0.5) @ Vl.T
        base = err(fp8, I, I)
        r = [err(fp8, T, Ti), mix(Gl), mix(Gt), err(nvfp4, T, Ti), err(nvfp4, T @ Q, Q.T @ Ti),
             err(nvfp4, I, I), err(nvfp4, Q, Q.T)]
        print(f"| {name} | " + " | ".join(f"{x / base:.3f}" for x in r) + " |")


if __name__ == "__main__":
    main()
