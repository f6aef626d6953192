"""The benchmark suite end to end, on tiny workloads (`run.py --quick`).

Checks what a run reports, never how fast anything is: every candidate of
every workload is measured in its process, with finite positive step times
and memory, lookups equal to the anchor's, and the JSON, table and chart are
written.
"""

import json
import math
import os

import numpy as np
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
    "kte_cpu_xla",
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
            faults = cell["page_faults_per_call"]
            assert math.isfinite(faults) and faults >= 0, (name, cell)
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


@pytest.mark.slow
def test_only_measures_the_named_candidate_alone():
    """Issue 28 (memory): in the shared process a candidate's peak RSS hid
    what it shares with the candidates built before it (W2's dense host
    path read 1.01x its state after the ragged one, 1.69x alone)."""
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    script = os.path.join(ROOT, "benchmarks", "candidates.py")
    common = ["--workload", "W2", "--family", "kte", "--quick"]
    done = testing.run_python(
        script,
        *common,
        "--rounds",
        "1",
        "--steps",
        "1",
        "--only",
        "kte_cpu_ragged",
        cwd=ROOT,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = json.loads(done.stdout.strip().splitlines()[-1])["candidates"]
    assert set(records) == {"kte_cpu_ragged"}
    assert records["kte_cpu_ragged"]["peak_rss_added_bytes"] > 0
    wrong = testing.run_python(
        script, *common, "--only", "kte_cpu", cwd=ROOT, env=env, timeout=300
    )
    assert wrong.returncode != 0
    assert "kte_cpu_ragged" in wrong.stderr and "'kte_cpu'" in wrong.stderr


# ------------------------------------------------------------------- W4


def test_w4_has_the_criteo_kaggle_cardinalities_capped():
    from benchmarks import workloads

    published = workloads.CRITEO_KAGGLE_CARDINALITIES
    assert len(published) == 26
    assert max(published) == 10_131_227  # the one Kaggle feature over 10^7
    spec = workloads.criteo_workload()
    assert spec.row_cap == 10**7 and spec.dim == 16
    assert workloads.CRITEO_NUMERIC == 13
    shapes = spec.table_shapes()
    assert list(shapes) == [f"cat_{i}" for i in range(26)]
    assert [rows for rows, _ in shapes.values()] == [
        min(c, 10**7) for c in published
    ]
    assert {dim for _, dim in shapes.values()} == {16}
    assert shapes["cat_2"] == (10**7, 16)
    assert shapes["cat_11"] == (8_351_593, 16)  # under the cap: unchanged
    quick = workloads.criteo_workload(quick=True)
    assert max(r for r, _ in quick.table_shapes().values()) == quick.row_cap
    assert min(r for r, _ in quick.table_shapes().values()) == 3


def test_w4_ids_are_zipf_heavy_tailed_and_in_range():
    from benchmarks import workloads

    rows = 100_000
    rng = np.random.default_rng(0)
    ids = workloads.zipf_ids(rng, rows, 200_000)
    assert ids.dtype == np.int64 and ids.min() >= 0 and ids.max() < rows
    counts = np.sort(np.unique(ids, return_counts=True)[1])[::-1]
    # Zipf(1.1): the 1% most frequent ids draw ~75% of the lookups (1% if
    # uniform), and rank 1 is drawn ~10**1.1 = 12.6 times as often as
    # rank 10.
    assert counts[: rows // 100].sum() / counts.sum() > 0.6
    assert 8 < counts[0] / counts[9] < 20
    uniform = np.random.default_rng(0).integers(0, rows, 200_000)
    uniform_counts = np.sort(np.unique(uniform, return_counts=True)[1])[::-1]
    assert uniform_counts[: rows // 100].sum() / 200_000 < 0.05
    # Tiny vocabularies (Criteo has 3- and 4-value features) fill too.
    assert set(workloads.zipf_ids(rng, 3, 1_000).tolist()) == {0, 1, 2}


def test_w4_rank_to_id_map_is_a_bijection():
    from benchmarks import workloads

    for rows in (1, 3, 10, 583, 2_654_435_761 % 1000 + 1000, 142_572):
        multiplier = workloads._ZIPF_MULTIPLIER % rows
        while np.gcd(multiplier, rows) != 1:
            multiplier += 1
        ranks = np.arange(rows, dtype=np.int64)
        assert len(np.unique((ranks * multiplier) % rows)) == rows


def test_w4_batches_are_deterministic_with_the_seed():
    from benchmarks import workloads

    spec = workloads.criteo_workload(quick=True)
    first = workloads.make_criteo_batches(spec)
    again = workloads.make_criteo_batches(spec)
    other = workloads.make_criteo_batches(spec, seed=1)
    assert len(first) == spec.batches
    for a, b, c in zip(first, again, other):
        assert list(a.ids) == list(spec.table_shapes())
        for name, ids in a.ids.items():
            assert ids.shape == (spec.batch_size,)
            np.testing.assert_array_equal(ids, b.ids[name])
        np.testing.assert_array_equal(a.numeric, b.numeric)
        np.testing.assert_array_equal(a.labels, b.labels)
        assert a.numeric.shape == (spec.batch_size, 13)
        assert np.all(np.isfinite(a.numeric)) and np.all(a.numeric >= 0)
        assert set(np.unique(a.labels).tolist()) <= {0.0, 1.0}
        assert not np.array_equal(a.ids["cat_2"], c.ids["cat_2"])


@pytest.mark.slow
@pytest.mark.slow
def test_w4_quick_run_reports_every_candidate_and_target(quick_run):
    results, stdout, _ = quick_run
    result = results["W4"]
    assert "error" not in result, result
    training = result["training"]
    assert set(training) == {
        "safe_lookup",
        "raw_xla",
        "keras_embedding_xla",
        "dense_head_xla",
        "kte_cpu",
        "kte_tensor_core_xla",
    }
    for name, record in training.items():
        assert "error" not in record, (name, record)
        assert _finite_positive(record["median_step_s"])
        assert _finite_positive(record["state_bytes"])
    assert set(result["serving"]) == {"1", "64"}  # quick batch is 256
    for cell in result["serving"].values():
        assert set(cell["x_peer"]) == {"kte_cpu", "kte_cpu_xla"}
        assert all(_finite_positive(x) for x in cell["x_peer"].values())
    text = result["table"]
    assert text in stdout
    assert "W4 training:" in text and "(target >= 1.5)" in text
    assert "W4 training bound: the dense model alone" in text
    assert "W4 RSS kte_cpu:" in text and "W4 RSS kte_tensor_core_xla:" in text
    assert text.count("W4 serving batch") == 4  # 2 batches, 2 exports
    assert "met" in text.split("Targets")[1]


@pytest.mark.slow
def test_row_layouts_report_every_layout_and_the_bound(quick_run):
    results, stdout, _ = quick_run
    layouts = results["row_layouts"]
    assert "error" not in layouts, layouts
    layers = ["split", "split_words", "inline", "inline_words"]
    layers += ["inline_aligned", "inline_aligned_words"]
    names = {"float32", "uint8_gather"} | {f"int8_{n}" for n in layers}
    names |= {f"{name}_xla" for name in names}
    ratios = layouts["speedup_vs_float32"]
    assert names == set(ratios)
    assert layouts["best_int8"] == max(
        (n for n in names if n.startswith("int8")), key=ratios.get
    )
    assert layouts["bound"] == max(
        ratios["uint8_gather"], ratios["uint8_gather_xla"]
    )
    assert layouts["met"] == (ratios[layouts["best_int8"]] >= 1.3)
    assert all(_finite_positive(ms) for ms in layouts["ms"].values())
    assert layouts["table"] in stdout


def test_repeated_runs_judge_targets_on_the_median():
    # Issue 28's three W2 runs: 1.39x, 1.74x, 1.47x. The last run alone
    # would meet 1.5x; the median of the three does not.
    runs = [
        {"W2": {"ratio": r, "target": 1.5, "met": r >= 1.5}, "W3": {}}
        for r in (1.39, 1.47, 1.74)
    ]
    goals = report.median_targets(runs)
    assert goals["W2"]["ratio"] == 1.47
    assert goals["W2"]["runs"] == [1.39, 1.47, 1.74]
    assert goals["W2"]["met"] is False
    assert goals["W3"] == {}


def test_minor_faults_count_the_pages_a_fresh_block_touches():
    from benchmarks import latency

    size = 64 * 2**20
    before = latency.minor_faults()
    # Fresh pages from malloc (numpy would ask for huge pages), one byte
    # written in each.
    block = bytearray(size)
    block[::4096] = b"\x01" * (size // 4096)
    assert latency.minor_faults() - before >= size // 4096 // 2
    del block
