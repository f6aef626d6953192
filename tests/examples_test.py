"""`examples/tpu_smoke.py`'s flow under the recording STAND-IN (not a TPU).

The script is written for a TPU VM. Here its `run` trains the demo model
through the engine protocol against `tests/engine_stand_in.py`, then
checkpoints, rebuilds on CPU, exports and compares served predictions with
the in-strategy ones: the hand-off a TPU user relies on.
"""

import importlib.util
import os
import pathlib

import pytest

from tests.engine_stand_in import StandInTPU

SCRIPT = pathlib.Path(__file__).parents[1] / "examples" / "tpu_smoke.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("tpu_smoke", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_smoke_flow_trains_exports_and_serves_equal(monkeypatch, tmp_path):
    tpu = StandInTPU(monkeypatch)
    result = _load_script().run(
        tpu.strategy,
        str(tmp_path),
        steps=5,
        global_batch_size=64,
        num_examples=1_000,
        tolerance=1e-5,
    )
    [engine] = tpu.built_objects
    assert int(engine.runs["apply_gradients"]) == 5 + 5  # warm-up + timed
    assert result["hardware"] == "v1"
    assert result["max_difference"] <= 1e-5
    assert result["steps_per_second"] > 0


@pytest.mark.tpu
def test_smoke_on_a_real_tpu(tmp_path):
    """Runs only on a TPU VM with TPU_NAME set (never in this project's CI)."""
    script = _load_script()
    strategy = script.connect(os.environ["TPU_NAME"])
    result = script.run(strategy, str(tmp_path), steps=300)
    assert result["hardware"] in ("v1", "v2")
    assert result["max_difference"] <= 1e-3
