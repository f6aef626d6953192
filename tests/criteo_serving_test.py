"""W4 serving: every export loads, answers as the peer's does, and is
measured at every batch size that fits; what is measured is checked, never
how fast."""

import math

import pytest

from benchmarks import criteo_serving
from benchmarks import workloads


@pytest.mark.slow
def test_latency_reports_every_export_at_every_batch_that_fits():
    spec = workloads.criteo_workload(quick=True)
    batches = workloads.make_criteo_batches(spec)
    cells = criteo_serving.serving_latency(spec, batches, rounds=1, calls=2)
    assert set(cells) == {"1", "64"}  # the quick batch is 256
    for cell in cells.values():
        # The exports timed against each other compute one model: without
        # the peer given our weights, this was 0.1 and more.
        assert set(cell["max_difference"]) == {"kte_cpu", "kte_cpu_xla"}
        for difference in cell["max_difference"].values():
            assert difference <= criteo_serving.ANSWER_TOLERANCE
        for name in ("kte_cpu", "kte_cpu_xla", "keras_embedding_xla"):
            assert cell[name]["p99_ms"] > 0
        assert set(cell["x_peer"]) == {"kte_cpu", "kte_cpu_xla"}
        for paired in cell["x_peer"].values():
            assert math.isfinite(paired) and paired > 0
