"""`examples/tpu_smoke.py`: the report a TPU user sends back.

The script is written for a TPU VM. Here it runs on CPU, where it must stop
with a SKIP and the reason, and its `run` goes through every stage under the
recording STAND-IN of the mid-level API (`tests/engine_stand_in.py`), which
checks the flow and the report, not the TPU.
"""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests.engine_stand_in import StandInTPU

SCRIPT = pathlib.Path(__file__).parents[1] / "examples" / "tpu_smoke.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("tpu_smoke", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(tpu, tmp_path, **kwargs):
    options = dict(
        steps=6,
        epochs=3,
        global_batch_size=64,
        num_examples=1_000,
        tolerance=1e-5,
    )
    options.update(kwargs)
    return _load_script().run(tpu.strategy, str(tmp_path), **options)


def test_smoke_stages_pass_under_the_stand_in(monkeypatch, tmp_path, capsys):
    tpu = StandInTPU(monkeypatch)
    summary = _run(tpu, tmp_path)
    printed = capsys.readouterr().out
    assert summary["result"] == "PASS", summary
    assert [s["name"] for s in summary["stages"]] == list(_load_script().STAGES)
    assert all(s["status"] == "PASS" for s in summary["stages"])
    for stage in summary["stages"]:
        assert f"PASS {stage['name']}" in printed
    assert printed.strip().splitlines()[-1] == "SMOKE PASS"
    numbers = summary["numbers"]
    assert numbers["losses"][-1] < numbers["losses"][0]
    assert set(numbers["embedding_step"].values()) == {1 + 3 * 6}
    assert numbers["max_difference"] <= 1e-5
    fit = summary["stages"][1]["details"]
    assert len(fit["val_losses"]) == 3
    restore = summary["stages"][4]["details"]["max_table_change"]
    assert sorted(restore) == [
        "country",
        "history_item_id_shared_embedding",
        "tags_weighted_by_tag_weights",
        "user_id",
    ]
    assert all(change > 0 for change in restore.values())
    [engine] = tpu.built_objects
    # The item ids reach the engine's enqueue dense [batch, 1]; the rest
    # sparse (the host's id rules then enqueue every feature sparse).
    step = engine._steps[next(iter(engine._steps))]
    kinds = {
        name: type(value).__name__ for name, value in step["inputs"].items()
    }
    assert {type(value).__name__ for value in step["features"].values()} == {
        "SparseTensor"
    }
    assert kinds["item_id_shared_embedding"] == "SymbolicTensor"
    assert kinds["history_shared_embedding"] == "SparseTensor"
    written = json.loads((tmp_path / "smoke_summary.json").read_text())
    assert written["result"] == "PASS"
    assert written["environment"]["embedding_hardware"] == "v1"
    assert "PJRT_DEVICE" in written["environment"]["variables"]


def test_a_failing_stage_is_reported_with_its_error(monkeypatch, tmp_path):
    tpu = StandInTPU(monkeypatch)
    summary = _run(tpu, tmp_path, tolerance=-1.0)  # nothing can be within
    assert summary["result"] == "FAIL"
    assert summary["failed_stage"] == "serve"
    [serve] = [s for s in summary["stages"] if s["name"] == "serve"]
    assert "AssertionError: served and TPU predictions differ" in serve["error"]
    assert "Traceback" in serve["traceback"]


# A TPU without an engine (v5e) runs every stage on the tensor core, with
# the demo columns' tensor_core_shape, and SparseCore (V2) every stage on
# TPUEmbeddingV2: tests/emulated/tpu_smoke_test.py.


@pytest.mark.slow
def test_the_script_on_cpu_reports_a_skip_and_the_environment(tmp_path):
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), "--output-dir", str(tmp_path)],
        env={
            k: v
            for k, v in os.environ.items()
            if k not in ("PJRT_DEVICE", "TF_PLUGGABLE_DEVICE_LIBRARY_PATH")
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = completed.stdout
    assert completed.returncode == 2, completed.stderr[-3000:]
    for line in ("tensorflow: ", "keras: ", "libtpu: ", "keras_tpu_embed: "):
        assert line in out
    assert "PJRT_DEVICE=(not set)" in out
    assert "HINT: " in out and "PJRT_DEVICE=TPU" in out
    assert "SKIP connect: no TPU reachable" in out
    assert (
        out.strip().splitlines()[-2].startswith("SMOKE SKIP: no TPU reachable")
    )
    summary = json.loads((tmp_path / "smoke_summary.json").read_text())
    assert summary["result"] == "SKIP"
    assert summary["environment"]["tensorflow"]


@pytest.mark.tpu
def test_smoke_on_a_real_tpu(tmp_path):
    """Runs only on a TPU VM with TPU_NAME set (never in this project's CI)."""
    script = _load_script()
    strategy = script.connect(os.environ["TPU_NAME"])
    summary = script.run(strategy, str(tmp_path))
    assert summary["result"] == "PASS", summary["failed_stage"]
