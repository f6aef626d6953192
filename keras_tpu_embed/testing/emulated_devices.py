"""The devices of an emulated TPU system: logical CPUs, or a pod's hosts.

One host is this process's CPU split into logical devices, which TF
allows only before its runtime starts. A pod slice is a cluster of
in-process TF servers, one per host, whose CPU devices are that host's
cores; this process is the client of the cluster, as a pod's coordinator
is, for the rest of its life.
"""

from __future__ import annotations

import socket
from typing import Any

from keras_tpu_embed._compat import tf


def host_of(device: str) -> str:
    """The host CPU of `device`, as TF's `device_util.get_host_for_device`."""
    spec = tf.DeviceSpec.from_string(device)
    host: str = tf.DeviceSpec(
        job=spec.job,
        replica=spec.replica,
        task=spec.task,
        device_type="CPU",
        device_index=0,
    ).to_string()
    return host


def by_host(devices: list[str]) -> list[tuple[str, tuple[str, ...]]]:
    """`(host, its devices)` for each host of `devices`, in their order."""
    hosts: dict[str, list[str]] = {}
    for device in devices:
        hosts.setdefault(host_of(device), []).append(device)
    return [(host, tuple(owned)) for host, owned in hosts.items()]


def cpu_devices(count: int) -> list[str]:
    """`count` logical CPU devices, configured here when TF has not started."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    configured = tf.config.get_logical_device_configuration(cpu) or []
    if len(configured) < count:
        try:
            tf.config.set_logical_device_configuration(
                cpu,
                [tf.config.LogicalDeviceConfiguration()] * count,
            )
        except RuntimeError:
            pass
    devices = tf.config.list_logical_devices("CPU")
    if len(devices) < count:
        raise RuntimeError(
            f"emulated_tpu(num_replicas={count}) needs {count} logical CPU "
            f"devices, but TensorFlow already started with {len(devices)}. "
            "Enter emulated_tpu before TensorFlow runs anything in the "
            "process (a fresh process, e.g. a subprocess per test), or "
            "split the CPU yourself first: tf.config."
            "set_logical_device_configuration(tf.config.list_physical_"
            f"devices('CPU')[0], [tf.config.LogicalDeviceConfiguration()] "
            f"* {count})."
        )
    return [device.name for device in devices[:count]]


# The hosts of this process's emulated pod: (hosts, replicas per host) ->
# devices. Its servers live as long as the process (TF cannot stop an
# in-process server), so a pod of the same shape is reused.
_PODS: dict[tuple[int, int], list[str]] = {}
_SERVERS: list[Any] = []


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return int(probe.getsockname()[1])


def pod_devices(num_replicas: int, num_hosts: int) -> list[str]:
    """The TPU cores of `num_hosts` hosts, as TF servers of this process.

    Each host is a task of the job "worker" with `num_replicas /
    num_hosts` CPU devices (its cores); this process is the client of the
    cluster, as the coordinator of a TPU pod is, and runs every host's ops
    through TF's remote eager runtime.
    """
    per_host = num_replicas // num_hosts
    shape = (num_hosts, per_host)
    if shape in _PODS:
        return _PODS[shape]
    if _PODS:
        hosts, replicas = next(iter(_PODS))
        raise RuntimeError(
            f"emulated_tpu(num_replicas={num_replicas}, num_hosts="
            f"{num_hosts}): this process already emulates a pod of {hosts} "
            f"hosts x {replicas} replicas, and TensorFlow connects a "
            "process to one cluster only. Use the same num_replicas and "
            "num_hosts throughout the process, or a process per shape."
        )
    cluster = tf.train.ClusterSpec(
        {"worker": [f"localhost:{_free_port()}" for _ in range(num_hosts)]}
    )
    config = tf.compat.v1.ConfigProto(device_count={"CPU": per_host})
    servers = [
        tf.distribute.Server(
            cluster, job_name="worker", task_index=task, config=config
        )
        for task in range(num_hosts)
    ]
    tf.config.experimental_connect_to_cluster(cluster)
    devices = [
        f"/job:worker/replica:0/task:{task}/device:CPU:{core}"
        for task in range(num_hosts)
        for core in range(per_host)
    ]
    _PODS[shape] = devices
    _SERVERS.extend(servers)
    return devices


def pod_is_connected() -> bool:
    """Whether this process is already the client of an emulated pod."""
    return bool(_PODS)
