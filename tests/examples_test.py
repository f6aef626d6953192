"""`examples/tpu_smoke.py`: the report a TPU user sends back.

The script is written for a TPU VM. Here it runs on CPU, where it must stop
with a SKIP and the reason. Its stages run under the emulated TPU (TF's
own mid-level API, only the chip emulated) in
`tests/emulated/tpu_smoke_test.py`, which also checks a failing stage's
report.
"""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).parents[1] / "examples" / "tpu_smoke.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("tpu_smoke", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
