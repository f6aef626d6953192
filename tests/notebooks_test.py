"""Executes the notebooks' code cells in order, in a fresh process.

The notebooks share that process, one after another, each in its own
namespace and directory (`scripts_in_one_process`); the TPU notebook's run
under the emulated TPU has a process of its own.

Each notebook's code cells are joined into one script (shell `!` lines
skipped) and run with this interpreter, so a failing assertion or exception
in any cell fails the test. Outputs are stripped in the repository.
"""

import json
import pathlib
import re

import pytest

from tests import scripts_in_one_process
from tests import testing

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[1] / "notebooks"
CPU_NOTEBOOKS = [
    "01_quickstart.ipynb",
    "02_migrate_from_tpuestimator.ipynb",
    "03_serving.ipynb",
]


TPU_NOTEBOOK = "04_train_on_tpu.ipynb"


def _is_tpu_cell(cell):
    return "tpu" in cell.get("metadata", {}).get("tags", [])


def _script(path, connect=None):
    """The notebook's code as one script: without its `tpu` cells, or,
    given `connect`, with them and `connect` in place of the cell that
    connects to the TPU."""
    notebook = json.loads(path.read_text())
    lines = []
    for cell in notebook["cells"]:
        if cell["cell_type"] != "code":
            continue
        assert not cell.get("outputs"), f"{path.name}: outputs not stripped"
        source = "".join(cell["source"])
        if _is_tpu_cell(cell):
            if connect is None:
                continue
            if "TPUClusterResolver" in source:
                source = connect
        for line in source.splitlines():
            if not line.lstrip().startswith(("!", "%")):
                lines.append(line)
    return "\n".join(lines)


@pytest.fixture(scope="module")
def notebook_runs(tmp_path_factory):
    """Per notebook (the TPU one without its `tpu` cells): its traceback
    or None, and what it wrote to stderr; all run in one fresh process,
    each in its own directory (`scripts_in_one_process`)."""
    root = tmp_path_factory.mktemp("notebooks")
    scripts = {}
    for name in CPU_NOTEBOOKS + [TPU_NOTEBOOK]:
        directory = root / name
        directory.mkdir()
        scripts[name] = (_script(NOTEBOOKS / name), directory)
    return scripts_in_one_process.run_scripts(scripts, root, timeout=1200)


@pytest.mark.parametrize("name", CPU_NOTEBOOKS + [TPU_NOTEBOOK])
def test_notebook_runs(name, notebook_runs):
    """Every code cell runs; in the TPU notebook, all but those tagged tpu."""
    run = notebook_runs[name]
    assert run["error"] is None, run["error"][-4000:]
    if name in CPU_NOTEBOOKS:
        # No warning from the package, or from Keras about its use there
        # (the layers' "ignores the input keys", Keras' "shuffle=True").
        warned = re.findall(r"^.*\d: \w*Warning: .*$", run["stderr"], re.M)
        assert not warned, "\n".join(warned)


# In place of "Connect to the TPU": 2 emulated replicas. The CPU is split
# before the notebook's first cell starts TensorFlow; the context manager is
# kept, as leaving it would undo the emulation.
SPLIT_CPU = """
import tensorflow as tf
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration()] * 2,
)
"""
EMULATED_CONNECT = """
from keras_tpu_embed.testing import emulated_tpu
emulation = emulated_tpu(num_replicas=2)
strategy = emulation.__enter__()
print("replicas:", strategy.num_replicas_in_sync)
print("embedding hardware:", tpu_hardware.embedding_hardware(strategy).value)
"""


@pytest.mark.slow
def test_tpu_notebook_runs_its_tpu_cells_under_the_emulated_tpu(tmp_path):
    """fit with every table on the engine, the checkpoint, the CPU model
    and its export: the notebook's own assertion compares served and TPU
    predictions."""
    script = tmp_path / "notebook.py"
    script.write_text(
        SPLIT_CPU + _script(NOTEBOOKS / TPU_NOTEBOOK, EMULATED_CONNECT)
    )
    completed = testing.run_python(str(script), timeout=900, cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr[-4000:]
    assert "replicas: 2" in completed.stdout
    assert "embedding hardware: v1" in completed.stdout
    # The notebook allows 1e-3 for a TPU's float32 matmuls (bfloat16
    # passes by default); under the emulation both sides are CPU float32,
    # where the difference was measured at 1.2e-7: a wrong export is caught.
    [difference] = re.findall(
        r"^max \|served - TPU\|: (\S+)$", completed.stdout, re.M
    )
    assert float(difference) <= 1e-5, completed.stdout
    warned = re.findall(r"^.*\d: \w*Warning: .*$", completed.stderr, re.M)
    assert not warned, "\n".join(warned)


def test_tpu_notebook_says_so_and_tags_everything_from_the_strategy_on():
    cells = json.loads((NOTEBOOKS / TPU_NOTEBOOK).read_text())["cells"]
    assert "needs a TPU VM" in "".join(cells[0]["source"])
    code = [cell for cell in cells if cell["cell_type"] == "code"]
    tagged = [_is_tpu_cell(cell) for cell in code]
    first = tagged.index(True)
    assert "TPUStrategy" in "".join(code[first]["source"])
    # CPU cells up to the strategy set-up, TPU cells after it: none mixed.
    assert tagged == [False] * first + [True] * (len(code) - first)
    assert first >= 3
    for cell in code[first:]:  # cannot run here; must at least compile
        compile("".join(cell["source"]), cell["id"], "exec")
