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

from benchmarks import report
from benchmarks.latency import CALLS
from benchmarks.latency import QUICK_CALLS
from tests import testing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PACKAGE = {"kte_cpu_ragged", "kte_cpu_dense", "kte_tensor_core_xla"}
SERVING = {"kte_cpu_serving", "kte_export_cpu"}
QUANTIZED = ("bfloat16", "int8")
EXPORTS = {
    "kte_cpu",
    "kte_tensor_core",
    "keras_embedding",
    "keras_embedding_xla",
    "tpu_embedding_for_serving",
}
QUICK_ROWS = (1000, 5000, 20000)
"""`workloads.QUICK_SCALE_ROWS`; the middle one stands for 10^6."""
ANCHORS = {"safe_lookup", "gather_bound_tf", "gather_bound_xla", "raw_xla"}
PEERS = {"keras_embedding", "keras_embedding_xla", "keras_rs", "tfrs"}
EXPECTED = {
    "W1": PACKAGE
    | SERVING
    | ANCHORS
    | PEERS
    | {
        "tpu_embedding_for_serving_sparse",
        "tpu_embedding_for_serving_ragged",
        "dense_features",
    },
    "W2": PACKAGE | ANCHORS | PEERS,
    "W3": {
        f"{kind}_{path}@{rows}"
        for kind in ("kte", "gather_bound")
        for path in ("cpu_dense", "tensor_core_xla")
        for rows in QUICK_ROWS
    },
}


def _finite_positive(value):
    return (
        isinstance(value, (int, float)) and math.isfinite(value) and value > 0
    )


FLOAT32_TOLERANCE = 1e-5
"""What float32 candidates must meet; a quantized one differs by more."""


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
        errors = {
            n: r["error"]
            for p in processes.values()
            for n, r in p["candidates"].items()
            if "error" in r
        }
        assert not errors, errors


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
            diff = record["max_abs_diff_to_anchor"]
            if name.endswith(QUANTIZED):
                # Its quantization error, reported beside its speed: more
                # than float32's, or table_dtype did not take (the error's
                # bound and tightness are quantization_test's).
                assert math.isfinite(diff), name
                assert diff > FLOAT32_TOLERANCE, (name, diff)
                checked.add(name)
                continue
            assert diff <= 1e-5, name
            checked.add(name)
    assert EXPECTED["W1"] - {"gather_bound_tf", "gather_bound_xla"} <= checked
    assert {f"kte_export_cpu_{d}" for d in QUANTIZED} <= checked


@pytest.mark.slow
def test_outputs_are_written(quick_run):
    results, stdout, out = quick_run
    assert (out / "results.png").stat().st_size > 0
    assert "Targets" in stdout and "W1:" in stdout
    assert {
        "W1",
        "W1_cpu_export",
        "W1_int8",
        "W2",
        "W3",
        "W2_rss",
        "latency",
    } <= set(results["targets"])
    assert results["targets"]["W3"]["paths"]["kte_cpu_dense"]["ratio"] > 0


@pytest.mark.slow
def test_quantized_candidates_are_measured(quick_run):
    """The package's export takes `table_dtype`: a run that says the
    quantized candidates were "not measured" is a regression."""
    results, stdout, _ = quick_run
    names = {
        n for p in results["W1"]["processes"].values() for n in p["candidates"]
    }
    assert {f"kte_export_cpu_{d}" for d in QUANTIZED} <= names
    notes = {
        n: why
        for p in results["W1"]["processes"].values()
        for n, why in p.get("not_measured", {}).items()
    }
    assert notes == {}
    assert results["latency"]["quantized_skipped"] == ""
    assert results["quantization"]["quantized_skipped"] == ""
    assert results["targets"]["W1_int8"]["met"] in (True, False)
    assert "not measured" not in stdout


@pytest.mark.slow
def test_latency_section(quick_run):
    results, stdout, out = quick_run
    latency = results["latency"]
    assert "error" not in latency, latency.get("error")
    expected = set(EXPORTS) | {f"kte_cpu_{d}" for d in QUANTIZED}
    assert set(latency["exports"]) == expected | {"kte_tensor_core_int8"}
    failed = {
        n: r["error"] for n, r in latency["exports"].items() if "error" in r
    }
    assert not failed, failed
    assert len(latency["batches"]) == 3 and latency["threads"] == [1, 8]
    quick = "--quick" in results["command"]
    for name, record in latency["exports"].items():
        cells = {(c["batch"], c["threads"]) for c in record["cells"]}
        assert cells == {
            (b, t) for b in latency["batches"] for t in latency["threads"]
        }, name
        for cell in record["cells"]:
            for key in ("p50_ms", "p99_ms", "examples_per_s"):
                assert _finite_positive(cell[key]), (name, cell)
            # The percentiles are over every call of every round.
            per_thread = QUICK_CALLS if quick else CALLS[cell["batch"]]
            assert cell["calls"] == (
                per_thread * cell["threads"] * latency["rounds"]
            ), (name, cell)
            assert _finite_positive(cell["vs_fastest_peer"]["ratio"]), name
        assert _finite_positive(record["saved_model_bytes"]), name
        diff = record["max_abs_diff"]
        assert math.isfinite(diff) and diff >= 0, name
        if name.endswith(QUANTIZED):
            assert diff > FLOAT32_TOLERANCE, name
        else:
            assert diff <= FLOAT32_TOLERANCE, name
    assert (out / "latency.png").stat().st_size > 0
    assert "Latency" in stdout and "p99 ms" in stdout


@pytest.mark.slow
def test_quantization_table(quick_run):
    results, stdout, _ = quick_run
    for name, record in results["latency"]["exports"].items():
        errors = record["max_abs_diff_per_table"]
        assert set(errors) == {"bag", "single", "seq"}, name
        assert all(math.isfinite(e) and e >= 0 for e in errors.values())
        if name.endswith(QUANTIZED):  # every table stored quantized
            assert all(e > 0 for e in errors.values()), (name, errors)
    demo = results["quantization"]["demo"]
    assert set(demo) == {"float32", *QUANTIZED}
    failed = {d: r["error"] for d, r in demo.items() if "error" in r}
    assert not failed, failed
    for dtype, record in demo.items():
        assert 0 < record["auc"] <= 1, dtype
        assert math.isfinite(record["auc_diff"]), dtype
        assert _finite_positive(record["saved_model_bytes"]), dtype
        assert _finite_positive(record["size_ratio"]), dtype
    assert demo["float32"]["auc_diff"] == 0
    for dtype in QUANTIZED:  # the scores moved: table_dtype took
        assert demo[dtype]["max_abs_score_diff"] > 0, dtype
    size = results["targets"]["latency"]["int8_size"]
    assert _finite_positive(size["ratio"])
    assert "Quantization" in stdout and "demo" in stdout


@pytest.mark.slow
def test_scale_reports_every_size_on_both_paths(quick_run):
    results, stdout, _ = quick_run
    paths = results["targets"]["W3"]["paths"]
    assert set(paths) == {"kte_cpu_dense", "kte_tensor_core_xla"}
    for path, scale in paths.items():
        assert scale["rows"] == list(QUICK_ROWS), path
        assert scale["ratio_rows"] == list(QUICK_ROWS[1:]), path
        for key in ("ratio", "ratio_to_smallest", "bound_ratio"):
            assert _finite_positive(scale[key]), (path, key)
        assert all(_finite_positive(ms) for ms in scale["step_ms"]), path
        assert all(_finite_positive(ms) for ms in scale["bound_ms"]), path
    assert f"{QUICK_ROWS[1]:,} -> {QUICK_ROWS[2]:,}" in stdout


def test_targets_pair_rounds_in_one_process():
    # Round by round, the peer beside us took 2x our time in round 0 and
    # 1x in rounds 1-2: the paired ratio is the median, 1.0, whatever the
    # other process's anchor says (its speed-up ratio is 3.0 here).
    workload = {
        "processes": {
            "kte": {
                "candidates": {
                    "ours": {"round_medians_s": [1.0, 2.0, 2.0]},
                    "raw_xla": {"round_medians_s": [2.0, 2.0, 2.0]},
                    "safe_lookup": {"round_medians_s": [9.0, 9.0, 9.0]},
                }
            }
        }
    }
    ours = {"name": "ours", "family": "kte", "speedup": 6.0}
    peer = {"name": "raw_xla", "speedup": 2.0}
    pair = report.paired(workload, ours, ["raw_xla", "safe_lookup"])
    assert pair == {"peer": "raw_xla", "ratio": 1.0, "rounds": 3}
    goal = report._versus(ours, peer, 1.5, pair)
    assert goal["ratio"] == 1.0 and not goal["met"]
    assert goal["ratio_across_processes"] == 3.0
    # Without the peer in our process, the cross-process ratio decides.
    assert report.paired(workload, ours, ["keras_embedding_xla"]) is None
    assert report._versus(ours, peer, 1.5, None)["met"]
