"""Session-wide pytest set-up: backend, quiet TF logs, doctest names."""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_tpu_embed as kte  # noqa: E402

# The test files that start processes, train to convergence or export many
# SavedModels: over 90% of the suite's time (`pytest --durations=0`,
# 2026-11-24). Every other test, and every doctest, is marked `fast`:
# `pytest -q -m fast -n 2` is the change-test loop (under a minute).
SLOW_FILES = frozenset(
    {
        "benchmarks_test.py",
        "demo_test.py",
        "dense_xla_test.py",
        "docs_test.py",
        "embedding_core_test.py",
        "examples_test.py",
        "install_test.py",
        "legacy_reference_test.py",
        "loading_test.py",
        "notebooks_test.py",
        "padded_host_test.py",
        "quantization_test.py",
        "replicas_test.py",
        "save_paths_test.py",
        "serving_devices_test.py",
        "serving_test.py",
    }
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "slow" not in item.keywords and item.path.name not in SLOW_FILES:
            item.add_marker(pytest.mark.fast)
    if "TPU_NAME" in os.environ:
        return
    skip = pytest.mark.skip(reason="needs a TPU VM (set TPU_NAME)")
    for item in items:
        if "tpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _doctest_names(doctest_namespace):
    """Docstring examples use the public names unqualified, plus tf/keras."""
    for name in kte.__all__:
        doctest_namespace[name] = getattr(kte, name)
    doctest_namespace.update(tf=tf, keras=keras, np=np, kte=kte)
    keras.utils.set_random_seed(0)
