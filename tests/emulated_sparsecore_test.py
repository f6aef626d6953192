"""The emulated SparseCore under TF's own `TPUEmbeddingV2`.

The SparseCore tests of `tests/emulated` run in a process of their own; the
kernels are checked alone in `sparsecore_kernels_test.py`,
`sparsecore_host_ops_test.py` and `sparsecore_optimizer_rules_test.py`.
"""

import pytest

from tests.emulated_tpu_test import sparsecore_files
from tests.emulated_tpu_test import suite_passes


@pytest.mark.slow
def test_emulated_sparsecore_suite_passes():
    """The SparseCore tests of `tests/emulated` (2 logical CPU devices,
    configured before TensorFlow starts) in a process of their own, apart
    from the V1 half (`emulated_tpu_test.py`) so that the test workers can
    share them."""
    suite_passes(*sparsecore_files())
