"""The ctypes binding against a real giftd: round trips of every shape and
buffer kind, and C errors arriving as GiftError with gift_strerror's text."""
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


def _raises(code, fn, *a):
    with pytest.raises(gift.GiftError) as e:
        fn(*a)
    assert e.value.code == code, e.value
    assert gift.strerror(code) in str(e.value)
    return e.value


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
