"""Emulated-pod tests: 2 hosts x 2 replicas, in a process of their own.

`emulated_tpu(num_replicas=4, num_hosts=2)` connects the process to a
cluster of two in-process TF servers (the hosts), for the rest of the
process: so this directory is skipped by the normal run (the root
`conftest.py`) and run in its own process by `tests/emulated_pod_test.py`,
apart from `tests/emulated` (one host on logical CPUs).
"""

import pytest

from tests.emulated_hosts import trained_pod


@pytest.fixture(scope="session")
def adagrad_pod(tmp_path_factory):
    """The Adagrad model trained once on the pod and what was read and
    saved of it (`trained_pod.train_adagrad_pod`). Session-scoped: the
    pod's files run in one process, and `chip_shards_test.py` and
    `engine_shards_test.py` check the same training."""
    return trained_pod.train_adagrad_pod(tmp_path_factory.mktemp("pod"))
