"""W4 serving: every export loads and are measured at every batch size that
fits; what is measured is checked, never how fast."""

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
        for name in ("kte_cpu", "kte_cpu_xla", "keras_embedding_xla"):
            assert 0 < cell[name]["p50_ms"] <= cell[name]["p99_ms"]
        assert set(cell["x_peer"]) == {"kte_cpu", "kte_cpu_xla"}
        for paired in cell["x_peer"].values():
            assert math.isfinite(paired) and paired > 0
