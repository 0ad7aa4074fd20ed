"""gift.torch.Policy: which tensors get the GIFT geometry and which codec."""
import pytest

torch = pytest.importorskip("torch")
import gift  # noqa: E402
import gift.torch  # noqa: E402


def test_default_policy_and_overrides():
    nn = torch.nn
    big, small, wide = nn.Linear(128, 256), nn.Linear(16, 16), nn.Linear(32, 1024)
    norm = nn.LayerNorm(128)
    p = gift.torch.Policy.from_comm("nvfp4-gift")
    assert p("big.weight", big.weight, big)["geometry"] is True
    assert p("big.bias", big.bias, big)["geometry"] is False          # 1-D
    assert p("small.weight", small.weight, small)["geometry"] is False  # too small
    assert p("wide.weight", wide.weight, wide)["geometry"] is False   # 32 inputs < 64
    assert p("norm.weight", norm.weight, norm)["geometry"] is False
    d = p("big.weight", big.weight, big)
    assert d["codec"] == "nvfp4" and d["error_feedback"] is True
    assert d["pull_error_feedback"] is True
    assert gift.torch.Policy.from_comm("f32")("big.weight", big.weight, big) == dict(
        codec="f32", geometry=False, rank=0, refresh=0, fp8_block=0, error_feedback=False,
        stochastic=False, pull_error_feedback=False)
    o = gift.torch.Policy.from_comm("fp8-gift", overrides={"big.*": {"geometry": False},
                                                           "*.bias": {"codec": "f32"},
                                                           "small.weight": {"pull_codec": "f32"}})
    assert o("big.weight", big.weight, big)["geometry"] is False
    assert o("small.bias", small.bias, small)["codec"] == "f32"
    # pull error feedback follows the pull codec unless set
    assert o("small.bias", small.bias, small)["pull_error_feedback"] is False
    assert o("small.weight", small.weight, small)["pull_error_feedback"] is False
    assert o("big.weight", big.weight, big)["pull_error_feedback"] is True
    n = gift.torch.Policy.from_comm("fp8", pull_error_feedback=False)
    assert n("big.weight", big.weight, big)["pull_error_feedback"] is False
    with pytest.raises(ValueError):
        gift.torch.Policy.from_comm("fp16")
