"""Every python block of the README and docs/ runs, so no example rots.

The blocks of one page run in order, in a fresh process (a page builds
on its earlier blocks), in a scratch directory. Pages share that process,
one after another, each in its own namespace and directory
(`scripts_in_one_process`), except those in `OWN_PROCESS`. A block right
after an `<!-- skip: reason -->` line is not run; only blocks that need a TPU VM
are marked so. A page whose blocks refer to files it does not make gets
them from `PREPARE`, run first in the same process.
"""

import pathlib
import re

import pytest

from tests import scripts_in_one_process
from tests import testing

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(
    r"(?:<!-- skip: (?P<skip>[^>]*?) -->\n)?^```python\n(?P<code>.*?)^```$",
    re.DOTALL | re.MULTILINE,
)

# docs/migration.md warm-starts `model` from a TPUEstimator checkpoint
# ("mod" over 8 hosts) and re-maps rows from old_users.txt to users.txt:
# write those, laid out as TF 1.x writes them (tests/warm_start_test.py).
PREPARE = {
    "migration.md": """
import keras
import numpy as np
import tensorflow as tf
import keras_tpu_embed as kte

V1 = tf.compat.v1
old = [f"u{i}" for i in range(8)]
pathlib.Path("old_users.txt").write_text("\\n".join(old) + "\\n")
pathlib.Path("users.txt").write_text("\\n".join(old[::-1]) + "\\n")
user = kte.categorical_column_with_vocabulary_file("user", "users.txt")
column = kte.embedding_column(user, 2)
inputs = kte.FeaturePreprocessor([column]).keras_inputs()
config = kte.EmbeddingConfig(optimizer=kte.optimizers.Adagrad(0.1))
layer = kte.TPUEmbeddingLayer([column], config=config, output="concat")
model = keras.Model(inputs, layer(inputs))
logical = np.arange(16, dtype=np.float32).reshape(8, 2)
order = np.concatenate([np.arange(h, 8, 8) for h in range(8)])
name = "input_layer/user_embedding/embedding_weights"
with tf.Graph().as_default():
    for variable_name in (name, name + "/Adagrad"):
        V1.get_variable(
            variable_name,
            initializer=tf.constant(logical[order]),
            partitioner=V1.fixed_size_partitioner(8),
        )
    with V1.Session() as session:
        session.run(V1.global_variables_initializer())
        V1.train.Saver().save(session, "legacy/model.ckpt-10000")
""",
}


def python_blocks(page):
    """`(line, code, skip reason or None)` of each python block."""
    text = page.read_text()
    return [
        (text[: m.start("code")].count("\n") + 1, m["code"], m["skip"])
        for m in BLOCK.finditer(text)
    ]


def test_blocks_are_found_and_only_tpu_blocks_skip():
    found = {page.name: python_blocks(page) for page in PAGES}
    assert len(found["README.md"]) == 2
    assert found["serving.md"] and found["multi-device.md"]
    skipped = [
        (name, reason)
        for name, blocks in found.items()
        for _, _, reason in blocks
        if reason
    ]
    assert skipped and all("TPU" in reason for _, reason in skipped)


# Pages that start TensorFlow in a way of their own, which a process can do
# once, before or instead of anything else: each runs in a fresh process.
OWN_PROCESS = {
    # MirroredStrategy, and parameter servers started in the process.
    "multi-device.md",
    # `emulated_tpu` splits the CPU, which only works before TF starts.
    "tpu.md",
}


def _runnable(page):
    """`(line, code)` of each python block not marked skip."""
    return [(line, c) for line, c, skip in python_blocks(page) if not skip]


def _page_script(page, chdir=""):
    """The page's runnable blocks as one script, after `chdir` and the
    page's `PREPARE`."""
    script = "import os, pathlib, sys\n"
    script += f"sys.path.insert(0, {str(ROOT)!r})\n" + chdir
    script += PREPARE.get(page.name, "")
    for line, code in _runnable(page):
        script += f"\n# --- {page.name}, line {line}\n{code}"
    return script


@pytest.fixture(scope="module")
def shared_process_pages(tmp_path_factory):
    """Per page not in `OWN_PROCESS`: its traceback or None, and what it
    wrote to stderr, all run in one fresh process."""
    root = tmp_path_factory.mktemp("pages")
    scripts = {}
    for page in PAGES:
        if page.name in OWN_PROCESS or not _runnable(page):
            continue
        directory = root / page.name
        directory.mkdir()
        scripts[page.name] = (_page_script(page), directory)
    return scripts_in_one_process.run_scripts(
        scripts, root, timeout=900, cwd=ROOT, TF_CPP_MIN_LOG_LEVEL="3"
    )


def _run_in_own_process(page, directory):
    """The page's traceback or None, and its stderr, from a fresh process
    of its own."""
    completed = testing.run_python(
        "-c",
        _page_script(page, "os.chdir(os.environ['DOCS_TEST_DIR'])\n"),
        timeout=600,
        cwd=str(ROOT),
        DOCS_TEST_DIR=str(directory),
        TF_CPP_MIN_LOG_LEVEL="3",
    )
    error = None
    if completed.returncode != 0:
        error = completed.stdout[-2000:] + completed.stderr[-4000:]
    return {"error": error, "stderr": completed.stderr}


@pytest.mark.slow
@pytest.mark.parametrize(
    # Pages whose every block needs a TPU VM have nothing to run here;
    # `test_blocks_are_found_and_only_tpu_blocks_skip` holds their reasons.
    "page",
    [p for p in PAGES if _runnable(p)],
    ids=lambda p: p.name,
)
def test_python_blocks_run(page, tmp_path, request):
    if page.name in OWN_PROCESS:
        run = _run_in_own_process(page, tmp_path)
    else:
        run = request.getfixturevalue("shared_process_pages")[page.name]
    assert run["error"] is None, run["error"][-6000:]
    # Documented usage prints no warning (the package's, or Keras' about
    # how the package uses it).
    warned = re.findall(r"^.*\d: \w*Warning: .*$", run["stderr"], re.M)
    assert not warned, "\n".join(warned)
