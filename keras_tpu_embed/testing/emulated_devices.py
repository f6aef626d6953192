"""The devices of an emulated TPU system: logical CPUs, or a pod's hosts.

One host is this process's CPU split into logical devices, which TF
allows only before its runtime starts. A pod slice is a cluster of TF
servers, one per host, whose CPU devices are that host's cores; this
process is the client of the cluster, as a pod's coordinator is, for the
rest of its life (TF connects a process to one cluster).

The hosts run in this process (the default, quick to start), or each in a
local process of its own (`pod_devices(..., host_processes=True)`), where
what a host holds is that process's memory and can be measured apart from
the client's (`host_process_ids`). A host process serves TF's remote eager
runtime on 127.0.0.1 and nothing else; it stops when its pipe from this
process closes, which the system does when this process ends, however it
ends (after TF's client has let go of the hosts: stopped earlier, they
would leave it errors to log at exit). Its port is reserved here
before it starts and stays reserved while it runs (`SO_REUSEPORT`, which
TF's gRPC server shares under `TF_GRPC_REUSE_PORT=1`), so no other
process can take it between the choice and the bind.

What either form emulates: the hosts as TF sees a pod's hosts (tasks of
the job "worker", devices and data moved between them by TF's runtime
over gRPC). What it does not: separate machines (one machine's memory
and cores are shared, the network is the loopback), a real TPU host's
input pipeline, the TPU interconnect, and a host that fails.
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
from typing import IO
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


# A host process: a TF server of the cluster named in argv, with
# `device_count` CPUs, until its stdin closes. Only TF is imported: the
# process holds what the client places on it, over TF's runtime.
_HOST_PROGRAM = """
import json, os, sys
import tensorflow as tf
cluster, task, cores = sys.argv[1:4]
server = tf.distribute.Server(
    tf.train.ClusterSpec(json.loads(cluster)),
    job_name="worker",
    task_index=int(task),
    config=tf.compat.v1.ConfigProto(device_count={"CPU": int(cores)}),
)
print("ready", flush=True)
sys.stdin.read()
os._exit(0)
"""
_HOST_START_S = 300.0
"""How long a host process may take to start (TF's import on a busy
machine), in seconds."""


@dataclasses.dataclass
class _Pod:
    """This process's emulated pod: its shape, devices and hosts."""

    num_hosts: int
    per_host: int
    devices: list[str]
    servers: list[Any]  # in-process TF servers
    processes: list[subprocess.Popen[str]]  # host processes
    reserved_ports: list[socket.socket]


# Its servers live as long as the process (TF cannot stop an in-process
# server, nor disconnect a client), so a pod of the same shape is reused.
_POD: _Pod | None = None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return int(probe.getsockname()[1])


def _reserved_port() -> socket.socket:
    """A port of 127.0.0.1 held by a socket that lets only a reusing
    socket (TF's server under `TF_GRPC_REUSE_PORT=1`) bind it too."""
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    holder.bind(("127.0.0.1", 0))
    return holder


def _start_host(
    cluster: dict[str, list[str]], task: int, cores: int, log: IO[str]
) -> subprocess.Popen[str]:
    env = dict(os.environ, TF_GRPC_REUSE_PORT="1")
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            _HOST_PROGRAM,
            json.dumps(cluster),
            str(task),
            str(cores),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        env=env,
        text=True,
    )


def _wait_ready(
    process: subprocess.Popen[str], task: int, log: IO[str]
) -> None:
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], _HOST_START_S)
    if ready and process.stdout.readline().strip() == "ready":
        return
    process.kill()
    process.wait()
    log.seek(0)
    tail = log.read()[-2000:]
    raise RuntimeError(
        f"emulated pod: host process {task} was not ready within "
        f"{_HOST_START_S:.0f} s (exit code {process.returncode}). Its "
        f"stderr ends with:\n{tail}"
    )


def _host_processes(
    num_hosts: int, per_host: int
) -> tuple[tf.train.ClusterSpec, list[subprocess.Popen[str]], list[Any]]:
    holders = [_reserved_port() for _ in range(num_hosts)]
    addresses = [f"127.0.0.1:{holder.getsockname()[1]}" for holder in holders]
    cluster = {"worker": addresses}
    processes: list[subprocess.Popen[str]] = []
    for task in range(num_hosts):
        with tempfile.TemporaryFile("w+") as log:
            process = _start_host(cluster, task, per_host, log)
            processes.append(process)
            _wait_ready(process, task, log)
    return tf.train.ClusterSpec(cluster), processes, holders


def pod_devices(
    num_replicas: int, num_hosts: int, host_processes: bool = False
) -> list[str]:
    """The TPU cores of `num_hosts` hosts, as TF servers of a cluster.

    Each host is a task of the job "worker" with `num_replicas /
    num_hosts` CPU devices (its cores); this process is the client of the
    cluster, as the coordinator of a TPU pod is, and runs every host's ops
    through TF's remote eager runtime.

    `emulated_tpu(num_replicas, num_hosts)` asks for the pod; to run its
    hosts as processes, call this first with `host_processes=True`:
    `emulated_tpu` then uses that pod (same shape).

    Args:
        num_replicas: The pod's cores, a multiple of `num_hosts`.
        num_hosts: The pod's hosts.
        host_processes: Each host as a local process (started now, on
            127.0.0.1, ending when this process ends) rather than a
            server in this process.

    Returns:
        The cores' device names, host by host.

    Raises:
        RuntimeError: this process already emulates a pod of another shape
            or form, or a host process did not start (its stderr said).
    """
    global _POD
    per_host = num_replicas // num_hosts
    if _POD is not None:
        if (_POD.num_hosts, _POD.per_host) == (num_hosts, per_host) and (
            not host_processes or _POD.processes
        ):
            return _POD.devices
        form = "host processes" if _POD.processes else "in-process hosts"
        raise RuntimeError(
            f"emulated_tpu(num_replicas={num_replicas}, num_hosts="
            f"{num_hosts}): this process already emulates a pod of "
            f"{_POD.num_hosts} hosts x {_POD.per_host} replicas ({form}), "
            "and TensorFlow connects a process to one cluster only. Use "
            "the same num_replicas and num_hosts throughout the process, "
            "or a process per shape."
        )
    servers: list[Any] = []
    processes: list[subprocess.Popen[str]] = []
    holders: list[Any] = []
    if host_processes:
        cluster, processes, holders = _host_processes(num_hosts, per_host)
    else:
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
    _POD = _Pod(num_hosts, per_host, devices, servers, processes, holders)
    return devices


def pod_is_connected() -> bool:
    """Whether this process is already the client of an emulated pod."""
    return _POD is not None


def host_process_ids() -> list[int]:
    """The process id of each host of this process's pod, task by task
    (empty when the hosts run in this process, or there is no pod)."""
    if _POD is None:
        return []
    return [process.pid for process in _POD.processes]
