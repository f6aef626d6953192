"""Under `ParameterServerStrategy` the layers refuse, naming the strategy.

TF's `ParameterServerStrategy` with a `variable_partitioner` makes each
table a `ShardedVariable` over the parameter servers, whose `tf.gather`
returns rows grouped by shard: ids `[V - 1, 0]` came back swapped, a
silent wrong answer. Until the layers train on parameter servers, they
refuse the strategy at construction and at build.

The cluster (2 parameter servers, 1 worker) runs as local processes on
127.0.0.1, and the coordinator in a process of its own (it connects the
process to the cluster for the rest of its life).
"""

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

SERVER = textwrap.dedent(
    """
    import json, os, sys
    import tensorflow as tf
    cluster, job, index = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    server = tf.distribute.Server(
        tf.train.ClusterSpec(cluster), job_name=job, task_index=index,
        protocol="grpc", start=True)
    print("ready", flush=True)
    server.join()
    """
)

COORDINATOR = textwrap.dedent(
    """
    import json, sys
    import keras
    import tensorflow as tf
    import keras_tpu_embed as kte

    cluster = tf.train.ClusterSpec(json.loads(sys.argv[1]))
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        cluster, rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver,
        variable_partitioner=(
            tf.distribute.experimental.partitioners.FixedShardsPartitioner(2)
        ),
    )
    column = kte.embedding_column(
        kte.categorical_column_with_identity("item", 10), 4)
    outcome = {}
    with strategy.scope():
        try:
            kte.TPUEmbeddingLayer([column])
            outcome["construction"] = "accepted"
        except RuntimeError as error:
            outcome["construction"] = str(error)
    layer = kte.TPUEmbeddingLayer([column])
    with strategy.scope():
        try:
            layer.build()
            outcome["build"] = "accepted"
        except RuntimeError as error:
            outcome["build"] = str(error)
    print(json.dumps(outcome))
    """
)


def _ports(count):
    """Free ports, kept from other test processes: each xdist worker
    searches its own range."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    base = 30000 + 2000 * int(worker.lstrip("gw") or 0) + (os.getpid() % 500)
    ports = []
    candidate = base
    while len(ports) < count:
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", candidate))
                ports.append(candidate)
            except OSError:
                pass
        candidate += 1
    return ports


@pytest.mark.slow
def test_layers_refuse_parameter_server_strategy(tmp_path):
    ps, worker = _ports(2), _ports(3)[2:]
    cluster = {
        "ps": [f"127.0.0.1:{port}" for port in ps],
        "worker": [f"127.0.0.1:{port}" for port in worker],
    }
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    servers = [
        subprocess.Popen(
            [sys.executable, "-c", SERVER, json.dumps(cluster), job, str(i)],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for job in ("ps", "worker")
        for i in range(len(cluster[job]))
    ]
    try:
        for server in servers:
            assert server.stdout.readline().strip() == "ready"
        result = subprocess.run(
            [sys.executable, "-c", COORDINATOR, json.dumps(cluster)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        for server in servers:
            server.kill()
            server.wait()
    assert result.returncode == 0, result.stderr[-3000:]
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    for moment in ("construction", "build"):
        message = outcome[moment]
        assert "ParameterServerStrategy" in message, (moment, message)
        assert "MultiWorkerMirroredStrategy" in message, (moment, message)
