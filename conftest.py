"""Session-wide pytest set-up: backend, quiet TF logs, doctest names."""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_tpu_embed as kte  # noqa: E402

# tests/emulated splits the CPU into logical devices, which only works
# before TensorFlow starts, and tests/emulated_hosts connects the process to
# a cluster: tests/emulated_tpu_test.py runs each in a process of its own
# (`pytest tests/emulated`, named explicitly, is still collected).
collect_ignore = ["tests/emulated", "tests/emulated_hosts"]

# The test files that start processes, train to convergence or export many
# SavedModels, costliest first: over 90% of the suite's time (seconds of
# `pytest --durations=0` on 2 shared cores, 2026-11-24, in comments). Every
# other test, and every doctest, is marked `fast`: `pytest -q -m fast -n 2`
# is the change-test loop (2 min 12 s for 1,020 tests, 2026-11-28).
SLOW_FILES = (
    # Subprocesses, one per test file so that the workers share them:
    "emulated_pod_test.py",  # tests/emulated_hosts
    "emulated_tpu_test.py",  # tests/emulated, engine files, first half
    "emulated_engine_test.py",  # the second half
    "emulated_sparsecore_test.py",  # the SparseCore files
    "replicas_test.py",  # 258
    "benchmarks_test.py",  # 130, one module fixture
    "parameter_server_test.py",  # 130, clusters of local server processes
    "quantization_test.py",  # 97
    "notebooks_test.py",  # 52 (+ 60 for notebook 04 under the emulation)
    "install_test.py",  # 40
    "save_paths_test.py",  # 38
    "legacy_reference_test.py",  # 36, one module fixture
    "docs_test.py",  # 35
    "serving_devices_test.py",  # 34
    "padded_host_test.py",  # 31
    "serving_test.py",  # 28
    "examples_test.py",  # 24
    "demo_test.py",  # 24
    "dense_xla_test.py",  # 20
    "v1_engine_test.py",  # 16 (with the two below, before the split)
    "engine_step_test.py",
    "engine_members_test.py",
    "loading_test.py",  # 13
)


def pytest_configure(config):
    # xdist's `--dist loadfile` reorders files by their number of tests,
    # most first (its `--loadscope-reorder` default), which puts the
    # one-test subprocess suites above last: a run ended with the SparseCore
    # suite alone on one worker for its last 10 minutes. Keep our order.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    # Costliest files first: `-n 2 --dist loadfile` gives each worker whole
    # files (a module fixture runs once), and starting the long ones first
    # keeps one worker from finishing a long file alone at the end.
    rank = {name: i for i, name in enumerate(SLOW_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
    # Markers, not `item.keywords`: keywords also hold the names of the
    # item's folders, and a folder named `tpu` (the package had one) would
    # skip every test in it.
    for item in items:
        slow = item.get_closest_marker("slow") is not None
        if not slow and item.path.name not in rank:
            item.add_marker(pytest.mark.fast)
    if "TPU_NAME" in os.environ:
        return
    skip = pytest.mark.skip(reason="needs a TPU VM (set TPU_NAME)")
    for item in items:
        if item.get_closest_marker("tpu") is not None:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _doctest_names(doctest_namespace):
    """Docstring examples use the public names unqualified, plus tf/keras."""
    for name in kte.__all__:
        doctest_namespace[name] = getattr(kte, name)
    doctest_namespace.update(tf=tf, keras=keras, np=np, kte=kte)
    keras.utils.set_random_seed(0)


@pytest.fixture
def mixed_bfloat16():
    """Keras' global dtype policy set to `mixed_bfloat16` for one test."""
    policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    yield
    keras.config.set_dtype_policy(policy)
