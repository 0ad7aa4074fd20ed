"""Two DDP workers (gloo on 127.0.0.1) through a real 2-shard giftd: with f32
codecs the gift comm hook, and GiftReducer without DDP, give the parameters
of gloo's own allreduce within 1e-6; with fp8-gift (sketches, epochs) both
replicas stay bit-identical and close to the f32 run."""
import os
import socket
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cluster, tmp_path, comm, steps, mode="ddp"):
    c = cluster(shards=2, world=2)
    port = _free_port()
    procs, outs = [], []
    for rank in range(2):
        out = str(tmp_path / f"{comm}-{rank}.pt")
        outs.append(out)
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), GIFT_SERVERS=c.servers, OPENBLAS_NUM_THREADS="1",
                   OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, "ddp_worker.py"), out,
                                       comm, str(steps), mode], env=env))
    try:
        for p in procs:
            assert p.wait(120) == 0, f"worker exited {p.returncode}"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [torch.load(o) for o in outs]


def test_ddp_f32_matches_gloo(cluster, tmp_path):
    res = _run(cluster, tmp_path, "f32", 6)
    for r in res:
        assert r["steps"] == 6
        for k, ref in r["ref"].items():
            diff = (r["gift"][k] - ref).abs().max().item()
            assert diff <= 1e-6, f"{k}: |gift - gloo| = {diff}"
    for k in res[0]["gift"]:
        assert torch.equal(res[0]["gift"][k], res[1]["gift"][k]), k


def test_reducer_f32_matches_gloo(cluster, tmp_path):
    """gift.torch.GiftReducer (no DDP) against DDP's gloo allreduce."""
    res = _run(cluster, tmp_path, "f32", 4, mode="reducer")
    for r in res:
        assert r["steps"] == 4
        for k, ref in r["ref"].items():
            diff = (r["gift"][k] - ref).abs().max().item()
            assert diff <= 1e-6, f"{k}: |gift - gloo| = {diff}"


def test_ddp_fp8_gift_replicas_identical(cluster, tmp_path):
    res = _run(cluster, tmp_path, "fp8-gift", 6)
    assert res[0]["geometry"], "no tensor was sent in the GIFT geometry"
    assert res[0]["stats"]["epochs_switched"] > 0, res[0]["stats"]
    for k in res[0]["gift"]:
        a, b = res[0]["gift"][k], res[1]["gift"][k]
        assert torch.equal(a, b), f"{k}: replicas differ"
        assert torch.isfinite(a).all(), k
        ref = res[0]["ref"][k]
        rel = ((a - ref).norm() / ref.norm()).item()
        assert rel < 0.05, f"{k}: fp8-gift is {rel:.3g} away from gloo f32"
