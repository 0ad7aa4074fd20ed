"""examples/train_llama.py: the learning-rate schedule's floor and its bounds."""
import importlib.util
import os

import pytest

pytest.importorskip("torch")

_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples",
                     "train_llama.py")
_spec = importlib.util.spec_from_file_location("train_llama", _PATH)
train_llama = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(train_llama)


def test_lr_floor_default_is_a_tenth():
    a = train_llama.parse_args(["--steps", "100", "--warmup", "10"])
    assert a.lr_floor == 0.1, a.lr_floor
    assert train_llama.lr_factor(10, a) == pytest.approx(1.0), train_llama.lr_factor(10, a)
    # The cosine ends at the floor: one step past the last, exactly.
    a.steps = 100
    end = train_llama.lr_factor(100, a)
    assert end == pytest.approx(0.1), end


@pytest.mark.parametrize("floor", ["0", "0.5", "1"])
def test_lr_floor_is_where_the_cosine_ends(floor):
    a = train_llama.parse_args(["--steps", "50", "--warmup", "5", "--lr-floor", floor])
    f = [train_llama.lr_factor(s, a) for s in range(5, 51)]
    assert f[-1] == pytest.approx(float(floor)), (floor, f[-1])
    assert all(x >= y - 1e-12 for x, y in zip(f, f[1:])), (floor, f)  # never rises


@pytest.mark.parametrize("bad", ["-0.01", "1.01", "nan", "inf", "-inf", "1e308", "two"])
def test_lr_floor_out_of_range_is_refused(bad, capsys):
    with pytest.raises(SystemExit) as e:
        train_llama.parse_args(["--lr-floor", bad])
    assert e.value.code == 2, (bad, e.value.code)
    err = capsys.readouterr().err
    assert "--lr-floor" in err or "lr_floor" in err or "lr-floor" in err, (bad, err)
