"""`examples/tpu_smoke.py --emulate`: the TPU smoke run under the emulation.

Every stage (the demo model with sparse, weighted and sequence ids on the
engine, fit, evaluate, checkpoints, the CPU restore, export, serving equal
to the TPU model) must PASS on `"V1"` and on SparseCore (`"V2"`,
`TPUEmbeddingV2`) with 2 replicas, and on a TPU without an engine
(`"UNSUPPORTED"`: tensor-core lookups, ids padded on the host to the demo
columns' `tensor_core_shape`). A stage that fails is reported with its
error and traceback.
"""

import importlib.util
import json
import pathlib

import pytest
import tensorflow as tf

from keras_tpu_embed.testing import emulated_tpu

SCRIPT = pathlib.Path(__file__).parents[2] / "examples" / "tpu_smoke.py"
SMALL = [
    "--steps",
    "20",
    "--epochs",
    "3",
    "--global-batch-size",
    "64",
    "--num-examples",
    "4000",
]


def _load_script():
    spec = importlib.util.spec_from_file_location("tpu_smoke", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _main(argv):
    return _load_script().main(argv)


@pytest.fixture
def enqueued(monkeypatch):
    """What the layers hand TF's `TPUEmbedding.enqueue`, by feature, and
    what TF's enqueue op is then made from (after the columns' id rules,
    which wrap `_generate_enqueue_op` of the instance)."""
    handed, made_from = [], []
    mid_level = tf.tpu.experimental.embedding.TPUEmbedding
    enqueue, generate = mid_level.enqueue, mid_level._generate_enqueue_op

    def enqueue_spy(self, features, *args, **kwargs):
        handed.append({k: type(v).__name__ for k, v in features.items()})
        return enqueue(self, features, *args, **kwargs)

    def generate_spy(self, flat_inputs, *args, **kwargs):
        made_from.append({type(value).__name__ for value in flat_inputs})
        return generate(self, flat_inputs, *args, **kwargs)

    monkeypatch.setattr(mid_level, "enqueue", enqueue_spy)
    monkeypatch.setattr(mid_level, "_generate_enqueue_op", generate_spy)
    return handed, made_from


def test_smoke_passes_under_the_emulated_v1_tpu(tmp_path, capsys, enqueued):
    code = _main(["--emulate", "V1", "--output-dir", str(tmp_path), *SMALL])
    printed = capsys.readouterr().out
    summary = json.loads((tmp_path / "smoke_summary.json").read_text())
    assert code == 0, printed
    assert "SMOKE PASS" in printed.splitlines()
    assert printed.strip().splitlines()[-2] == "SMOKE PASS"
    assert [s["name"] for s in summary["stages"]] == list(_load_script().STAGES)
    assert [s["status"] for s in summary["stages"]] == ["PASS"] * 7
    for stage in summary["stages"]:
        assert f"PASS {stage['name']}" in printed
    numbers = summary["numbers"]
    assert numbers["losses"][-1] < numbers["losses"][0]
    [fit] = [s for s in summary["stages"] if s["name"] == "fit"]
    assert len(fit["details"]["val_losses"]) == 3
    [restore] = [s for s in summary["stages"] if s["name"] == "cpu_restore"]
    moved = restore["details"]["max_table_change"]
    assert sorted(moved) == [
        "country",
        "history_item_id_shared_embedding",
        "tags_weighted_by_tag_weights",
        "user_id",
    ]
    assert all(change > 0 for change in moved.values())
    assert "PJRT_DEVICE" in summary["environment"]["variables"]
    # The item ids reach the engine's enqueue dense [batch, 1], the rest
    # sparse; the host's id rules then make TF's enqueue op of sparse ids
    # only (one kind per call, as TF's enqueue takes them).
    handed, made_from = enqueued
    assert handed, "no enqueue reached TF's TPUEmbedding"
    assert {kinds["item_id_shared_embedding"] for kinds in handed} == {
        "SymbolicTensor"
    }
    assert {kinds["history_shared_embedding"] for kinds in handed} == {
        "SparseTensor"
    }
    assert set().union(*made_from) == {"SparseTensor"}
    assert summary["environment"]["emulated"] == "V1"
    assert summary["environment"]["replicas"] == 2
    assert summary["environment"]["embedding_hardware"] == "v1"
    assert set(summary["numbers"]["embedding_step"].values()) == {1 + 3 * 20}
    assert summary["numbers"]["max_difference"] <= 1e-5


def test_smoke_passes_under_the_emulated_tpu_without_an_engine(
    tmp_path, capsys
):
    code = _main(
        ["--emulate", "UNSUPPORTED", "--output-dir", str(tmp_path), *SMALL]
    )
    printed = capsys.readouterr().out
    summary = json.loads((tmp_path / "smoke_summary.json").read_text())
    assert code == 0, printed
    assert [s["status"] for s in summary["stages"]] == ["PASS"] * 7
    assert summary["environment"]["embedding_hardware"] == "no_engine"
    assert set(summary["numbers"]["embedding_step"].values()) == {1 + 3 * 20}
    assert summary["numbers"]["max_difference"] <= 1e-5


def test_smoke_passes_under_the_emulated_sparse_core_tpu(tmp_path, capsys):
    code = _main(["--emulate", "V2", "--output-dir", str(tmp_path), *SMALL])
    printed = capsys.readouterr().out
    summary = json.loads((tmp_path / "smoke_summary.json").read_text())
    assert code == 0, printed
    assert "SMOKE PASS" in printed.splitlines()
    assert [s["status"] for s in summary["stages"]] == ["PASS"] * 7
    assert summary["environment"]["emulated"] == "V2"
    assert summary["environment"]["embedding_hardware"] == "v2"
    [build] = [s for s in summary["stages"] if s["name"] == "build"]
    assert build["details"]["engine_tables"]  # on SparseCore, not local
    assert set(summary["numbers"]["embedding_step"].values()) == {1 + 3 * 20}
    assert summary["numbers"]["max_difference"] <= 1e-5


def test_a_failing_stage_is_reported_with_its_error(tmp_path):
    with emulated_tpu(2, embedding_feature="V1") as strategy:
        summary = _load_script().run(
            strategy,
            str(tmp_path),
            steps=3,
            epochs=2,
            global_batch_size=32,
            num_examples=400,
            tolerance=-1.0,  # nothing can be within
        )
    assert summary["result"] == "FAIL"
    assert summary["failed_stage"] == "serve"
    [serve] = [s for s in summary["stages"] if s["name"] == "serve"]
    assert "AssertionError: served and TPU predictions differ" in serve["error"]
    assert "Traceback" in serve["traceback"]
