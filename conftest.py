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
# before TensorFlow starts: tests/emulated_tpu_test.py runs it in a process
# of its own (`pytest tests/emulated`, named explicitly, is still collected).
collect_ignore = ["tests/emulated"]


def pytest_collection_modifyitems(config, items):
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
