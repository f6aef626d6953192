"""The emulated SparseCore (V2) tests pass, in a process of their own.

They live in `tests/emulated` (2 logical CPU devices, configured before
TensorFlow starts) and run apart from the V1 half
(`emulated_tpu_test.py`) so that the test workers can share them.
"""

import pytest

from tests.emulated_tpu_test import suite_passes


@pytest.mark.slow
def test_emulated_sparsecore_suite_passes():
    suite_passes(
        "tests/emulated/sparsecore_chip_test.py",
        "tests/emulated/sparsecore_training_test.py",
        "tests/emulated/sparsecore_checkpoint_test.py",
        "tests/emulated/sparsecore_keras_rs_test.py",
    )
