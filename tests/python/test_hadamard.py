"""The Hadamard treatment (issue 42) from Python: gift.Tensor(transform=...),
gift.torch's comm names fp8-hadamard and nvfp4-hadamard (on the tensors GIFT
would take, the rest Euclidean), train_llama's --comm, and round trips
through a real giftd."""
import importlib.util
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import gift  # noqa: E402
import gift.torch  # noqa: E402

nn = torch.nn


def test_tensor_transform_field():
    assert gift.Tensor("w", 4, 8).transform == gift.TRANSFORM_NONE
    t = gift.Tensor("w", 4, 8, transform="hadamard")
    assert t.transform == gift.TRANSFORM_HADAMARD and t.hadamard and "hadamard" in repr(t)
    assert gift.transform_of("euclidean") == gift.TRANSFORM_NONE
    with pytest.raises(ValueError):
        gift.Tensor("w", 4, 8, transform="walsh")
    with pytest.raises(ValueError):
        gift.transform_of(5)


@pytest.mark.parametrize("comm,codec", [("fp8-hadamard", "fp8-e4m3"), ("nvfp4-hadamard", "nvfp4")])
def test_comm_names(comm, codec):
    big, small, wide = nn.Linear(128, 256), nn.Linear(16, 16), nn.Linear(32, 1024)
    p = gift.torch.Policy.from_comm(comm)
    d = p("big.weight", big.weight, big)
    assert d["transform"] == "hadamard" and d["geometry"] is False and d["codec"] == codec
    assert d["error_feedback"] is True  # lossy codec: the default stays on
    # the others as GIFT would leave them: Euclidean
    for name, param, mod in (("big.bias", big.bias, big), ("small.weight", small.weight, small),
                             ("wide.weight", wide.weight, wide)):
        e = p(name, param, mod)
        assert "transform" not in e and e["geometry"] is False, name
    # the same tensors as the -gift arm
    g = gift.torch.Policy.from_comm(comm.replace("hadamard", "gift"))
    for name, param, mod in (("big.weight", big.weight, big), ("big.bias", big.bias, big),
                             ("small.weight", small.weight, small)):
        assert g(name, param, mod)["geometry"] == ("transform" in p(name, param, mod)), name


def test_train_llama_accepts_the_names():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples",
                        "train_llama.py")
    spec = importlib.util.spec_from_file_location("train_llama", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for comm in ("fp8-hadamard", "nvfp4-hadamard"):
        assert mod.parse_args(["--comm", comm]).comm == comm


def test_f32_round_trip_is_the_rotation_and_back(cluster):
    """World of one, f32: the pulled mean is D H (H D g), g up to rounding
    (not bit for bit: the rotation rounds), odd shapes included."""
    c = cluster(shards=1, world=1)
    shapes = [(64, 96), (3, 1000), (1, 4096), (40, 7)]
    with gift.Client(servers=c.servers, rank=0, world_size=1) as cl:
        cl.declare([gift.Tensor(f"h{i}", r, k, transform="hadamard")
                    for i, (r, k) in enumerate(shapes)])
        rng = np.random.default_rng(3)
        for step in range(2):
            gs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
            outs = [np.empty_like(g) for g in gs]
            ops = [cl.push_pull(i, step, g, o) for i, (g, o) in enumerate(zip(gs, outs))]
            for op in ops:
                assert op.wait() == 0
            for (r, k), g, o in zip(shapes, gs, outs):
                err = np.linalg.norm(o - g) / np.linalg.norm(g)
                assert err < 1e-6, ((r, k), err)


def test_reducer_nvfp4_hadamard(cluster):
    """GiftReducer with --comm nvfp4-hadamard: the Linear weight goes rotated
    (declared hadamard), the bias Euclidean; with one worker the gradient
    comes back within nvfp4's error."""
    c = cluster(shards=1, world=1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 256), nn.Linear(256, 8, bias=False))
    red = gift.torch.GiftReducer(model, comm="nvfp4-hadamard", servers=c.servers, rank=0,
                                 world_size=1)
    try:
        kinds = {t.name: t.hadamard for t in red.tensors}
        assert kinds == {"0.weight": True, "0.bias": False, "1.weight": False}, kinds
        assert "hadamard" in red.describe()
        x = torch.randn(32, 128)
        model(x).pow(2).sum().backward()
        want = [p.grad.clone() for p in model.parameters()]
        red.synchronize()
        for w, p in zip(want, model.parameters()):
            err = (p.grad - w).norm() / w.norm()
            assert err < 0.25, err
    finally:
        red.close()
