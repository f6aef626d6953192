"""The emulated-TPU suites pass, each run in its own process.

Four processes: two halves of the engine files (this file and
`emulated_engine_test.py`), the SparseCore files
(`emulated_sparsecore_test.py`) and the pod (`emulated_pod_test.py`).

`tests/emulated` splits the CPU into 2 logical devices, which TensorFlow
allows only before its runtime starts; `tests/emulated_hosts` connects the
process to a cluster of two in-process TF servers (a pod's two hosts) for
the rest of the process. Neither can run inside this session (the root
`conftest.py` leaves them out): each runs in a fresh `python -m pytest`,
and its output is shown when it fails.
"""

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def suite_passes(*arguments):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            *arguments,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    # The summary line: some tests passed and none failed, errored or
    # skipped (exit code 0 alone would also accept a run that collected
    # nothing, and a skip would pass for a test that never ran).
    summary = result.stdout.strip().splitlines()[-1]
    assert re.match(r"^\d+ passed", summary), output
    assert not re.search(
        r"\b(failed|error|errors|skipped|xfailed|deselected)\b", summary
    ), output


def sparsecore_files():
    """The SparseCore half of `tests/emulated`: every `sparsecore_*` test
    file, found, so that a new one runs without being listed."""
    return sorted(
        str(path.relative_to(ROOT))
        for path in (ROOT / "tests" / "emulated").glob("sparsecore_*_test.py")
    )


def engine_files():
    """The other half: every other test file of `tests/emulated`."""
    every = sorted(
        str(path.relative_to(ROOT))
        for path in (ROOT / "tests" / "emulated").glob("*_test.py")
    )
    return [path for path in every if path not in sparsecore_files()]


def test_the_two_halves_run_every_emulated_test_file_once():
    halves = engine_files() + sparsecore_files()
    every = sorted(
        str(path.relative_to(ROOT))
        for path in (ROOT / "tests" / "emulated").glob("*_test.py")
    )
    assert sorted(halves) == every
    assert len(set(halves)) == len(halves)
    assert "tests/emulated/sparsecore_batch_test.py" in sparsecore_files()


def engine_halves():
    """The engine files in two halves of about equal time (alternate files
    of the sorted list), one process each, so that the two test workers
    share them (`--dist loadfile` keeps a file's tests on one worker)."""
    files = engine_files()
    return files[0::2], files[1::2]


def test_the_engine_halves_run_every_engine_file_once():
    first, second = engine_halves()
    assert sorted(first + second) == engine_files()
    assert first and second


@pytest.mark.slow
def test_emulated_tpu_suite_passes():
    """The engine (V1) and no-engine TPU tests, first half; the second
    runs in `emulated_engine_test.py`, SparseCore's in
    `emulated_sparsecore_test.py` and the pod's in `emulated_pod_test.py`,
    so that the test workers can share them."""
    suite_passes(*engine_halves()[0])
