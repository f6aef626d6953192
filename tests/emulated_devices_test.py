"""The devices of an emulated TPU system, in this process.

Pods run in `tests/emulated_hosts` (a process of their own: a process is
the client of one cluster for the rest of its life).
"""

import pytest
import tensorflow as tf

from keras_tpu_embed.testing import emulated_devices


def test_host_of_a_core_is_its_tasks_cpu_0():
    host = emulated_devices.host_of("/job:worker/replica:0/task:1/device:CPU:3")
    assert host == "/job:worker/replica:0/task:1/device:CPU:0"


def test_by_host_groups_devices_in_their_order():
    devices = [
        f"/job:worker/replica:0/task:{task}/device:CPU:{core}"
        for task in (1, 0)
        for core in (0, 1)
    ]
    hosts = emulated_devices.by_host(devices)
    assert [host for host, _ in hosts] == [
        "/job:worker/replica:0/task:1/device:CPU:0",
        "/job:worker/replica:0/task:0/device:CPU:0",
    ]
    assert [owned for _, owned in hosts] == [
        tuple(devices[:2]),
        tuple(devices[2:]),
    ]


def test_cpu_devices_after_tensorflow_started_says_how_to_split_first():
    started = len(tf.config.list_logical_devices("CPU"))
    with pytest.raises(RuntimeError, match="set_logical_device_configuration"):
        emulated_devices.cpu_devices(started + 1)
    assert len(emulated_devices.cpu_devices(started)) == started


def test_this_process_is_no_pods_client():
    assert not emulated_devices.pod_is_connected()
