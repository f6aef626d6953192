"""`examples/tpu_smoke.py --emulate`: the TPU smoke run under the emulation.

Every stage (the demo model with sparse, weighted and sequence ids on the
engine, fit, evaluate, checkpoints, the CPU restore, export, serving equal
to the TPU model) must PASS on `"V1"` and on SparseCore (`"V2"`,
`TPUEmbeddingV2`) with 2 replicas, and on a TPU without an engine
(`"UNSUPPORTED"`: tensor-core lookups, ids padded on the host to the demo
columns' `tensor_core_shape`).
"""

import importlib.util
import json
import pathlib

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


def _main(argv):
    spec = importlib.util.spec_from_file_location("tpu_smoke", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(argv)


def test_smoke_passes_under_the_emulated_v1_tpu(tmp_path, capsys):
    code = _main(["--emulate", "V1", "--output-dir", str(tmp_path), *SMALL])
    printed = capsys.readouterr().out
    summary = json.loads((tmp_path / "smoke_summary.json").read_text())
    assert code == 0, printed
    assert "SMOKE PASS" in printed.splitlines()
    assert [s["status"] for s in summary["stages"]] == ["PASS"] * 7
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
