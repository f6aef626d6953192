"""The benchmark suite end to end, on tiny workloads (`run.py --quick`).

Checks what a run reports, never how fast anything is: every candidate of
every workload is measured in its process, with finite positive step times
and memory, lookups equal to the anchor's, and the JSON, table and chart are
written.
"""

import json
import math
import os

import pytest

from tests import testing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PACKAGE = {"kte_cpu_ragged", "kte_cpu_dense", "kte_tensor_core_xla"}
ANCHORS = {"safe_lookup", "gather_bound_tf", "gather_bound_xla", "raw_xla"}
PEERS = {"keras_embedding", "keras_embedding_xla", "keras_rs", "tfrs"}
EXPECTED = {
    "W1": PACKAGE
    | ANCHORS
    | PEERS
    | {
        "tpu_embedding_for_serving_sparse",
        "tpu_embedding_for_serving_ragged",
        "dense_features",
    },
    "W2": PACKAGE | ANCHORS | PEERS,
    "W3": {
        "kte_cpu_dense@1000",
        "kte_cpu_dense@20000",
        "gather_bound_cpu_dense@1000",
        "gather_bound_cpu_dense@20000",
    },
}


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("benchmarks")
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    done = testing.run_python(
        os.path.join(ROOT, "benchmarks", "run.py"),
        "--quick",
        "--rounds",
        "1",
        "--steps",
        "1",
        "--out",
        str(out),
        cwd=ROOT,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    with open(out / "results.json") as handle:
        return json.load(handle), done.stdout, out


@pytest.mark.slow
def test_every_candidate_is_measured(quick_run):
    results, _, _ = quick_run
    for workload, expected in EXPECTED.items():
        processes = results[workload]["processes"]
        failed = {f: p["error"] for f, p in processes.items() if "error" in p}
        assert not failed, failed
        names = {n for p in processes.values() for n in p["candidates"]}
        assert expected <= names, expected - names


@pytest.mark.slow
def test_numbers_are_finite_and_positive(quick_run):
    results, _, _ = quick_run
    for workload in EXPECTED:
        for process in results[workload]["processes"].values():
            for name, record in process["candidates"].items():
                for key in ("median_step_s", "peak_rss_bytes"):
                    value = record[key]
                    assert math.isfinite(value) and value > 0, (name, key)
                assert all(t > 0 for t in record["step_times_s"]), name
    for row in results["W1"]["rows"] + results["W2"]["rows"]:
        assert row["speedup"] > 0 and math.isfinite(row["speedup"]), row
        assert row["bound_fraction"] > 0, row


@pytest.mark.slow
def test_lookups_equal_the_anchor(quick_run):
    results, _, _ = quick_run
    checked = set()
    for process in results["W1"]["processes"].values():
        for name, record in process["candidates"].items():
            if record["role"] == "bound":
                continue
            assert record["max_abs_diff_to_anchor"] <= 1e-5, name
            checked.add(name)
    assert EXPECTED["W1"] - {"gather_bound_tf", "gather_bound_xla"} <= checked


@pytest.mark.slow
def test_outputs_are_written(quick_run):
    results, stdout, out = quick_run
    assert (out / "results.png").stat().st_size > 0
    assert "Targets" in stdout and "W1:" in stdout
    assert {"W1", "W2", "W3", "W2_rss"} <= set(results["targets"])
    assert results["targets"]["W3"]["paths"]["kte_cpu_dense"]["ratio"] > 0
