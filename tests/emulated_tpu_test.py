"""The emulated-TPU suite (`tests/emulated`) passes, run in its own process.

Those tests split the CPU into 2 logical devices, which TensorFlow allows
only before its runtime starts, so they cannot run inside this session
(the root `conftest.py` leaves them out): here they run in a fresh
`python -m pytest`, and its output is shown when it fails.
"""

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_emulated_tpu_suite_passes():
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
            "tests/emulated",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    # The summary line: some tests passed and none failed or errored (exit
    # code 0 alone would also accept a run that collected nothing).
    summary = result.stdout.strip().splitlines()[-1]
    assert re.match(r"^\d+ passed", summary), output
    assert not re.search(r"\b(failed|error|errors)\b", summary), output
