"""
Fixtures for the Python tests: a real giftd cluster on 127.0.0.1.

GIFTD_BIN and GIFT_LIBRARY come from CTest (tests/python/CMakeLists.txt);
run by hand, they default to the repository's build/ folder.
"""
import os
import select
import signal
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "python"))
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def giftd_bin():
    return os.environ.get("GIFTD_BIN", os.path.join(REPO, "build", "server", "giftd"))


class Cluster:
    """S giftd shards for W workers on free loopback ports; servers is the
    GIFT_SERVERS string. stop() sends SIGTERM and reaps them (SIGKILL after
    5 s); the log of each shard is kept in tmp_path."""

    def __init__(self, shards, world, logdir, extra=()):
        self.procs, addrs, self.logs = [], [], []
        try:
            for i in range(shards):
                log = os.path.join(str(logdir), f"giftd-{i}.log")
                self.logs.append(log)
                p = subprocess.Popen(
                    [giftd_bin(), "--bind", "127.0.0.1", "--port", "0", "--http-port", "0",
                     "--shard-id", str(i), "--num-shards", str(shards), "--world-size",
                     str(world), "--log-level", "warn", *extra],
                    stdout=subprocess.PIPE, stderr=open(log, "w"))
                self.procs.append(p)
                addrs.append(f"127.0.0.1:{self._ready_port(p, log)}")
        except BaseException:
            self.stop()
            raise
        self.servers = ",".join(addrs)

    @staticmethod
    def _ready_port(p, log, timeout=10.0):
        line, end = b"", time.monotonic() + timeout
        while not line.endswith(b"\n"):
            left = end - time.monotonic()
            r, _, _ = select.select([p.stdout], [], [], max(left, 0))
            if not r:
                raise RuntimeError(f"giftd printed no ready line in {timeout} s; log {log}")
            c = os.read(p.stdout.fileno(), 1)
            if not c:
                raise RuntimeError(f"giftd exited before it was ready: {open(log).read()}")
            line += c
        words = dict(w.split("=", 1) for w in line.decode().split()[2:])
        return int(words["port"])

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if p.stdout:
                p.stdout.close()
        self.procs = []


@pytest.fixture
def cluster(tmp_path):
    """cluster(shards, world) -> Cluster; every cluster is stopped at the end."""
    made = []

    def make(shards=1, world=1, extra=()):
        c = Cluster(shards, world, tmp_path, extra)
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()
