"""The ctypes binding against a real giftd: round trips of every shape and
buffer kind, and C errors arriving as GiftError with gift_strerror's text."""
import os

import numpy as np
import pytest

import gift

torch = pytest.importorskip("torch")

SHAPES = [(1,), (7,), (1, 1), (3, 5), (64, 33), (2, 3, 4), (4, 1, 3, 3), (300, 257)]


def _client(cluster):
    c = cluster(shards=2, world=1)
    return gift.Client(servers=c.servers, rank=0, world_size=1)


def _rows_cols(shape):
    return (1, shape[0]) if len(shape) == 1 else (shape[0], int(np.prod(shape[1:])))


def test_version_and_strerror():
    assert gift.version().count(".") == 2
    assert gift.strerror(-19) == "tensor list differs from the declared one"
    assert gift.strerror(-13)  # every code has a sentence


def test_round_trip_every_shape(cluster):
    """World of one: the mean is the gradient itself, bit for bit in f32,
    for numpy and torch buffers, in place and out of place, contiguous or not."""
    with _client(cluster) as c:
        tensors = [gift.Tensor(f"t{i}", *_rows_cols(s)) for i, s in enumerate(SHAPES)]
        tensors.append(gift.Tensor("bf", 16, 64, codec="bf16"))
        c.declare(tensors)
        rng = np.random.default_rng(1)
        for step in range(3):
            ops, checks = [], []
            for i, s in enumerate(SHAPES):
                g = rng.standard_normal(s).astype(np.float32)
                if step == 0:  # numpy, out of place
                    out = np.empty_like(g)
                    ops.append(c.push_pull(i, step, g, out))
                    checks.append((g, out))
                elif step == 1:  # torch, in place
                    t = torch.from_numpy(g.copy())
                    ops.append(c.push_pull(i, step, t))
                    checks.append((g, t))
                else:  # torch, a non-contiguous gradient (copied), contiguous output
                    t = torch.from_numpy(g.copy())
                    src = t.t() if t.dim() == 2 else t
                    out = torch.empty(src.shape)
                    ops.append(c.push_pull(i, step, src, out))
                    checks.append((src.contiguous().numpy(), out))
            bf = torch.randn(16, 64)
            bf_out = torch.empty(16, 64)
            ops.append(c.push_pull(len(SHAPES), step, bf, bf_out))
            for op in ops:
                assert op.wait() == 0
            for want, got in checks:
                got = got.numpy() if hasattr(got, "numpy") else got
                np.testing.assert_array_equal(got.reshape(want.shape), want)
            # bf16: 8 significant bits, round to nearest
            assert torch.allclose(bf_out, bf, rtol=2 ** -8, atol=0)
        s = c.stats()
        assert s["bytes_out"] > 0 and s["bytes_in"] > 0 and s["frames_out"] > 0


def test_push_then_pull_and_callbacks(cluster):
    import threading
    with _client(cluster) as c:
        c.declare([gift.Tensor("w", 128, 256, codec="fp8", geometry=True, refresh=1)])
        g = torch.randn(128, 256)
        out = torch.zeros(128, 256)
        seen, ev = [], threading.Event()
        c.sketch_inputs(0, 0, torch.randn(512, 256))
        c.push(0, 0, g).wait()
        op = c.pull(0, 0, out, callback=lambda st: (seen.append(st), ev.set()))
        assert ev.wait(30) and seen == [0]
        op.wait()
        rel = (out - g).norm() / g.norm()
        assert 0 < rel < 0.1, rel


def test_pull_error_feedback(cluster):
    """pull_error_feedback: the shards carry the residual of the nvfp4-encoded
    mean into the next step, so over T steps of one constant gradient the sum
    of the pulled means is off by about one step's rounding, not T of them
    (without it every step rounds the same way and the errors add up). Each
    pulled mean stays an nvfp4 value of the mean: per-step error of the same
    order either way. Two shards, so the residual lives on both."""
    steps = 40
    with _client(cluster) as c:
        c.declare([gift.Tensor("plain", 64, 256, codec="f32", pull_codec="nvfp4"),
                   gift.Tensor("ef", 64, 256, codec="f32", pull_codec="nvfp4",
                               pull_error_feedback=True)])
        g = np.random.default_rng(7).standard_normal((64, 256)).astype(np.float32)
        sums = [np.zeros_like(g, dtype=np.float64) for _ in range(2)]
        step_err = [[], []]
        out = np.empty_like(g)
        for step in range(steps):
            for i in range(2):
                assert c.push_pull(i, step, g, out).wait() == 0
                sums[i] += out
                step_err[i].append(float(np.linalg.norm(out - g) / np.linalg.norm(g)))
        gn = np.linalg.norm(g) * steps
        drift = [float(np.linalg.norm(sm - steps * g.astype(np.float64)) / gn) for sm in sums]
        # plain: T equal roundings (relL2 of nvfp4 ~0.1); ef: one step's worth over T
        assert drift[0] > 0.05, f"plain nvfp4 pull drift {drift[0]:.4f} (expected ~0.1)"
        assert drift[1] < drift[0] / 10, \
            f"pull EF drift {drift[1]:.5f} not below a tenth of plain {drift[0]:.5f}"
        assert max(step_err[1]) < 3 * max(step_err[0]), \
            f"pull EF per-step relL2 up to {max(step_err[1]):.4f}, plain {max(step_err[0]):.4f}"


def _raises(code, fn, *a):
    with pytest.raises(gift.GiftError) as e:
        fn(*a)
    assert e.value.code == code, e.value
    assert gift.strerror(code) in str(e.value)
    return e.value


def test_open_errors_name_the_server(cluster):
    # a port nobody listens on: "connection refused" and the address, not a bare timeout
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    addr = f"127.0.0.1:{port}"
    e = _raises(-22, gift.Client, addr, 0, 1, 0, 0, 300)
    assert "connection refused" in str(e) and addr in str(e), e
    # a world size the shard does not have: both numbers and the shard's address
    cl = cluster(1, 2)
    e = _raises(-16, gift.Client, cl.servers, 0, 3, 0, 0, 5000)
    assert "world size 3" in str(e) and "has 2" in str(e) and "shard 0 (127.0.0.1:" in str(e), e
    # an operation that times out (rank 1 never comes) says after how long and how to set it
    with gift.Client(cl.servers, 0, 2, 0, 300, 5000) as c:
        c.declare([gift.Tensor("a", 4, 8)])
        e = _raises(-22, c.push_pull(0, 0, np.ones((4, 8), np.float32)).wait)
        assert "300 ms" in str(e) and "GIFT_TIMEOUT_MS" in str(e), e


def test_c_errors_are_exceptions(cluster):
    # bad server list: gift_client_open says GIFT_EINVAL
    e = _raises(-1, gift.Client, "no-port-here", 0, 1)
    assert "gift_client_open" in str(e)
    with _client(cluster) as c:
        # a zero-row tensor is refused by gift_declare
        _raises(-1, c.declare, [gift.Tensor("bad", 0, 4)])
    with _client(cluster) as c:
        c.declare([gift.Tensor("a", 4, 8), gift.Tensor("w", 64, 64, codec="fp8", geometry=True,
                                                          refresh=10)])
        x = np.ones((4, 8), np.float32)
        _raises(-1, c.push_pull, 5, 0, x)              # unknown tensor id
        _raises(-1, c.sketch_inputs, 0, 0, np.ones((8, 8), np.float32))   # not a geometry tensor
        _raises(-1, c.sketch_inputs, 1, 3, np.ones((8, 64), np.float32))  # not a refresh step
        bad = np.ones((64, 64), np.float32)
        bad[3, 3] = np.nan
        _raises(-2, c.sketch_inputs, 1, 0, bad)        # NaN in the inputs
        _raises(-2, c.push(1, 0, bad).wait)            # NaN in a push fails the op
        # Python-side checks for what C cannot see
        with pytest.raises(ValueError):
            c.push_pull(0, 0, np.ones(5, np.float32))
        with pytest.raises(TypeError):
            c.push_pull(0, 0, np.ones((4, 8), np.float64))
        with pytest.raises(TypeError):
            c.push_pull(0, 0, torch.ones(4, 8, dtype=torch.bfloat16))
    # the error class carries code and message
    err = gift.GiftError(-22, "gift_op_wait")
    assert err.code == -22 and err.message == gift.strerror(-22)


# ---------------------------------------------------------------------------
# Device tensors (gift_tensor_desc_t.memory = GIFT_MEMORY_CUDA)


def test_tensor_desc_layout_matches_the_header(tmp_path):
    """gift._lib._TensorDesc must be gift_tensor_desc_t, field for field."""
    c = _header_layout(tmp_path, gift._lib._TensorDesc, "gift_tensor_desc_t",
                       "  printf(\"memory_cuda %d\\n\", GIFT_MEMORY_CUDA);\n"
                       "  printf(\"enodev %d\\n\", GIFT_ENODEV);\n")
    assert gift.MEMORY_CUDA == c["memory_cuda"] == 1
    assert gift.strerror(c["enodev"]) == gift.strerror(-28)


def test_device_tensor_needs_a_device(cluster):
    """Without a usable CUDA device (this library built without CUDA, or no
    GPU), declaring a device tensor fails with GIFT_ENODEV; host tensors of
    the list are unaffected by the failed attempt."""
    import torch as _t
    if _t.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    with _client(cluster) as c:
        e = _raises(-28, c.declare, [gift.Tensor("w", 8, 8, device=0)])
        assert "CUDA" in e.message
        c.declare([gift.Tensor("w", 8, 8)])
        g = torch.randn(8, 8)
        out = torch.empty(8, 8)
        assert c.push_pull(0, 0, g, out).wait() == 0
        assert torch.equal(out, g)
        with pytest.raises(TypeError):  # declared on the host: a CUDA-looking request is refused
            gift._pointer(g, 64, False, "x", 0)


def test_tensor_device_names():
    assert gift.Tensor("a", 1, 1).device is None and gift.Tensor("a", 1, 1).memory == 0
    assert gift.Tensor("a", 1, 1, device="cpu").device is None
    assert gift.Tensor("a", 1, 1, device="cuda:2").device == 2
    assert gift.Tensor("a", 1, 1, device=3).memory == gift.MEMORY_CUDA
    assert gift.Tensor("a", 1, 1, device=torch.device("cuda", 1)).device == 1
    with pytest.raises(ValueError):
        gift.Tensor("a", 1, 1, device="tpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (Debian's torch is "
                    "CPU-only)")
def test_cuda_tensors_straight_through(cluster):
    """World of one on a GPU: CUDA tensors go to libgiftclient as device
    pointers; f32 comes back bit for bit, fp8 within its error, the sketch
    takes device inputs; a CPU tensor for a device tensor is refused."""
    with _client(cluster) as c:
        c.declare([gift.Tensor("f", 64, 100, device="cuda:0"),
                   gift.Tensor("w", 128, 256, codec="fp8", geometry=True, refresh=1,
                               error_feedback=True, device=0)])
        for step in range(3):
            g = torch.randn(64, 100, device="cuda")
            out = torch.full((64, 100), float("nan"), device="cuda")
            w = torch.randn(128, 256, device="cuda")
            wout = torch.full((128, 256), float("nan"), device="cuda")
            c.sketch_inputs(1, step, torch.randn(512, 256, device="cuda"))
            ops = [c.push_pull(0, step, g, out), c.push_pull(1, step, w, wout)]
            for op in ops:
                assert op.wait() == 0
            assert torch.equal(out, g)
            rel = ((wout - w).norm() / w.norm()).item()
            assert 0 < rel < 0.1, rel
        with pytest.raises(TypeError):
            c.push_pull(0, 3, torch.randn(64, 100))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (Debian's torch is "
                    "CPU-only)")
def test_reducer_cuda_gradients_straight_through(cluster):
    """gift.torch declares a CUDA model's parameters as device tensors and
    hands their .grad to libgiftclient without a host copy (world of one,
    f32: the mean is the gradient, bit for bit)."""
    import gift.torch as gt
    c = cluster(shards=1, world=1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 8)).cuda()
    red = gt.GiftReducer(model, comm="f32", servers=c.servers, rank=0, world_size=1)
    try:
        assert all(t.device == torch.cuda.current_device() for t in red.tensors)
        for _ in range(2):
            model.zero_grad()
            model(torch.randn(16, 64, device="cuda")).square().sum().backward()
            want = [p.grad.clone() for p in model.parameters()]
            red.synchronize()
            for p, w in zip(model.parameters(), want):
                assert torch.equal(p.grad, w)
    finally:
        red.close()


def test_codec_threads_same_means(cluster):
    """Client(codec_threads=N): the pulled means of GIFT and error-feedback
    tensors are the bytes the I/O thread alone gives, step for step (each
    client on a fresh cluster, so the steps start at 0 both times); a count
    outside 0..64 is refused with the reason."""
    def run(threads):
        c = cluster(shards=2, world=1)
        with gift.Client(servers=c.servers, rank=0, world_size=1,
                         codec_threads=threads) as cl:
            cl.declare([gift.Tensor("geo", 64, 96, codec="fp8-e4m3", geometry=True, rank=16,
                                    refresh=2),
                        gift.Tensor("ef", 48, 80, codec="nvfp4", error_feedback=True)])
            rng = np.random.default_rng(7)
            outs = []
            for step in range(5):
                gs = [rng.standard_normal((64, 96)).astype(np.float32),
                      rng.standard_normal((48, 80)).astype(np.float32)]
                if step % 2 == 0:
                    cl.sketch_inputs(0, step, rng.standard_normal((32, 96)).astype(np.float32))
                res = [np.empty_like(g) for g in gs]
                ops = [cl.push_pull(i, step, g, o) for i, (g, o) in enumerate(zip(gs, res))]
                for op in ops:
                    assert op.wait() == 0
                outs.append(res)
            return outs
    base, pooled = run(0), run(2)
    for step, (a, b) in enumerate(zip(base, pooled)):
        for name, x, y in zip(("geo", "ef"), a, b):
            assert np.array_equal(x, y), (step, name, float(np.abs(x - y).max()))
    c = cluster(shards=1, world=1)
    with pytest.raises(gift.GiftError) as e:
        gift.Client(servers=c.servers, rank=0, world_size=1, codec_threads=65)
    assert e.value.code == -1, e.value  # GIFT_EINVAL


def test_client_opts_layout_matches_the_header(tmp_path):
    """gift._lib._ClientOpts must be gift_client_opts_t, field for field
    (codec_threads was appended after run_id)."""
    c = _header_layout(tmp_path, gift._lib._ClientOpts, "gift_client_opts_t",
                       "  gift_client_opts_t o = GIFT_CLIENT_OPTS_INIT;\n"
                       "  printf(\"init_codec_threads %d\\n\", o.codec_threads);\n")
    assert c["init_codec_threads"] == -1  # GIFT_CLIENT_OPTS_INIT: from the environment


def _header_layout(tmp_path, cls, struct, extra=""):
    """Checks that ctypes structure cls is C's struct, field for field: a C
    program compiled against client/include/gift/client.h prints its size,
    each field's offset and the extra printf lines. Returns what it printed
    as a dict (skips without a C compiler)."""
    import ctypes
    import shutil
    import subprocess
    from conftest import REPO
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to read the header's layout")
    fields = [f for f, _ in cls._fields_]
    src = tmp_path / "layout.c"
    src.write_text("#include <stddef.h>\n#include <stdio.h>\n#include \"gift/client.h\"\n"
                   "int main(void) {\n"
                   f"  printf(\"sizeof %zu\\n\", sizeof({struct}));\n" +
                   "".join(f"  printf(\"{f} %zu\\n\", offsetof({struct}, {f}));\n"
                           for f in fields) + extra + "  return 0;\n}\n")
    exe = tmp_path / "layout"
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    subprocess.run([cc, "-std=c11", "-I", os.path.join(REPO, "client", "include"), "-I",
                    os.path.join(REPO, "common"), str(src), "-o", str(exe)], check=True, env=env)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True, env=env).stdout
    c = dict((k, int(v)) for k, v in (line.split() for line in out.splitlines()))
    assert ctypes.sizeof(cls) == c["sizeof"], (struct, ctypes.sizeof(cls), c["sizeof"])
    for f in fields:
        assert getattr(cls, f).offset == c[f], (struct, f, getattr(cls, f).offset, c[f])
    return c
