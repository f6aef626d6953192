"""The emulated pod: 2 hosts x 2 replicas (`tests/emulated_hosts`), in a
process of its own (it connects the process to a cluster of local TF
servers for the rest of the process)."""

import pytest

from tests.emulated_tpu_test import suite_passes


@pytest.mark.slow
def test_emulated_pod_suite_passes():
    suite_passes("tests/emulated_hosts")
