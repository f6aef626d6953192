"""The install extras resolve against the package registry.

`pip install '.[tpu]'` is what a TPU VM user runs first; it must find a
TensorFlow that exists for TPUs. These tests ask pip to resolve the extras
without installing anything (`--dry-run`), so they need the registry and
are skipped when it is unreachable.
"""

import json
import os
import pathlib
import platform
import re
import socket
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _registry_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
    except OSError:
        return False
    return True


pytestmark = [
    pytest.mark.network,
    # Off-line development machines cannot ask the registry; CI always can,
    # so there an unreachable registry fails these tests instead.
    pytest.mark.skipif(
        not os.environ.get("CI") and not _registry_reachable(),
        reason="pip resolves the extras against the package registry, "
        "which this machine cannot reach (CI always runs these)",
    ),
]


def _resolve(tmp_path, *requirements):
    report = tmp_path / "report.json"
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--report",
            str(report),
            *requirements,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    installs = json.loads(report.read_text())["install"]
    return {
        re.sub(r"[-_.]+", "-", item["metadata"]["name"]).lower(): item[
            "metadata"
        ]["version"]
        for item in installs
    }


@pytest.mark.skipif(
    sys.platform != "linux" or platform.machine() != "x86_64",
    reason="tensorflow-tpu publishes wheels for x86_64 Linux only (TPU VMs), "
    "so pip cannot resolve it elsewhere",
)
def test_tpu_extra_resolves_to_a_tensorflow_tpu_that_exists(tmp_path):
    versions = _resolve(tmp_path, ".[tpu]")
    assert versions["tensorflow-tpu"].startswith(("2.20.", "2.21."))


def test_cpu_extra_resolves_on_both_supported_versions(tmp_path):
    for version in ("2.20", "2.21"):
        versions = _resolve(tmp_path, ".[cpu]", f"tensorflow-cpu=={version}.*")
        assert versions["tensorflow-cpu"].startswith(f"{version}.")
