"""A TensorFlow cluster of local processes, to try parameter servers on
one machine: each task a `tf.distribute.Server` in its own process on
127.0.0.1, killed on the way out.

Used by the tests and benchmarks of `kte.parameter_server`; on a real
cluster each task runs on its own machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from typing import Iterator

SERVER = """
import json, sys
import tensorflow as tf
cluster, job, index = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
server = tf.distribute.Server(
    tf.train.ClusterSpec(cluster), job_name=job, task_index=index,
    protocol="grpc", start=True)
print("ready", flush=True)
server.join()
"""

ATTEMPTS = 3
"""Clusters started before giving up: a port found free can be taken by
another process before its server binds it (that server then exits)."""


@contextlib.contextmanager
def local_cluster(
    parameter_servers: int = 2, workers: int = 2
) -> Iterator[
    tuple[dict[str, list[str]], dict[tuple[str, int], subprocess.Popen[str]]]
]:
    """Starts the servers; yields the cluster (as `tf.train.ClusterSpec`
    takes it) and each task's process by `(job, index)`.

    Example:

        with local_cluster() as (cluster, processes):
            resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
                tf.train.ClusterSpec(cluster), rpc_layer="grpc")
            strategy = tf.distribute.experimental.ParameterServerStrategy(
                resolver)

    (A process that connects to a cluster stays connected for its life:
    run the coordinator in a process of its own.)

    Raises:
        RuntimeError: when no attempt got every server running.
    """
    for _ in range(ATTEMPTS):
        ports = free_ports(parameter_servers + workers)
        cluster = {
            "ps": [f"127.0.0.1:{p}" for p in ports[:parameter_servers]],
            "worker": [f"127.0.0.1:{p}" for p in ports[parameter_servers:]],
        }
        processes = _start(cluster)
        try:
            if all(_ready(process) for process in processes.values()):
                yield cluster, processes
                return
        finally:
            for process in processes.values():
                process.kill()
                process.wait()
    raise RuntimeError(
        f"Could not start a local cluster of {parameter_servers} parameter "
        f"servers and {workers} workers in {ATTEMPTS} attempts: a server "
        "exited before it was ready (its port taken?)."
    )


def free_ports(count: int) -> list[int]:
    """Ports the system calls free now, all different."""
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()


def _start(
    cluster: dict[str, list[str]],
) -> dict[tuple[str, int], subprocess.Popen[str]]:
    environment = dict(
        os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES=""
    )
    return {
        (job, index): subprocess.Popen(
            [
                sys.executable,
                "-c",
                SERVER,
                json.dumps(cluster),
                job,
                f"{index}",
            ],
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for job in ("ps", "worker")
        for index in range(len(cluster[job]))
    }


def _ready(process: subprocess.Popen[str]) -> bool:
    assert process.stdout is not None
    return process.stdout.readline().strip() == "ready"
