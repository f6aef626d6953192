"""The second half of the emulated engine (V1) and no-engine TPU tests,
in a process of its own (see `emulated_tpu_test.py`)."""

import pytest

from tests.emulated_tpu_test import engine_halves
from tests.emulated_tpu_test import suite_passes


@pytest.mark.slow
def test_emulated_engine_suite_passes():
    suite_passes(*engine_halves()[1])
