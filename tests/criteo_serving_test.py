"""W4 serving: both exports load and are measured at every batch size that
fits; what is measured is checked, never how fast."""

import math

import pytest

from benchmarks import criteo_serving
from benchmarks import workloads


@pytest.mark.slow
def test_latency_reports_both_exports_at_every_batch_that_fits():
    spec = workloads.criteo_workload(quick=True)
    batches = workloads.make_criteo_batches(spec)
    cells = criteo_serving.serving_latency(spec, batches, rounds=1, calls=2)
    assert set(cells) == {"1", "64"}  # the quick batch is 256
    for cell in cells.values():
        for name in ("kte_cpu", "keras_embedding_xla"):
            assert 0 < cell[name]["p50_ms"] <= cell[name]["p99_ms"]
        assert math.isfinite(cell["x_peer"]) and cell["x_peer"] > 0
