"""gift.policy_table: the owners' decisions as the worker's binding reads them."""
import os
import select
import signal
import subprocess
import time

import numpy as np
import pytest

import gift
from conftest import giftd_bin

SAMPLE = """\
# HELP giftd_policy 1, labelled with the geometry owner's policy (giftd --policy).
giftd_policy{policy="auto"} 1
giftd_policy_budget 4.5
giftd_policy_max_transform_gflops 0
giftd_tensor_policy{key="3",tensor="b \\"q\\"",mode="euclidean",push_codec="nvfp4",pull_codec="nvfp4"} 1
giftd_tensor_policy{key="0",tensor="a",mode="gift",push_codec="fp8-e4m3",pull_codec="fp8-e4m3"} 1
giftd_tensor_transform_rank{key="0",tensor="a"} 32
giftd_tensor_transform_rank{key="3",tensor="b \\"q\\""} 64
giftd_tensor_predicted_error_ratio{key="0",tensor="a"} 0.31
giftd_tensor_element_cost{key="0",tensor="a"} 8.5
giftd_world_size 2
"""


def test_parse_metrics():
    p = gift.parse_metrics(SAMPLE)
    assert p["policy"] == "auto" and p["budget_bits"] == 4.5, p
    assert [r["key"] for r in p["tensors"]] == [0, 3], p["tensors"]
    a, b = p["tensors"]
    assert a == {"key": 0, "tensor": "a", "mode": "gift", "push_codec": "fp8-e4m3",
                 "pull_codec": "fp8-e4m3", "rank": 32, "predicted_ratio": 0.31, "bits": 8.5}, a
    assert b["tensor"] == 'b "q"' and b["mode"] == "euclidean" and b["rank"] == 64, b


def _giftd(tmp_path, *extra):
    log = open(os.path.join(str(tmp_path), "giftd.log"), "w")
    p = subprocess.Popen([giftd_bin(), "--bind", "127.0.0.1", "--port", "0", "--http-port", "0",
                          "--world-size", "1", "--log-level", "warn", *extra],
                         stdout=subprocess.PIPE, stderr=log)
    line, end = b"", time.monotonic() + 10
    while not line.endswith(b"\n"):
        r, _, _ = select.select([p.stdout], [], [], max(end - time.monotonic(), 0))
        assert r, "giftd printed no ready line"
        c = os.read(p.stdout.fileno(), 1)
        assert c, "giftd exited before it was ready"
        line += c
    words = dict(w.split("=", 1) for w in line.decode().split()[2:])
    return p, f"127.0.0.1:{words['port']}", f"127.0.0.1:{words['http_port']}"


def test_policy_table_from_a_shard(tmp_path):
    p, server, http = _giftd(tmp_path, "--policy", "none", "--budget-bits", "7")
    try:
        with gift.Client(servers=server, rank=0, world_size=1) as c:
            c.declare([gift.Tensor("w", 64, 128, codec="fp8", geometry=True, rank=16),
                       gift.Tensor("b", 1, 64)])
            g = np.ones(64 * 128, dtype=np.float32)
            c.push_pull(0, 0, g, np.empty_like(g)).wait()
            table = gift.policy_table(server, http)
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(10)
        p.stdout.close()
    assert len(table) == 1, table
    row = table[0]
    assert row["tensor"] == "w" and row["policy"] == "none" and row["budget_bits"] == 7, row
    # policy none: Euclidean; the budget (7 bits) cannot afford fp8 for the only tensor.
    assert row["mode"] == "euclidean" and row["push_codec"] == "nvfp4", row
    assert row["server"] == server and row["rank"] == 16, row
